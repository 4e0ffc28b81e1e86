"""Planning ahead online: a rollout policy (Bertsekas's rollout; model-predictive control) on the twin (issue 27).

At each decision with more than one distinct choice, ``rollout`` plays the run forward in a fresh twin once per
candidate node and per sampled future: the past replayed as it happened, the candidate taken for the deciding pod,
a base heuristic deciding every pod after it. Every candidate is scored on the same futures (common random
numbers); it keeps the base's choice unless another candidate's mean energy is lower by at least ``confidence``
standard errors of the paired differences (0, the default: the least mean). ``penalty`` charges waiting and SLO
violations in joules (0 by default: the twin's SLO and pending time are reported beside, not optimised).

Several bases (``base=a|b|...``, Bertsekas's parallel rollout): each base's own choice is a candidate, and each
candidate is scored with the base whose continuation is cheapest on average over the futures; on the true future
the run then costs no more than the best of the bases, whichever it is on that run.

What the futures are made of decides what the policy knows:

* ``future=model`` (the default): the workload's distribution, not the run. Each pod that has not ended lives as
  long as a pod of its kind drawn from the scenario's own generators that lived at least its age; the pods to
  come are a fresh draw of the generators after now. This is what a learner trained on those generators knows,
  and what an operator who fitted a model of the cluster's workload (cluster/fitted.py) would have. A scenario
  with a trace in its workload has no such model: there the policy is its base.
* ``future=sample``: only the run so far. Ended pods keep their lives; the others' lives are drawn from a
  lognormal fitted to the run's lives (running pods count as lives of at least their age: a censored fit, shrunk
  toward ``prior_s`` while few pods have ended); the pods to come repeat the run's arrivals so far (gaps and pods
  resampled: a bootstrap, so bursts stay bursts).
* ``future=oracle`` (registered as ``rollout-oracle``, family ``clairvoyant``): the run's true future, one sample:
  what planning is worth with a perfect model.

The online futures read no duration of a pod that has not ended, no usage of a pod that has not run, and no
step of a usage profile ahead of now (a running profiled pod holds the demand it shows;
tests/agent/test_planner.py shuffles the durations and checks the futures' profiles). Candidates: each base's
own choice (the first base's first), then the feasible nodes in the first base's order of preference, empty
nodes of one kind in one power state counted once (the lowest index), at most ``max_candidates``. Each rollout replays the run from its start, so a decision
costs (samples x candidates x bases) runs of the episode: seconds on the small suite, too slow for clusters of
hundreds of nodes (``budget_s`` caps the planning time). The policy runs in the twin only (family ``planner``:
in no best-heuristic comparison, not in the default set).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from scipy.special import ndtr, ndtri

from joulesched.agent.baselines import _float_opt, _int_opt
from joulesched.agent.policy import PolicyError, decide
from joulesched.agent.runner import Pinned, run_policy
from joulesched.cluster.state import DEFAULT_CPU_REQUEST_M, ClusterState, PodRequest
from joulesched.cluster.workload import SERVICE

FUTURES = ("sample", "model", "oracle")
#: Fresh workloads of the scenario's generators that ``future=model``'s lifetime distribution is read from.
MODEL_DRAWS = 4
_DONE = 3  # cluster/twin.py's pod status of a pod that ended


def _take(wl, idx: np.ndarray, submit: np.ndarray, duration: np.ndarray):
    """A workload of ``wl``'s rows ``idx`` (repeats allowed) with new submit times and durations."""
    return dataclasses.replace(wl.subset(idx), submit_s=submit, duration_s=duration)


def _unseen_usage(wl, pods: np.ndarray, share: float) -> None:
    """Set the usage of ``pods`` (which have not run: their usage is not known yet) to ``share`` of their
    CPU request (of kube's non-zero 100m for a pod without one), constant: a usage profile's steps are the pod's
    future demand, so they are dropped too (a review: services' diurnal profiles were replayed as they are)."""
    req = wl.cpu_req[pods]
    wl.usage_m[pods] = np.maximum(1.0, np.where(req > 0, req, DEFAULT_CPU_REQUEST_M) * share)
    if wl.profile is not None:
        wl.profile[pods] = -1


def _running_usage(wl, tw, running: np.ndarray) -> None:
    """The running ``pods`` (rows of both ``wl`` and the twin ``tw``) hold the demand they show now: a profiled
    pod's later steps are its future, which a cluster does not know."""
    if wl.profile is None or not running.size:
        return
    p = running[wl.profile[running] >= 0]
    if p.size:
        wl.usage_m[p] = tw.current_usage(p)
        wl.profile[p] = -1


