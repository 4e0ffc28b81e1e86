"""The schema-2 DQN over a sample of the nodes (issue 28): the ``sample`` option, the columns it reads, what
the sample always holds, exactness where the sample is the whole cluster, and the cached inference weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from joulesched.agent.config import DQNConfig
from joulesched.agent.dqn import DQN
from joulesched.agent.dqn_policy import SAMPLE_PICKS, DQNPolicy, parse_sample
from joulesched.agent.features import N_FEATURES_V2, heuristic_picks
from joulesched.agent.kube_scoring import num_nodes_to_score
from joulesched.agent.policy import PolicyError, canonical_spec, parse_spec
from joulesched.agent.registry import make_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import ASLEEP
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload

ROOT = Path(__file__).resolve().parents[2]
LARGE = ROOT / "scenarios" / "large.yaml"


def _policy(sample: str, seed: int = 5) -> DQNPolicy:
    torch.manual_seed(seed)
    return DQNPolicy(net=DQN(DQNConfig(), seed=seed).q, config=DQNConfig(), threads=1, sample=sample)


def test_the_sample_option_and_the_model_spec_with_options():
    assert parse_sample("off") is None and parse_sample(None) is None
    assert parse_sample("auto") == 0 and parse_sample("25") == 25
    for bad in ("0.5", "101", "-1", "some"):
        with pytest.raises(PolicyError, match="sample="):
            parse_sample(bad)
    assert parse_spec("dqn=models/v2.pt:sample=auto") == ("dqn", {"sample": "auto"}, "models/v2.pt")
    assert parse_spec("dqn=models/v2.pt") == ("dqn", {}, "models/v2.pt")
    assert canonical_spec("dqn = models/v2.pt:sample=auto,threads=1") == "dqn=models/v2.pt:sample=auto,threads=1"
    pol = make_policy("dqn=models/v2.pt:sample=auto")
    assert pol.sample_pct == 0 and pol.kube_sampling and pol.name == "dqn=models/v2.pt:sample=auto"
    assert not make_policy("dqn=models/v2.pt").kube_sampling  # serve's --sample-pct still applies to it
    with pytest.raises(PolicyError, match="unknown option 'bogus'"):
        make_policy("dqn=models/v2.pt:bogus=1")


def _drive(twin: Twin, pols: list[DQNPolicy], limit: int, step, seed: int = 1) -> int:
    """Hand ``limit`` of the twin's decisions to ``step(d)`` (a node, or None) and bind each to a random feasible
    node or, 40 % of the time, to ``step``'s, so the cluster fills. The twin reports to one observer: the first
    policy's predictor, which the others share. Returns the decisions handed out."""
    pols[0].attach(twin)
    for p in pols[1:]:
        p.predictor = pols[0].predictor
    twin.begin()
    for p in pols:
        p.reset(twin.state, np.random.default_rng(0))
    rng = np.random.default_rng(seed)
    k = 0
    try:
        while k < limit and (d := twin.next_decision()) is not None:
            got = step(d)
            feas = np.flatnonzero(d.mask)
            twin.bind(d, int(rng.choice(feas)) if rng.random() < 0.6 or got is None else int(got))
            k += 1
    finally:
        pols[0].detach(twin)
    return k


def test_parts_at_reads_the_same_columns_as_parts():
    sc = load_scenario(LARGE)
    twin = Twin(sc, build_workload(sc, 3))
    pol = _policy("auto")
    rng = np.random.default_rng(3)

    def step(d):
        feat = pol._builder(d.state) if pol._feat is None or not pol._feat.matches(d.state) else pol._feat
        cols = np.sort(rng.choice(len(d.state), size=37, replace=False))
        full, ctx_full = feat.parts(d.state, d.pod, d.mask, meta=d.meta, predictor=pol.predictor)
        full, ctx_full = full.copy(), ctx_full.copy()
        sub, ctx = feat.parts_at(d.state, d.pod, d.mask, cols, meta=d.meta, predictor=pol.predictor)
        np.testing.assert_array_equal(sub, full[:, cols])
        np.testing.assert_array_equal(ctx, ctx_full)

    assert _drive(twin, [pol], 120, step) == 120


