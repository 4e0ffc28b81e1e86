"""A third-party policy, as a plugin author would write it: one module and one entry point.

The registry test installs it through a ``joulesched.policies`` entry point of a throw-away distribution.
"""

from __future__ import annotations

import numpy as np

from joulesched.agent.policy import NodeScores, PolicyBase
from joulesched.cluster.state import ClusterState, PodRequest


class FullestFirst(PolicyBase):
    """The feasible node with the most requested CPU, below ``limit`` of its allocatable if one is."""

    family = "packing"

    def __init__(self, limit: str = "1.0") -> None:
        self.limit = float(limit)
        self.scorer = self

    def node_scores(self, state: ClusterState, pod: PodRequest, idx: np.ndarray) -> NodeScores:
        frac = (state.req_cpu[idx] + pod.filter_cpu) / np.maximum(state.alloc_cpu[idx], 1)
        total = np.where(frac <= self.limit, frac, -frac)
        return NodeScores(idx, {"RequestedFraction": (1, frac)}, total)

    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray) -> int:
        idx = np.flatnonzero(mask)
        return int(idx[int(np.argmax(self.node_scores(state, pod, idx).total))])
