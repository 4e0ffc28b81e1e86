"""The online lifetime and load predictor (agent/predictor.py): age-conditioned lifetimes per key with fallbacks,
re-prediction as pods age, the node view, the cluster feed, and honesty: decisions never depend on durations
the run has not seen yet."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from joulesched.agent.config import DQNConfig
from joulesched.agent.dqn import DQN
from joulesched.agent.dqn_policy import DQNPolicy
from joulesched.agent.predictor import KubePodFeed, LifetimeModel, PodPredictor
from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.objects import PodInfo
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import PodMeta, build_workload
from tests.support.decisions import decisions, unseen_durations

ROOT = Path(__file__).resolve().parents[2]
BATCH = PodMeta(kind="job", owner_kind="Job", app="batch", qos_class="Burstable")
OTHER = PodMeta(kind="job", owner_kind="Job", app="etl", qos_class="Burstable")
WEB = PodMeta(kind="service", owner_kind="Deployment", app="web", qos_class="Guaranteed", priority=1000)


def _model_with(lives: dict[PodMeta, list[float]], shrink: float = 3.0) -> tuple[PodPredictor, LifetimeModel]:
    pred = PodPredictor(shrink=shrink)
    for meta, ls in lives.items():
        kid = pred.kid_of(meta)
        for life in ls:
            pred.model.observe(kid, life)
    return pred, pred.model


def test_remaining_life_is_conditioned_on_age():
    """Half the pods live 100 s, half 10,000 s: an arriving pod expects the mean; one that has lived 200 s is
    one of the long ones and expects the rest of 10,000 s."""
    pred, _ = _model_with({BATCH: [100.0] * 50 + [10_000.0] * 50})
    assert pred.pod_remaining(BATCH, 0.0) == pytest.approx(5_050, rel=0.05)
    assert pred.pod_remaining(BATCH, 200.0) == pytest.approx(9_800, rel=0.05)
    assert pred.pod_remaining(BATCH, 50.0) < pred.pod_remaining(BATCH, 200.0)


def test_an_unseen_key_falls_back_to_its_class_and_a_seen_key_to_its_own():
    pred, _ = _model_with({BATCH: [60.0] * 200, WEB: [20_000.0] * 200})
    # etl has never ended: it is predicted as the jobs of its class (owner, priority, QoS), not as the services.
    assert pred.pod_remaining(OTHER, 0.0) == pytest.approx(60, rel=0.1)
    assert pred.pod_remaining(WEB, 0.0) == pytest.approx(20_000, rel=0.05)
    # A few observations of its own move it most of the way (shrinkage: 20 against a pseudo-count of 3).
    for _ in range(20):
        pred.model.observe(pred.kid_of(OTHER), 3_000.0)
    assert 2_000 < pred.pod_remaining(OTHER, 0.0) < 3_000


def test_lindy_prior_before_any_pod_has_ended():
    pred = PodPredictor(prior_s=600.0)
    assert pred.pod_remaining(BATCH, 0.0) == pytest.approx(600.0)
    for age in (1_000.0, 10_000.0, 100_000.0):
        r = pred.pod_remaining(BATCH, age)
        assert 0.4 * age <= r <= 1.5 * age, (age, r)  # as long again as it has lived, roughly


def test_running_pods_are_re_predicted_as_they_age():
    """LAVA: a pod that outlives the short mode is re-read from the tail; the node's time to empty follows."""
    pred, _ = _model_with({BATCH: [100.0] * 50 + [10_000.0] * 50})
    pred.set_nodes(["a", "b"])
    pred.bound(0.0, "p", 0, BATCH, 1000.0)
    early, _ = pred.nodes(50.0, 2)
    late, _ = pred.nodes(300.0, 2)
    assert early[1] == 0.0 and late[1] == 0.0  # node b holds nothing
    assert early[0] == pytest.approx(5_000, rel=0.06)
    assert late[0] == pytest.approx(9_700, rel=0.06)


def test_node_view_and_load_share():
    pred, _ = _model_with({BATCH: [100.0] * 100, WEB: [50_000.0] * 100})
    pred.set_nodes(["a", "b", "c"])
    pred.bound(0.0, "j1", 0, BATCH, 1000.0)
    pred.bound(0.0, "s1", 0, WEB, 3000.0)
    pred.bound(0.0, "j2", 1, BATCH, 500.0)
    empty_in, stay = pred.nodes(10.0, 3)
    assert empty_in[0] == pytest.approx(50_000 - 10, rel=0.05)  # the service keeps node a busy
    assert empty_in[1] == pytest.approx(90, rel=0.2) and empty_in[2] == 0.0
    # In 10 minutes only the service's 3000 m of the 4000 m requested on node a are predicted to remain.
    assert stay[0] == pytest.approx(0.75) and stay[1] == 0.0 and stay[2] == 1.0
    pred.ended(100.0, "j1")
    assert pred.running == 2 and pred.model.observed == 201


