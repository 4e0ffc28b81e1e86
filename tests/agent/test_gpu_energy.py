"""``gpu-energy``, the packer that knows GPU power, worked out by hand: the watts a pod adds on each GPU model,
which awake node it takes, which sleeping node it wakes, and that it is a best-heuristic candidate."""

import numpy as np

from joulesched.agent.gpu_policies import gpu_watts_added
from joulesched.agent.registry import BEST_HEURISTIC_CANDIDATES, GPU_POLICIES, family_of, make_policy
from joulesched.agent.train import GPU_REFERENCES
from joulesched.cluster.state import ASLEEP, ClusterState, PodRequest

CPU = [100.0 + 10.0 * k for k in range(11)]  # 100 W idle, 200 W at full load: the same CPU side everywhere
T4 = [10.0 + 6.0 * k for k in range(11)]  # 10 W idle, 70 W at full share
V100 = [40.0 + 26.0 * k for k in range(11)]  # 40 W idle, 300 W
BENT = [0.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 130.0, 140.0]  # steep first tenth


def cluster(counts, gpu_curves, models, asleep=(), cpu_m=None):
    n = len(counts)
    st = ClusterState([f"n{i}" for i in range(n)], cpu_m or [64000] * n, [262144] * n, [110] * n, [CPU] * n,
                      sleep_watts=[5.0] * n, can_sleep=True, wake_s=60, gpu_count=list(counts),
                      gpu_model=list(models), gpu_curves=list(gpu_curves))
    for i in asleep:
        st.power_state[i] = ASLEEP
    return st


def pick(st, pod, seed=0):
    pol = make_policy("gpu-energy")
    pol.reset(st, np.random.default_rng(seed))
    return pol.choose(st, pod, st.feasible(pod))


def test_it_is_a_gpu_aware_best_heuristic_candidate_and_a_gpu_validation_reference():
    assert family_of("gpu-energy") == "gpu-aware"
    assert "gpu-energy" in GPU_POLICIES and "gpu-energy" in BEST_HEURISTIC_CANDIDATES
    assert "gpu-energy" in GPU_REFERENCES


def test_watts_added_read_each_gpu_curve_on_the_gpu_the_share_would_take():
    st = cluster((2, 2, 2), [T4, V100, BENT], ["T4", "V100", "X"])
    idx = np.arange(3)
    half = PodRequest(1000, 100, gpu=1, gpu_milli=500)
    assert np.allclose(gpu_watts_added(st, half, idx), [30.0, 130.0, 90.0])  # bent: 0 -> 90 W at half
    two = PodRequest(1000, 100, gpu=2)
    assert np.allclose(gpu_watts_added(st, two, idx), [120.0, 520.0, 280.0])
    # A share goes on the fullest GPU that fits: on the bent curve 400 -> 600 milli adds 20 W, not 0 -> 200's 60.
    st.bind(2, PodRequest(1000, 100, gpu=1, gpu_milli=400), "x")
    tenth = PodRequest(1000, 100, gpu=1, gpu_milli=200)
    assert np.isclose(gpu_watts_added(st, tenth, np.array([2]))[0], 20.0)
    assert (gpu_watts_added(st, PodRequest(1000, 100), idx) == 0).all()
    full = PodRequest(1000, 100, gpu=1, gpu_milli=700)
    st.bind(0, PodRequest(1000, 100, gpu=2), "both")
    assert gpu_watts_added(st, full, np.array([0]))[0] == 0.0  # does not fit: nothing added


def test_among_awake_nodes_the_least_watts_added_wins_then_gpu_packing():
    st = cluster((8, 2, 2), [V100, T4, T4], ["V100", "T4", "T4"])
    share = PodRequest(1000, 100, gpu=1, gpu_milli=300)
    # gpu-packing's tiers alone would not choose among three idle nodes; the T4s add 18 W, the V100 78 W.
    assert pick(st, share) in (1, 2)
    st.bind(2, PodRequest(1000, 100, gpu=1, gpu_milli=500), "half")
    # Equal watts on both T4 nodes: the partly used GPU (node 2) first, as gpu-packing.
    assert pick(st, share) == 2
    assert make_policy("gpu-packing").choose(st, share, st.feasible(share)) == 2


def test_it_wakes_the_fewest_watts_per_gpu_for_a_gpu_pod_and_per_core_for_a_cpu_pod():
    # Node 0: 8 V100 (200 + 8 x 300 W at peak: 325 W per GPU); node 1: 2 T4 (200 + 140: 170 W per GPU);
    # node 2: no GPU. All asleep: awake-first's rule (watts per core at full load) sees them equal and wakes
    # the first; gpu-energy wakes the T4 node for a GPU pod.
    st = cluster((8, 2, 0), [V100, T4, CPU], ["V100", "T4", ""], asleep=(0, 1, 2))
    gpu_pod = PodRequest(1000, 100, gpu=1)
    assert pick(st, gpu_pod) == 1
    # A CPU pod: waking a GPU node turns its GPUs on (8 x 40 W, 2 x 10 W idle): the node without GPUs.
    assert pick(st, PodRequest(1000, 100)) == 2
    scores = make_policy("gpu-energy").scorer.node_scores(st, gpu_pod, np.flatnonzero(st.feasible(gpu_pod)))
    assert np.allclose(scores.plugins["WattsPerUnit"][1], [325.0, 170.0])
    assert "WattsPerUnit" in scores.note


def test_an_awake_node_that_fits_is_used_before_waking_a_cheaper_one():
    st = cluster((8, 2), [V100, T4], ["V100", "T4"], asleep=(1,))
    assert pick(st, PodRequest(1000, 100, gpu=1)) == 0


def test_the_ablation_gpu_arms_train_schema_3_taught_by_each_gpu_heuristic():
    from pathlib import Path

    from bench.dqn_ablation import ARMS, DEFAULT_ARMS, GPU_ARMS, GPU_FULL_ARMS, train_command
    from joulesched.agent.config import TrainConfig, with_overrides
    from joulesched.cluster.scenario import load_scenario

    for arms, kind, nodes, compact in ((GPU_ARMS, "openb-mini", 164, False), (GPU_FULL_ARMS, "openb-full", 1523, True)):
        assert not set(arms) & set(DEFAULT_ARMS) and set(arms) <= set(ARMS)
        teachers = set()
        for arm, (_, sets) in arms.items():
            cfg = with_overrides(TrainConfig(), list(sets)).dqn
            assert cfg.feature_schema == 3
            # the arms measured before compaction keep the layout they were measured with
            assert cfg.compact_replay is compact
            make_policy(cfg.teacher)  # the spec builds
            teachers.add(cfg.teacher)
            cmd = train_command(arm, 0, 100, Path("m.pt"))
            files = [cmd[k + 1] for k, x in enumerate(cmd) if x == "-s"]
            assert any(load_scenario(f).node_count == nodes and kind in f for f in files)
            assert not any("openb-eval" in f or "heldout" in f for f in files)  # never the evaluation's windows
        assert teachers == {"gpu-packing", "gpu-energy"}
