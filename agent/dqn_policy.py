"""The trained DQN as a Policy: ``--policy dqn=models/small.pt`` works wherever the baselines do.

Greedy (epsilon = 0) always: exploration exists only inside agent/train.py. Each decision builds the feature
rows (numpy, no Python loop over nodes) and scores the feasible ones in one batched forward pass of the shared
scorer's trunk and advantage head under ``torch.inference_mode``; ties go to the lowest index. Empty nodes
whose rows repeat a lower-index empty node's row are scored once (exact: same argmax).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from joulesched.agent.checkpoint import feature_names, load_network
from joulesched.agent.dqn import QNetwork
from joulesched.agent.features import FeatureBuilder
from joulesched.agent.policy import NodeScores, PolicyError, Scorer
from joulesched.cluster.state import ClusterState, PodRequest

#: From this many feasible nodes on, empty nodes identical to a lower-index empty node are not scored again
#: (FeatureBuilder.candidates): same choice, far fewer rows in big, lightly loaded clusters.
DEDUPE_MIN = 64


class DQNPolicy:
    """Greedy placement by a trained :class:`agent.dqn.QNetwork`.

    :param path: a checkpoint written by ``joulesched train`` (safetensors; anything else is refused).
    :param threads: torch intra-op threads (process-wide; 1 is fastest for this small MLP). ``0`` leaves
        torch's setting alone.
    """

    name = "dqn"
    net: QNetwork
    meta: dict

    def __init__(self, path: str | None = None, threads: str | int = 1, net: QNetwork | None = None) -> None:
        if net is None:
            if not path:
                raise PolicyError("policy 'dqn' needs a model file: dqn=models/NAME.pt")
            net, meta = load_network(Path(path))
        else:
            meta = {}
        try:
            threads = int(threads)
        except ValueError:
            raise PolicyError(f"policy 'dqn': option threads={threads!r} is not an integer") from None
        if threads > 0 and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.net, self.meta, self.path = net, meta, path
        self._feat: FeatureBuilder | None = None

    @property
    def scorer(self) -> Scorer:
        return self

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        self._feat = FeatureBuilder(state)

    def node_scores(self, state: ClusterState, pod: PodRequest, idx: np.ndarray, top: int = 3) -> NodeScores:
        """Each candidate's Q-value and advantage (the greedy choice maximises the advantage, which ranks nodes as
        Q does), and the ``top`` features that moved its advantage most: gradient x value, signed, per feature
        (the contribution relative to an all-zero row)."""
        if self._feat is None or not self._feat.matches(state):
            self._feat = FeatureBuilder(state)
        mask = np.zeros(len(state), dtype=bool)
        mask[idx] = True
        rows = torch.from_numpy(self._feat.build(state, pod, mask).copy())
        with torch.inference_mode():
            q = self.net(rows[None], torch.from_numpy(mask)[None])[0].numpy().astype(np.float64)
        x = rows[torch.from_numpy(idx)].clone().requires_grad_(True)
        with torch.enable_grad():
            adv = self.net.advantages(x)
            adv.sum().backward()  # rows are scored independently, so each row's gradient is its own
        contrib = (x.grad * x).detach().numpy()
        a = adv.detach().numpy().astype(np.float64)
        names = feature_names()
        feats = []
        for k in range(len(idx)):
            order = np.argsort(-np.abs(contrib[k]))[:top]
            feats.append([{"name": names[j], "value": float(x.detach()[k, j]), "contribution": float(contrib[k, j])}
                          for j in order])
        return NodeScores(idx, {"Q": (1, q[idx]), "Advantage": (1, a)}, a, feats)

    @torch.inference_mode()
    def scores(self, state: ClusterState, pod: PodRequest, mask: np.ndarray) -> np.ndarray:
        """Advantage of every node (higher is better); infeasible nodes get -inf."""
        if self._feat is None or not self._feat.matches(state):
            self._feat = FeatureBuilder(state)
        rows = self._feat.build(state, pod, mask)
        a = self.net.advantages(torch.from_numpy(rows)).numpy().astype(np.float64)
        return np.where(mask, a, -np.inf)

    @torch.inference_mode()
    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray) -> int:
        idx = np.flatnonzero(mask)
        if idx.size == 1:
            return int(idx[0])
        if self._feat is None or not self._feat.matches(state):
            self._feat = FeatureBuilder(state)
        rows = self._feat.build(state, pod, mask)
        if idx.size >= DEDUPE_MIN:
            idx = self._feat.candidates(state, idx)
        if idx.size < rows.shape[0]:
            rows = rows[idx]
        a = self.net.advantages(torch.from_numpy(rows))
        return int(idx[int(torch.argmax(a))])
