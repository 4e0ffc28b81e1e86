"""kube-scheduler's formulas on values worked out by hand (reference.md section 1 and 3)."""

import numpy as np
import pytest

from joulesched.agent import kube_scoring as ks
from joulesched.agent.baselines import DefaultK8s, fit_peaks
from joulesched.agent.policy import PolicyError, parse_spec
from joulesched.agent.registry import make_policy
from joulesched.cluster.state import ClusterState, PodRequest
from tests.helpers import LINEAR_100_200

A = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


def test_least_allocated_floors_each_resource_then_the_mean():
    # cpu: (4000-1500)*100/4000 = 62.5 -> 62; mem: (8192-4096)*100/8192 = 50; (62+50)/2 = 56
    assert ks.least_allocated((A(4000), A(8192)), (A(1500), A(4096))).tolist() == [56]


def test_least_allocated_is_zero_when_requested_exceeds_allocatable():
    assert ks.least_allocated((A(1000), A(1000)), (A(1001), A(1000))).tolist() == [0]


def test_zero_allocatable_resource_is_skipped():
    # memory allocatable 0: only cpu counts, (1000-250)*100/1000 = 75
    assert ks.least_allocated((A(1000), A(0)), (A(250), A(10))).tolist() == [75]


def test_most_allocated():
    # cpu 1500*100/4000 = 37.5 -> 37; mem 50; (37+50)//2 = 43; requested above allocatable caps at 100
    assert ks.most_allocated((A(4000, 100), A(8192, 100)), (A(1500, 500), A(4096, 50))).tolist() == [43, 75]


def test_requested_to_capacity_ratio_rounds_half_away_from_zero():
    shape = ks.validate_shape([(0, 0), (100, 10)])
    assert shape == [(0, 0), (100, 100)]
    # u_cpu = 1400*100//4000 = 35, u_mem = 50 -> (35+50)/2 = 42.5 -> 43 (Go's math.Round), not 42
    assert ks.requested_to_capacity_ratio((A(4000), A(8192)), (A(1400), A(4096)), shape).tolist() == [43]


def test_requested_to_capacity_ratio_truncates_toward_zero_like_go():
    # Decreasing shape (0,100)->(30,0); u = 20: 100 + trunc(-100*20/30) = 100 - 66 = 34 (floor would give 33).
    shape = ks.validate_shape([(0, 10), (30, 0)])
    s = ks.requested_to_capacity_ratio((A(1000), A(1000)), (A(200), A(200)), shape, weights=(1, 1))
    assert s.tolist() == [34]
    # Past the last point the score is the last point's: u = 50 -> 0, and zero scores are left out of the mean.
    s = ks.requested_to_capacity_ratio((A(1000), A(1000)), (A(500), A(200)), shape)
    assert s.tolist() == [34]


def test_rtcr_shape_validation():
    for bad in ([(0, 11)], [(10, 1), (5, 2)], [(101, 1)], []):
        with pytest.raises(ValueError):
            ks.validate_shape(bad)


def test_balanced_allocation():
    # fractions 0.5 and 0.25: std = 0.125 -> floor(87.5) = 87; equal fractions -> 100; capped at 1 -> |1-0.5|/2
    alloc = (A(4000, 4000, 1000), A(8192, 8192, 1000))
    req = (A(2000, 1500, 5000), A(2048, 3072, 500))
    assert ks.balanced_allocation(alloc, req).tolist() == [87, 100, 75]


def test_num_nodes_to_score():
    assert ks.num_nodes_to_score(50) == 50
    assert ks.num_nodes_to_score(100) == 100  # 50 % of 100 is 50, raised to the minimum of 100
    assert ks.num_nodes_to_score(1000) == 420  # 50 - 1000/125 = 42 %
    assert ks.num_nodes_to_score(5000) == 500  # 10 %
    assert ks.num_nodes_to_score(6000) == 300  # 50 - 48 = 2 %, raised to 5 %
    assert ks.num_nodes_to_score(1000, percentage=100) == 1000


def test_target_load_packing():
    cap = np.array([4000.0, 4000.0, 4000.0])
    used = np.array([800.0, 2000.0, 3500.0])
    pred = ks.tlp_predicted_usage(400)  # 400m * 1.5 = 600m
    assert pred == 600
    # U = 35 -> round(60*35/40 + 40) = round(92.5) = 93; U = 65 -> round(40*35/60) = 23; U = 102.5 -> 0
    assert ks.target_load_packing(used, cap, pred, 40).tolist() == [93, 23, 0]
    assert ks.tlp_predicted_usage(None) == 1000
    # an explicit 0 is present: scheduler-plugins' PredictUtilisation tests the key, so it predicts 0, not 1000m
    assert ks.tlp_predicted_usage(0) == 0 and ks.tlp_predicted_usage(400, 0) == 0
    assert ks.tlp_predicted_usage(333) == 500  # 499.5 rounds half away from zero


