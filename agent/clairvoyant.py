"""The lifetime-aware packer with the future known: a reference, and a teacher for the learner (issue 27).

``clairvoyant`` is :class:`~joulesched.agent.lifetime_aware.LifetimeAware` with its predictor replaced by the
twin's own knowledge: the deciding pod's true duration and, per node, when its last bound pod is due to end
(:meth:`Twin.due_ends <joulesched.cluster.twin.Twin.due_ends>`). It says what knowing lifetimes exactly buys a
rule on the same keys (the gap between ``lifetime-aware`` and it is what a better predictor could win), and it
labels the states a learner visits in training (DAgger-style: agent/train.py, ``teacher``). It runs only in
the twin: on a cluster nothing knows a pod's future, and :meth:`attach` refuses any other backend. It is not a
heuristic (family ``clairvoyant``): no "best heuristic" comparison includes it, and the default policy set
leaves it out.

With exact lifetimes, co-location by end time pays before best fit (``fit_classes=1``, NILAS's own order, the
default here): on heterogeneous-sleep it is 5-10 % below the best sleep-aware heuristic (docs/dqn.md, "Issue 27"),
where with predicted lifetimes the same order loses (docs/PERFORMANCE.md, "The lifetime-aware heuristic").

``r2`` < 1 makes it an oracle of a given quality instead of an exact one: what a calibrated predictor that
explains the share ``r2`` of the variance of log lifetimes would be worth to the same rule (the curve of
docs/dqn.md, "What a predictor of a given quality is worth"). Each pod's predicted log life is
``mu + r2 (y - mu) + eta`` with ``y`` its true log life, ``mu`` and ``sigma^2`` the mean and variance of ``y``
over the workload, and ``eta ~ N(0, r2 (1 - r2) sigma^2)`` drawn once per pod: an unbiased conditional
expectation (its error is uncorrelated with it) whose variance is ``r2 sigma^2``, as a regression on keys of that
R^2 would give (the Alibaba OpenB trace's keys give about 0.32, ../shared/docs/reference-3.md). The residual is
lognormal with variance ``(1 - r2) sigma^2`` in log space, and a running pod is re-predicted as it ages, as
LAVA re-predicts: its remaining life is the median of that distribution given it has run so far. ``r2=1`` is the
exact reference; ``r2=0`` knows only the workload's lifetime distribution and each pod's age. With
``extend=expected`` the awake time a pod adds to a node is priced as its expectation under that distribution
(``E[(L - e)+]`` given the pod's age, ``e`` the node's emptying time) instead of the median's excess: the rule
that uses the prediction's uncertainty (docs/dqn.md measures both). ``power=gpu`` puts the lifetimes in front of
``gpu-energy``'s keys, as ``gpu-lifetime-aware`` does with its predictor (docs/dqn.md, "Lifetimes on the GPU
cluster").
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr, ndtri

from joulesched.agent.baselines import _float_opt, _int_opt
from joulesched.agent.lifetime_aware import POWER_KEYS, LifetimeAware
from joulesched.agent.policy import PolicyError
from joulesched.cluster.state import ClusterState

#: How the awake time a pod adds is priced (option ``extend``).
EXTENDS = ("median", "expected")


class Clairvoyant(LifetimeAware):
    """Lifetime-aware packing on the true lifetimes (twin only): among awake nodes, least awake time added
    (priced at idle watts), then watts per core, then best fit in ``fit_classes`` classes, then the node that
    empties soonest after the pod; awake-first's waking rule. A reference for what exact lifetimes are worth
    and a training teacher, never a deployable policy.

    :param headroom: as awake-first's (0 < h <= 1, default 1).
    :param fit_classes: how coarse the best fit is before co-location by end time (1: co-location first).
    :param r2: the oracle's quality, the share of the variance of log lifetimes it explains (1: exact).
    :param seed: the seed of the oracle's errors (with ``r2`` < 1).
    :param extend: ``median`` (the added awake time of the median life) or ``expected`` (its expectation under
        the oracle's residual distribution; with ``r2`` < 1).
    :param empty: ``awake`` or ``asleep``, how an awake node without pods ranks (agent/sleep_aware.py).
    :param power: ``cpu`` (``lifetime-aware``'s keys) or ``gpu`` (``gpu-lifetime-aware``'s: GPU power known).
    """

    name = "clairvoyant"
    twin_only = True  # it reads the twin's true pod lifetimes: a cluster refuses it before anything starts
    uses_meta = False  # it reads the twin, not the pod's metadata
    #: It must be handed the twin it runs in (``attach``), also where it is only a teacher (agent/train.py).
    reads_twin = True

    def __init__(self, headroom: str | float = "1", fit_classes: str | int = "1", r2: str | float = "1",
                 seed: str | int = "0", extend: str = "median", empty: str = "awake", power: str = "cpu") -> None:
        super().__init__(headroom, prediction="0", fit_classes=fit_classes, empty=empty)
        if power not in POWER_KEYS:
            raise PolicyError(f"policy {self.name!r}: option power={power!r} is not one of {', '.join(POWER_KEYS)}")
        self.power = power
        if power == "gpu":
            if self.fit_classes != 1:  # gpu-energy's keys rank by watts, with no best fit in classes
                raise PolicyError(f"policy {self.name!r}: option fit_classes={self.fit_classes} has no effect with "
                                  "power=gpu")
            self.wake_label = "WattsPerUnit"
        self.r2 = _float_opt(self.name, "r2", str(r2), 0.0, 1.0, closed=True)
        self.seed = _int_opt(self.name, "seed", str(seed), 0, 2**63 - 1)
        if extend not in EXTENDS:
            raise PolicyError(f"policy {self.name!r}: option extend={extend!r} is not one of {', '.join(EXTENDS)}")
        self.extend = extend
        self._pod_dist: tuple[float, float, float] | None = None  # the deciding pod's (m, s, age) for 'expected'
        self._twin = None
        self._oracle: tuple[np.ndarray, float, float] | None = None  # per pod eta, mu, sigma

    def attach(self, backend: object) -> None:
        if not (callable(getattr(backend, "due_ends", None)) and callable(getattr(backend, "deciding_life", None))):
            raise PolicyError("policy 'clairvoyant' reads the twin's true pod lifetimes: it runs in the twin only "
                              f"(benchmark, training), not on {type(backend).__name__}")
        self._twin = backend
        self._oracle = None if self.r2 == 1.0 else self._errors(backend)

    def detach(self, backend: object) -> None:
        self._twin = self._oracle = None

    def _errors(self, twin) -> tuple[np.ndarray, float, float]:
        """The workload's log-lifetime mean and deviation, and each pod's error ``eta``."""
        wl = twin.workload
        life = np.where(wl.is_service, np.minimum(wl.submit_s + wl.duration_s, twin.scenario.duration_s)
                        - wl.submit_s, wl.duration_s)
        y = np.log(np.maximum(life[life > 0], 1.0))
        mu, sigma = (float(y.mean()), float(y.std())) if y.size else (0.0, 0.0)
        sd = np.sqrt(self.r2 * (1.0 - self.r2)) * sigma
        return np.random.default_rng(self.seed).normal(0.0, 1.0, len(wl)) * sd, mu, sigma

    def _log_median(self, pods: np.ndarray, began: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, float]:
        """The oracle's log life of each pod before it starts (its residual distribution's median) and that
        distribution's deviation."""
        eta, mu, sigma = self._oracle
        m = mu + self.r2 * (np.log(np.maximum(end - began, 1.0)) - mu) + eta[pods]
        return m, float(np.sqrt(1.0 - self.r2) * sigma)

    def _predicted_life(self, pods: np.ndarray, began: np.ndarray, end: np.ndarray, now: float) -> np.ndarray:
        """The oracle's life of each pod (from ``began``): the median of its residual distribution given the
        age it has reached."""
        m, s = self._log_median(pods, began, end)
        return self._median_life(m, s, np.maximum(now - began, 0.0))

    @staticmethod
    def _median_life(m: np.ndarray, s: float, age: np.ndarray) -> np.ndarray:
        """The median of a lognormal life (log median ``m``, deviation ``s``) given it has lasted ``age``."""
        if s == 0.0:  # no residual: the median is the life itself
            return np.maximum(np.exp(m), age)
        with np.errstate(divide="ignore"):
            u0 = ndtr((np.log(age) - m) / s)  # the share of such pods that would have ended by now
        # ndtri(1) is inf: a pod far past every prediction lives on (the age bound below).
        return np.maximum(np.exp(m + s * ndtri(np.minimum(u0 + (1.0 - u0) / 2, 1.0 - 1e-12))), age)

    def _lives(self, st: ClusterState, idx: np.ndarray) -> tuple[np.ndarray, float | np.ndarray]:
        tw = self._twin
        if tw is None:
            raise PolicyError("policy 'clairvoyant' was not attached to a twin (run it with run_policy)")
        if self._oracle is None:
            return np.maximum(tw.due_ends()[idx] - st.now, 0.0), tw.deciding_life(idx)  # per node: GPU speed
        now = st.now
        pods, node, began, end = tw.live_lives()
        due = np.full(len(st), now)
        np.maximum.at(due, node, began + self._predicted_life(pods, began, end, now))
        p, b, e = tw.deciding_pod()
        m, s = self._log_median(np.array([p]), np.array([b]), np.array([e]))
        age = max(now - b, 0.0)
        life = float(self._median_life(m, s, np.array([age]))[0])
        self._pod_dist = (float(m[0]), s, age)
        return np.maximum(due[idx] - now, 0.0), max(b + life - now, 0.0)

    def _added(self, empty_in: np.ndarray, life: float) -> np.ndarray:
        if self.extend == "median" or self._oracle is None or self._pod_dist is None or self._pod_dist[1] == 0.0:
            return super()._added(empty_in, life)
        # E[(L - a - e)+ | L > a] for a lognormal life L (log median m, deviation s) that has lived a: the
        # lognormal's partial expectation above a + e, over its survival at a.
        m, s, age = self._pod_dist
        x = empty_in + age
        with np.errstate(divide="ignore"):
            lx = np.log(np.maximum(x, 1e-300))
            surv = float(ndtr((m - np.log(age)) / s)) if age > 0 else 1.0
        part = np.exp(m + s * s / 2) * ndtr((m + s * s - lx) / s) - x * ndtr((m - lx) / s)
        return np.maximum(part, 0.0) / max(surv, 1e-12)
