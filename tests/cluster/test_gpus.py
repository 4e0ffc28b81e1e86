"""GPUs in the cluster model (issue 25): scenario validation, per-GPU share accounting in ClusterState, the
GPU filter in the chain, the twin never breaking a GPU constraint, and the CPU/GPU energy split."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.filters import REASON_GPU, REASON_GPU_MODEL, REASON_GPU_SHARE
from joulesched.cluster.kube.objects import parse_node, parse_pod, CurveResolver
from joulesched.cluster.scenario import ScenarioError, load_scenario
from joulesched.cluster.state import ClusterState, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload, load_trace, write_trace

T4 = [10.0 + 6.0 * k for k in range(11)]  # 10 W idle, 70 W at full share


def _state(counts=(2, 4, 0), models=("T4", "V100M16", "")) -> ClusterState:
    n = len(counts)
    return ClusterState([f"n{i}" for i in range(n)], [64000] * n, [262144] * n, [110] * n, [[100.0] * 11] * n,
                        gpu_count=list(counts), gpu_model=list(models), gpu_curves=[T4] * n)


def test_a_share_never_straddles_two_gpus_and_whole_gpus_take_free_ones():
    st = _state()
    a = PodRequest(1000, 100, gpu=1, gpu_milli=600)
    b = PodRequest(1000, 100, gpu=1, gpu_milli=600)
    st.bind(0, a, "a")
    st.bind(0, b, "b")  # 400 left on GPU 0: b takes GPU 1, never 400 + 200
    assert st.gpu_free[0, :2].tolist() == [400, 400]
    c = PodRequest(1000, 100, gpu=1, gpu_milli=500)
    assert not st.feasible(c)[0]  # 800 milli free in all, but no GPU with 500
    assert st.filter_reasons(0, c) == [REASON_GPU_SHARE]
    small = PodRequest(1000, 100, gpu=1, gpu_milli=300)
    st.bind(0, small, "s")  # best fit: the fullest GPU it fits
    assert sorted(st.gpu_free[0, :2].tolist()) == [100, 400]
    whole = PodRequest(1000, 100, gpu=2)
    assert st.feasible(whole).tolist() == [False, True, False]
    assert st.filter_reasons(2, whole) == [REASON_GPU]
    st.bind(1, whole, "w")
    assert st.gpu_whole_free[1] == 2 and st.gpu_max_free[1] == 1000
    st.unbind(0, a, "a")
    st.unbind(0, b, "b")
    st.unbind(0, small, "s")
    st.unbind(1, whole, "w")
    assert (st.gpu_free[0, :2] == 1000).all() and (st.gpu_free[1] == 1000).all() and not st.gpu_assign


def test_model_constraint_and_bad_requests():
    st = _state()
    v100 = PodRequest(1000, 100, gpu=1, gpu_models=frozenset({"V100M16", "A10"}))
    assert st.feasible(v100).tolist() == [False, True, False]
    assert st.filter_reasons(0, v100) == [REASON_GPU_MODEL]
    with pytest.raises(ValueError, match="share of one GPU"):
        PodRequest(1000, 100, gpu=2, gpu_milli=500)
    with pytest.raises(ValueError, match="1..1000"):
        PodRequest(1000, 100, gpu=1, gpu_milli=1200)
    with pytest.raises(ValueError, match="do not fit"):
        st.bind(2, PodRequest(1000, 100, gpu=1), "x")


def _scenario(tmp_path: Path, pods: str, *, groups: str | None = None, sleep: bool = True) -> Path:
    (tmp_path / "pods.csv").write_text(pods)
    groups = groups or """
  - {name_prefix: t4, count: 3, cpu_m: 32000, memory_mib: 131072, power_watts: [50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150], gpu_count: 2, gpu_model: T4, gpu_power_watts: [10, 70]}
  - {name_prefix: v100, count: 2, cpu_m: 64000, memory_mib: 262144, power_watts: [80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180], gpu_count: 8, gpu_model: V100M32}
  - {name_prefix: cpu, count: 2, cpu_m: 32000, memory_mib: 131072, power_watts: [50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150]}