def test_peaks_fit_recovers_an_exponential():
    x = np.linspace(0, 100, 11)
    curve = 50 + 20 * np.exp(0.015 * x)
    k0, k1, k2 = fit_peaks(curve)
    assert k2 == pytest.approx(0.015, rel=1e-3)
    assert k0 == pytest.approx(50, rel=1e-3) and k1 == pytest.approx(20, rel=1e-3)


def test_peaks_fits_each_distinct_curve_once_and_keeps_the_fits_across_resets(monkeypatch):
    """A review: Peaks refitted every node's curve at each reset (8 s at 2,000 nodes, in the first decision's
    latency, and live at every node-set change). Each node still gets its own curve's fit."""
    from joulesched.agent import baselines

    x = np.linspace(0, 100, 11)
    curves = [list(50 + 20 * np.exp(0.015 * x)), list(LINEAR_100_200)]
    st = ClusterState([f"n{i}" for i in range(6)], [4000] * 6, [8192] * 6, [110] * 6, [curves[i % 2] for i in range(6)])
    calls = []
    real = baselines.fit_peaks
    monkeypatch.setattr(baselines, "fit_peaks", lambda c: calls.append(1) or real(c))
    pol = make_policy("peaks")
    pol.reset(st, np.random.default_rng(0))
    assert len(calls) == 2
    for i in range(6):
        np.testing.assert_allclose(pol.k[i], real(np.asarray(curves[i % 2])))
    pol.reset(st, np.random.default_rng(1))
    assert len(calls) == 2


def _state(n=3, cpu=4000, mem=8192):
    return ClusterState([f"n{i}" for i in range(n)], [cpu] * n, [mem] * n, [110] * n, [LINEAR_100_200] * n)


def test_default_k8s_uses_non_zero_requests_for_fit_and_real_for_balanced():
    st = _state(2)
    st.bind(0, PodRequest(None, None))  # best-effort: counts 100m / 200Mi for Fit only
    pol = DefaultK8s()
    scores = pol.plugin_scores(st, PodRequest(1000, 2048), np.array([0, 1]))
    # node0 Fit: cpu (4000-1100)*100/4000 = 72, mem (8192-2248)*100/8192 = 72 -> 72; node1: 75, 75 -> 75
    assert scores["NodeResourcesFit"][1].tolist() == [72, 75]
    # Balanced on real requests: both nodes 0.25 / 0.25 -> 100
    assert scores["NodeResourcesBalancedAllocation"][1].tolist() == [100, 100]


def test_balanced_allocation_skips_best_effort_pods():
    st = _state(2)
    st.bind(0, PodRequest(2000, 100))
    s = DefaultK8s().plugin_scores(st, PodRequest(None, None), np.array([0, 1]))
    assert s["NodeResourcesBalancedAllocation"][1].tolist() == [0, 0]


@pytest.mark.parametrize("cpu, mem, skipped", [(0, None, True), (0, 0, True), (None, 0, True), (0, 100, False)])
def test_balanced_allocation_skips_pods_requesting_no_cpu_or_memory(cpu, mem, skipped):
    """kube's isBestEffortPod reads the real requests: an explicit 0 is skipped as an absent request is."""
    st = _state(2)
    st.bind(0, PodRequest(2000, 100))
    s = DefaultK8s().plugin_scores(st, PodRequest(cpu, mem), np.array([0, 1]))["NodeResourcesBalancedAllocation"][1]
    assert (s.tolist() == [0, 0]) == skipped


def test_default_k8s_gpu_weight_leaves_gpus_out_for_a_pod_without_them():
    """kube's calculateResourceAllocatableRequest returns (0, 0) for an extended resource the pod does not request:
    nvidia.com/gpu is not scored, so a GPU node and a CPU-only one tie."""
    st = ClusterState(["cpu-only", "gpu-node"], [8000, 8000], [16384, 16384], [110, 110], [LINEAR_100_200] * 2,
                      gpu_count=[0, 4], gpu_model=["", "T4"])
    fit = make_policy("default-k8s:gpu_weight=1").plugin_scores(st, PodRequest(1000, 2048), np.array([0, 1]))
    # cpu (8000-1000)*100//8000 = 87, memory (16384-2048)*100//16384 = 87, on both nodes
    assert fit["NodeResourcesFit"][1].tolist() == [87, 87]


