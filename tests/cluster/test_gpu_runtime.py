"""A GPU job's run time following its GPUs' speed (``gpu_runtime``, docs/twin.md "GPU speed"): how long a job
runs on each model, which jobs scale, checkpointed work across GPUs of two speeds, the lower bound's
workload, the optimum's refusal, and bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from joulesched.agent.lower_bound import lower_bound
from joulesched.agent.optimum import OptimumError, instance
from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.cli import app
from joulesched.power.gpu import GPU_SPEED
from tests.cluster.test_nodepower import SLEEP, Spread
from tests.helpers import scenario, workload

CURVE = [50.0 + 10.0 * k for k in range(11)]
GROUPS = f"""
  - {{name_prefix: t4, count: 1, cpu_m: 32000, memory_mib: 131072, power_watts: {CURVE}, gpu_count: 2, gpu_model: T4}}
  - {{name_prefix: v100, count: 1, cpu_m: 32000, memory_mib: 131072, power_watts: {CURVE}, gpu_count: 2, gpu_model: V100M32}}
"""
PODS = ("name,submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,gpu_count,gpu_milli,gpu_spec,slo_class\n"
        "t4-be,0,1000,1000,100,500,1,,T4,BE\n"
        "v100-be,0,1000,1000,100,500,1,,V100M32,BE\n"
        "t4-ls,0,1000,1000,100,500,1,,T4,LS\n"
        "cpu,0,1000,1000,100,500,,,,BE\n")


def _file(tmp_path, runtime: str = "", groups: str = GROUPS):
    (tmp_path / "pods.csv").write_text(PODS)
    p = tmp_path / "s.yaml"
    p.write_text(f"name: speed\nseed: 1\nduration_s: 100\nidle_policy: {{mode: always_on}}\nnodes:{groups}"
                 f"workload: {{trace: pods.csv}}\n{runtime}")
    return p


def _lives(path) -> dict[str, float]:
    sc = load_scenario(path)
    wl = build_workload(sc)
    tw = Twin(sc, wl)
    run_policy(tw, make_policy("gpu-packing"), 0)
    names = [m.split(",")[0] for m in PODS.splitlines()[1:]]
    return {n: tw.pod_end[p] - tw.pod_start[p] for p, n in enumerate(names)}


def test_off_by_default_every_job_runs_its_duration_on_any_gpu(tmp_path):
    assert _lives(_file(tmp_path)) == pytest.approx({"t4-be": 1000, "v100-be": 1000, "t4-ls": 1000, "cpu": 1000})


def test_a_gpu_job_runs_duration_times_reference_over_its_gpus_speed(tmp_path):
    lives = _lives(_file(tmp_path, "gpu_runtime: {reference: 1.0}\n"))
    t4 = 1000 / GPU_SPEED["T4"]  # 2,812.5 s: a T4 has 320 of a V100's 900 GB/s
    assert lives == pytest.approx({"t4-be": t4, "v100-be": 1000, "t4-ls": t4, "cpu": 1000})
    # The durations measured on a T4 (reference = its speed): the V100 job runs shorter, the T4 ones as long.
    lives = _lives(_file(tmp_path, f"gpu_runtime: {{reference: {GPU_SPEED['T4']}}}\n"))
    assert lives == pytest.approx({"t4-be": 1000, "v100-be": 1000 * GPU_SPEED["T4"], "t4-ls": 1000, "cpu": 1000})


def test_slo_limits_it_to_those_classes_and_a_group_overrides_its_speed(tmp_path):
    lives = _lives(_file(tmp_path, "gpu_runtime: {slo: [BE]}\n",
                         groups=GROUPS.replace("gpu_model: T4}", "gpu_model: T4, gpu_speed: 0.5}")))
    assert lives == pytest.approx({"t4-be": 2000, "v100-be": 1000, "t4-ls": 1000, "cpu": 1000})


def test_checkpointed_work_moves_between_gpus_in_the_durations_units():
    # Two 4,000 s GPU jobs on a GPU of speed 0.5 (n0) and one of speed 1 (n1), both checkpointing: consolidation
    # empties n0 at 100 s, when its job has done 50 s of work at half speed; restarted on n1 at 130 s it has
    # 3,950 s left, not the 7,900 s of node time it had left on n0.
    idle = {**SLEEP, "consolidation": {"interval_s": 100, "restart_s": 30, "checkpoint_fraction": 1.0}}
    gpu = {"gpu_count": 2, "gpu_model": "X", "gpu_power_watts": [10.0, 70.0]}
    sc = scenario([{**gpu, "gpu_speed": 0.5}, {**gpu, "gpu_speed": 1.0}], duration_s=100, idle=idle,
                  gpu_runtime={"reference": 1.0})
    wl = dataclasses.replace(workload((0, 4000, 300, 10, 300), (1, 4000, 300, 10, 300)), gpu=np.array([1, 1]),
                             gpu_milli=np.array([1000, 1000]), gpu_spec=np.array([0, 0]))
    tw = Twin(sc, wl)
    r = run_policy(tw, Spread(), 0)
    assert r.evictions == 1 and tw.pod_node[0] == 1
    assert tw.pod_end[0] == pytest.approx(130 + 3950)
    assert tw.pod_end[1] == pytest.approx(1 + 4000)


def test_the_lower_bound_reads_every_job_at_its_fastest_and_stays_below_every_run(tmp_path):
    fast = GROUPS.replace("gpu_model: V100M32}", "gpu_model: V100M32, gpu_speed: 2.0}")
    sc = load_scenario(_file(tmp_path, "gpu_runtime: {reference: 1.0}\n", groups=fast))
    wl = build_workload(sc)
    tw = Twin(sc, wl)
    quick = tw.fastest_workload()
    # Each GPU job at its run time on the fastest GPU it may use: the T4-only ones on the T4, the V100 one at 2.
    t4 = 1000 / GPU_SPEED["T4"]
    assert quick.duration_s.tolist() == pytest.approx([t4, 500, t4, 1000])
    assert Twin(load_scenario(_file(tmp_path)), wl).fastest_workload() is wl  # nothing scales: the workload
    lb = lower_bound(tw.state, quick, sc.duration_s, tw.placeable).joules
    for spec in ("gpu-packing", "gpu-energy", "default-k8s", "fgd"):
        assert lb <= run_policy(Twin(sc, wl), make_policy(spec), 0).energy_joules


def test_the_optimum_refuses_it(tmp_path):
    sc = load_scenario(_file(tmp_path, "gpu_runtime: {reference: 1.0}\n"))
    with pytest.raises(OptimumError, match="sets gpu_runtime"):
        instance(sc)


@pytest.mark.parametrize("runtime,groups,words", [
    ("gpu_runtime: {reference: 0}\n", GROUPS, "gpu_runtime.reference"),
    ("gpu_runtime: {slo: []}\n", GROUPS, "gpu_runtime.slo"),
    ("gpu_runtime: {speed: 2}\n", GROUPS, "gpu_runtime.speed"),
    ("", GROUPS.replace("gpu_model: T4}", "gpu_model: T4, gpu_speed: -1}"), "nodes.0.gpu_speed"),
    ("", GROUPS.replace("gpu_count: 2, gpu_model: T4}", "gpu_speed: 2}"), "gpu_speed is given but gpu_count is 0"),
    ("gpu_runtime: {}\n", f"\n  - {{name_prefix: c, count: 1, cpu_m: 1000, memory_mib: 1024, power_watts: {CURVE}}}\n",
     "gpu_runtime is set but no node group has GPUs"),
])
def test_bad_input_exits_2_naming_the_field(tmp_path, runtime, groups, words):
    r = CliRunner().invoke(app, ["validate", str(_file(tmp_path, runtime, groups=groups))])
    assert r.exit_code == 2, r.output
    assert words in r.output


class _Looker:
    """gpu-packing, looking at the twin's true lives at the last decision."""

    name = "looker"

    def __init__(self):
        self.inner = make_policy("gpu-packing")
        self.scorer = None
        self.seen = None

    def attach(self, backend):
        self.twin = backend

    def detach(self, backend):
        pass

    def reset(self, state, rng):
        self.inner.reset(state, rng)

    def choose(self, state, pod, mask):
        if state.now > 0:
            self.seen = (self.twin.live_lives(), self.twin.due_ends(), self.twin.deciding_life(np.arange(len(state))),
                         self.twin.deciding_life())
        return self.inner.choose(state, pod, mask)


