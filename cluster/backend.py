"""The Backend seam: where pods come from and where placements go.

A backend yields one :class:`Decision` at a time (a pod that needs a node, the ClusterState a policy reads,
the mask of nodes that pass the filters) and binds the policy's answer. The twin
(:class:`joulesched.cluster.twin.Twin`) and the live scheduler (:class:`joulesched.live.scheduler.Scheduler`,
over the Kubernetes cache) both implement it, and one loop drives either:
:func:`joulesched.agent.runner.run_policy`.

A new backend is one class with these five methods (``begin``, ``next_decision``, ``bind``, ``abandon``,
``result``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np

from joulesched.cluster.state import ClusterState, PodRequest

if TYPE_CHECKING:
    from joulesched.cluster.workload import PodMeta

R = TypeVar("R", covariant=True)


@dataclass(slots=True)
class Decision:
    """One pod waiting for a node.

    ``state`` is what the policy reads (the same object for a whole twin run; a live backend hands out a new
    one when its node set changes, and the runner then resets the policy). ``mask`` marks the nodes that pass
    the filters. ``key`` is the backend's own handle on the pod. ``meta`` is what is known about the pod
    beyond its requests (kind, owner, priority, QoS class, app, namespace, limits): the twin fills it from the
    workload (:meth:`~joulesched.cluster.workload.Workload.meta`), the live scheduler from the Pod object
    (:func:`~joulesched.cluster.kube.objects.pod_meta`), so a policy sees the same features on both; ``None``
    from a backend that knows nothing more. A decision is valid until it is bound or abandoned.
    """

    state: ClusterState
    pod: PodRequest
    mask: np.ndarray
    key: Any = None
    meta: PodMeta | None = None


class Backend(Protocol, Generic[R]):
    """The loop "next pod needing a node → ClusterState and mask → bind"."""

    def begin(self) -> None:
        """Begin a run: the twin resets to time 0; a live backend has nothing to do."""
        ...

    def next_decision(self) -> Decision | None:
        """The next pod with at least one feasible node, or None when the run is over (or stopped)."""
        ...

    def bind(self, decision: Decision, node: int) -> None:
        """Place the decision's pod on ``node`` (an index where ``decision.mask`` is True)."""
        ...

    def abandon(self, decision: Decision, error: BaseException) -> None:
        """The policy failed on this decision: re-raise (the twin) or log, requeue and go on (a daemon)."""
        ...

    def result(self) -> R:
        """What the run measured (the twin: energy, SLO, pending times; a daemon: its counters)."""
        ...