@pytest.mark.parametrize("name", ["target-load-packing", "peaks"])
def test_tlp_and_peaks_predict_a_pod_by_its_cpu_limit(name, monkeypatch):
    """scheduler-plugins' PredictUtilisation: the limit (2000m) first, not request x 1.5 (1500m)."""
    from joulesched.cluster.workload import PodMeta

    st = _state(2, cpu=8000)
    st.usage_cpu[:] = [1600.0, 0.0]
    pod, meta = PodRequest(1000, 2048), PodMeta(kind="service", cpu_limit_m=2000, qos_class="Burstable")
    pol = make_policy(name)
    pol.reset(st, np.random.default_rng(0))
    assert pol.uses_meta
    idx, mask = np.array([0, 1]), np.ones(2, dtype=bool)
    total = pol.node_scores(st, pod, idx, meta=meta).total
    if name == "target-load-packing":
        # U = 100 (1600 + 2000) / 8000 = 45 -> round(40 * 55 / 60) = 37; U = 25 -> round(60 * 25 / 40 + 40) = 78
        assert total.tolist() == [37, 78]
        assert pol.choose(st, pod, mask, meta=meta) == 1
        assert pol.node_scores(st, pod, idx).total.tolist() == [98, 68]  # no metadata: request x 1.5 (1500m)
    else:  # the same prediction is the x PEAKS adds to each node's power model
        seen = []
        monkeypatch.setattr(ks, "tlp_predicted_usage", lambda req, lim=None: seen.append((req, lim)) or 1000.0)
        pol.choose(st, pod, mask, meta=meta)
        pol.node_scores(st, pod, idx)
        assert seen[0] == (1000, 2000) and set(seen[1:]) == {(1000, None)}
        monkeypatch.undo()
    assert pol.node_scores(st, pod, idx, meta=PodMeta()).total.tolist() == pol.node_scores(st, pod, idx).total.tolist()


def test_ties_are_broken_uniformly_with_the_seeded_generator():
    st = _state(3)
    mask = np.ones(3, dtype=bool)
    picks = set()
    for seed in range(40):
        pol = make_policy("default-k8s")
        pol.reset(st, np.random.default_rng(seed))
        picks.add(pol.choose(st, PodRequest(100, 100), mask))
    assert picks == {0, 1, 2}
    a, b = make_policy("default-k8s"), make_policy("default-k8s")
    a.reset(st, np.random.default_rng(7))
    b.reset(st, np.random.default_rng(7))
    assert [a.choose(st, PodRequest(100, 100), mask) for _ in range(10)] == \
        [b.choose(st, PodRequest(100, 100), mask) for _ in range(10)]


def test_single_feasible_node_is_chosen_without_scoring():
    st = _state(3)
    mask = np.array([False, False, True])
    for name in ["default-k8s", "most-allocated", "peaks", "energy-greedy", "round-robin", "random"]:
        pol = make_policy(name)
        pol.reset(st, np.random.default_rng(0))
        assert pol.choose(st, PodRequest(100, 100), mask) == 2


def test_percentage_of_nodes_to_score_rotates_the_start_index():
    st = _state(1000, cpu=100000, mem=100000)
    pol = make_policy("most-allocated")
    pol.reset(st, np.random.default_rng(0))
    mask = np.ones(1000, dtype=bool)
    first = pol.candidates(st, mask)
    assert first.size == 420 and first[0] == 0
    second = pol.candidates(st, mask)
    assert second[0] == 420 and second.size == 420
    third = pol.candidates(st, mask)  # wraps around: 840..999 then 0..259
    assert third[0] == 840 and third[-1] == 259


def test_most_allocated_packs_and_default_spreads():
    st = _state(2)
    st.bind(0, PodRequest(2000, 4096))
    mask = np.ones(2, dtype=bool)
    for name, expect in [("most-allocated", 0), ("default-k8s", 1)]:
        pol = make_policy(name)
        pol.reset(st, np.random.default_rng(0))
        assert pol.choose(st, PodRequest(500, 512), mask) == expect