def test_the_sample_holds_the_picks_the_tight_fits_and_every_empty_group():
    sc = load_scenario(LARGE)
    twin = Twin(sc, build_workload(sc, 3))
    pol = _policy("5")  # 5 % of 240 nodes: the 100-node floor
    sampled = []

    def step(d):
        got = pol.choose(d.state, d.pod, d.mask, meta=d.meta)
        assert d.mask[got]
        feat, st = pol._feat, d.state
        out = pol._sample(feat, st, d.pod, d.mask)
        if out is None:
            return got
        sampled.append(1)
        cols, w, pos, picks = out
        k = num_nodes_to_score(len(st), 5)
        reps, cnt = feat.groups(st, d.mask)
        empty = st.pods[reps] == 0
        assert set(reps[empty]) <= set(cols)  # every group of identical empty nodes, exactly
        busy = np.flatnonzero(st.pods > 0)
        assert np.isclose(w.sum(), busy.size + cnt[empty].sum())  # the columns stand for every node
        assert cols.size <= max(k, 16 + int(empty.sum())) + 2 * SAMPLE_PICKS + 32 + 16
        idx = np.flatnonzero(d.mask)
        af, pb = heuristic_picks(st, d.pod, idx, feat.wpc)
        for p in (af, pb):  # the busy picks (the first SAMPLE_PICKS of a tie); an empty one is in its group
            busy_p = p[st.pods[p] > 0]
            assert np.isin(busy_p[:SAMPLE_PICKS], cols).all()
        fb = idx[(st.pods[idx] > 0) & (st.power_state[idx] != ASLEEP)]
        if fb.size:  # the tightest fit among the awake busy feasible nodes and the most efficient (ties: one)
            free = (st.alloc_cpu - st.nz_cpu - d.pod.nz_cpu) / np.maximum(st.alloc_cpu, 1)
            fc = cols[np.isin(cols, fb)]
            assert free[fc].min() == free[fb].min()
            assert feat.wpc[fc].min() == feat.wpc[fb].min()
        assert np.array_equal(pos, np.flatnonzero(d.mask[cols]))
        return got

    _drive(twin, [pol], 600, step)
    assert len(sampled) > 50  # the cluster got busy enough to sample


def test_a_sample_as_large_as_the_cluster_chooses_as_full_scoring():
    """sample=100: the budget is every node, so the exact path (grouped empty nodes) runs: same choices."""
    sc = load_scenario(LARGE)
    twin = Twin(sc, build_workload(sc, 4))
    full, whole = _policy("off", seed=7), _policy("100", seed=7)

    def step(d):
        a = full.choose(d.state, d.pod, d.mask, meta=d.meta)
        assert whole.choose(d.state, d.pod, d.mask, meta=d.meta) == a
        return a

    assert _drive(twin, [full, whole], 300, step) == 300


def test_the_folded_inference_weights_follow_a_training_step():
    dqn = DQN(DQNConfig(), seed=2)
    net = dqn.q
    x = torch.rand(20, N_FEATURES_V2)
    x[:, 26:] = x[0, 26:]
    cand = torch.arange(20)
    with torch.no_grad():
        before = net.score(x, cand).clone()
        ref = net(x[None], torch.ones(1, 20, dtype=torch.bool))[0]
    assert torch.allclose(before - before[0], ref - ref[0], atol=1e-5)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    net(x[None], torch.ones(1, 20, dtype=torch.bool)).sum().backward()
    opt.step()
    with torch.no_grad():
        after = net.score(x, cand)
        ref = net(x[None], torch.ones(1, 20, dtype=torch.bool))[0]
    assert not torch.allclose(after, before)
    assert torch.allclose(after - after[0], ref - ref[0], atol=1e-5)


