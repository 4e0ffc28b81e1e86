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
"""

from __future__ import annotations

import numpy as np

from joulesched.agent.lifetime_aware import LifetimeAware
from joulesched.agent.policy import PolicyError
from joulesched.cluster.state import ClusterState


class Clairvoyant(LifetimeAware):
    """Lifetime-aware packing on the true lifetimes (twin only): among awake nodes, least awake time added
    (priced at idle watts), then watts per core, then best fit in ``fit_classes`` classes, then the node that
    empties soonest after the pod; awake-first's waking rule. A reference for what exact lifetimes are worth
    and a training teacher, never a deployable policy.

    :param headroom: as awake-first's (0 < h <= 1, default 1).
    :param fit_classes: how coarse the best fit is before co-location by end time (1: co-location first).
    """

    name = "clairvoyant"
    uses_meta = False  # it reads the twin, not the pod's metadata
    #: It must be handed the twin it runs in (``attach``), also where it is only a teacher (agent/train.py).
    reads_twin = True

    def __init__(self, headroom: str | float = "1", fit_classes: str | int = "1") -> None:
        super().__init__(headroom, prediction="0", fit_classes=fit_classes)
        self._twin = None

    def attach(self, backend: object) -> None:
        if not (callable(getattr(backend, "due_ends", None)) and callable(getattr(backend, "deciding_life", None))):
            raise PolicyError("policy 'clairvoyant' reads the twin's true pod lifetimes: it runs in the twin only "
                              f"(benchmark, training), not on {type(backend).__name__}")
        self._twin = backend

    def detach(self, backend: object) -> None:
        self._twin = None

    def _lives(self, st: ClusterState, idx: np.ndarray) -> tuple[np.ndarray, float]:
        tw = self._twin
        if tw is None:
            raise PolicyError("policy 'clairvoyant' was not attached to a twin (run it with run_policy)")
        return np.maximum(tw.due_ends()[idx] - st.now, 0.0), tw.deciding_life()
