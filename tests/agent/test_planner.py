"""The rollout planner (agent/planner.py, issue 27): on the true future it never does worse than its base (the
rollout improvement property, on the deterministic twin); on sampled futures its decisions read no duration the
run has not seen; where there is no workload model it is its base; its options are checked."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from joulesched.agent import planner as ro
from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import BEST_HEURISTIC_CANDIDATES, DEFAULT_POLICIES, entry, make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from tests.support.decisions import decisions, drive, unseen_durations

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "scenarios" / "small"
BASE = "awake-first:fit=efficient"


def _energy(sc, wl, spec: str) -> float:
    return run_policy(Twin(sc, wl), make_policy(spec)).energy_joules


@pytest.mark.parametrize(("name", "k"), [("sleep-homogeneous", 1), ("sleep-mixed", 2)])
def test_oracle_rollout_never_above_its_base(name, k):
    """With the true future and a deterministic twin, one-step lookahead over the base's continuation can only
    improve on the base (Bertsekas's rollout property). On these workloads it improves by more than 0.5 %."""
    sc = load_scenario(SMALL / f"{name}.yaml")
    wl = build_workload(sc, sc.seed + k)
    base = _energy(sc, wl, BASE)
    oracle = _energy(sc, wl, f"rollout-oracle:base={BASE}")
    assert oracle <= base * (1 + 1e-9)
    assert oracle < 0.995 * base


def test_parallel_rollout_never_above_its_best_base():
    """With several bases (``base=a|b``) each candidate is continued by the base that does it cheapest, and each
    base's own choice is a candidate: on the true future the run costs no more than the best base. On
    small-sleep-mixed seed 101 awake-first never wakes the low-idle nodes, energy-greedy does: the parallel
    rollout beats both bases and the rollout over awake-first alone (which stays at its base there)."""
    sc = load_scenario(SMALL / "sleep-mixed.yaml")
    wl = build_workload(sc, sc.seed)
    bases = {b: _energy(sc, wl, b) for b in (BASE, "energy-greedy")}
    one = _energy(sc, wl, f"rollout-oracle:base={BASE}")
    both = _energy(sc, wl, f"rollout-oracle:base={BASE}|energy-greedy")
    assert both <= min(bases.values()) * (1 + 1e-9)
    assert both < 0.99 * one


def test_a_planning_budget_keeps_the_best_base_and_plans_less():
    """``budget_s``: once spent, each pod goes where the base chosen by the last planned decision puts it, so on
    the true future the run still costs no more than the best base, with far fewer rollouts."""
    sc = load_scenario(SMALL / "sleep-mixed.yaml")
    wl = build_workload(sc, sc.seed)
    spec = f"rollout-oracle:base={BASE}|energy-greedy"
    full, cut = make_policy(spec), make_policy(f"{spec},budget_s=0.05")
    e_full = run_policy(Twin(sc, wl), full).energy_joules
    e_cut = run_policy(Twin(sc, wl), cut).energy_joules
    best = min(_energy(sc, wl, b) for b in (BASE, "energy-greedy"))
    assert e_cut <= best * (1 + 1e-9) and e_full <= best * (1 + 1e-9)
    assert 0 < cut.rollouts < full.rollouts


def test_a_base_that_reads_the_pods_metadata():
    """lifetime-aware (its predictor keyed by the pod's metadata) as the base: the planner and its rollouts hand
    it the metadata, and the rollout property holds."""
    sc = load_scenario(SMALL / "sleep-mixed.yaml")
    wl = build_workload(sc, sc.seed + 1)
    base = _energy(sc, wl, "lifetime-aware")
    oracle = _energy(sc, wl, "rollout-oracle:base=lifetime-aware")
    assert oracle <= base * (1 + 1e-9) and oracle < 0.995 * base


def test_sampled_futures_read_no_unseen_duration():
    """Shuffle the durations of every pod arriving from the cut on and lengthen those running across it: every
    decision before the cut stays, for both online futures (the bootstrap and the generator's model)."""
    sc = load_scenario(SMALL / "sleep-homogeneous.yaml")
    wl = build_workload(sc, sc.seed + 1)
    twin = Twin(sc, wl)
    run_policy(twin, make_policy(BASE))
    t_cut, dur, before = unseen_durations(wl, twin, cut=20, min_running=3)
    for spec in ("rollout:future=sample,samples=4,seed=3", "rollout:future=model,samples=4,seed=3"):
        first = decisions(Twin(sc, wl), make_policy(spec), 7, until=t_cut)
        again = decisions(Twin(sc, dataclasses.replace(wl, duration_s=dur)), make_policy(spec), 7, until=t_cut)
        assert [n for n, b in zip(again, before) if b] == [n for n, b in zip(first, before) if b], spec
    # The probe can fail: the oracle reads the future, and its decisions before the cut move.
    o1 = decisions(Twin(sc, wl), make_policy("rollout-oracle"), 7, until=t_cut)
    o2 = decisions(Twin(sc, dataclasses.replace(wl, duration_s=dur)), make_policy("rollout-oracle"), 7, until=t_cut)
    assert [n for n, b in zip(o1, before) if b] != [n for n, b in zip(o2, before) if b]


def test_no_model_on_a_trace_replay_is_the_base():
    """A trace replay has no generator to draw other futures from: ``future=model`` decides as its base, pod for
    pod, and plays nothing forward."""
    sc = load_scenario(SMALL / "trace-sleep.yaml")
    wl = build_workload(sc)
    pol = make_policy("rollout:future=model,samples=4")
    t1, t2 = Twin(sc, wl), Twin(sc, wl)
    run_policy(t1, pol)
    run_policy(t2, make_policy(BASE))
    assert t1.pod_node == t2.pod_node
    assert pol.rollouts == 0


def test_model_future_keeps_the_past_and_draws_the_rest():
    """A future of ``future=model`` holds every arrived pod's row (requests, submit time, an ended pod's
    duration), gives each pod still running a life at least its age, and adds pods only after now."""
    sc = load_scenario(SMALL / "sleep-mixed.yaml")
    wl = build_workload(sc, sc.seed)
    tw = Twin(sc, wl)
    pol = make_policy("rollout:future=model,samples=2")
    pol.attach(tw)
    tw.begin()
    pol.reset(tw.state, np.random.default_rng(0))
    for _ in range(15):
        d = tw.next_decision()
        tw.bind(d, pol.choose(d.state, d.pod, d.mask))
    d = tw.next_decision()
    k, now = tw._next_arrival, tw.now
    fut, fixed = pol._future()
    assert np.array_equal(fut.submit_s[:k], wl.submit_s[:k]) and np.array_equal(fut.cpu_req[:k], wl.cpu_req[:k])
    assert (fut.submit_s[k:] > now).all()
    status, start = np.asarray(tw.pod_status[:k]), np.asarray(tw.pod_start[:k])
    done = status == ro._DONE
    assert done.any() and (~done).any()
    assert np.array_equal(fut.duration_s[:k][done], wl.duration_s[:k][done])
    running = ~done & ~np.isnan(start)
    assert (start[running] + fut.duration_s[:k][running] > now).all()
    assert fixed == {p: n for p, n in enumerate(tw.pod_node[:k]) if n >= 0}
    pol.detach(tw)


def test_censored_fit_recovers_a_lognormal():
    """EM on lives and ages (lives known only to exceed them) finds the lognormal's parameters where the ended
    lives alone would not: half the pods are still running, the long-lived ones more often."""
    rng = np.random.default_rng(1)
    life = np.exp(math.log(600) + 0.9 * rng.standard_normal(4000))
    age = rng.uniform(0, 2000, 4000)
    ended = life <= age
    mu, sigma = ro.censored_lognormal(life[ended], age[~ended], prior_s=60.0, prior_n=1.0)
    assert abs(mu - math.log(600)) < 0.08 and abs(sigma - 0.9) < 0.08
    naive = np.log(life[ended]).mean()
    assert naive < math.log(600) - 0.2  # what ignoring the running pods would say


def test_sample_lives_respect_age_and_cap():
    rng = np.random.default_rng(0)
    ages = np.array([0.0, 10.0, 500.0, 5000.0])
    lives = np.stack([ro.sample_lives(rng, math.log(300), 1.0, ages, cap=3000.0) for _ in range(200)])
    assert (lives > ages).all()
    assert (lives[:, :3] <= 3000.0).all()
    assert np.allclose(lives[:, 3], 5000.0 + 1e-3)


def test_options_and_backends():
    with pytest.raises(PolicyError, match="future"):
        make_policy("rollout:future=psychic")
    with pytest.raises(PolicyError, match="base"):
        make_policy("rollout:base=clairvoyant")
    with pytest.raises(PolicyError, match="base=.*nonesuch"):
        make_policy("rollout:base=pabfd|nonesuch")
    with pytest.raises(PolicyError, match="samples"):
        make_policy("rollout:samples=0")
    with pytest.raises(PolicyError, match="twin only"):
        make_policy("rollout").attach(object())
    with pytest.raises(PolicyError, match="not attached"):
        sc = load_scenario(SMALL / "sleep-mixed.yaml")
        tw = Twin(sc, build_workload(sc))
        tw.begin()
        d = tw.next_decision()
        make_policy("rollout").choose(d.state, d.pod, d.mask)
    # Twin only and costly: in no best-heuristic comparison and not in the default set.
    assert entry("rollout").family == "planner" and entry("rollout-oracle").family == "clairvoyant"
    assert "rollout" not in BEST_HEURISTIC_CANDIDATES and "rollout" not in DEFAULT_POLICIES


def test_every_predictor_base_of_a_planner_is_fed_the_runs_pods():
    """The twin had one observer slot: with two predictor bases only the last attached learned from the run, the
    other chose with prior-only predictions (a review). Each is now told of every bind and end, and a base's
    detach leaves the others subscribed."""
    sc = load_scenario(ROOT / "scenarios" / "tiny.yaml")
    tw = Twin(sc, build_workload(sc, sc.seed))
    plan = make_policy("rollout:base=lifetime-aware|lifetime-aware:empty=asleep,samples=1")
    plan.attach(tw)
    p0, p1 = (b.feed.predictor for b in plan.bases)
    drive(tw, "awake-first", 100)
    assert p0.running == p1.running > 0 and p0.model.observed == p1.model.observed > 0
    plan.bases[0].detach(tw)
    assert tw.pod_observer is p1


@pytest.mark.parametrize("future", ["sample", "model"])
def test_online_futures_read_no_usage_profile_ahead(future):
    """A profiled pod's steps are its future demand: the online futures dropped only the unseen pods' usage_m,
    which a profiled pod does not read, so services' diurnal profiles were replayed as they are (a review). In a
    future now, every pod that has not run, and every running one, holds a constant demand: the running ones'
    what they show now."""
    sc = load_scenario(ROOT / "scenarios" / "services-diurnal-sleep.yaml")
    wl = build_workload(sc, sc.seed)
    assert (wl.profile >= 0).any()
    tw = Twin(sc, wl)
    plan = make_policy(f"rollout:future={future},samples=1,seed=1")
    plan.attach(tw)
    plan._twin = tw
    drive(tw, "awake-first", 150)
    k = tw._next_arrival
    status = np.asarray(tw.pod_status[:k])
    running = np.flatnonzero((status != 3) & ~np.isnan(np.asarray(tw.pod_start[:k], dtype=np.float64)))
    assert (wl.profile[running] >= 0).any()
    out, _ = plan._future()
    assert (out.profile[:k][status != 3] < 0).all()  # an ended pod's profile is its past: seen
    if future == "sample":  # the pods to come are the run's, resampled; with "model" a fresh draw of the generators
        assert (out.profile[k:] < 0).all()
    np.testing.assert_allclose(out.usage_m[running], tw.current_usage(running))