def test_evicted_or_cut_off_pods_teach_nothing():
    pred = PodPredictor()
    pred.set_nodes(["a"])
    pred.bound(0.0, "p", 0, BATCH, 100.0)
    pred.ended(500.0, "p", completed=False)
    assert pred.model.observed == 0 and pred.running == 0
    pred.ended(600.0, "never-bound")  # unknown pods are ignored
    assert pred.model.observed == 0


def test_arrival_rate_and_trend():
    pred = PodPredictor()
    pred.set_nodes(["a"])
    for k in range(100):  # one pod of 1000 m a second for 100 s
        pred.bound(float(k), k, 0, BATCH, 1000.0)
    load, trend = pred.arrivals(100.0, total_cpu_m=100_000.0)
    assert 0.0 < load < 1.0
    assert trend > 0.5  # the last 5 minutes are far busier than the last hour
    _, later = pred.arrivals(3_000.0, total_cpu_m=100_000.0)
    assert later < trend


def _info(uid: str, node: str = "", phase: str = "Pending", meta: PodMeta = BATCH) -> PodInfo:
    return PodInfo(uid=uid, namespace="default", name=uid, node_name=node, scheduler_name="joulesched",
                   request=PodRequest(500, 512), phase=phase, deleting=False, meta=meta)


def test_kube_feed_turns_cache_events_into_observations():
    """The cache's listener calls (old, new): a pod seen pending and then bound starts its life; its deletion
    ends it. A pod first seen already running is followed for its node but its lifetime (start unknown) is not
    learned."""
    now = [1000.0]
    feed = KubePodFeed(clock=lambda: now[0])
    pred = PodPredictor()
    pred.set_nodes(["n0", "n1"])
    feed(None, _info("a"))
    now[0] = 1010.0
    feed(_info("a"), _info("a", "n1", "Running"))
    feed(None, _info("old", "n0", "Running"))  # e.g. at start-up: already bound
    assert feed.drain(pred, now=10.0) == 2
    assert pred.running == 2
    now[0] = 1130.0
    feed(_info("a", "n1", "Running"), None)  # deleted (or gone Succeeded: the field selector drops it)
    feed(_info("old", "n0", "Running"), None)
    feed.drain(pred, now=130.0)
    assert pred.running == 0 and pred.model.observed == 1
    # It lived 120 s (bound at state time 10, ended at 130), and one end moves the prediction from the prior
    # (600 s) toward it.
    assert pred.model.levels[-1].sums.sum() == pytest.approx(120.0)
    assert 120 < pred.pod_remaining(BATCH, 0.0) < 600


def test_a_new_key_adds_its_row_without_rebuilding_the_table(monkeypatch):
    """Every new key (a CronJob's Job: a new owner name per run) rebuilt the whole table at the next decision,
    so decisions slowed with the keys seen (a review: 35 ms at 10,000). The row added alone is the row a rebuild
    computes, and the table is not rebuilt for it."""
    import dataclasses

    import numpy as np

    import joulesched.agent.predictor as predictor

    monkeypatch.setattr(predictor, "INCREMENTAL_KEYS", 0)  # as past 2,048 keys (every figure in the docs is below)
    model = LifetimeModel()
    rng = np.random.default_rng(3)
    for j in range(30):
        kid = model.key_id(dataclasses.replace(BATCH, app=f"app-{j % 7}", qos_class=("Burstable", "BestEffort")[j % 2]))
        model.observe(kid, float(rng.lognormal(5, 1.5)))
    model.table()
    fresh_at = model._fresh_at
    for j in range(50):  # new keys, sharing classes with the observed ones at the general levels
        model.key_id(dataclasses.replace(OTHER, app=f"cron-{j}", qos_class=("Burstable", "BestEffort")[j % 2]))
    assert model._fresh_at == fresh_at and model._table.shape[0] == len(model.kid)  # no rebuild pending
    appended = model.table().copy()
    model._fresh_at = -1
    assert np.allclose(model.table(), appended, rtol=1e-12, atol=0)
    kid = model.key_id(dataclasses.replace(OTHER, app="cron-0", qos_class="Burstable"))
    model.observe(kid, 42.0)  # its own first end: its row alone, as a rebuild would give it for that key
    alone = model._estimate(np.asarray([model._kid_rows[kid]]))[0]
    assert model._fresh_at >= 0 and model.table()[kid] == pytest.approx(alone)