"""
    idle = "{mode: sleep, sleep_after_s: 60, sleep_watts: 5, wake_s: 30}" if sleep else "{mode: always_on}"
    p = tmp_path / "s.yaml"
    p.write_text(f"name: gpu\nseed: 1\nduration_s: 20000\nidle_policy: {idle}\nnodes:{groups}"
                 "workload: {trace: pods.csv}\n")
    return p


def _random_gpu_pods(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    rows = ["name,submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,gpu_count,gpu_milli,gpu_spec"]
    for i in range(n):
        kind = rng.integers(0, 4)
        count, milli = [(0, ""), (1, int(rng.integers(1, 1000))), (1, 1000), (int(rng.choice([2, 4, 8])), 1000)][kind]
        spec = rng.choice(["", "", "T4", "V100M32", "T4|V100M32"]) if count else ""
        if count and count > 2 and spec == "T4":
            spec = "V100M32"
        cpu = int(rng.integers(1, 16)) * 1000
        rows.append(f"p{i},{i * 7.0},{float(rng.integers(50, 3000))},{cpu},{cpu * 2},{cpu / 2},"
                    f"{count or ''},{milli if count else ''},{spec}")
    return "\n".join(rows) + "\n"


def _check_placements(sc, wl, tw: Twin) -> int:
    """Replay the run from its per-pod node and times: at no instant does a node hold more whole GPUs plus
    shared GPUs than it has, a share exceed one GPU, or a pod sit on a model it does not allow."""
    groups = {}
    for g in sc.nodes:
        for k in range(g.count):
            groups[f"{g.name_prefix}-{k}"] = g
    names = tw.state.names
    events = []
    placed = 0
    for p in range(len(wl)):
        node = tw.pod_node[p]
        if node < 0 or not wl.gpu[p]:
            continue
        placed += 1
        g = groups[names[node]]
        spec = wl.gpu_spec_table[int(wl.gpu_spec[p])]
        assert g.gpu_count >= int(wl.gpu[p]), (p, names[node])
        assert spec is None or g.gpu_model in spec, (p, g.gpu_model, spec)
        start, end = tw.pod_start[p], tw.pod_end[p]
        assert not math.isnan(start)
        events += [(start, 1, p, node), (end if not math.isnan(end) else math.inf, 0, p, node)]
    whole: dict[int, int] = {}
    shares: dict[int, list[int]] = {}
    for t, kind, p, node in sorted(events):
        c, m = int(wl.gpu[p]), int(wl.gpu_milli[p])
        if kind == 0:
            if m < 1000:
                shares[node].remove(m)
            else:
                whole[node] -= c
            continue
        if m < 1000:
            shares.setdefault(node, []).append(m)
        else:
            whole[node] = whole.get(node, 0) + c
        g = groups[names[node]]
        # shares packed at best on the GPUs left: at least ceil(sum / 1000) of them
        need = whole.get(node, 0) + math.ceil(sum(shares.get(node, [])) / 1000)
        assert need <= g.gpu_count, (t, names[node], whole.get(node), shares.get(node))
    return placed


class _Checked:
    """Wraps a policy: at every decision the state's per-GPU books are consistent."""

    def __init__(self, inner):
        self.inner, self.name, self.scorer = inner, inner.name, None

    def reset(self, state, rng):
        self.inner.reset(state, rng)

    def choose(self, state, pod, mask):
        used = np.zeros_like(state.gpu_free)
        for node, took in state.gpu_assign.values():
            for g, m in took:
                used[node, g] += m
        have = state.gpu_free >= 0
        assert (state.gpu_free[have] + used[have] == 1000).all() and (used[~have] == 0).all()
        return self.inner.choose(state, pod, mask)


@pytest.mark.parametrize("policy", ["default-k8s", "most-allocated", "random", "awake-first", "round-robin",
                                    "gpu-random", "gpu-best-fit", "gpu-dot-product", "gpu-packing",
                                    "gpu-clustering", "fgd", "gpu-energy", "gpu-lifetime-aware"])
def test_the_twin_never_breaks_a_gpu_count_share_or_model_constraint(tmp_path, policy):
    sc = load_scenario(_scenario(tmp_path, _random_gpu_pods(400, 7)))
    wl = build_workload(sc)
    tw = Twin(sc, wl)
    res = run_policy(tw, _Checked(make_policy(policy)), seed=3)
    placed = _check_placements(sc, wl, tw)
    assert placed > 200 and res.placed_pods > placed
    assert res.gpu_energy_joules > 0 and res.cpu_energy_joules > 0
    assert math.isclose(sum(res.node_energy_joules), res.energy_joules, rel_tol=1e-9)
    assert math.isclose(sum(res.node_gpu_joules), res.gpu_energy_joules, rel_tol=1e-9)


