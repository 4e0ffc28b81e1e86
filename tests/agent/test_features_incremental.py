"""The schema-2 features' per-decision work over every node, kept between decisions (issue 28): the nodes' watts
now (:class:`NodeWatts`, patched where usage or power state changed) and the heuristics' picks computed on the
earlier keys' ties only (:func:`heuristic_picks` with :class:`PickTables`). Each is compared with the
from-scratch computation it replaces after every step of random binds, ends and node changes, and the shipped
model's decisions in the twin are compared with those of the from-scratch path (same seeds, twin run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from joulesched.agent import features
from joulesched.agent.features import FeatureBuilderV2, NodeWatts, PickTables, _lexmin, heuristic_picks
from joulesched.agent.registry import make_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import ASLEEP, ON, WAKING, ClusterState, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload

ROOT = Path(__file__).resolve().parents[2]


def picks_scratch(st, pod, idx, wpc=None, tables=None):
    """The picks as computed before issue 28's second pass: every key over every awake feasible node."""
    a = idx[st.power_state[idx] != ASLEEP]
    if a.size == 0:  # nothing awake (or no candidate): that branch did not change
        return heuristic_picks(st, pod, idx, wpc)
    wpc = st.peak_watts / np.maximum(st.alloc_cpu, 1) * 1000.0 if wpc is None else wpc
    cpu = np.maximum(st.alloc_cpu[a], 1).astype(np.float64)
    nz = st.nz_cpu[a]
    w = wpc[a]
    best = a[w == w.min()]
    if best.size > 1:
        cb = np.maximum(st.alloc_cpu[best], 1).astype(np.float64)
        mb = np.maximum(st.alloc_mem[best], 1).astype(np.float64)
        best = _lexmin(best, [(st.alloc_cpu[best] - st.nz_cpu[best] - pod.nz_cpu) / cb,
                                  (st.alloc_mem[best] - st.nz_mem[best] - pod.nz_mem) / mb])
    x0 = np.minimum(nz / cpu, 1.0) * 10.0
    x1 = np.minimum((nz + pod.nz_cpu) / cpu, 1.0) * 10.0
    curves = st.curves
    i0, i1 = np.minimum(x0.astype(np.int64), 9), np.minimum(x1.astype(np.int64), 9)
    lo0, lo1 = curves[a, i0], curves[a, i1]
    p0 = lo0 + (x0 - i0) * (curves[a, i0 + 1] - lo0)
    p1 = lo1 + (x1 - i1) * (curves[a, i1 + 1] - lo1)
    pb = _lexmin(a, [np.round(p1 - p0, 9), (cpu - nz - pod.nz_cpu) / cpu])
    return best, pb


def _cluster(rng: np.random.Generator, n: int) -> ClusterState:
    """``n`` nodes of 4 kinds (so whole kinds tie on watts per core), sleep-capable."""
    kinds = []
    for _ in range(4):
        base = float(rng.uniform(20, 120))
        kinds.append((int(rng.choice([4000, 8000, 16000])), np.round(base + np.cumsum(rng.uniform(0, 15, 11)), 1)))
    kind = rng.integers(0, 4, n)
    return ClusterState([f"n{i}" for i in range(n)], [kinds[k][0] for k in kind], [4 * kinds[k][0] for k in kind],
                        [110] * n, [kinds[k][1] for k in kind], sleep_watts=[5.0] * n, can_sleep=True, wake_s=60.0)