def test_energy_greedy_prefers_the_flat_curve_and_avoids_waking():
    flat = [100 + k for k in range(11)]
    steep = [10 + 20 * k for k in range(11)]
    st = ClusterState(["flat", "steep"], [1000, 1000], [1000, 1000], [10, 10], [flat, steep], sleep_watts=[5, 5],
                      can_sleep=True)
    pol = make_policy("energy-greedy")
    pol.reset(st, np.random.default_rng(0))
    mask = np.ones(2, dtype=bool)
    assert pol.choose(st, PodRequest(500, 10), mask) == 0  # +5 W vs +100 W
    st.power_state[0] = 1  # asleep: waking it costs ~100 W
    assert pol.choose(st, PodRequest(500, 10), mask) == 1


def test_round_robin_cycles_over_feasible_nodes():
    st = _state(3)
    pol = make_policy("round-robin")
    pol.reset(st, np.random.default_rng(0))
    mask = np.array([True, False, True])
    assert [pol.choose(st, PodRequest(1, 1), mask) for _ in range(4)] == [0, 2, 0, 2]


def test_policy_specs():
    assert parse_spec("most-allocated:balanced=1,pct=50") == ("most-allocated", {"balanced": "1", "pct": "50"}, None)
    assert parse_spec("dqn=models/a.pt") == ("dqn", {}, "models/a.pt")
    assert make_policy("most-allocated:balanced=1").balanced_weight == 1
    assert make_policy("requested-to-capacity-ratio:shape=0:10|100:0").shape == [(0, 100), (100, 0)]
    for bad, msg in [("nope", "unknown policy"), ("most-allocated:balanced=x", "not an integer"),
                     ("target-load-packing:x=150", "must be in"), ("round-robin:foo=1", "unknown option .foo.; its options: none"), ("target-load-packing:y=3", "unknown option .y.; its options: pct, x"), ("default-k8s:", "followed by key=value"), ("most-allocated=m.pt", "takes no model file"),
                     ("requested-to-capacity-ratio:shape=0:20", "bad shape"), ("default-k8s:pct", "key=value")]:
        with pytest.raises(PolicyError, match=msg):
            make_policy(bad)


def test_prefer_no_schedule_taints_are_scored_as_kubes_taint_toleration():
    """kube's TaintToleration (weight 3): untolerated PreferNoSchedule taints counted per node, normalised to 0..100
    against the most and reversed. Ignored before, so default-k8s always took the empty tainted node."""
    from joulesched.cluster.filters import NodeTraits, Taint, Toleration, pod_constraints

    soft = Taint("dedicated", "batch", "PreferNoSchedule")
    st = ClusterState(["tainted", "plain"], [4000, 4000], [8192, 8192], [110, 110], [LINEAR_100_200] * 2,
                      traits=[NodeTraits.of(taints=[soft]), NodeTraits.of()])
    st.bind(1, PodRequest(1000, 2048))
    pol, both = DefaultK8s(), np.array([0, 1])
    # Fit [87, 62] + Balanced [100, 100] = [187, 162]: without the taint's score the empty tainted node wins
    pod = PodRequest(500, 1024)
    s = pol.node_scores(st, pod, both)
    assert s.plugins["TaintToleration"][0] == 3
    assert s.plugins["TaintToleration"][1].tolist() == [0, 100] and s.total.tolist() == [187, 462]
    assert pol.choose(st, pod, np.array([True, True])) == 1
    # A pod that tolerates it (an empty effect tolerates every effect) sees no difference: the plugin is constant
    tolerant = PodRequest(500, 1024, pod_constraints(tolerations=[Toleration("dedicated", "Equal", "batch")]))
    assert "TaintToleration" not in pol.node_scores(st, tolerant, both).plugins
    assert pol.choose(st, tolerant, np.array([True, True])) == 0
    # A toleration for another effect does not tolerate it (kube keeps only PreferNoSchedule and empty ones)
    other = PodRequest(500, 1024, pod_constraints(tolerations=[Toleration("dedicated", "Exists", "", "NoSchedule")]))
    assert pol.choose(st, other, np.array([True, True])) == 1
    # Two taints against one: 100 - 1*100//2 = 50 for the node with one
    st2 = ClusterState(["two", "one"], [4000, 4000], [8192, 8192], [110, 110], [LINEAR_100_200] * 2,
                       traits=[NodeTraits.of(taints=[soft, Taint("slow", "", "PreferNoSchedule")]),
                               NodeTraits.of(taints=[soft])])
    assert pol.node_scores(st2, pod, both).plugins["TaintToleration"][1].tolist() == [0, 50]