def test_gpu_energy_idle_allocated_and_asleep(tmp_path):
    one = "\n  - {name_prefix: t4, count: 1, cpu_m: 8000, memory_mib: 65536, power_watts: [50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150], gpu_count: 2, gpu_model: T4, gpu_power_watts: [10, 70]}\n"
    # One pod holding half a GPU for 1000 s from t=0, on an always-on node, for the 20000 s scenario.
    pods = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,gpu_count,gpu_milli\n0,1000,1000,1024,0.0,1,500\n"
    sc = load_scenario(_scenario(tmp_path, pods, groups=one, sleep=False))
    res = run_policy(Twin(sc, build_workload(sc)), make_policy("default-k8s"))
    # busy GPU at 50 %: 40 W, the other idles at 10 W; then both idle.
    assert res.gpu_energy_joules == pytest.approx(1000 * (40 + 10) + 19000 * 20)
    assert res.cpu_energy_joules == pytest.approx(20000 * 50.0)
    # Asleep after 60 s idle: the node draws its sleep watts only (GPUs included).
    sc = load_scenario(_scenario(tmp_path, pods, groups=one, sleep=True))
    res = run_policy(Twin(sc, build_workload(sc)), make_policy("default-k8s"))
    assert res.gpu_energy_joules == pytest.approx(1000 * 50 + 60 * 20)
    assert res.cpu_energy_joules == pytest.approx(1060 * 50.0 + (20000 - 1060) * 5.0)


def test_scenario_and_trace_gpu_errors(tmp_path):
    bad_group = "\n  - {name_prefix: t4, count: 1, cpu_m: 8000, memory_mib: 65536, power_watts: ibm-x3550-m3-x5675, gpu_model: T4}\n"
    with pytest.raises(ScenarioError, match="gpu_model is given but gpu_count is 0"):
        load_scenario(_scenario(tmp_path, "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n0,1,1,1,1\n",
                                groups=bad_group))
    head = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,gpu_count,gpu_milli,gpu_spec\n"
    (tmp_path / "t.csv").write_text(head + "0,10,1000,1024,500,1,1200,\n")
    with pytest.raises(ScenarioError, match="line 2, column gpu_milli: 1200 milli-GPU is outside 1..1000"):
        load_trace(tmp_path / "t.csv")
    sc = load_scenario(_scenario(tmp_path, head + "0,10,1000,1024,500,1,500,A100\n"))
    with pytest.raises(ScenarioError, match="pod pod-0 allows GPU model.s. A100, which no node group has"):
        build_workload(sc)


def test_gpu_columns_round_trip(tmp_path):
    src = tmp_path / "a.csv"
    src.write_text(_random_gpu_pods(50, 2))
    wl = load_trace(src)
    write_trace(wl, tmp_path / "b.csv")
    wl2 = load_trace(tmp_path / "b.csv")
    for col in ("gpu", "gpu_milli", "submit_s", "cpu_req"):
        assert (getattr(wl, col) == getattr(wl2, col)).all()
    assert [wl.name_of(i) for i in range(len(wl))] == [wl2.name_of(i) for i in range(len(wl2))]
    assert [wl.gpu_spec_table[c] for c in wl.gpu_spec] == [wl2.gpu_spec_table[c] for c in wl2.gpu_spec]