def censored_lognormal(lives: np.ndarray, ages: np.ndarray, prior_s: float, prior_sigma: float = 1.0,
                       prior_n: float = 3.0, iters: int = 30) -> tuple[float, float]:
    """(mu, sigma) of log life fitted by EM to ended lives and running ages (lives known only to exceed them),
    each moment shrunk toward the prior's (log ``prior_s``, ``prior_sigma``) with the weight of ``prior_n``
    pods."""
    y = np.log(np.maximum(lives, 1.0))
    c = np.log(np.maximum(ages, 1.0))
    mu, sigma = math.log(prior_s), prior_sigma
    n = y.size + c.size
    if n == 0:
        return mu, sigma
    for _ in range(iters):
        if c.size:
            z = (c - mu) / sigma
            surv = np.maximum(ndtr(-z), 1e-12)
            h = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) / surv  # inverse Mills ratio
            e1 = mu + sigma * h
            e2 = mu * mu + sigma * sigma + sigma * (c + mu) * h
        else:
            e1 = e2 = np.zeros(0)
        m1 = (y.sum() + e1.sum() + prior_n * math.log(prior_s)) / (n + prior_n)
        m2 = ((y * y).sum() + e2.sum() + prior_n * (math.log(prior_s) ** 2 + prior_sigma ** 2)) / (n + prior_n)
        new_mu, new_sigma = m1, math.sqrt(max(m2 - m1 * m1, 1e-4))
        if abs(new_mu - mu) < 1e-6 and abs(new_sigma - sigma) < 1e-6:
            return new_mu, new_sigma
        mu, sigma = new_mu, new_sigma
    return mu, sigma


def sample_lives(rng: np.random.Generator, mu: float, sigma: float, ages: np.ndarray, cap: float) -> np.ndarray:
    """Whole lives drawn from the lognormal given each has lasted ``ages`` (so each is at least its age), at
    most ``cap`` (an age above the cap keeps the age)."""
    u0 = ndtr((np.log(np.maximum(ages, 1e-9)) - mu) / sigma)
    u = u0 + (1.0 - u0) * rng.random(ages.size)
    life = np.exp(mu + sigma * ndtri(np.clip(u, 1e-12, 1.0 - 1e-12)))
    return np.maximum(np.minimum(life, cap), ages + 1e-3)


