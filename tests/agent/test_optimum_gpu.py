"""The optimum on a GPU cluster (issue 25 item 4, docs/optimum.md "GPUs"): the MIP states the GPU filter (model,
count, a share on one GPU, whole GPUs free) and the GPU power the twin meters (idle while awake, the allocated
share's rise while a pod runs, nothing asleep); its optimum replays in the twin to the joule, and
fluid <= LP <= optimum <= every policy, the GPU-aware ones included.

HiGHS (highspy) is a real solver installed from PyPI; nothing here is mocked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.agent import optimum as opt
from joulesched.agent.lower_bound import gpu_dynamic_joules, lower_bound
from joulesched.agent.registry import BASELINES, GPU_POLICIES
from joulesched.cluster.scenario import Scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.cli import app

LINEAR = [100.0 + 10.0 * k for k in range(11)]
SLEEP = {"mode": "sleep", "sleep_after_s": 30, "sleep_watts": 5, "wake_s": 20}


def gpu_scenario(tmp: Path, pods: list[tuple], groups: list[dict] | None = None, idle: dict | None = None,
                 name: str = "g") -> Scenario:
    """Pods: (submit, duration, cpu request, memory, usage, gpu count, gpu milli, allowed models '|')."""
    rows = ["submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,gpu_count,gpu_milli,gpu_spec"]
    rows += [",".join(str(x) for x in p) for p in pods]
    (tmp / f"{name}.csv").write_text("\n".join(rows) + "\n")
    base = {"cpu_m": 2000, "memory_mib": 4096, "power_watts": LINEAR}
    groups = groups or [
        {**base, "name_prefix": "t4", "count": 2, "gpu_count": 1, "gpu_model": "T4", "gpu_power_watts": [10, 70]},
        {**base, "name_prefix": "a10", "count": 1, "gpu_count": 2, "gpu_model": "A10", "gpu_power_watts": [20, 150]},
        {**base, "name_prefix": "cpu", "count": 1}]
    return Scenario.model_validate({"name": name, "seed": 0, "duration_s": 600.0, "idle_policy": idle or SLEEP,
                                    "nodes": groups, "workload": {"trace": f"{name}.csv"},
                                    "source": tmp / f"{name}.yaml"})


# Whole and shared GPU pods of both models, one restricted to A10 and one to either, a CPU-only pod, and a
# 2-GPU A10 pod that needs both of the A10 node's GPUs free when it arrives.
PODS = [(0.0, 200.0, 500, 256, 400.0, 1, 1000, ""),
        (10.0, 300.0, 500, 256, 300.0, 1, 500, ""),
        (20.0, 250.0, 250, 256, 200.0, 1, 300, "A10"),
        (40.0, 100.0, 500, 256, 500.0, 0, "", ""),
        (280.0, 200.0, 250, 256, 250.0, 2, 1000, "A10"),
        (300.0, 150.0, 500, 256, 450.0, 1, 600, ""),
        (320.0, 100.0, 250, 256, 100.0, 1, 500, "T4|A10")]


def test_the_instance_reads_the_gpus_and_the_optimum_replays_exactly_with_the_bound_chain(tmp_path):
    sc = gpu_scenario(tmp_path, PODS)
    inst = opt.instance(sc, 0)
    assert inst.gpu.tolist() == [1, 1, 2, 0] and list(inst.gpu_model) == ["T4", "T4", "A10", ""]
    assert inst.g.tolist() == [1, 1, 1, 0, 2, 1, 1] and inst.gm.tolist()[:3] == [1000, 500, 300]
    assert len(set(inst.kinds.tolist())) == 3  # the two T4 nodes are interchangeable, the others not
    fits = inst.gpu_fits()
    assert fits[2].tolist() == [False, False, True, False]  # A10 only
    assert fits[4].tolist() == [False, False, True, False]  # two GPUs: only the A10 node has them
    assert fits[3].all()  # no GPU: anywhere
    res = opt.solve(inst, time_limit=30)
    assert res.status == "optimal", res
    rr = opt.replay(sc, 0, res.assignment)
    assert abs(rr.energy_joules - res.energy_joules) <= opt.REPLAY_TOL * rr.energy_joules
    assert rr.gpu_energy_joules > 0.2 * rr.energy_joules  # the GPUs are a real share of it
    for p, node in res.assignment.items():  # every placement passes the GPU filter's count and model
        assert fits[list(inst.pod).index(p), node]
    lp = opt.lp_bound(inst)
    boa = opt.lp_bound(inst, bind_on_arrival=True, fluid_joules=lp.fluid_joules)
    assert lp.fluid_joules <= lp.joules * (1 + 1e-6) <= boa.joules * (1 + 1e-6) <= res.energy_joules * (1 + 1e-6)
    # Every policy, the GPU-aware ones included, uses at least the LP bound; those whose run binds every pod on
    # arrival at least the optimum, and the model prices their schedules at the twin's energy.
    specs = tuple(dict.fromkeys((*BASELINES, *GPU_POLICIES)))
    every = opt.policy_energies(sc, 0, specs)
    assert min(every.values()) >= lp.joules * (1 - 1e-9)
    in_class = 0
    for spec in specs:
        sched = opt.twin_schedule(inst, spec)
        if sched is None:
            continue
        in_class += 1
        assert res.energy_joules <= sched.twin_joules * (1 + 1e-9), spec
        assert opt.evaluate(inst, sched) == pytest.approx(sched.twin_joules, rel=1e-9), spec
    assert in_class >= 3 and any(s in GPU_POLICIES and opt.twin_schedule(inst, s) for s in GPU_POLICIES)


def test_the_gpu_power_counts_by_hand(tmp_path):
    # Always on, one A10 node (2 GPUs, 20 W idle, 150 W max each) and nothing else: 100 W CPU idle + 40 W GPU
    # idle for the 600 s run; a pod of half a GPU and 0 CPU usage adds 65 W for its 100 s, a whole-GPU pod
    # 130 W for its 50 s, both at once (each on its own GPU).
    groups = [{"name_prefix": "a10", "count": 1, "cpu_m": 2000, "memory_mib": 4096, "power_watts": LINEAR,
               "gpu_count": 2, "gpu_model": "A10", "gpu_power_watts": [20, 150]}]
    pods = [(0.0, 100.0, 100, 10, 0.0, 1, 500, ""), (10.0, 50.0, 100, 10, 0.0, 1, 1000, "")]
    sc = gpu_scenario(tmp_path, pods, groups, {"mode": "always_on"})
    inst = opt.instance(sc, 0)
    res = opt.solve(inst, time_limit=20)
    expected = 140 * 600 + 65 * 100 + 130 * 50
    assert res.status == "optimal" and res.energy_joules == pytest.approx(expected, rel=1e-12)
    assert opt.replay(sc, 0, res.assignment).energy_joules == pytest.approx(expected, rel=1e-12)
    # The fluid bound counts the GPUs' idle and their rise: here it is tight, and the benchmark's call on the
    # twin's own state and workload gives the same.
    assert opt.fluid(inst) == pytest.approx(expected, rel=1e-9)
    twin = Twin(sc, build_workload(sc, sc.seed))
    lb = lower_bound(twin.state, twin.workload, sc.duration_s, twin.placeable)
    assert lb.joules == pytest.approx(expected, rel=1e-9)
    assert gpu_dynamic_joules(twin.state, twin.workload) == pytest.approx(65 * 100 + 130 * 50)


def test_a_share_never_straddles_two_gpus_and_whole_gpus_need_a_free_one(tmp_path):
    # Two identical 2-GPU nodes that sleep. Shares of 600 and 600 take one GPU each of the first node; a 500
    # share then fits neither GPU there (400 free on each, 800 in all) and a whole-GPU pod finds no free GPU
    # there: both go to the second node, although waking it costs and the aggregate share would fit.
    groups = [{"name_prefix": "a10", "count": 2, "cpu_m": 4000, "memory_mib": 4096, "power_watts": LINEAR,
               "gpu_count": 2, "gpu_model": "A10", "gpu_power_watts": [20, 150]}]
    pods = [(100.0, 200.0, 100, 10, 50.0, 1, 600, ""), (110.0, 200.0, 100, 10, 50.0, 1, 600, ""),
            (120.0, 100.0, 100, 10, 50.0, 1, 500, ""), (130.0, 50.0, 100, 10, 50.0, 1, 1000, "")]
    sc = gpu_scenario(tmp_path, pods, groups)
    inst = opt.instance(sc, 0)
    res = opt.solve(inst, time_limit=20)
    assert res.status == "optimal"
    rr = opt.replay(sc, 0, res.assignment)
    assert abs(rr.energy_joules - res.energy_joules) <= opt.REPLAY_TOL * rr.energy_joules
    a = res.assignment
    assert a[0] == a[1] and a[2] == a[3] != a[0]
    # Without the third and fourth pods one node is enough and the other sleeps from sleep_after_s on.
    sc2 = gpu_scenario(tmp_path, pods[:2], groups, name="two")
    res2 = opt.solve(opt.instance(sc2, 0), time_limit=20)
    assert res2.status == "optimal" and len(set(res2.assignment.values())) == 1


def test_what_the_model_cannot_state_is_refused(tmp_path):
    # Shares of a GPU whose curve bends: the node's GPU watts would depend on the twin's best-fit spread.
    groups = [{"name_prefix": "a10", "count": 1, "cpu_m": 2000, "memory_mib": 4096, "power_watts": LINEAR,
               "gpu_count": 2, "gpu_model": "A10",
               "gpu_power_watts": [20, 60, 80, 95, 105, 115, 122, 130, 138, 144, 150]}]
    sc = gpu_scenario(tmp_path, [(0.0, 100.0, 100, 10, 50.0, 1, 500, "")], groups, name="bent")
    with pytest.raises(opt.OptimumError, match="not linear"):
        opt.instance(sc, 0)
    # The command says so with exit 2; inside a benchmark over a suite the row is 'unsupported', not optimal.
    path = tmp_path / "bent.yaml"
    path.write_text(json.dumps(sc.model_dump(mode="json")))
    r = CliRunner().invoke(app, ["optimum", "-s", str(path), "--time-limit", "5"])
    assert r.exit_code == 2 and "not linear" in r.output
    row = opt.optimum_entry(sc, 0, time_limit=5)
    assert row["status"] == "unsupported" and row["certificate"] == "bound-only" and row["optimum_joules"] is None
    # Whole GPUs sit at 0 or 100 % of the curve: the same cluster with a whole-GPU pod is exact.
    sc = gpu_scenario(tmp_path, [(0.0, 100.0, 100, 10, 50.0, 1, 1000, "")], groups, {"mode": "always_on"},
                      name="whole")
    inst = opt.instance(sc, 0)
    res = opt.solve(inst, time_limit=20)
    assert res.status == "optimal"
    assert opt.replay(sc, 0, res.assignment).energy_joules == pytest.approx(res.energy_joules, rel=1e-12)