def test_the_true_lives_clairvoyant_reads_follow_the_gpu(tmp_path):
    (tmp_path / "extra.csv").write_text(PODS.splitlines()[0] + "\nlate,10,1000,1000,100,500,1,,,BE\n")
    path = _file(tmp_path, "gpu_runtime: {reference: 1.0}\n")
    path.write_text(path.read_text().replace("trace: pods.csv", "trace: [pods.csv, extra.csv]"))
    sc = load_scenario(path)
    tw = Twin(sc, build_workload(sc))
    look = _Looker()
    run_policy(tw, look, 0)
    (_, _, began, end), due, per_node, plain = look.seen
    t4 = 1000 / GPU_SPEED["T4"]
    assert sorted((end - began).tolist()) == pytest.approx([1000, 1000, t4, t4])  # cpu, v100-be, two T4 jobs
    assert due.tolist() == pytest.approx([t4, 1000])  # the T4 node empties when its jobs end, at 2,812.5 s
    assert plain == 1000 and per_node.tolist() == pytest.approx([t4, 1000])  # the late pod asks for any GPU
    assert tw.runtime_factors(np.array([0, 1, 3]), np.array([0, 1, -1])).tolist() == pytest.approx(
        [1 / GPU_SPEED["T4"], 1, 1])


def test_services_never_scale(tmp_path):
    (tmp_path / "pods.csv").write_text(
        "name,submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,gpu_count,gpu_milli,gpu_spec,kind\n"
        "svc,0,1000,1000,100,500,1,,T4,service\njob,0,1000,1000,100,500,1,,T4,job\n")
    p = tmp_path / "s.yaml"
    p.write_text(f"name: svc\nseed: 1\nduration_s: 5000\nidle_policy: {{mode: always_on}}\nnodes:{GROUPS}"
                 "workload: {trace: pods.csv}\ngpu_runtime: {}\n")
    sc = load_scenario(p)
    tw = Twin(sc, build_workload(sc))
    run_policy(tw, make_policy("gpu-packing"), 0)
    lives = [tw.pod_end[k] - tw.pod_start[k] for k in range(2)]
    assert lives == pytest.approx([1000, 1000 / GPU_SPEED["T4"]])


@pytest.mark.parametrize("cmd", [["validate"], ["benchmark", "-p", "gpu-packing", "-o", "out", "-s"]])
def test_a_misspelt_slo_class_exits_2_naming_the_classes_there_are(tmp_path, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    path = _file(tmp_path, "gpu_runtime: {slo: [be]}\n")
    r = CliRunner().invoke(app, [*cmd, str(path)])
    assert r.exit_code == 2, r.output
    assert "matches no pod's service class" in r.output and "BE, LS" in r.output
    assert str(Path(path).resolve()) in " ".join(r.output.split())  # the file, as every scenario error names it