def test_the_node_view_follows_a_row_updated_alone(monkeypatch):
    """Past INCREMENTAL_KEYS a key's row was rewritten in place: the node view, keyed on the table's identity,
    kept the running pods' old predicted ends (989 s where a view from scratch says 50,565 s; a review)."""
    import joulesched.agent.predictor as predictor

    monkeypatch.setattr(predictor, "INCREMENTAL_KEYS", 0)
    p = PodPredictor(horizon_s=600)
    metas = [PodMeta(app=f"a{i}") for i in range(100)]
    for i, m in enumerate(metas):
        p.bound(0.0, ("w", i), 0, m, 100)
    for i in range(100):
        p.ended(1000.0, ("w", i))
    for j in range(3):
        p.bound(1000.0, ("r", j), 1, metas[5], 100)
    p.nodes(1009.0, 3)
    for j in range(4):  # four lives of 100,000 s of that key: its row alone is recomputed
        p.bound(-98998.0, ("y", j), 2, metas[5], 100)
        p.ended(1010.0, ("y", j))
    view, scratch = p.nodes(1011.0, 3), p.nodes_scratch(1011.0, 3)
    assert view[0] == pytest.approx(scratch[0]) and view[0][1] > 10_000


def test_kube_feed_learns_nothing_from_an_evicted_pod_and_parse_pod_reads_the_condition():
    """A pod the node power controller's consolidation evicted was learnt as a whole life (the twin censors
    evictions): the DisruptionTarget condition kube sets on an evicted or preempted pod now censors it."""
    import dataclasses

    from joulesched.cluster.kube.objects import parse_pod

    now = [0.0]
    feed = KubePodFeed(clock=lambda: now[0])
    pred = PodPredictor()
    pred.set_nodes(["n0"])
    for uid in ("done", "evicted"):
        feed(None, _info(uid))
        feed(_info(uid), _info(uid, "n0", "Running"))
    feed.drain(pred, now=0.0)
    now[0] = 50.0
    feed(_info("done", "n0", "Running"), None)
    feed(dataclasses.replace(_info("evicted", "n0", "Running"), disrupted=True), None)
    feed.drain(pred, now=50.0)
    assert pred.running == 0 and pred.model.observed == 1
    # A kubelet's node-pressure eviction: Failed and DisruptionTarget in one update.
    feed(None, _info("pressed"))
    feed(_info("pressed"), _info("pressed", "n0", "Running"))
    feed.drain(pred, now=50.0)
    feed(_info("pressed", "n0", "Running"), dataclasses.replace(_info("pressed", "n0", "Failed"), disrupted=True))
    feed.drain(pred, now=60.0)
    assert pred.running == 0 and pred.model.observed == 1
    pod = {"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": {"nodeName": "n0"},
           "status": {"phase": "Running", "conditions": [
               {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}}
    assert parse_pod(pod).disrupted
    pod["status"]["conditions"][0]["status"] = "False"
    assert not parse_pod(pod).disrupted


# ---- honesty ----------------------------------------------------------------------------------------------------
def _v2_policy() -> DQNPolicy:
    torch.manual_seed(7)
    cfg = DQNConfig()
    return DQNPolicy(net=DQN(cfg, seed=7).q, config=cfg, threads=1)


def test_decisions_never_depend_on_durations_not_yet_seen():
    """Shuffle the true durations of every pod that arrives after time T, and lengthen the durations of the pods
    still running at T (so that they still end after T): every placement decided before T stays the same.
    Nothing before T can have seen those durations, unless a policy reads them from the twin."""
    sc = load_scenario(ROOT / "scenarios" / "heterogeneous-sleep.yaml")
    wl = build_workload(sc, 77)
    twin = Twin(sc, wl)
    base = decisions(twin, _v2_policy(), 77)
    t_cut, dur, before = unseen_durations(wl, twin)
    changed = Twin(sc, dataclasses.replace(wl, duration_s=dur))
    again = decisions(changed, _v2_policy(), 77, until=t_cut)
    assert [n for n, b in zip(again, before) if b] == [n for n, b in zip(base, before) if b]
    # The test can fail: a policy that reads the twin's departure times (schema 1's departure_soon column,
    # models/small.pt) moves decisions made before T.
    v1 = make_policy(f"dqn={ROOT / 'models' / 'small.pt'}")
    v1_base = decisions(Twin(sc, wl), v1, 77, until=t_cut)
    v1_again = decisions(Twin(sc, dataclasses.replace(wl, duration_s=dur)), v1, 77, until=t_cut)
    assert [n for n, b in zip(v1_again, before) if b] != [n for n, b in zip(v1_base, before) if b]