def test_a_model_from_a_file_folds_its_weights_once_and_chooses_the_same():
    """A file's model is the policy's alone: the weights folded at reset serve every decision (no version check
    per decision), with the same choices as folding per decision; an in-memory network keeps the check."""
    sc = load_scenario(LARGE)
    twin = Twin(sc, build_workload(sc, 5))
    kept = make_policy("dqn=models/v2.pt:sample=auto")
    each = make_policy("dqn=models/v2.pt:sample=auto")
    each.reset = lambda st, rng, _r=each.reset: (_r(st, rng), setattr(each, "_folded", None))
    calls = []
    fold = kept.net._folded_np
    kept.net._folded_np = lambda: calls.append(1) or fold()

    def step(d):
        a = kept.choose(d.state, d.pod, d.mask, meta=d.meta)
        assert each.choose(d.state, d.pod, d.mask, meta=d.meta) == a
        return a

    assert _drive(twin, [kept, each], 300, step) == 300
    assert kept._folded is not None and len(calls) == 1  # folded at reset, never again
    assert _policy("auto")._folded is None and not _policy("auto").path


@pytest.mark.parametrize("attention", [True, False])
def test_the_numpy_decision_path_scores_as_the_torch_network(attention):
    """choose() scores with score_parts_np; it is score_parts (and so the batched network) to float32 rounding,
    with and without the weights of identical nodes and a candidate subset, and it follows a training step."""
    from joulesched.agent.dqn import SetQNetwork

    torch.manual_seed(3)
    net = SetQNetwork(N_FEATURES_V2, N_FEATURES_V2 - 26, 48, attention=attention)
    rng = np.random.default_rng(3)
    for m in (2, 37, 500):
        node_t = rng.random((26, m), dtype=np.float32) * 2 - 0.5
        ctx = rng.random(N_FEATURES_V2 - 26, dtype=np.float32)
        cand = np.sort(rng.choice(m, max(1, m // 2), replace=False))
        logw = np.log(rng.integers(1, 9, m)).astype(np.float32)
        for c, w in ((np.arange(m), None), (cand, logw)):
            with torch.no_grad():
                ref = net.score_parts(torch.from_numpy(node_t), torch.from_numpy(ctx), torch.from_numpy(c),
                                      None if w is None else torch.from_numpy(w)).numpy()
            got = net.score_parts_np(node_t, ctx, c, w)
            assert got.shape == ref.shape == (c.size,)
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    before = net.score_parts_np(node_t, ctx, cand, logw).copy()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    x = torch.from_numpy(np.concatenate([node_t.T, np.tile(ctx, (node_t.shape[1], 1))], axis=1))[None]
    net(x, torch.ones(1, node_t.shape[1], dtype=torch.bool)).sum().backward()
    opt.step()
    after = net.score_parts_np(node_t, ctx, cand, logw)
    with torch.no_grad():
        ref = net.score_parts(torch.from_numpy(node_t), torch.from_numpy(ctx), torch.from_numpy(cand),
                              torch.from_numpy(logw)).numpy()
    assert not np.allclose(after, before)
    np.testing.assert_allclose(after, ref, rtol=1e-4, atol=1e-5)


_BLAS_THREADS = """
import pickle, sys
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
threadpool_limits(limits=2, user_api="blas")  # as on a 2-core machine, whatever this one has
from joulesched.agent.registry import make_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload

def blas():
    return sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})

pol = make_policy(sys.argv[1])
built = blas()
copy = pickle.loads(pickle.dumps(pol))  # as a worker process receives it
sc = load_scenario("scenarios/tiny.yaml")
copy.reset(Twin(sc, build_workload(sc)).state, np.random.default_rng(0))
print(built, blas())
"""


@pytest.mark.parametrize(("spec", "want"), [("dqn=models/v2.pt", "[2] [1]"), ("dqn=models/v2.pt:threads=0", "[2] [2]")])
def test_a_run_caps_numpys_blas_pool_at_the_policys_threads(spec, want):
    """The decision path's matmuls are numpy's: OpenBLAS's pool of one thread per core busy-waits beside
    serve's informer and binding threads (0.6 of a core at 5,000 nodes), so ``threads`` caps it too, when a run
    starts (reset), also in a copy sent to another process, and not when a policy is only built (a spec
    checked); 0 leaves it alone. In a fresh interpreter: the cap is process-wide."""
    out = subprocess.run([sys.executable, "-c", _BLAS_THREADS, spec], capture_output=True, text=True, cwd=ROOT,
                         check=True, timeout=120).stdout.strip().splitlines()[-1]
    assert out == want