class Rollout:
    """The run played forward once per candidate node and future, the base heuristic deciding after the deciding
    pod; the candidate with the least mean energy (twin only; module docstring).

    :param base: the heuristic that decides every later pod in a rollout (a spec of a policy that does not read
        the twin), or several separated by ``|`` (parallel rollout: each candidate is scored with the base
        whose continuation is cheapest on average, and each base's own choice is a candidate; on the true future
        the run then costs no more than the best of the bases).
    :param samples: futures per decision (the oracle has one).
    :param future: ``model`` (the scenario's generators), ``sample`` (the run so far) or ``oracle`` (the truth).
    :param max_candidates: at most this many distinct candidates (each base's choice always among them).
    :param penalty: each second a pod waits and a minute per SLO violation, charged at this multiple of the
        cluster's peak watts (0: energy alone).
    :param prior_s: ``future=sample``'s median life before any pod has ended.
    :param confidence: leave the base's choice only for a candidate whose mean saving is at least this many
        standard errors of the paired differences over the futures.
    :param seed: the futures' generator.
    :param budget_s: the seconds of planning the whole run may take (0: no limit); once spent, each later pod is
        placed by the base whose continuation the last planned decision chose, so on the true future the run
        still costs no more than that decision's rollout (an anytime planner: the optimum's warm start).
    """

    name = "rollout"
    #: choose() is handed the pod's metadata, for bases that read it (lifetime-aware's predictor).
    uses_meta = True
    reads_twin = True

    def __init__(self, base: str = "awake-first:fit=efficient", samples: str | int = "32", future: str = "model",
                 max_candidates: str | int = "6", penalty: str | float = "0", prior_s: str | float = "600",
                 confidence: str | float = "0", seed: str | int = "0", budget_s: str | float = "0") -> None:
        from joulesched.agent.registry import make_policy

        if future not in FUTURES:
            raise PolicyError(f"policy {self.name!r}: option future={future!r} is not one of {', '.join(FUTURES)}")
        self.future = future
        self.samples = 1 if future == "oracle" else _int_opt(self.name, "samples", str(samples), 1, 1000)
        self.max_candidates = _int_opt(self.name, "max_candidates", str(max_candidates), 1, 10_000)
        self.penalty = _float_opt(self.name, "penalty", str(penalty), 0.0, 1e9, closed=True)
        self.prior_s = _float_opt(self.name, "prior_s", str(prior_s), 1.0, 1e9, closed=True)
        self.confidence = _float_opt(self.name, "confidence", str(confidence), 0.0, 100.0, closed=True)
        self.seed = _int_opt(self.name, "seed", str(seed), 0, 2**63 - 1)
        self.budget_s = _float_opt(self.name, "budget_s", str(budget_s), 0.0, 1e9, closed=True)
        specs = [b.strip() for b in str(base).split("|")]
        try:
            self.bases = [make_policy(b) for b in specs]  # the run's own instances (candidates)
            self._sims = [make_policy(b) for b in specs]  # the rollouts': the run's bases keep their state
        except PolicyError as e:
            raise PolicyError(f"policy {self.name!r}: option base={base!r}: {e}") from None
        for b, pol in zip(specs, self.bases):
            if getattr(pol, "reads_twin", False):
                raise PolicyError(f"policy {self.name!r}: option base={b!r} plays the twin itself; a base must "
                                  "be a heuristic that sees what a scheduler sees")
        self._twin = None
        self._rng = np.random.default_rng(self.seed)
        self._pool = None
        self._fit = None  # future=sample's (what the run had shown, (mu, sigma)) at this decision
        self.rollouts = 0  # twin runs so far (for benchmarks' cost figures)
        self._spent = 0.0  # seconds of planning this run
        self._follow = 0  # the base the last planned decision's best rollout continued with

    # ---- the Policy protocol ----------------------------------------------------------------------------------
    def attach(self, backend: object) -> None:
        if not callable(getattr(backend, "live_lives", None)):
            raise PolicyError(f"policy {self.name!r} plays the run forward in the twin: it runs in the twin only "
                              f"(benchmark, training), not on {type(backend).__name__}")
        self._twin = backend
        self._rng = np.random.default_rng(self.seed)
        self._pool = self._fit = None
        self._spent, self._follow = 0.0, 0
        for b in self.bases:
            if (att := getattr(b, "attach", None)) is not None:
                att(backend)

    def detach(self, backend: object) -> None:
        for b in self.bases:
            if (det := getattr(b, "detach", None)) is not None:
                det(backend)
        self._twin = None

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        for b in self.bases:
            b.reset(state, rng)

    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> int:
        tw = self._twin
        if tw is None:
            raise PolicyError(f"policy {self.name!r} was not attached to a twin (run it with run_policy)")
        if self.budget_s and self._spent >= self.budget_s:
            return decide(self.bases[self._follow], state, pod, mask, meta)
        t0 = time.perf_counter()
        try:
            return self._plan(tw, state, pod, mask, meta)
        finally:
            self._spent += time.perf_counter() - t0

    def _plan(self, tw, state: ClusterState, pod: PodRequest, mask: np.ndarray, meta) -> int:
        cands = self._candidates(state, pod, mask, meta)
        if len(cands) == 1:
            return cands[0]
        nb = len(self._sims)
        cost = np.empty((self.samples, len(cands), nb))
        for s in range(self.samples):
            fut = self._future()
            if fut is None:
                return cands[0]
            wl, fixed = fut
            for j, c in enumerate(cands):
                for h in range(nb):
                    cost[s, j, h] = self._play(wl, fixed, tw.pod, c, h)
        # Each candidate with the base that continues it cheapest on average (one base: that base).
        h_of = cost.mean(axis=0).argmin(axis=1)
        cost = cost[:, np.arange(len(cands)), h_of]
        j = self._select(cost)
        self._follow = int(h_of[j])
        return cands[j]

    def _select(self, cost: np.ndarray) -> int:
        """The column of ``cost`` (futures x candidates, the first base's choice first) to take."""
        # Leave the first base's choice (first) only where a candidate is cheaper with confidence: the mean of
        # the paired differences over the futures at least `confidence` standard errors below zero. Taking the
        # plain least mean would favour whichever candidate the futures' noise flattered (the optimiser's curse).
        diff = cost[:, 1:] - cost[:, :1]
        mean = diff.mean(axis=0)
        j = int(np.argmin(mean))
        if self.samples > 1:
            se = diff[:, j].std(ddof=1) / math.sqrt(self.samples)
            if not mean[j] + self.confidence * se < 0.0:
                return 0
        elif not mean[j] < -1e-3:  # one future (the oracle): ties to a millijoule go to the base
            return 0
        return j + 1

    # ---- candidates ---------------------------------------------------------------------------------------------
    def _candidates(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, meta) -> list[int]:
        """Distinct feasible nodes: each base's choice (the first base's first), then by the first base's
        preference (each earlier choice masked out in turn), at most ``max_candidates`` (and never fewer than
        the bases' own choices: the parallel rollout's guarantee needs them); empty nodes of one kind in one
        power state count once."""
        empty = (st.nz_cpu == 0) & (st.nz_mem == 0)
        seen: set[tuple[int, int]] = set()
        out: list[int] = []

        def add(n: int) -> None:
            sig = (int(st.group[n]), int(st.power_state[n])) if empty[n] else None
            if n not in out and (sig is None or sig not in seen):
                out.append(n)
                if sig is not None:
                    seen.add(sig)

        for b in self.bases:
            add(decide(b, st, pod, mask, meta))
        m = mask.copy()
        m[out] = False
        first = self.bases[0]
        while len(out) < self.max_candidates and m.any():
            nxt = decide(first, st, pod, m, meta)
            add(nxt)
            m[nxt] = False
        return out

    # ---- futures -------------------------------------------------------------------------------------------------
    def _future(self):
        """One future: (workload, pod -> node of the pods bound so far)."""
        tw = self._twin
        wl, now = tw.workload, tw.now
        k = tw._next_arrival  # pods that have arrived: 0..k-1 (the deciding pod among them)
        node = np.asarray(tw.pod_node[:k], dtype=np.int64)
        fixed = {p: int(n) for p, n in enumerate(node.tolist()) if n >= 0}
        if self.future == "oracle":
            return wl, fixed
        if self.future == "model":
            return self._model_future(k, fixed)  # None: no model, the base decides
        status = np.asarray(tw.pod_status[:k])
        done = status == _DONE
        start = np.asarray(tw.pod_start[:k], dtype=np.float64)
        end = np.asarray(tw.pod_end[:k], dtype=np.float64)
        # Lives and ages in the durations' units: the replay scales them by the node's GPU speed again.
        per = tw.runtime_factors(np.arange(k), node)
        lives = ((end - start) / per)[done]
        running = (~done) & ~np.isnan(start)
        ages = np.maximum(now - start[running], 0.0) / per[running]
        # The fit depends on the decision, not the future: once per decision, not per sample.
        key = (now, k, lives.size, ages.size)
        if self._fit is None or self._fit[0] != key:
            self._fit = (key, censored_lognormal(lives, ages, self.prior_s))
        mu, sigma = self._fit[1]
        rng = self._rng
        cap = 50.0 * max(tw.scenario.duration_s, 1.0)
        dur = wl.duration_s[:k].astype(np.float64).copy()
        undone = np.flatnonzero(~done)
        age = np.where(running[undone], np.maximum(now - start[undone], 0.0) / per[undone], 0.0)
        dur[undone] = sample_lives(rng, mu, sigma, age, cap)
        # The pods to come: the run's arrivals so far resampled (gaps and pods), until the scenario's end.
        submit = wl.submit_s[:k].astype(np.float64)
        gaps = np.diff(np.concatenate(([0.0], submit)))
        t, times = now, []
        horizon = float(tw.scenario.duration_s)
        if gaps.size and gaps.sum() > 0:
            while True:
                t += float(gaps[rng.integers(gaps.size)])
                if t >= horizon:
                    break
                times.append(t)
        fut = rng.integers(k, size=len(times))
        idx = np.concatenate((np.arange(k), fut))
        sub = np.concatenate((submit, np.asarray(times, dtype=np.float64)))
        fdur = sample_lives(rng, mu, sigma, np.zeros(len(times)), cap)
        out = _take(wl, idx, sub, np.concatenate((dur, fdur)))
        # Usage is seen once a pod runs: the others (the deciding pod, and each resampled pod to come) use the
        # run's mean share of their request so far.
        seen = ~np.isnan(start) & (wl.cpu_req[:k] > 0)
        # what was seen: a running profiled pod's demand now (its usage_m is its mean over its planned life)
        used = wl.usage_m[:k].astype(np.float64)
        live = np.flatnonzero(running & (wl.profile[:k] >= 0)) if wl.profile is not None else np.zeros(0, np.int64)
        used[live] = tw.current_usage(live)
        share = float(np.mean(used[seen] / wl.cpu_req[:k][seen])) if seen.any() else 0.65
        _unseen_usage(out, np.concatenate((np.flatnonzero(np.isnan(start)), np.arange(k, len(idx)))), share)
        _running_usage(out, tw, np.flatnonzero(running))
        return out, fixed

    def _model(self) -> tuple[dict[int, np.ndarray], float] | None:
        """The workload model of ``future=model``: lives per pod kind (sorted) and the mean share of a request a
        pod uses, from ``MODEL_DRAWS`` fresh workloads of the scenario's own generators; None for a scenario with
        a trace in its workload (a replay's other draws would be the run itself)."""
        from joulesched.cluster.workload import build_workload

        if self._pool is not None:
            return self._pool or None
        sc = self._twin.scenario
        if sc.workload.traces:
            self._pool = ()
            return None
        draws = [build_workload(sc, int(self._rng.integers(2**31))) for _ in range(MODEL_DRAWS)]
        kind = np.concatenate([w.kind for w in draws])
        life = np.concatenate([np.where(w.is_service, np.minimum(w.submit_s + w.duration_s, sc.duration_s)
                                        - w.submit_s, w.duration_s) for w in draws])
        req = np.concatenate([w.cpu_req for w in draws]).astype(np.float64)
        use = np.concatenate([w.usage_m for w in draws])
        share = float(np.mean(use[req > 0] / req[req > 0])) if (req > 0).any() else 0.65
        self._pool = ({int(c): np.sort(life[kind == c]) for c in np.unique(kind).tolist()}, share)
        return self._pool

    def _model_future(self, k: int, fixed: dict[int, int]):
        """A future drawn from the scenario's own generators (``future=model``): each pod that has not ended
        lives as long as a generated pod of its kind that lived at least its age, and the pods to come are a
        fresh workload of the generators after now. It knows the distribution the run was drawn from, not the
        run. None where there is no model (a trace replay)."""
        from joulesched.cluster.workload import build_workload, merge_workloads

        model = self._model()
        if model is None:
            return None
        pool, share = model
        tw = self._twin
        sc, wl, now = tw.scenario, tw.workload, tw.now
        rng = self._rng
        status = np.asarray(tw.pod_status[:k])
        start = np.asarray(tw.pod_start[:k], dtype=np.float64)
        dur = wl.duration_s[:k].astype(np.float64).copy()
        per = tw.runtime_factors(np.arange(k), np.asarray(tw.pod_node[:k], dtype=np.int64))  # ages in work
        for p in np.flatnonzero(status != _DONE).tolist():
            age = 0.0 if math.isnan(start[p]) else max(now - start[p], 0.0) / per[p]
            if wl.kind[p] == SERVICE:  # a service's stop is relative to its submission
                age = max(now - float(wl.submit_s[p]), 0.0)
            lives = pool.get(int(wl.kind[p]), np.zeros(0))
            lo = int(np.searchsorted(lives, age, side="right"))
            dur[p] = float(lives[rng.integers(lo, lives.size)]) if lo < lives.size else age * 1.5 + 1.0
        past = _take(wl, np.arange(k), wl.submit_s[:k].astype(np.float64), dur)
        _unseen_usage(past, np.flatnonzero(np.isnan(start)), share)
        _running_usage(past, tw, np.flatnonzero((status != _DONE) & ~np.isnan(start)))
        fresh = build_workload(sc, int(rng.integers(2**31)))
        later = fresh.subset(fresh.submit_s > now)
        return (merge_workloads([past, later]) if len(later) else past), fixed

    # ---- one rollout -------------------------------------------------------------------------------------------
    def _play(self, wl, fixed: dict[int, int], pod: int, cand: int, base: int = 0) -> float:
        from joulesched.cluster.twin import Twin

        tw = Twin(self._twin.scenario, wl)
        res = run_policy(tw, Pinned({**fixed, pod: cand}, self._sims[base]))
        self.rollouts += 1
        peak = float(tw.state.peak_watts.sum())
        waited = res.mean_pending_s * max(res.placed_pods, 1) + res.unschedulable_pods * tw.scenario.duration_s
        return res.energy_joules + self.penalty * peak * (waited + 60.0 * res.slo_violations)


class RolloutOracle(Rollout):
    """:class:`Rollout` on the run's true future (``future=oracle``, one sample): a clairvoyant reference.

    :param base: the heuristic that decides every later pod in a rollout.
    :param max_candidates: at most this many distinct candidates (the base's choice always among them).
    :param penalty: as :class:`Rollout`'s.
    """

    name = "rollout-oracle"

    def __init__(self, base: str = "awake-first:fit=efficient", max_candidates: str | int = "6",
                 penalty: str | float = "0", budget_s: str | float = "0") -> None:
        super().__init__(base=base, future="oracle", max_candidates=max_candidates, penalty=penalty,
                         budget_s=budget_s)
