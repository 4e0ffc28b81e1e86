"""Compacted replay states (agent/dqn.py ``compact_state``): each state's distinct rows with the number of nodes
they stand for. The networks must read them as the full state, the update must take the full state's gradient,
the buffer must hold them under its memory cap, and rollouts must record them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import joulesched.agent.dqn as dqn_mod
from joulesched.agent.config import DQNConfig, RewardConfig
from joulesched.agent.dqn import (DQN, QNetwork, ReplayBatch, ReplayBuffer, SetQNetwork, Transitions, compact_state,
                                  margin_loss)
from joulesched.agent.features import N_FEATURES, n_features
from joulesched.agent.train import EpisodeSpec, RolloutTask, rollout
from joulesched.cluster.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
HOMOGENEOUS = ROOT / "scenarios" / "homogeneous.yaml"


def _state_with_copies(rng: np.random.Generator, n: int, f: int, kinds: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows drawn from ``kinds`` distinct ones plus a few unique rows, float16, shared context columns."""
    base = rng.uniform(-1, 3, size=(kinds, f)).astype(np.float16)
    rows = base[rng.integers(kinds, size=n)].copy()
    rows[: n // 5] = rng.uniform(-1, 3, size=(n // 5, f)).astype(np.float16)  # busy nodes: each its own row
    rows[:, -3:] = rows[0, -3:]
    mask = rng.random(n) < 0.7
    return rows, mask


def test_a_compacted_state_rebuilds_the_state_in_first_seen_order():
    rows, mask = _state_with_copies(np.random.default_rng(1), 200, 12)
    rows[150] = rows[151]
    mask[150], mask[151] = True, False  # the same features, one feasible and one not: two rows
    r, m, c, inv = compact_state(rows, mask)
    assert r.shape[0] < 200 and c.sum() == 200
    np.testing.assert_array_equal(r[inv], rows)
    np.testing.assert_array_equal(m[inv], mask)
    assert inv[150] != inv[151]
    first = [int(np.flatnonzero(inv == j)[0]) for j in range(r.shape[0])]
    assert first == sorted(first)  # rows in the order of their first node
    r0, m0, c0, inv0 = compact_state(rows, mask, dedup=False)
    assert r0.shape[0] == 200 and (c0 == 1).all() and (inv0 == np.arange(200)).all()


def test_a_hash_collision_falls_back_to_the_exact_comparison(monkeypatch):
    rows, mask = _state_with_copies(np.random.default_rng(2), 60, 9)
    want = compact_state(rows, mask)
    monkeypatch.setattr(dqn_mod, "_ROW_HASH", np.zeros(1024, dtype=np.uint64))  # every row hashes alike
    got = compact_state(rows, mask)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def _batch(states: list[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    return dqn_mod._pad(states)


@pytest.mark.parametrize("make", [
    lambda: SetQNetwork(n_features(3)[0], n_features(3)[1], 24, attention=True, inducing=3, attention_dim=8,
                        head_hidden=8),
    lambda: SetQNetwork(n_features(3)[0], n_features(3)[1], 24, attention=False),
    lambda: QNetwork(16),
], ids=["set-attention", "set-no-attention", "schema-1"])
def test_the_networks_read_a_compacted_state_as_the_full_one(make):
    torch.manual_seed(3)
    net = make()
    f = net.n_features if hasattr(net, "n_features") else N_FEATURES
    rng = np.random.default_rng(3)
    full, comp, invs = [], [], []
    for n in (90, 40):  # two clusters of different sizes in one padded batch
        rows, mask = _state_with_copies(rng, n, f)
        full.append((rows, mask, np.ones(n, np.int32)))
        r, m, c, inv = compact_state(rows, mask)
        comp.append((r, m, c))
        invs.append(inv)
    x, m, v, _ = _batch(full)
    xc, mc, vc, cc = _batch(comp)
    with torch.no_grad():
        q = net(torch.from_numpy(x), torch.from_numpy(m), torch.from_numpy(v))
        qc = net(torch.from_numpy(xc), torch.from_numpy(mc), torch.from_numpy(vc), torch.from_numpy(cc))
    for b, inv in enumerate(invs):
        n = inv.size
        feas = m[b, :n]
        np.testing.assert_allclose(qc[b, inv].numpy()[feas], q[b, :n].numpy()[feas], rtol=1e-4, atol=1e-4)
        assert int(qc[b].argmax()) == int(inv[int(q[b].argmax())])


def test_an_update_on_compacted_states_takes_the_full_states_gradient():
    cfg = DQNConfig(feature_schema=3, hidden=16, attention_dim=8, head_hidden=8, batch_size=2, buffer_size=4,
                    learning_rate=1e-3, bc_margin=0.1)
    f = n_features(3)[0]
    rng = np.random.default_rng(4)
    s, s2 = [], []
    for n in (70, 50):
        for out in (s, s2):
            rows, mask = _state_with_copies(rng, n, f)
            mask[:3] = True
            out.append((rows, mask))
    actions, teacher = np.array([1, 2]), np.array([0, 2])

    def batch(dedup: bool) -> ReplayBatch:
        a, nx = [compact_state(r, m, dedup) for r, m in s], [compact_state(r, m, dedup) for r, m in s2]
        x, m, v, c = _batch([t[:3] for t in a])
        nx_, nm, nv, nc = _batch([t[:3] for t in nx])
        t = torch.from_numpy
        return ReplayBatch(t(x), t(m), t(np.array([a[b][3][actions[b]] for b in range(2)])), torch.tensor([0.5, -1.0]),
                           t(nx_), t(nm), torch.tensor([0.9, 0.8]), t(v),
                           t(np.array([a[b][3][teacher[b]] for b in range(2)])), t(nv), t(c), t(nc))

    agents = [DQN(cfg, seed=5), DQN(cfg, seed=5)]
    losses = [ag.update(batch(d), bc_weight=0.5) for ag, d in zip(agents, (False, True))]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    # The gradients (Adam's step would magnify the rounding noise of a parameter whose true gradient is 0: the
    # attention keys' bias, which shifts every node's logit alike).
    for (k, p0), p1 in zip(agents[0].q.named_parameters(), agents[1].q.parameters()):
        torch.testing.assert_close(p0.grad, p1.grad, rtol=1e-3, atol=1e-6, msg=k)
    assert float(agents[0].q.value[2].bias.grad.abs()) > 1e-3  # a real step, not two zero gradients


def test_the_margin_loss_counts_the_teachers_identical_nodes():
    """A node identical to the teacher's is another action: uncompacted it takes the margin, so where the teacher's
    node leads, the loss is the margin and its gradient 0. Compacted, the teacher's row stands for both and must
    keep that margin (it did not: a margin-only step then pushed the network where the full state's does not)."""
    q = torch.tensor([[1.0, 1.0, 0.2]])
    assert margin_loss(q, torch.tensor([0]), 0.5).item() == pytest.approx(0.5)  # node 1 is node 0's twin
    qc, counts = torch.tensor([[1.0, 0.2]]), torch.tensor([[2.0, 1.0]])
    assert margin_loss(qc, torch.tensor([0]), 0.5, counts).item() == pytest.approx(0.5)
    assert margin_loss(qc, torch.tensor([0]), 0.5).item() == 0.0  # what the count restores
    # bc_margin_twins=false: the twins are the teacher's choice; the margin is against the other row only.
    assert margin_loss(qc, torch.tensor([0]), 0.5, counts, twins=False).item() == 0.0
    assert margin_loss(torch.tensor([[1.0, 0.7]]), torch.tensor([0]), 0.5, counts, twins=False).item() == \
        pytest.approx(0.2)

    # Through an update: the teacher takes the network's own best node, whose row stands for several nodes.
    cfg = DQNConfig(feature_schema=3, hidden=16, attention_dim=8, head_hidden=8, batch_size=2, buffer_size=4,
                    learning_rate=1e-3, bc_margin=0.5, bc_margin_twins=True)  # exact: the full state's
    f = n_features(3)[0]
    rng = np.random.default_rng(7)
    states = []
    for n in (40, 30):
        base = rng.uniform(-1, 3, size=(5, f)).astype(np.float16)
        rows = base[np.arange(n) % 5].copy()  # every row has copies
        rows[:, -3:] = rows[0, -3:]
        states.append((rows, np.ones(n, dtype=bool)))

    def batch(dedup: bool, teacher: list[int]) -> ReplayBatch:
        a = [compact_state(r, m, dedup) for r, m in states]
        x, m, v, c = _batch([t[:3] for t in a])
        t = torch.from_numpy
        act = t(np.array([a[b][3][teacher[b]] for b in range(2)]))
        return ReplayBatch(t(x), t(m), act, torch.zeros(2), t(x), torch.zeros_like(t(m)), torch.zeros(2), t(v),
                           act.clone(), t(v), t(c), t(c))

    agents = [DQN(cfg, seed=3), DQN(cfg, seed=3)]
    full = batch(False, [0, 0])
    with torch.no_grad():
        teacher = agents[0].q(full.obs, full.mask, full.valid).argmax(-1).tolist()
    losses = [ag.update(batch(d, teacher), bc_weight=1.0, td_weight=0.0) for ag, d in zip(agents, (False, True))]
    assert losses[0] == pytest.approx(cfg.bc_margin, rel=1e-5) and losses[1] == pytest.approx(losses[0], rel=1e-5)
    for (k, p0), p1 in zip(agents[0].q.named_parameters(), agents[1].q.parameters()):
        torch.testing.assert_close(p0.grad, p1.grad, rtol=1e-3, atol=1e-6, msg=k)
    # The default: the twins are one choice with the teacher's, so where it leads by the margin the loss is below it.
    plain = DQN(dataclasses.replace(cfg, bc_margin_twins=False), seed=3)
    assert plain.update(batch(True, teacher), bc_weight=1.0, td_weight=0.0) < cfg.bc_margin


def _episode(steps: int, rows_per_state: int, mark: float) -> Transitions:
    f = 5
    states = steps + 1
    rows = np.full((states * rows_per_state, f), mark, dtype=np.float16)
    return Transitions(rows, np.ones(rows.shape[0], bool), np.full(rows.shape[0], 3, np.int32),
                       np.arange(states + 1, dtype=np.int64) * rows_per_state, np.zeros(steps, np.int64),
                       np.zeros(steps, np.int64), np.full(steps, mark, np.float32), np.ones(steps, np.float32),
                       np.minimum(np.arange(steps) + 2, steps), np.full(steps, -1, np.int64),
                       np.full(steps, -1, np.int64))


def test_the_buffer_keeps_the_newest_episodes_under_its_memory_cap():
    one = _episode(10, 4, 0.0).nbytes
    buf = ReplayBuffer(1_000, memory_bytes=int(2.5 * one))
    for e in range(5):
        buf.add_many(_episode(10, 4, float(e)))
    assert set(buf.episodes) == {3, 4} and len(buf) == 20 and buf.bytes <= 2.5 * one
    b = buf.sample(400, np.random.default_rng(0))
    assert set(b.returns.tolist()) == {3.0, 4.0}  # only what is held
    assert (b.counts[b.valid] == 3).all() and b.counts.shape == (400, 4)
    # By capacity: a full ring overwrites its oldest transitions and lets their episode go.
    ring = ReplayBuffer(15)
    for e in range(3):
        ring.add_many(_episode(10, 2, float(e)))
    assert len(ring) == 15 and set(ring.episodes) == {1, 2}
    assert set(ring.sample(300, np.random.default_rng(1)).returns.tolist()) == {1.0, 2.0}


def test_an_episode_larger_than_the_memory_cap_is_kept_whole_and_said(caplog):
    """Trimming went on into the newest episode until one transition was left (its states are freed only with
    its last one): every batch was 128 copies of it, and the RL phase never started (a review)."""
    one = _episode(10, 4, 0.0).nbytes
    buf = ReplayBuffer(1_000, memory_bytes=int(0.8 * one))
    with caplog.at_level("WARNING", logger="joulesched.agent.dqn"):
        for e in range(3):
            buf.add_many(_episode(10, 4, float(e)))
    assert set(buf.episodes) == {2} and len(buf) == 10  # the newest episode, all of it
    said = [r.getMessage() for r in caplog.records if "replay_memory_mb" in r.getMessage()]
    assert len(said) == 1 and "holds that episode alone" in said[0]


def test_a_ring_shorter_than_an_episode_keeps_its_last_steps():
    for capacity in (1, 2, 3):
        ring = ReplayBuffer(capacity)
        ring.add_many(_episode(5, 2, 1.0))
        ring.add_many(_episode(4, 2, 2.0))
        assert len(ring) == capacity and set(ring.episodes) == {1}
        assert sorted(int(s) for s in ring.step[:capacity]) == list(range(4 - capacity, 4))
        assert set(ring.sample(20, np.random.default_rng(0)).returns.tolist()) == {2.0}


def test_rollouts_store_each_state_once_with_its_node_counts():
    sc = load_scenario(HOMOGENEOUS)
    cfg = DQNConfig(max_episode_decisions=40)
    res = rollout(RolloutTask(EpisodeSpec(sc, 3, 1.0, 5, "homogeneous"), cfg, RewardConfig(), None, 1.0))
    tr = res.transitions
    rows0, mask0, counts0 = tr.state(0)
    assert rows0.shape[0] < sc.node_count and counts0.sum() == sc.node_count  # identical empty nodes: one row
    assert tr.rows.shape[0] < tr.n_states * sc.node_count // 2
    full = rollout(RolloutTask(EpisodeSpec(sc, 3, 1.0, 5, "homogeneous"), DQNConfig(max_episode_decisions=40,
                                                                                      compact_replay=False),
                               RewardConfig(), None, 1.0)).transitions
    assert (full.actions == tr.actions).all() and full.rows.shape[0] == tr.n_states * sc.node_count
    for k in range(tr.n_states - 1):  # the action's row is the action's node's row
        r, m, _ = tr.state(k)
        fr, fm, _ = full.state(k)
        np.testing.assert_array_equal(r[tr.action_rows[k]], fr[tr.actions[k]])
        np.testing.assert_array_equal(r[tr.teacher_rows[k]], fr[tr.teacher[k]])
        assert m[tr.action_rows[k]] and fm[tr.actions[k]]


def test_the_ablation_keeps_the_models_trained_before_compaction(tmp_path):
    """A pre-compaction arm's model (its recipe without the layout setting) is its arm's, not retrained; a model
    of an arm trained compacted is matched as written."""
    import json

    from bench.dqn_ablation import LEGACY, _done, _recipe

    model = tmp_path / "default-s0.pt"
    model.write_bytes(b"x")
    recipe = _recipe("default", 0, 40000)
    assert recipe["sets"][-len(LEGACY):] == list(LEGACY)
    old = dict(recipe, sets=[s for s in recipe["sets"] if s not in LEGACY])
    model.with_suffix(".recipe.json").write_text(json.dumps(old))
    assert _done(model, recipe)
    assert not _done(model, _recipe("default", 0, 80000))
    full = _recipe("gpu-full-teach-energy", 0, 1000)
    model.with_suffix(".recipe.json").write_text(json.dumps(full))
    assert _done(model, full)
    model.with_suffix(".recipe.json").write_text(json.dumps(dict(full, sets=[*full["sets"], *LEGACY])))
    assert not _done(model, full)


def test_a_model_saved_before_compaction_resumes_on_the_old_layout(tmp_path):
    from joulesched.agent.checkpoint import load_checkpoint, save_checkpoint

    assert load_checkpoint(ROOT / "models" / "v2.pt").config.compact_replay is False  # saved before it existed
    path = tmp_path / "new.pt"
    save_checkpoint(path, DQN(DQNConfig(feature_schema=3, hidden=16, attention_dim=8, head_hidden=8)), {})
    assert load_checkpoint(path).config.compact_replay is True