def test_live_objects_map_gpus():
    node = {"metadata": {"name": "g1", "labels": {"nvidia.com/gpu.product": "T4"}},
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "2"}}}
    info = parse_node(node, CurveResolver())
    assert (info.gpu_count, info.gpu_model) == (2, "T4")
    whole = {"metadata": {"name": "a", "uid": "a"}, "spec": {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "1"}}}]}}
    assert (parse_pod(whole).request.gpu, parse_pod(whole).request.gpu_milli) == (2, 1000)
    shared = {"metadata": {"name": "b", "uid": "b", "annotations": {"alibabacloud.com/gpu-milli": "250",
                                                                     "alibabacloud.com/gpu-card-model": "T4|A10"}},
              "spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}}
    r = parse_pod(shared).request
    assert (r.gpu, r.gpu_milli, r.gpu_models) == (1, 250, frozenset({"T4", "A10"}))


def test_fgd_keeps_whole_gpus_whole_and_gpu_packing_fills_a_partly_used_gpu():
    from joulesched.agent.gpu_policies import FGD, GpuPacking, shape_of

    st = _state(counts=(4, 4), models=("T4", "T4"))
    whole = PodRequest(1000, 100, gpu=2)
    share = PodRequest(1000, 100, gpu=1, gpu_milli=500)
    st.bind(0, PodRequest(1000, 100, gpu=1, gpu_milli=500), "x")  # node 0: one GPU half used
    fgd = FGD()
    fgd.reset(st, np.random.default_rng(0))
    for _ in range(5):  # the workload FGD has seen: mostly 2-GPU pods
        fgd.seen[shape_of(whole)] += 1
    # A half-GPU pod: FGD puts it beside the other half (node 0), where it strands nothing for 2-GPU pods.
    assert fgd.choose(st, share, st.feasible(share)) == 0
    pk = GpuPacking()
    pk.reset(st, np.random.default_rng(0))
    assert pk.choose(st, share, st.feasible(share)) == 0


def test_default_k8s_scores_nvidia_gpu_only_when_its_profile_lists_it():
    st = _state(counts=(4, 4), models=("T4", "T4"))
    st.bind(0, PodRequest(1000, 100, gpu=3), "busy")  # node 0: 3 of 4 GPUs taken; CPU equal otherwise
    st.bind(1, PodRequest(1000, 100), "cpu")
    pod = PodRequest(1000, 100, gpu=1)
    idx = np.array([0, 1])
    plain = make_policy("default-k8s").plugin_scores(st, pod, idx)["NodeResourcesFit"][1]
    assert plain[0] == plain[1]  # kube's default profile: cpu and memory only
    gpu = make_policy("default-k8s:gpu_weight=1").plugin_scores(st, pod, idx)["NodeResourcesFit"][1]
    # LeastAllocated over (cpu, memory, nvidia.com/gpu): node 1's GPUs are free, node 0 would be full.
    assert gpu[1] > gpu[0]
    # kube's formula: floor((s_cpu + s_mem + w s_gpu) / (2 + w)), s_r = (A - R) * 100 // A
    s_cpu = (64000 - 2000) * 100 // 64000
    s_mem = (262144 - 300) * 100 // 262144
    assert gpu.tolist() == [(s_cpu + s_mem + 0) // 3, (s_cpu + s_mem + 75) // 3]


@pytest.mark.parametrize("edit,words", [
    (lambda s, p: (s, p.replace("500,\n", "500,A100\n")), ["pod pod-0 allows GPU model(s) A100, which no node group has"]),
    (lambda s, p: (s.replace("gpu_count: 2, ", ""), p), ["nodes.0: gpu_model is given but gpu_count is 0"]),
    (lambda s, p: (s, p.replace(",1,500,", ",1,1500,")), ["line 2, column gpu_milli: 1500 milli-GPU is outside 1..1000"]),
])
def test_validate_exits_2_on_bad_gpu_input(tmp_path, edit, words):
    from typer.testing import CliRunner

    from joulesched.pipelines.cli import app

    sc = ("name: v\nseed: 0\nduration_s: 100\nnodes:\n  - {name_prefix: g, count: 1, cpu_m: 8000, memory_mib: 8192, "
          "power_watts: ibm-x3550-m3-x5675, gpu_count: 2, gpu_model: T4}\nworkload: {trace: p.csv}\n")
    pods = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,gpu_count,gpu_milli,gpu_spec\n0,10,1000,1024,500,1,500,\n"
    sc, pods = edit(sc, pods)
    (tmp_path / "s.yaml").write_text(sc)
    (tmp_path / "p.csv").write_text(pods)
    res = CliRunner().invoke(app, ["validate", str(tmp_path / "s.yaml")])
    assert res.exit_code == 2
    flat = " ".join(res.output.split())
    for w in words:
        assert w in flat, flat


def test_node_power_wakes_a_node_whose_gpus_fit():
    from joulesched.cluster.nodepower import NodePowerCore, PowerPolicy
    from joulesched.cluster.state import ASLEEP

    # Node 2 (no GPUs) is the most efficient; node 1 has 4 V100s; node 0's 2 T4s hold a half-GPU pod each.
    st = _state(counts=(2, 4, 0), models=("T4", "V100M16", ""))
    st.peak_watts[:] = [300.0, 400.0, 100.0]
    st.bind(0, PodRequest(1000, 100, gpu=1, gpu_milli=600), "a")
    st.bind(0, PodRequest(1000, 100, gpu=1, gpu_milli=600), "b")
    st.power_state[1:] = ASLEEP
    core = NodePowerCore(PowerPolicy())
    assert core.choose_wake(st, [PodRequest(1000, 100)]) == []  # node 0 is awake and has CPU room
    # Two 500-milli pods: neither fits a T4 (400 free on each), so node 1 wakes once, for both.
    half = PodRequest(1000, 100, gpu=1, gpu_milli=500)
    assert core.choose_wake(st, [half, half]) == [1]
    # Five whole GPUs fit no node: nothing is woken for them.
    assert core.choose_wake(st, [PodRequest(1000, 100, gpu=5)]) == []