def _pod(rng: np.random.Generator) -> PodRequest:
    if rng.random() < 0.15:
        return PodRequest()  # best effort: the scoring defaults
    return PodRequest(cpu_m=int(rng.choice([50, 100, 250, 500, 1000, 2000])), memory_mib=int(rng.integers(64, 4096)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_watts_and_picks_equal_the_scratch_computation_after_every_step(seed):
    rng = np.random.default_rng(seed)
    st = _cluster(rng, 60)
    feat = FeatureBuilderV2(st)
    view, tables = NodeWatts(feat), PickTables(st)
    bound: list[tuple[int, PodRequest]] = []
    changed_picks = 0
    for step in range(400):
        r = rng.random()
        if r < 0.45 or not bound:  # a bind: its requests and its demand
            i, pod = int(rng.integers(len(st))), _pod(rng)
            st.bind(i, pod)
            st.usage_cpu[i] += pod.nz_cpu * rng.uniform(0.2, 1.5)
            bound.append((i, pod))
        elif r < 0.75:  # an end
            i, pod = bound.pop(int(rng.integers(len(bound))))
            st.unbind(i, pod)
            st.usage_cpu[i] = max(0.0, st.usage_cpu[i] - pod.nz_cpu)
        elif r < 0.9:  # a node's power state changes (sleep, wake, awake)
            st.power_state[int(rng.integers(len(st)))] = rng.choice([ON, ASLEEP, WAKING])
        else:  # the live cache's metrics refresh: a new usage array for every node
            st.usage_cpu = st.usage_cpu * rng.uniform(0.8, 1.2, len(st))
        u, w, n_asleep, n_waking = view.update(st)
        u0, w0, n_asleep0, n_waking0 = view.scratch(st)
        np.testing.assert_array_equal(u, u0)
        np.testing.assert_array_equal(w, w0)
        assert (n_asleep, n_waking) == (n_asleep0, n_waking0)
        np.testing.assert_array_equal(tables.at_requests(st), tables.draw_scratch(st))
        for _ in range(3):
            pod = _pod(rng)
            mask = rng.random(len(st)) < rng.choice([0.3, 0.9, 1.0])
            if rng.random() < 0.3:
                mask[:] = True
            idx = np.flatnonzero(mask)
            got = heuristic_picks(st, pod, idx, feat.wpc, tables)
            want = picks_scratch(st, pod, idx, feat.wpc)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
            np.testing.assert_array_equal(heuristic_picks(st, pod, idx)[1], want[1])  # tables built on the fly
            changed_picks += want[1].size != len(st)
    assert changed_picks > 0  # the picks were not all trivial ties


def test_the_picks_tie_across_a_whole_kind_as_before():
    """Identical empty nodes tie exactly on every key: every one of them is named, by both paths."""
    st = ClusterState([f"n{i}" for i in range(40)], [8000] * 40, [32000] * 40, [110] * 40,
                      [[50 + 10 * k for k in range(11)]] * 40)
    pod = PodRequest(cpu_m=500, memory_mib=512)
    idx = np.arange(40)
    got, want = heuristic_picks(st, pod, idx), picks_scratch(st, pod, idx)
    assert got[1].size == 40
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def _decisions(spec: str, limit: int, scratch: bool, monkeypatch) -> tuple[list[int], int]:
    """The node the policy ``spec`` chooses at each of the twin's first ``limit`` decisions, and how many took the
    sampled path; ``scratch``: with the from-scratch watts and picks. Each pod is bound to the policy's choice or,
    60 % of the time, to a random feasible node (same seed in both runs), so that many nodes are busy and the
    sample engages (the model alone keeps large's busy nodes under the budget)."""
    with monkeypatch.context() as m:
        if scratch:
            m.setattr(features, "heuristic_picks", picks_scratch)
            m.setattr(FeatureBuilderV2, "compiled_picks",  # the sampled path's picks, compiled
                      lambda self, st, pod, mask: picks_scratch(st, pod, np.flatnonzero(mask)))
            m.setattr(NodeWatts, "update", NodeWatts.scratch)
        sc = load_scenario(ROOT / "scenarios" / "large.yaml")
        twin = Twin(sc, build_workload(sc))
        pol = make_policy(spec)
        sampled = 0
        orig = pol._sample

        def counting(*a, **k):
            nonlocal sampled
            out = orig(*a, **k)
            sampled += out is not None
            return out

        pol._sample = counting
        pol.attach(twin)
        try:
            twin.reset()
            pol.reset(twin.state, np.random.default_rng(0))
            out: list[int] = []
            rng = np.random.default_rng(1)
            while len(out) < limit and (d := twin.next_decision()) is not None:
                node = int(pol.choose(d.state, d.pod, d.mask, meta=d.meta))
                out.append(node)
                twin.place(int(rng.choice(np.flatnonzero(d.mask))) if rng.random() < 0.6 else node)
        finally:
            pol.detach(twin)
        return out, sampled


@pytest.mark.parametrize("spec", ["dqn=models/v2.pt:sample=5", "dqn=models/v2.pt"])
def test_the_shipped_models_decisions_equal_the_scratch_paths(spec, monkeypatch):
    fast, sampled = _decisions(spec, 700, False, monkeypatch)
    ref, sampled_ref = _decisions(spec, 700, True, monkeypatch)
    assert len(fast) == 700 and fast == ref and sampled == sampled_ref
    if spec.endswith("sample=5"):
        assert sampled > 0  # the sampled path ran (its picks come from _sample)


def test_the_predictors_view_at_some_nodes_is_the_full_views_there():
    """``PodPredictor.nodes(..., at=cols)`` (what the sampled columns read) equals the full view at ``cols``."""
    from joulesched.agent.predictor import PodPredictor
    from joulesched.cluster.workload import PodMeta

    rng = np.random.default_rng(3)
    n = 50
    pred = PodPredictor()
    pred.set_nodes([f"n{i}" for i in range(n)])
    meta = PodMeta(kind="job", owner_kind="Job", app="a", qos_class="Burstable")
    running, now = [], 0.0
    for key in range(600):
        now += float(rng.exponential(20.0))
        if rng.random() < 0.6 or not running:
            pred.bound(now, key, int(rng.integers(n)), meta, float(rng.choice([100.0, 500.0])))
            running.append(key)
        else:
            pred.ended(now, running.pop(int(rng.integers(len(running)))))
        cols = np.sort(rng.choice(n, size=int(rng.integers(1, n)), replace=False))
        full, share = pred.nodes(now, n)
        part, share_at = pred.nodes(now, n, at=cols)
        np.testing.assert_array_equal(part, full[cols])
        np.testing.assert_array_equal(share_at, share)


def test_a_builder_never_matches_a_new_state_that_reuses_a_freed_ones_id():
    """Live, a node change rebuilds the ClusterState; CPython may give the new object the freed one's id, with
    the same node count but other nodes. The builder must not take any new state for its own (its static columns
    and kept watts are the old cluster's), whether or not it lands on the freed address."""
    import gc

    rng = np.random.default_rng(7)
    st = _cluster(rng, 12)
    fb = FeatureBuilderV2(st)
    assert fb.matches(st)
    old = id(st)
    del st
    gc.collect()
    same_address = 0
    for _ in range(200):  # same-size states, some of which CPython usually places at the freed address
        cand = _cluster(rng, 12)
        same_address += id(cand) == old
        assert not fb.matches(cand)
        del cand
    # (same_address > 0 on CPython in practice: the case that id() comparison got wrong; not asserted, it is the
    # allocator's choice)


def _groups_by_hand(feat: FeatureBuilderV2, st: ClusterState, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FeatureBuilderV2.groups' contract in plain Python: every busy node alone; each run of empty nodes with
    the same (class, power state, fits) read once at its lowest index with its count; no grouping at all when
    no two empty nodes share a key."""
    first: dict[tuple[int, int, bool], int] = {}
    count: dict[int, int] = {}
    for i in range(st.pods.size):
        if st.pods[i] == 0:
            k = (int(feat.node_class[i]), int(st.power_state[i]), bool(mask[i]))
            rep = first.setdefault(k, i)
            count[rep] = count.get(rep, 0) + 1
    if all(c == 1 for c in count.values()):
        return feat.rows, np.ones(feat.n)
    reps = sorted(set(np.flatnonzero(st.pods > 0).tolist()) | set(count))
    return np.array(reps), np.array([float(count.get(r, 1)) for r in reps])


@pytest.mark.parametrize("classes", ["kinds", "many"])
def test_the_empty_node_groups_follow_their_contract_with_narrow_and_wide_keys(classes):
    """The representatives and counts of the contract, with a few node kinds and with 6,000 classes (a key table
    of 36,000 entries), after random binds, ends, power-state changes and masks."""
    rng = np.random.default_rng(7)
    n = 12000 if classes == "many" else 300
    st = _cluster(rng, n)
    feat = FeatureBuilderV2(st)
    if classes == "many":  # 6,000 classes of two nodes each: more than int16 keys hold (5,461)
        feat.node_class = np.arange(n, dtype=np.int64) // 2
    bound: list[int] = []
    for _ in range(60):
        for _ in range(int(rng.integers(1, 40))):
            if bound and rng.random() < 0.4:
                st.unbind(bound.pop(int(rng.integers(len(bound)))), PodRequest(cpu_m=100, memory_mib=64))
            else:
                i = int(rng.integers(n))
                st.bind(i, PodRequest(cpu_m=100, memory_mib=64), strict=False)
                bound.append(i)
        flip = rng.integers(0, n, 20)
        st.power_state[flip] = rng.choice([ON, ASLEEP, WAKING], flip.size)
        mask = rng.random(n) < rng.choice([0.3, 0.9, 1.0])
        got, want = feat.groups(st, mask), _groups_by_hand(feat, st, mask)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
