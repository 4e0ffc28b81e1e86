"""The offline optimum (agent/optimum.py, docs/optimum.md): the MIP prices schedules exactly as the twin meters
them, its optimum replays in the twin to the joule, and fluid <= LP <= optimum <= every policy.

HiGHS (highspy) is a real solver installed from PyPI; nothing here is mocked.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as stg
from typer.testing import CliRunner

from joulesched.agent import optimum as opt
from joulesched.agent.registry import BASELINES
from joulesched.cluster.scenario import Scenario, load_scenario
from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "scenarios" / "small"
LINEAR = [100.0 + 10.0 * k for k in range(11)]  # 100 W idle, 200 W at full load


def make(tmp: Path, pods: list[tuple], nodes: list[dict], idle: dict | None = None, duration_s: float = 1000.0,
         name: str = "t") -> Scenario:
    """A scenario over a trace of ``pods`` (submit, duration, cpu request, memory request, usage)."""
    rows = ["submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m"]
    rows += [",".join(repr(x) if isinstance(x, float) else str(x) for x in p) for p in pods]
    (tmp / f"{name}.csv").write_text("\n".join(rows) + "\n")
    groups = []
    for k, n in enumerate(nodes):
        g = {"name_prefix": f"g{k}", "count": 1, "cpu_m": 1000, "memory_mib": 1024, "power_watts": LINEAR}
        g.update(n)
        groups.append(g)
    return Scenario.model_validate({"name": name, "seed": 0, "duration_s": duration_s,
                                    "idle_policy": idle or {"mode": "always_on"}, "nodes": groups,
                                    "workload": {"trace": f"{name}.csv"}, "source": tmp / f"{name}.yaml"})


def sleeping_twins(tmp: Path, seed: int, n: int = 6, wake_s: float = 15.0) -> Scenario:
    """Three nodes (two identical), ``n`` random pods, sleep with a wake-up: instances the MIP proves in about a
    second."""
    rng = np.random.default_rng(seed)
    pods, t = [], 0.0
    for _ in range(n):
        t += float(rng.choice([0.0, 10.0, 40.0]))
        cpu = int(rng.choice([250, 500]))
        pods.append((t, float(rng.choice([30.0, 80.0])), cpu, 128, 0.8 * cpu))
    idle = {"mode": "sleep", "sleep_after_s": 20.0, "sleep_watts": 5.0, "wake_s": wake_s}
    curve = [60.0 + 8.0 * k for k in range(11)]
    return make(tmp, pods, [{"count": 2}, {"cpu_m": 2000, "memory_mib": 2048, "power_watts": curve}], idle, 300.0)


def solved(sc: Scenario, time_limit: float = 30.0) -> tuple[opt.Instance, opt.OptimumResult]:
    inst = opt.instance(sc, 0)
    res = opt.solve(inst, time_limit=time_limit)
    assert res.status == "optimal", res
    return inst, res


def test_one_pod_on_one_linear_node_by_hand(tmp_path):
    # Always on: 100 W for the 1000 s window plus 40 % of the 100 W range for the pod's 300 s.
    sc = make(tmp_path, [(0.0, 300.0, 500, 10, 400.0)], [{}])
    inst, res = solved(sc)
    assert res.energy_joules == pytest.approx(100 * 1000 + 40 * 300)
    assert opt.replay(sc, 0, res.assignment).energy_joules == pytest.approx(res.energy_joules, rel=1e-12)


def test_the_optimum_lets_the_second_pod_wait_for_a_waking_node_instead_of_waking_another(tmp_path):
    # Two nodes asleep from 10 s (sleep_after 10, 5 W, wake 50 s). Pod A arrives at 100 and wakes a node
    # (up at 150). Pod B arrives at 120: on the waking node it starts at 150; on the other node it wakes a second
    # one. Each pod: 500m of usage for 100 s on a 1000m node (+50 W). By hand, with B on A's node: that node is
    # idle (100 W) from 100 to 150, runs both on [150, 250) at 200 W, idles until 260 (sleep_after 10) and
    # sleeps; the other sleeps from 10 on.
    idle = {"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 5, "wake_s": 50}
    sc = make(tmp_path, [(100.0, 100.0, 500, 10, 500.0), (120.0, 100.0, 500, 10, 500.0)], [{"count": 2}], idle)
    inst, res = solved(sc)
    expected = 2 * 100 * 10 + 5 * 990 + 5 * (90 + 740) + 100 * 50 + 200 * 100 + 100 * 10
    assert res.energy_joules == pytest.approx(expected)
    assert len(set(res.assignment.values())) == 1 and res.starts == {0: 150.0, 1: 150.0}
    assert opt.replay(sc, 0, res.assignment).energy_joules == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["sleep-mixed", "trace-always-on"])
def test_the_model_prices_every_heuristic_schedule_at_the_twins_energy(name):
    """Fixing a heuristic's twin run in the model (node and start of every pod) and solving for the rest gives
    the energy the twin metered: the model and the twin agree on schedules the optimum did not choose too."""
    inst = opt.instance(load_scenario(SMALL / f"{name}.yaml"), 0)
    checked = 0
    for spec in BASELINES:
        sched = opt.twin_schedule(inst, spec)
        if sched is None:
            continue  # queued a pod: outside the model's class
        assert opt.evaluate(inst, sched) == pytest.approx(sched.twin_joules, rel=1e-9), spec
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("seed", [7, 8])
def test_with_instant_wake_ups_the_model_prices_heuristic_schedules_and_keeps_their_warm_start(tmp_path, seed):
    """wake_s = 0: a pod that wakes its node starts on arrival, as one on an awake node does, so two of the
    model's modes share its start. The twin's state picks one (the node was asleep or not); taking the first
    always made most heuristic schedules infeasible in the model (evaluate None, the warm start refused)."""
    inst = opt.instance(sleeping_twins(tmp_path, seed, n=8, wake_s=0.0), 0)
    checked = 0
    for spec in ("default-k8s", "most-allocated", "energy-greedy", "awake-first:fit=efficient"):
        sched = opt.twin_schedule(inst, spec)
        if sched is None:
            continue
        assert opt.evaluate(inst, sched) == pytest.approx(sched.twin_joules, rel=1e-9), spec
        checked += 1
    assert checked >= 3
    b = opt._build(inst)
    fixed = opt._fix(b, sched)
    assert opt._price(b, *fixed)[0] == pytest.approx(sched.twin_joules, rel=1e-9)  # the warm start HiGHS gets


def test_the_clairvoyant_rollout_seeds_the_mip_below_every_heuristic():
    """The MIP's warm starts include a parallel rollout on the true future (agent/planner.py): on
    small-sleep-mixed seed 102 its schedule is in the model's class, priced by the model at the twin's energy,
    and more than 3 % below every heuristic's, which the MIP alone did not reach in 20 s; solve() starts from
    it."""
    inst = opt.instance(load_scenario(SMALL / "sleep-mixed.yaml"), 1)
    heur = min(s.twin_joules for s in (opt.twin_schedule(inst, w) for w in opt.warm_specs()) if s is not None)
    spec = opt.warm_specs(60.0)[-1]
    assert spec.startswith("rollout-oracle:") and spec not in opt.warm_specs()
    sched = opt.twin_schedule(inst, spec)
    assert sched is not None and opt.evaluate(inst, sched) == pytest.approx(sched.twin_joules, rel=1e-9)
    assert sched.twin_joules < 0.97 * heur
    res = opt.solve(inst, time_limit=20, threads=1)
    assert res.warm_joules <= heur * (1 + 1e-9) and res.energy_joules <= res.warm_joules * (1 + 1e-9)


curves = stg.lists(stg.floats(0, 40), min_size=10, max_size=10).flatmap(
    lambda inc: stg.floats(10, 120).map(lambda idle: [round(idle + sum(inc[:k]), 3) for k in range(11)]))


@stg.composite
def instances(draw):
    groups = [{"count": draw(stg.integers(1, 2)), "cpu_m": draw(stg.sampled_from([1000, 2000, 4000])),
               "memory_mib": draw(stg.sampled_from([1024, 4096])), "max_pods": draw(stg.sampled_from([2, 4, 110])),
               "power_watts": draw(curves)} for _ in range(draw(stg.integers(1, 2)))]
    idle = None
    if draw(stg.booleans()):
        floor = min(g["power_watts"][0] for g in groups)
        idle = {"mode": "sleep", "sleep_after_s": draw(stg.sampled_from([0.0, 20.0, 60.0, 200.0])),
                "sleep_watts": draw(stg.floats(0, floor)), "wake_s": draw(stg.sampled_from([0.0, 15.0, 60.0]))}
    pods, t = [], 0.0
    for _ in range(draw(stg.integers(1, 8))):
        t += draw(stg.sampled_from([0.0, 0.0, 10.0, 30.0, draw(stg.floats(0.1, 200))]))  # bursts and ties
        cpu = draw(stg.sampled_from([100, 250, 500, 1000]))
        pods.append((t, draw(stg.sampled_from([20.0, 60.0, draw(stg.floats(1, 600))])), cpu,
                     draw(stg.sampled_from([0, 256, 512])), draw(stg.floats(0.05, 1.0)) * cpu))
    return groups, idle, pods, draw(stg.sampled_from([300.0, 900.0]))


@settings(max_examples=int(os.environ.get("OPT_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(instances())
def test_fluid_le_lp_le_optimum_le_every_policy_and_the_optimum_replays_exactly(case):
    """On random small instances where no policy can overload a node (usage at most requests): the MIP's best
    schedule replayed in the twin gives the energy the MIP claims (within 1e-9); every policy whose run binds
    each pod on arrival uses at least the MIP's proven bound; fluid <= LP <= bind-on-arrival bound <= the
    MIP's best schedule, and when it is proven optimal, that schedule <= every such policy.

    The chain is asserted on whatever the solver reaches in 20 s: a drawn 4-node, 8-pod instance once needed
    17-34 s on the loaded 2 cores, and a time limit reached is no failure of the bounds (the instances of
    test_fluid_chain_on_instances_that_certainly_prove below are asserted optimal)."""
    groups, idle, pods, duration = case
    with tempfile.TemporaryDirectory() as d:
        sc = make(Path(d), pods, groups, idle, duration)
        inst = opt.instance(sc, 0)
        res = opt.solve(inst, time_limit=20)
        lp = opt.lp_bound(inst)
        assert lp.fluid_joules <= lp.joules * (1 + 1e-6) + 1e-6
        if res.status == "infeasible":
            return  # every schedule queues a pod (too many for the pod slots): no policy stays in the class
        assert res.status in ("optimal", "time_limit"), res
        assert res.energy_joules is not None and res.bound_joules <= res.energy_joules * (1 + 1e-9)
        assert lp.joules <= res.energy_joules * (1 + 1e-6)
        boa = opt.lp_bound(inst, bind_on_arrival=True, time_limit=20)
        assert boa.status in ("optimal", "time_limit")
        assert lp.joules * (1 - 1e-6) <= boa.joules <= res.energy_joules * (1 + 1e-6)
        replayed = opt.replay(sc, 0, res.assignment)  # any schedule of the model replays, optimal or not
        assert abs(replayed.energy_joules - res.energy_joules) <= 1e-9 * replayed.energy_joules
        for spec in BASELINES:
            sched = opt.twin_schedule(inst, spec)
            if sched is not None:
                assert res.bound_joules <= sched.twin_joules * (1 + 1e-9), spec
                if res.status == "optimal":
                    assert res.energy_joules <= sched.twin_joules * (1 + 1e-9), spec


@pytest.mark.parametrize("seed", range(3))
def test_fluid_chain_on_instances_that_certainly_prove(tmp_path, seed):
    """Three nodes (two identical), six pods, sleep with a wake-up: the MIP proves these in well under a second
    of solving, so here the optimum itself is asserted, with the chain and the exact replay."""
    sc = sleeping_twins(tmp_path, seed)
    inst = opt.instance(sc, 0)
    res = opt.solve(inst, time_limit=60)
    assert res.status == "optimal", res
    lp = opt.lp_bound(inst)
    boa = opt.lp_bound(inst, bind_on_arrival=True)
    assert lp.fluid_joules <= lp.joules * (1 + 1e-6) <= boa.joules * (1 + 1e-6) <= res.energy_joules * (1 + 1e-6)
    rr = opt.replay(sc, 0, res.assignment)
    assert abs(rr.energy_joules - res.energy_joules) <= opt.REPLAY_TOL * rr.energy_joules
    for spec in BASELINES:
        sched = opt.twin_schedule(inst, spec)
        if sched is not None:
            assert res.energy_joules <= sched.twin_joules * (1 + 1e-9), spec


def test_the_lp_bound_scales_and_sits_between_the_fluid_bound_and_every_policy():
    sc = load_scenario(ROOT / "scenarios" / "heterogeneous-sleep.yaml")
    inst = opt.instance(sc, 0)
    lp = opt.lp_bound(inst)
    energies = opt.policy_energies(sc, 0, ("awake-first", "energy-greedy", "most-allocated"))
    assert lp.status == "optimal"
    assert lp.fluid_joules <= lp.joules * (1 + 1e-6) <= min(energies.values())
    # The bind-on-arrival bound at scale: tighter, and below every policy run that binds each pod on arrival.
    boa = opt.lp_bound(inst, bind_on_arrival=True, fluid_joules=lp.fluid_joules, time_limit=120)
    assert boa.joules >= lp.joules * 1.02
    in_class = [s for s in (opt.twin_schedule(inst, p) for p in ("awake-first", "awake-first:fit=efficient", "pabfd",
                                                                  "most-allocated")) if s is not None]
    assert in_class and all(boa.joules <= s.twin_joules for s in in_class)
    # On a thinned grid (as on the 240-node scenario) the through-the-bin covers carry it: still a bound.
    lp_c = opt.lp_bound(inst, max_bins=60, fluid_joules=lp.fluid_joules)
    boa_c = opt.lp_bound(inst, bind_on_arrival=True, max_bins=60, fluid_joules=lp.fluid_joules, time_limit=120)
    assert boa_c.coarse and lp_c.joules * 1.01 <= boa_c.joules <= min(s.twin_joules for s in in_class)


def test_time_limits_and_unsupported_idle_policies_are_usage_errors(tmp_path):
    sc = make(tmp_path, [(0.0, 10.0, 100, 10, 50.0)], [{}])
    inst = opt.instance(sc, 0)
    for bad in (0, -1, float("nan"), float("inf"), "soon"):
        with pytest.raises(opt.OptimumError, match="time-limit"):
            opt.solve(inst, time_limit=bad)
    held = make(tmp_path, [(0.0, 10.0, 100, 10, 50.0)], [{"count": 2}],
                {"mode": "sleep", "sleep_after_s": 10, "min_awake": 1}, name="held")
    with pytest.raises(opt.OptimumError, match="min_awake"):
        opt.instance(held, 0)
    capped = make(tmp_path, [(0.0, 10.0, 100, 10, 50.0)], [{"count": 2}],
                  {"mode": "sleep", "sleep_after_s": 10, "max_sleeps_per_hour": 1}, name="capped")
    with pytest.raises(opt.OptimumError, match="max_sleeps_per_hour=1"):  # certified optimal, 20 % beatable
        opt.instance(capped, 0)


@pytest.mark.parametrize("args,message", [
    (["optimum", "-s", "scenarios/small/sleep-mixed.yaml", "--time-limit", "0"], "positive number of seconds"),
    (["optimum", "-s", "scenarios/small/sleep-mixed.yaml", "--time-limit", "-5"], "positive number of seconds"),
    (["optimum", "-s", "scenarios/nonexistent.yaml"], "not found"),
    (["benchmark", "-s", "scenarios/tiny.yaml", "-p", "default-k8s", "--optimum", "--optimum-time-limit", "0"],
     "positive number of seconds"),
])
def test_malformed_options_exit_2(tmp_path, args, message):
    out = tmp_path / "out"
    r = CliRunner().invoke(app, [*args, *(["--out", str(out)] if args[0] == "benchmark" else [])])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not out.exists()


def test_the_optimum_command_reports_bounds_replay_and_every_heuristic(tmp_path):
    sc = make(tmp_path, [(0.0, 300.0, 500, 10, 400.0), (50.0, 300.0, 500, 10, 400.0)], [{"count": 2}],
              {"mode": "sleep", "sleep_after_s": 30, "sleep_watts": 5, "wake_s": 20}, name="cli")
    path = tmp_path / "cli.yaml"
    path.write_text(json.dumps(sc.model_dump(mode="json")))
    r = CliRunner().invoke(app, ["optimum", "-s", str(path), "--seeds", "2", "--time-limit", "20", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["seed"] for row in rows] == [0, 1]
    for row in rows:
        assert row["status"] == "optimal" and row["replay_rel_error"] < 1e-9
        # The certificate: optimal, the twin's energy for the schedule, the bound, the gap, solver and time.
        assert row["certificate"] == "optimal" and row["schedule_joules"] == row["replay_joules"]
        assert row["best_gap"] <= 1e-4 and row["solver"] == "highs" and row["time_s"] > 0
        assert row["best_bound_joules"] <= row["schedule_joules"] * (1 + 1e-9)
        assert row["fluid_joules"] <= row["lp_bound_joules"] * (1 + 1e-6) <= row["optimum_joules"] * (1 + 1e-6)
        assert row["optimum_joules"] <= min(row["policies"].values()) * (1 + 1e-9)
        assert {"awake-first", "pabfd", "most-allocated"} <= set(row["policies"])


def test_the_optimum_commands_best_heuristic_is_the_best_candidate_never_default_k8s_or_a_learned_policy():
    """``joulesched optimum`` runs every best-heuristic candidate by default (the variants too: on this trace
    pabfd:empty=asleep beats every plain heuristic) and its "best heuristic" is the least-energy heuristic among
    the policies, not default-k8s, a reference or a learned policy that happens to use less."""
    from joulesched.agent.registry import BEST_HEURISTIC_CANDIDATES, HEURISTIC_FAMILIES, family_of
    from joulesched.pipelines.cli.bench import best_heuristic

    r = CliRunner().invoke(app, ["optimum", "-s", str(SMALL / "trace-sleep.yaml"), "--max-nodes", "1",
                                 "--time-limit", "5", "--json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    assert set(BEST_HEURISTIC_CANDIDATES) <= set(row["policies"])
    heur = {p: e for p, e in row["policies"].items() if family_of(p) in HEURISTIC_FAMILIES}
    assert row["best_heuristic"] == min(heur, key=heur.get)
    assert best_heuristic({"default-k8s": 1.0, "random": 1.5, "dqn=m.pt": 0.5, "most-allocated": 2.0}) \
        == "most-allocated"
    assert best_heuristic({"default-k8s": 1.0}) is None


def test_benchmark_optimum_row_and_the_headroom_table(tmp_path):
    from joulesched.pipelines.benchmark import headroom, load_results

    out = tmp_path / "b"
    r = CliRunner().invoke(app, ["benchmark", "-s", "scenarios/small/trace-always-on.yaml", "-p", "default-k8s",
                                 "-p", "most-allocated", "-p", "awake-first", "--optimum", "--optimum-time-limit",
                                 "10", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "results.json").read_text())
    o = doc["scenarios"][0]["optimum"]
    assert o["lp_bound_joules"] >= doc["scenarios"][0]["lower_bound_joules"] * (1 - 1e-6)
    assert o["optimum_joules"] <= min(p["energy_joules"] for p in doc["scenarios"][0]["policies"].values()) * (1 + 1e-9)
    row = headroom(load_results(out / "results.json"))["small-trace-always-on"]
    assert row["best_upstream_policy"] == "most-allocated" and row["best_sleep_aware_policy"] == "awake-first"
    assert row["fluid_bound"] <= row["lp_bound"] * (1 + 1e-6) <= row["best_bound"] * (1 + 1e-6)
    assert row["best_bound"] <= min(row["best_upstream"], row["best_sleep_aware"]) + 1e-12
    assert np.isfinite(row["optimum"])
    # Both bounds, what the best one assumes, the optimum's gap to it, and each policy's share of the gap.
    assert row["fluid_bound"] <= row["every_run_bound"] * (1 + 1e-9) <= row["boa_bound"] * (1 + 1e-9)
    assert row["bound_assumes"] == ("bind-on-arrival" if row["boa_bound"] > row["every_run_bound"] else "every-run")
    assert row["optimum_gap"] == pytest.approx((row["optimum"] - row["boa_bound"]) / row["optimum"], rel=1e-9)
    assert row["target"] == row["optimum"]
    assert row["target_kind"] in ("optimum", "optimum, bind-on-arrival", "best schedule")
    if row["target_kind"] == "optimum":  # proven over every run: a bound every run obeys meets it
        assert row["every_run_bound"] >= row["optimum"] * (1 - 1e-4)
    shares = row["share_of_gap"]
    assert set(shares) == {"default-k8s", "most-allocated", "awake-first"}
    best = row["best_heuristic_policy"]
    assert shares[best] == pytest.approx(0.0, abs=1e-12)  # one seed: the best heuristic closes none of its own gap
    for p, v in shares.items():  # (best heuristic − policy) / (best heuristic − optimum), from the rows' ratios
        gap = row["best_heuristic"] - row["optimum"]
        assert v == pytest.approx((row["best_heuristic"] - row["policies"][p]) / gap, rel=1e-9)
    assert shares["default-k8s"] < 0
    html = (out / "report.html").read_text()
    assert "<h2>Headroom</h2>" in html and "0.903" in html  # the fluid bound's ratio, in the table
    assert "bound, bind-on-arrival" in html and "bound, every run" in html and 'id="gap-shares"' in html
    assert f"<td>{100 * shares['most-allocated']:.0f} %</td>" in html  # default-k8s, the reference, has no column


def test_a_workload_with_services_is_refused_by_the_optimum_and_skipped_by_the_benchmark(tmp_path):
    """The MIP models constant-usage jobs; services and profiles get a clear refusal (exit 2) when asked for
    directly, and an 'unsupported' row (n/a) inside a benchmark over a whole suite."""
    from typer.testing import CliRunner

    from joulesched.agent.optimum import optimum_entry
    from joulesched.cluster.scenario import load_scenario
    from joulesched.pipelines.cli import app

    path = Path(__file__).resolve().parents[2] / "scenarios" / "services-diurnal-sleep.yaml"
    r = CliRunner().invoke(app, ["optimum", "--scenario", str(path), "--time-limit", "5"])
    assert r.exit_code == 2 and "services or usage profiles" in r.output
    row = optimum_entry(load_scenario(path), 0, time_limit=5)
    assert row["status"] == "unsupported" and row["optimum_joules"] is None


def test_the_certificate_is_feasible_or_bound_only_when_nothing_is_proven(tmp_path):
    """A row whose gap is open is 'feasible'; one the twin meters differently from the MIP is never 'optimal';
    one with no schedule (above the MIP's limits) is 'bound-only' with the LP bound, valid for every run."""
    base = {"name": "x", "seed": 0, "status": "optimal", "optimum_joules": 100.0, "bound_joules": 100.0,
            "gap": 0.0, "lp_bound_joules": 90.0, "fluid_joules": 80.0, "replay_joules": 100.0,
            "replay_rel_error": 0.0, "wall_s": 1.0, "lp_wall_s": 0.5, "solver": "highs"}
    assert opt.certify(dict(base), True)["certificate"] == "optimal"
    open_gap = opt.certify({**base, "status": "time_limit", "bound_joules": 95.0, "gap": 0.05}, True)
    assert open_gap["certificate"] == "feasible" and open_gap["best_gap"] == pytest.approx(0.05)
    assert open_gap["bound_assumes"] == "bind-on-arrival" and open_gap["bound_every_run_joules"] == 90.0
    off = opt.certify({**base, "replay_joules": 100.0 * (1 + 1e-6), "replay_rel_error": 1e-6}, True)
    assert off["certificate"] == "feasible" and off["schedule_joules"] == pytest.approx(100.0 * (1 + 1e-6))
    sc = load_scenario(SMALL / "sleep-mixed.yaml")
    row = opt.optimum_entry(sc, 0, time_limit=5, max_nodes=2)
    assert row["certificate"] == "bound-only" and row["schedule_joules"] is None
    assert row["bound_every_run_joules"] == max(row["lp_bound_joules"], row["fluid_joules"])
    # The bind-on-arrival bound is the best one here, and the row says which runs it holds for.
    assert row["best_bound_joules"] == row["boa_bound_joules"] > row["bound_every_run_joules"]
    assert row["bound_assumes"] == "bind-on-arrival"


@pytest.mark.parametrize("seed", range(3))
def test_the_wake_order_among_identical_nodes_keeps_the_optimum(tmp_path, seed):
    """The orbit rule (a node of a kind is woken only if the one before it is awake or woken with it) cuts
    schedules but never the optimum: three identical nodes that sleep and wake again in bursts, solved with and
    without it, give the same energy; every heuristic's schedule, relabelled as the rule wants, is priced at
    the twin's energy."""
    rng = np.random.default_rng(100 + seed)
    pods = []
    for burst in (50.0, 200.0, 330.0):
        for _ in range(int(rng.integers(2, 4))):
            cpu = int(rng.choice([400, 600]))
            pods.append((burst + float(rng.choice([0.0, 5.0])), float(rng.choice([20.0, 40.0])), cpu, 64, 0.9 * cpu))
    pods.sort()
    idle = {"mode": "sleep", "sleep_after_s": 10.0, "sleep_watts": 5.0, "wake_s": 8.0}
    sc = make(tmp_path, pods, [{"count": 3}], idle, 400.0)
    inst = opt.instance(sc, 0)
    with_rule = opt.solve(inst, time_limit=60)
    without = opt.solve(inst, time_limit=60, wake_order=False)
    assert with_rule.status == without.status == "optimal"
    assert with_rule.energy_joules == pytest.approx(without.energy_joules, rel=1e-9)
    assert with_rule.rows > without.rows
    for spec in ("round-robin", "awake-first", "default-k8s"):
        sched = opt.twin_schedule(inst, spec)
        if sched is not None:
            assert opt.evaluate(inst, sched) == pytest.approx(sched.twin_joules, rel=1e-9), spec
