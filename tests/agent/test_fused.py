"""The compiled decision passes (agent/fused.py) against the numpy code they replace: equal results, not close."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from joulesched.agent import fused
from joulesched.agent.dqn_policy import SAMPLE_EFFICIENT, SAMPLE_FIT, SAMPLE_PICKS, DQNPolicy
from joulesched.agent.features import FeatureBuilderV2, PickTables, heuristic_picks
from joulesched.agent.kube_scoring import num_nodes_to_score
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import ASLEEP, ON, WAKING, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload

ROOT = Path(__file__).resolve().parents[2]


def _state(seed: int, n: int = 60):
    """A twin state with random requests, power states and few node kinds (so keys tie often)."""
    sc = load_scenario(ROOT / "scenarios" / "large.yaml")
    st = Twin(sc, build_workload(sc, 1)).state
    rng = np.random.default_rng(seed)
    n = len(st)
    st.nz_cpu[:] = (rng.integers(0, 9, n) * 500).clip(max=st.alloc_cpu)  # multiples of 500m: many equal fits
    st.nz_mem[:] = (rng.integers(0, 5, n) * 1024).clip(max=st.alloc_mem)
    st.pods[:] = np.where(st.nz_cpu > 0, rng.integers(1, 6, n), 0)
    st.power_state[:] = rng.choice([ON, ON, ON, ASLEEP, WAKING], n).astype(np.int8)
    st.power_state[st.pods > 0] = ON
    return st, rng


@pytest.mark.parametrize("seed", range(40))
def test_picks_are_heuristic_picks(seed):
    st, rng = _state(seed)
    feat = FeatureBuilderV2(st)
    for _ in range(5):
        mask = rng.random(len(st)) < rng.choice([0.0, 0.02, 0.3, 1.0])
        if seed % 4 == 0:  # only sleepers feasible: the wake choice
            mask &= st.power_state == ASLEEP
        pod = PodRequest(cpu_m=int(rng.choice([100, 500, 1000, 2500])), memory_mib=int(rng.choice([256, 1024])))
        want = heuristic_picks(st, pod, np.flatnonzero(mask), feat.wpc, PickTables(st))
        got = feat.compiled_picks(st, pod, mask)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


def test_round9_is_numpys_round():
    rng = np.random.default_rng(0)
    x = np.concatenate((rng.normal(0, 50, 20_000), np.arange(-50, 50) * 0.5e-9, rng.integers(-10**6, 10**6, 500) * 1e-9
                        + 0.5e-9))
    got = np.array([fused._round9(v) for v in x])
    np.testing.assert_array_equal(got, np.round(x, 9))


def _sampled_run(scenario: str, sample: str, decisions: int, seed: int = 2):
    """Each decision's compiled sample beside the numpy one, along a twin run: 60 % of the pods go to a random
    feasible node (so the cluster spreads past the budget), the rest where the sampled policy puts them."""
    sc = load_scenario(ROOT / "scenarios" / scenario)
    twin = Twin(sc, build_workload(sc, seed))
    pol = DQNPolicy("models/v2.pt", sample=sample)
    pol.attach(twin)
    rng = np.random.default_rng(seed)
    compared = 0
    try:
        twin.reset()
        pol.reset(twin.state, rng)
        k = 0
        while k < decisions and (d := twin.next_decision()) is not None:
            st, feat = d.state, pol._feat
            if feat is None or not feat.matches(st):
                feat = pol._builder(st)
            start = pol._sample_start
            ref = _sample_np(pol, feat, st, d.pod, d.mask)
            after_ref = pol._sample_start
            pol._sample_start = start
            got = pol._sample(feat, st, d.pod, d.mask)
            assert (ref is None) == (got is None)
            if ref is not None:
                for r, g in zip(ref[:3], got[:3]):
                    np.testing.assert_array_equal(g, r)
                for r, g in zip(ref[3], got[3]):
                    np.testing.assert_array_equal(g, r)
                assert pol._sample_start == after_ref
                compared += 1
            node = pol.choose(st, d.pod, d.mask, meta=d.meta)
            assert d.mask[node]
            twin.place(int(rng.choice(np.flatnonzero(d.mask))) if rng.random() < 0.6 else node)
            k += 1
    finally:
        pol.detach(twin)
    return compared


def test_the_compiled_sample_is_the_numpy_sample_along_a_run():
    """large (240 nodes) at 5 %: the 100-node floor, so most decisions sample once the cluster fills. And warm
    (the policy's reset) compiled each loop for the types the decisions passed: none was compiled again
    mid-run (a second signature would be a compile of seconds inside a decision)."""
    assert _sampled_run("large.yaml", "5", 700) > 100
    for loop in (fused.picks, fused.sample, fused.node_columns, fused.empty_groups, fused.advance_view):
        assert len(loop.signatures) == 1, (loop.__name__, loop.signatures)


def test_the_sampled_columns_are_parts_columns_with_the_compiled_picks():
    """parts_at (compiled columns and picks) against parts (numpy) on random columns of random states."""
    for seed in range(6):
        st, rng = _state(seed)
        feat = FeatureBuilderV2(st, prediction=False)
        mask = rng.random(len(st)) < 0.5
        pod = PodRequest(cpu_m=700, memory_mib=900)
        full, ctx_full = feat.parts(st, pod, mask)
        full, ctx_full = full.copy(), ctx_full.copy()
        cols = np.sort(rng.choice(len(st), size=50, replace=False))
        sub, ctx = feat.parts_at(st, pod, mask, cols)
        np.testing.assert_array_equal(sub, full[:, cols])
        np.testing.assert_array_equal(ctx, ctx_full)


def _sample_np(self, feat, st, pod, mask, groups=None):
    """DQNPolicy._sample in numpy, as it was before the compiled loops (its ties: the lowest index)."""
    n = len(st)
    k = num_nodes_to_score(n, self.sample_pct or 0)
    reps, cnt = feat.groups(st, mask) if groups is None else groups
    empty = st.pods[reps] == 0
    busy = reps[~empty]
    n_groups = reps.size - busy.size
    if busy.size + n_groups <= k:
        return None
    idx = np.flatnonzero(mask)
    busy_all = st.pods > 0
    fb_mask = mask & busy_all
    fb = np.flatnonzero(fb_mask)  # feasible busy nodes (boolean masks: no gathers over every node)
    wpc = feat.wpc
    picks = heuristic_picks(st, pod, idx, wpc, feat.pick_tables)
    keep = [fb[:0]]
    if fb.size:
        keep += [p[st.pods[p] > 0][:SAMPLE_PICKS] for p in picks]
        quota = max(1, k // 8)
        awake = np.flatnonzero(fb_mask & (st.power_state != ASLEEP))
        if awake.size:
            free = (st.alloc_cpu[awake] - st.nz_cpu[awake] - pod.nz_cpu) / np.maximum(st.alloc_cpu[awake], 1)
            keep.append(awake[_smallest(free, min(SAMPLE_FIT, quota))])
        keep.append(fb[_smallest(wpc[fb], min(SAMPLE_EFFICIENT, quota))])
    must = np.unique(np.concatenate(keep))
    must = must[st.pods[must] > 0]  # an empty pick is in its group already
    out = busy_all.copy()
    out[must] = False
    rest = np.flatnonzero(out)  # the busy nodes not in must, in order
    r = max(k - must.size - n_groups, min(rest.size, 16))
    if rest.size > r:
        step = rest.size / r
        start = self._sample_start % rest.size
        take = (start + (np.arange(r) * step).astype(np.int64)) % rest.size
        self._sample_start = (start + 1) % rest.size
        stride = rest[np.sort(take)]
        w_rest = rest.size / r
    else:
        stride, w_rest = rest, 1.0
    er = reps[empty]
    cols = np.concatenate((must, stride, er))
    w = np.concatenate((np.ones(must.size), np.full(stride.size, w_rest), cnt[empty]))
    order = np.argsort(cols, kind="stable")
    cols, w = cols[order], w[order]
    pos = np.flatnonzero(mask[cols])
    return cols, w, pos, picks


def _smallest(v: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` smallest values of ``v``, the lower position first among equal values."""
    if v.size <= k:
        return np.arange(v.size)
    return np.argsort(v, kind="stable")[:k]
