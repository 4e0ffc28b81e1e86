"""The predictor's incremental node view (issue 28) equals the from-scratch computation it replaced.

Random binds, ends (completed and censored), re-binds of a running pod, node re-indexing and queries at
random times go to one predictor; after each step its incremental :meth:`PodPredictor.nodes` is compared
with :meth:`PodPredictor.nodes_scratch` (every running pod read afresh), which is the code that ran before."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.agent.predictor import PodPredictor
from joulesched.cluster.workload import PodMeta

METAS = [PodMeta(kind="job", owner_kind="Job", app=f"app{i}", qos_class="Burstable") for i in range(4)] + [
    PodMeta(kind="service", owner_kind="Deployment", app="web", qos_class="Guaranteed"), None]


def _check(pred: PodPredictor, now: float, n: int) -> None:
    e_inc, s_inc = pred.nodes(now, n)
    e_ref, s_ref = pred.nodes_scratch(now, n)
    np.testing.assert_allclose(e_inc, e_ref, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(s_inc, s_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_view_equals_the_rebuild_on_random_event_sequences(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    names = [f"n{i}" for i in range(n)]
    pred = PodPredictor(horizon_s=float(rng.choice([30.0, 600.0])))
    pred.set_nodes(names)
    running: list[int] = []
    next_key = 0
    now = 0.0
    checks = renames = 0
    for _ in range(1500):
        now += float(rng.exponential(rng.choice([0.3, 5.0, 200.0])))
        r = rng.random()
        if r < 0.45 or not running:
            cpu = float(rng.choice([0.0, 100.0, 250.0, 1000.0, 1234.5]))
            meta = METAS[int(rng.integers(len(METAS)))]
            # a start slightly in the past, as the cluster feed reports it
            pred.bound(now - float(rng.uniform(0, 0.5)), next_key, int(rng.integers(n)), meta, cpu,
                       learn=bool(rng.random() < 0.9))
            running.append(next_key)
            next_key += 1
        elif r < 0.75:
            key = running.pop(int(rng.integers(len(running))))
            pred.ended(now, key, completed=bool(rng.random() < 0.8))
        elif r < 0.8:  # a running pod seen bound again (moved): replaced
            key = running[int(rng.integers(len(running)))]
            pred.bound(now, key, int(rng.integers(n)), METAS[0], 500.0)
        elif r < 0.82:  # the node set changes: one node goes, the rest are re-ordered
            gone = names[int(rng.integers(len(names)))]
            names = [x for x in names if x != gone]
            rng.shuffle(names)
            renames += 1
            names.append(f"new{renames}")
            assert len(set(names)) == n
            pred.set_nodes(names)
            alive = set(pred._pos)
            running = [k for k in running if k in alive]
        if rng.random() < 0.6:
            _check(pred, now, len(names) + int(rng.integers(0, 3)))
            checks += 1
    assert checks > 500
    assert pred.model.observed > 50  # the table changed many times on the way


def test_view_follows_ageing_pods_without_events():
    """No bind or end between the queries: only the pods' ages move (bin edges, the horizon flag)."""
    pred = PodPredictor(horizon_s=600.0)
    for life in [100.0] * 30 + [10_000.0] * 30:
        pred.model.observe(pred.kid_of(METAS[0]), life)
    for i in range(50):
        pred.bound(float(i), i, i % 7, METAS[i % 3], 100.0 * (1 + i % 4))
    for now in np.concatenate((np.linspace(50, 20_000, 400), [20_000.0, 20_000.0])):  # a repeated time too
        _check(pred, float(now), 7)


def test_a_query_back_in_time_or_before_a_start_is_answered_from_scratch():
    pred = PodPredictor()
    pred.bound(0.0, "a", 0, METAS[0], 100.0)
    pred.bound(10.0, "b", 1, METAS[1], 100.0)
    _check(pred, 5_000.0, 2)
    _check(pred, 100.0, 2)  # earlier than the last query
    pred.bound(20_000.0, "c", 1, METAS[1], 100.0)  # starts after the next query
    _check(pred, 6_000.0, 2)
    _check(pred, 30_000.0, 3)
