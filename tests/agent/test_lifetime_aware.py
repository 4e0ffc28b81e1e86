"""The lifetime-aware packer (agent/lifetime_aware.py): its keys worked out by hand on the online predictor, its
ablation (no prediction is exactly awake-first:fit=efficient), honesty (no decision reads a duration the run has
not seen), bad options, and its place in every best-heuristic comparison."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from joulesched.agent.lifetime_aware import log2_class
from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import BEST_HEURISTIC_CANDIDATES, DEFAULT_POLICIES, family_of, make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import ClusterState, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import PodMeta, build_workload
from tests.support.decisions import decisions, unseen_durations
from tests.support.predictor import taught_policy

ROOT = Path(__file__).resolve().parents[2]
LINEAR = [100.0 + 10.0 * k for k in range(11)]
LONG = PodMeta(kind="job", owner_kind="Job", app="train", qos_class="Burstable")
SHORT = PodMeta(kind="job", owner_kind="Job", app="etl", qos_class="Burstable")
NEW = PodMeta(kind="job", owner_kind="Job", app="report", qos_class="Burstable")


def _cluster(n=3):
    return ClusterState([f"n{i}" for i in range(n)], [8000] * n, [65536] * n, [110] * n, [LINEAR] * n,
                        sleep_watts=[5.0] * n, can_sleep=True, wake_s=60)


def _policy(st, lives):
    return taught_policy("lifetime-aware", st, lives)


def _bind(st, pred, node, key, meta, cpu):
    st.bind(node, PodRequest(cpu, 100))
    pred.bound(st.now, key, node, meta, float(cpu))


def test_a_long_pod_goes_where_it_adds_no_awake_time_not_to_the_tighter_fit():
    st = _cluster()
    pol, pred = _policy(st, {LONG: [36000.0] * 20, SHORT: [300.0] * 20, NEW: [7200.0] * 20})
    _bind(st, pred, 0, "a", LONG, 2000)  # stays up ~10 h
    _bind(st, pred, 1, "b", SHORT, 3000)  # empties in ~5 min; the tighter fit
    pod = PodRequest(1000, 100)
    mask = st.feasible(pod)
    assert make_policy("awake-first:fit=efficient").choose(st, pod, mask) == 1
    # A 2-hour pod on n1 would keep it awake ~2 h longer; on n0 it adds nothing.
    assert pol.choose(st, pod, mask, meta=NEW) == 0


def test_pods_that_end_together_share_a_node_within_a_fit_class():
    st = _cluster()
    pol, pred = _policy(st, {LONG: [36000.0] * 20, SHORT: [1200.0] * 20, NEW: [600.0] * 20})
    _bind(st, pred, 0, "a", LONG, 2000)  # empties in ~10 h
    _bind(st, pred, 1, "b", SHORT, 1800)  # empties in ~20 min
    pod = PodRequest(500, 100)
    mask = st.feasible(pod)
    # Free CPU after placement: n0 5500/8000, n1 5700/8000, one fit class (of 8). Best fit says n0; the
    # 10-minute pod outlives neither, and n1 empties soonest after it.
    assert make_policy("awake-first:fit=efficient").choose(st, pod, mask) == 0
    assert pol.choose(st, pod, mask, meta=NEW) == 1
    scores = pol.node_scores(st, pod, np.flatnonzero(mask), meta=NEW)
    assert scores.rule == "lexicographic" and list(scores.plugins)[:4] == [
        "Tier", "ExtendJ", "WattsPerCoreAwake", "FitClass"]
    assert int(scores.idx[np.argmax(scores.total)]) == 1


def test_log2_classes():
    assert log2_class(np.array([0.0, 60.0, 61.0, 119.0, 120.0, 240.0]), 60.0).tolist() == [0, 0, 1, 1, 2, 3]


def test_without_prediction_it_is_exactly_awake_first_efficient():
    sc = load_scenario(ROOT / "tests" / "support" / "scenarios" / "heldout-hetero-sleep-12.yaml")
    wl = build_workload(sc, 3)
    a, b, c = Twin(sc, wl), Twin(sc, wl), Twin(sc, wl)
    run_policy(a, make_policy("awake-first:fit=efficient"), 3)
    run_policy(b, make_policy("lifetime-aware:prediction=0"), 3)
    run_policy(c, make_policy("lifetime-aware"), 3)
    assert list(a.pod_node) == list(b.pod_node)
    # The prediction moves decisions (else the policy would be a renamed packer).
    assert list(c.pod_node) != list(a.pod_node)


def test_decisions_never_depend_on_durations_not_yet_seen():
    """As the DQN's test (tests/agent/test_predictor.py): shuffle future pods' durations and lengthen the running
    ones; every placement decided before the cut stays the same."""
    sc = load_scenario(ROOT / "scenarios" / "heterogeneous-sleep.yaml")
    wl = build_workload(sc, 77)
    twin = Twin(sc, wl)
    base = decisions(twin, make_policy("lifetime-aware"), 77)
    t_cut, dur, before = unseen_durations(wl, twin)
    again = decisions(Twin(sc, dataclasses.replace(wl, duration_s=dur)), make_policy("lifetime-aware"), 77,
                      until=t_cut)
    assert [n for n, b in zip(again, before) if b] == [n for n, b in zip(base, before) if b]


@pytest.mark.parametrize("spec, words", [
    ("lifetime-aware:prediction=maybe", "prediction='maybe' is not an integer"),
    ("lifetime-aware:horizon_s=600", "horizon_s"),  # gone: it changed no decision of this rule
    ("lifetime-aware:fit_classes=0", "fit_classes=0 must be in 1..1000"),
    ("lifetime-aware:fit_classes=x", "fit_classes='x' is not an integer"),
    ("lifetime-aware:headroom=2", "headroom=2 must be in (0, 1]"),
])
def test_bad_options_name_the_problem(spec, words):
    with pytest.raises(PolicyError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        make_policy(spec)


def test_it_is_a_sleep_aware_heuristic_in_every_best_heuristic_comparison():
    assert family_of("lifetime-aware") == "sleep-aware"
    assert "lifetime-aware" in BEST_HEURISTIC_CANDIDATES and "lifetime-aware" in DEFAULT_POLICIES


def test_on_a_cluster_it_learns_from_the_cache_pod_events():
    """A live backend has no observe_pods: the policy subscribes once to its cache and drains the events when it
    decides, so a pod's bind and deletion reach the predictor before the next choice."""
    from types import SimpleNamespace

    from joulesched.cluster.kube.objects import PodInfo

    listeners = []
    backend = SimpleNamespace(cache=SimpleNamespace(add_pod_listener=listeners.append))
    pol = make_policy("lifetime-aware")
    pol.attach(backend)
    pol.attach(backend)  # a second run on the same cache: still one subscription
    assert len(listeners) == 1
    st = _cluster(2)
    pol.reset(st, np.random.default_rng(0))

    def info(node="", phase="Pending"):
        return PodInfo(uid="a", namespace="default", name="a", node_name=node, scheduler_name="joulesched",
                       request=PodRequest(500, 512), phase=phase, deleting=False, meta=LONG)

    feed = listeners[0]
    feed(None, info())
    feed(info(), info("n1", "Running"))
    pod = PodRequest(500, 100)
    pol.choose(st, pod, st.feasible(pod), meta=NEW)
    assert pol.feed.predictor.running == 1
    feed(info("n1", "Running"), None)
    pol.choose(st, pod, st.feasible(pod), meta=NEW)
    assert pol.feed.predictor.running == 0 and pol.feed.predictor.model.observed == 1
