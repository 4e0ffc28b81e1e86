"""Masked Double DQN with a size-independent node scorer.

Three roles, as in Stable-Baselines3: :class:`QNetwork` (the shared scorer), :class:`ReplayBuffer` (storage,
returning a :class:`ReplayBatch`) and :class:`DQN` (exploration and the update). Every hyperparameter is a
field of :class:`joulesched.agent.config.DQNConfig`.

The network
-----------
One MLP ``f`` maps each node's feature row (node, pod and cluster-context columns, agent/features.py) to an
embedding ``h_i`` and an advantage ``A_i``. A value head reads the cluster context plus the mean of ``h`` over
the feasible nodes. Q is the dueling combination over the feasible set::

    Q_i = V(context, mean_j h_j) + A_i - mean_{j feasible} A_j

Nothing depends on the node count, so the same weights run on 3 nodes or 5,000. The argmax only needs ``A``,
so inference scores the feasible nodes with the trunk and the advantage head and skips the value head.

Masking: infeasible nodes get ``-1e9`` before any argmax or max, both for the greedy action and for the
target's ``max`` over ``s'`` (the buffer stores the next state's mask). Discounting is per simulated second
(``gamma = exp(-dt / gamma_tau_s)``), since decisions are irregular in time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from joulesched.agent.config import DQNConfig
from joulesched.agent.features import CONTEXT_SLICE, N_CONTEXT, N_FEATURES, N_POD

NEG = -1e9


class QNetwork(nn.Module):
    """The shared node scorer. Input rows ``(..., N, N_FEATURES)``, mask ``(..., N)`` bool; output Q ``(..., N)``."""

    def __init__(self, hidden: int = 64, n_features: int = N_FEATURES, n_context: int = N_POD + N_CONTEXT) -> None:
        super().__init__()
        self.n_features = n_features
        self.trunk = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.adv = nn.Linear(hidden, 1)
        self.value = nn.Sequential(nn.Linear(n_context + hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def advantages(self, x: torch.Tensor) -> torch.Tensor:
        """A per row, without the value head: all that the greedy choice needs."""
        return self.adv(self.trunk(x)).squeeze(-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)  # (B, N, H)
        a = self.adv(h).squeeze(-1)  # (B, N)
        m = mask.to(h.dtype)
        cnt = m.sum(-1, keepdim=True).clamp_min(1.0)
        pooled = (h * m.unsqueeze(-1)).sum(-2) / cnt  # (B, H)
        ctx = x[..., 0, CONTEXT_SLICE]  # pod and context columns are the same on every row
        v = self.value(torch.cat((ctx, pooled), -1))  # (B, 1)
        a_mean = (a * m).sum(-1, keepdim=True) / cnt
        q = v + a - a_mean
        return q.masked_fill(~mask, NEG)


class ReplayBatch(NamedTuple):
    obs: torch.Tensor  # (B, N, F) float32
    mask: torch.Tensor  # (B, N) bool
    actions: torch.Tensor  # (B,) int64
    returns: torch.Tensor  # (B,) float32, the discounted n-step reward sum
    next_obs: torch.Tensor
    next_mask: torch.Tensor
    discounts: torch.Tensor  # (B,) float32: prod of per-step gammas over the n steps; 0 when terminated


class ReplayBuffer:
    """Circular storage of n-step transitions, observations as float16 (features are bounded in [-1, 4])."""

    obs: np.ndarray
    mask: np.ndarray
    size: int
    pos: int

    def __init__(self, capacity: int, max_nodes: int, n_features: int = N_FEATURES) -> None:
        if capacity < 1 or max_nodes < 1:
            raise ValueError("capacity and max_nodes must be >= 1")
        self.capacity, self.max_nodes = capacity, max_nodes
        self.obs = np.zeros((capacity, max_nodes, n_features), dtype=np.float16)
        self.next_obs = np.zeros_like(self.obs)
        self.mask = np.zeros((capacity, max_nodes), dtype=bool)
        self.next_mask = np.zeros_like(self.mask)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.returns = np.zeros(capacity, dtype=np.float32)
        self.discounts = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self.pos = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs, mask, action, ret, next_obs, next_mask, discount) -> None:
        i = self.pos
        n = obs.shape[0]
        self.obs[i, :n] = obs
        self.obs[i, n:] = 0
        self.mask[i, :n] = mask
        self.mask[i, n:] = False
        self.next_obs[i, :n] = next_obs
        self.next_obs[i, n:] = 0
        self.next_mask[i, :n] = next_mask
        self.next_mask[i, n:] = False
        self.actions[i] = action
        self.returns[i] = ret
        self.discounts[i] = discount
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> ReplayBatch:
        idx = rng.integers(self.size, size=batch_size)
        t = torch.from_numpy
        return ReplayBatch(
            t(self.obs[idx].astype(np.float32)), t(self.mask[idx]), t(self.actions[idx]), t(self.returns[idx]),
            t(self.next_obs[idx].astype(np.float32)), t(self.next_mask[idx]), t(self.discounts[idx]))


class DQN:
    """Online and target networks, the optimizer, and the masked Double DQN update."""

    def __init__(self, cfg: DQNConfig, seed: int = 0) -> None:
        self.cfg = cfg
        torch.manual_seed(seed)
        self.q = QNetwork(cfg.hidden)
        self.q_target = QNetwork(cfg.hidden)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.learning_rate)
        self.updates = 0

    @torch.inference_mode()
    def greedy(self, rows: np.ndarray, mask: np.ndarray) -> int:
        """argmax of Q over the feasible rows (rows (N, F) float32, mask (N,) bool)."""
        idx = np.flatnonzero(mask)
        if idx.size == 1:
            return int(idx[0])
        a = self.q.advantages(torch.from_numpy(np.ascontiguousarray(rows[idx], dtype=np.float32)))
        return int(idx[int(torch.argmax(a))])

    def update(self, b: ReplayBatch) -> float:
        """One gradient step of masked Double DQN with Huber loss; returns the loss."""
        with torch.no_grad():
            next_online = self.q(b.next_obs, b.next_mask)
            best = next_online.argmax(-1, keepdim=True)
            next_q = self.q_target(b.next_obs, b.next_mask).gather(-1, best).squeeze(-1)
            has_next = b.next_mask.any(-1)
            next_q = torch.where(has_next, next_q, torch.zeros_like(next_q))
            target = b.returns + b.discounts * next_q
        q = self.q(b.obs, b.mask).gather(-1, b.actions.unsqueeze(-1)).squeeze(-1)
        loss = F.huber_loss(q, target, delta=self.cfg.huber_delta)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        return float(loss.detach())

    def sync_target(self) -> None:
        self.q_target.load_state_dict(self.q.state_dict())


def discount(dt_s: float, tau_s: float) -> float:
    """Per-step discount for ``dt_s`` simulated seconds."""
    return math.exp(-max(dt_s, 0.0) / tau_s)
