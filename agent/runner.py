"""The one loop of the data flow: a Policy deciding for a Backend, from the first pod to the last.

    scenario → backend (twin | kube) → ClusterState → policy → placement → meter → results

The same function runs a benchmark cell on the twin and the live scheduler on a cluster. Decision latency
(filter plus policy, as kube-scheduler's scheduling attempt) is measured by the backend, which knows when
its filtering began.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from joulesched.agent.policy import Policy, PolicyBase, decide
from joulesched.cluster.backend import Backend
from joulesched.cluster.state import ClusterState, PodRequest

R = TypeVar("R")


def run_policy(backend: Backend[R], policy: Policy, seed: int = 0) -> R:
    """Drive ``backend`` with ``policy`` until it has no more decisions; return the backend's result.

    The policy is reset with a generator seeded by ``seed`` before its first decision, and again with the
    same generator whenever the backend hands out a new ClusterState (a live cluster's nodes changed). A policy
    whose ``uses_meta`` is true is also handed the pod's metadata, ``choose(state, pod, mask, meta=...)``
    (:attr:`~joulesched.cluster.backend.Decision.meta`: the same fields in the twin and on a cluster). A policy
    with ``attach(backend)`` / ``detach(backend)`` is given the backend before and after the run, to subscribe to
    what it reports as the run goes (the DQN's lifetime predictor: the twin's binds and ends, a live cache's pod
    events). A policy with ``warm()`` (compiled decision loops, agent/fused.py) is warmed first, so that the
    compile is not timed as the first decision.
    """
    rng = np.random.default_rng(seed)
    warm = getattr(policy, "warm", None)
    if warm is not None:  # compiled code built before the run: not timed as its first decision (live/scheduler.py)
        warm()
    attach = getattr(policy, "attach", None)
    if attach is not None:  # a policy that learns from the run's pod events (the DQN's predictor) subscribes
        attach(backend)
    try:
        return _loop(backend, policy, rng)
    finally:
        detach = getattr(policy, "detach", None)
        if detach is not None:
            detach(backend)


def _loop(backend: Backend[R], policy: Policy, rng: np.random.Generator) -> R:
    backend.begin()
    state = None
    reset, choose = policy.reset, policy.choose
    with_meta = bool(getattr(policy, "uses_meta", False))
    nxt, bind = backend.next_decision, backend.bind
    while (d := nxt()) is not None:
        try:  # reset too: a decision is handed over with the backend's lock held, which abandon() releases
            if d.state is not state:
                state = None  # until the reset succeeds: a failed one is tried again on the next decision
                reset(d.state, rng)
                state = d.state
            node = choose(state, d.pod, d.mask, meta=d.meta) if with_meta else choose(state, d.pod, d.mask)
            bind(d, node)
        except Exception as e:
            backend.abandon(d, e)
    return backend.result()


class Pinned(PolicyBase):
    """Each pod in ``nodes`` on its node where that is feasible, every other decision ``fallback``'s: a run
    replayed as far as it is known and continued by a policy (the optimum teacher's re-solve starts, the rollout
    planner's rollouts). Twin only: the pod is read from the backend it is attached to (``Twin.pod``)."""

    name = "pinned"

    def __init__(self, nodes: dict[int, int], fallback: Policy) -> None:
        self.nodes, self.fallback = nodes, fallback
        self._twin = None
        # A fallback that reads the pod's metadata (lifetime-aware's predictor) is handed it.
        self.uses_meta = bool(getattr(fallback, "uses_meta", False))

    def attach(self, backend) -> None:
        self._twin = backend
        if (attach := getattr(self.fallback, "attach", None)) is not None:
            attach(backend)

    def detach(self, backend) -> None:
        if (detach := getattr(self.fallback, "detach", None)) is not None:
            detach(backend)
        self._twin = None

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        self.fallback.reset(state, rng)

    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> int:
        node = self.nodes.get(self._twin.pod, -1)
        if 0 <= node < len(mask) and mask[node]:
            return node
        return decide(self.fallback, state, pod, mask, meta)
