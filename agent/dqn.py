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

That is :class:`QNetwork`, feature schema 1 (``models/small.pt``). Schema 2's :class:`SetQNetwork` adds
cross-node context, a set-transformer block (Lee et al., "Set Transformer", ICML 2019: an *induced set
attention block*): ``K`` learned seed vectors attend over every node's embedding (feasible or not), giving
``K`` summaries of the whole cluster, and each node's row then attends over those summaries. Its advantage
head reads the node's embedding beside what it took from the summaries, so a node's score depends on every
other node, at O(N K) cost rather than the O(N^2) of full self-attention. Identical rows (empty nodes of one
kind and power state) can be read once with their multiplicity (a log-count added to the attention logits,
which is exact). ``attention=False`` leaves the summaries out (the "without attention" ablation: each node
scored from its own row and the shared context columns alone).

Masking: infeasible nodes get ``-1e9`` before any argmax or max, both for the greedy action and for the
target's ``max`` over ``s'`` (the buffer stores the next state's mask). Discounting is per simulated second
(``gamma = exp(-dt / gamma_tau_s)``), since decisions are irregular in time.
"""

from __future__ import annotations

import logging
import math
import os
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits
from torch import nn

from joulesched.agent.config import DQNConfig
from joulesched.agent.features import CONTEXT_SLICE, N_FEATURES, n_features

log = logging.getLogger(__name__)
NEG = -1e9


class QNetwork(nn.Module):
    """The shared node scorer. Input rows ``(..., N, N_FEATURES)``, mask ``(..., N)`` bool; output Q ``(..., N)``."""

    def __init__(self, hidden: int = 64, n_features: int = N_FEATURES, n_context: int = n_features(1)[1]) -> None:
        super().__init__()
        self.n_features = n_features
        self.trunk = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.adv = nn.Linear(hidden, 1)
        self.value = nn.Sequential(nn.Linear(n_context + hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def advantages(self, x: torch.Tensor) -> torch.Tensor:
        """A per row, without the value head: all that the greedy choice needs."""
        return self.adv(self.trunk(x)).squeeze(-1)

    def score(self, x: torch.Tensor, cand: torch.Tensor, logw: torch.Tensor | None = None) -> torch.Tensor:
        """A of rows ``cand`` of ``x`` (M, F): rows are scored independently."""
        return self.advantages(x[cand])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor | None = None,
                counts: torch.Tensor | None = None) -> torch.Tensor:
        """Q of every row; ``counts`` (..., N): how many identical nodes each row stands for (None: one each)."""
        h = self.trunk(x)  # (B, N, H)
        a = self.adv(h).squeeze(-1)  # (B, N)
        m, cnt = _feasible_weights(mask, counts, h.dtype)
        pooled = (h * m.unsqueeze(-1)).sum(-2) / cnt  # (B, H)
        ctx = x[..., 0, CONTEXT_SLICE]  # pod and context columns are the same on every row
        v = self.value(torch.cat((ctx, pooled), -1))  # (B, 1)
        a_mean = (a * m).sum(-1, keepdim=True) / cnt
        q = v + a - a_mean
        return q.masked_fill(~mask, NEG)


class SetQNetwork(nn.Module):
    """Schema 2's scorer: a per-node MLP, an induced set attention block over the nodes, a dueling head.

    Rows ``(..., N, F)``; ``mask`` (feasible) and ``valid`` (real nodes, not padding) ``(..., N)`` bool.
    """

    def __init__(self, n_features: int, n_context: int, hidden: int = 64, attention: bool = True,
                 inducing: int = 4, attention_dim: int = 16, head_hidden: int = 32) -> None:
        super().__init__()
        self.n_features, self.n_context = n_features, n_context
        self.attention, self.dk = attention, attention_dim
        self.embed = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        mix_in = hidden
        if attention:
            dv = head_hidden
            self.seeds = nn.Parameter(torch.randn(inducing, attention_dim) / math.sqrt(attention_dim))
            self.pool_kv = nn.Linear(hidden, attention_dim + dv)  # node keys and values for the K seeds
            self.row_q = nn.Linear(hidden, attention_dim)  # each node's query over the K summaries
            self.sum_kv = nn.Linear(dv, attention_dim + dv)  # the summaries' keys and values
            mix_in = hidden + dv
        self.mix = nn.Sequential(nn.Linear(mix_in, head_hidden), nn.ReLU())
        self.adv = nn.Linear(head_hidden, 1)
        self.value = nn.Sequential(nn.Linear(n_context + head_hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def _summaries(self, e: torch.Tensor, valid: torch.Tensor | None, logw: torch.Tensor | None) -> torch.Tensor:
        """(..., K, dv): the seeds' attention over the nodes."""
        kv = self.pool_kv(e)
        k, v = kv[..., :self.dk], kv[..., self.dk:]
        logits = torch.matmul(k, self.seeds.t()) / math.sqrt(self.dk)  # (..., N, K)
        if logw is not None:
            logits = logits + logw.unsqueeze(-1)
        if valid is not None:
            valid = valid | ~valid.any(-1, keepdim=True)  # never an all-masked softmax
            logits = logits.masked_fill(~valid.unsqueeze(-1), float("-inf"))
        att = torch.softmax(logits, dim=-2)  # over the nodes
        return torch.matmul(att.transpose(-1, -2), v)  # (..., K, dv)

    def _heads(self, e: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
        """(..., N, head_hidden): each row's embedding beside what it reads from the summaries."""
        if s is None:
            return self.mix(e)
        skv = self.sum_kv(s)
        sk, sv = skv[..., :self.dk], skv[..., self.dk:]
        q = self.row_q(e)
        att = torch.softmax(torch.matmul(q, sk.transpose(-1, -2)) / math.sqrt(self.dk), dim=-1)  # (..., N, K)
        return self.mix(torch.cat((e, torch.matmul(att, sv)), dim=-1))

    def score(self, x: torch.Tensor, cand: torch.Tensor, logw: torch.Tensor | None = None) -> torch.Tensor:
        """Advantages of rows ``cand`` of ``x`` (M, F): every row of ``x`` is a node of the cluster (``logw``: the
        log of how many identical nodes a row stands for), only the candidates are scored."""
        nn_ = self.n_features - self.n_context
        return self.score_parts(x[:, :nn_].t(), x[0, nn_:], cand, logw)

    def score_parts(self, node_t: torch.Tensor, ctx: torch.Tensor, cand: torch.Tensor,
                    logw: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`score` from the node columns transposed, ``(F_node, M)``, and the shared columns once,
        ``(F_context,)``: the same arithmetic as :meth:`forward`, regrouped for one decision. The shared columns
        enter the first layer as a bias; the attention's keys, queries and values are folded into their weights
        (``softmax(e W_k s^T)`` is ``softmax(e (W_k s^T))``, and the attention-weighted mean of ``W_v e + b`` is
        ``W_v`` (mean of e) ``+ b``), so per node it costs the embedding and K products, not three projections.
        The weight slices and the products that do not depend on the input are computed once per set of weights
        (:meth:`_folded`; a training step that changes a parameter in place makes them anew)."""
        f = self._folded()
        b1 = f["b1"] + torch.mv(f["w1c"], ctx)
        e = torch.relu(torch.addmm(b1.unsqueeze(1), f["w1n"], node_t))  # (H, M)
        e = torch.relu(torch.addmm(f["b2"], f["w2"], e))
        ec = e if cand.numel() == e.shape[1] else e[:, cand]  # (H, C)
        if not self.attention:
            h = torch.relu(torch.addmm(f["bm"], f["wm"], ec))
        else:
            lp = torch.addmm(f["bk"], f["a_pool"], e)  # (K, M)
            if logw is not None:
                lp = lp + logw.unsqueeze(0)
            att = torch.softmax(lp, dim=1)
            s = torch.addmm(f["bv"], torch.mm(att, e.t()), f["wv_t"])  # (K, dv)
            skv = torch.addmm(f["sum_b"], s, f["sum_w_t"])
            dk = self.dk
            sk, sv = skv[:, :dk], skv[:, dk:]
            a_row = torch.mm(sk, f["row_w"]) * f["scale"]  # (K, H)
            lr = torch.addmm((torch.mv(sk, f["row_b"]) * f["scale"]).unsqueeze(1), a_row, ec)  # (K, C)
            att_r = torch.softmax(lr, dim=0)
            z = torch.mm(torch.mm(f["wm_s"], sv.t()), att_r)  # (head_hidden, C)
            h = torch.relu(torch.addmm(f["bm"], f["wm_e"], ec) + z)
        return torch.mv(h.t(), f["adv_w"]) + f["adv_b"]

    def score_parts_np(self, node_t: np.ndarray, ctx: np.ndarray, cand: np.ndarray,
                       logw: np.ndarray | None = None, folded: dict | None = None) -> np.ndarray:
        """:meth:`score_parts` in numpy, float32, on the same folded weights: the per-decision path. The network
        is small (48 hidden, a few hundred columns), so torch's per-operator dispatch was a third of its time;
        the same arithmetic (a few products regrouped), equal to float32 rounding
        (tests/agent/test_dqn_policy_sample.py). ``folded``: :meth:`_folded_np`'s answer, kept by a caller
        whose weights cannot change (a model loaded from a file), which skips the check of every parameter's
        version."""
        f = self._folded_np() if folded is None else folded
        node_t, ctx = np.asarray(node_t, dtype=np.float32), np.asarray(ctx, dtype=np.float32)  # float32 throughout
        e = f["w1n"] @ node_t
        e += (f["b1"] + f["w1c"] @ ctx)[:, None]
        np.maximum(e, 0.0, out=e)
        e2 = f["w2"] @ e
        e2 += f["b2"]
        e = np.maximum(e2, 0.0, out=e2)
        ec = e if cand.size == e.shape[1] else e[:, cand]
        if not self.attention:
            h = f["wm"] @ ec
        else:
            lp = f["a_pool"] @ e
            lp += f["bk"]
            if logw is not None:
                lp += logw
            att = _softmax_inplace(lp, axis=1)
            s = (att @ e.T) @ f["wv_t"] + f["bv"]  # (K, dv)
            skv = s @ f["sum_w_t"] + f["sum_b"]
            dk = self.dk
            sk, sv = skv[:, :dk], skv[:, dk:]
            lr = (sk @ f["row_w"]) @ ec
            lr += (sk @ f["row_b"])[:, None]
            lr *= f["scale"]
            att_r = _softmax_inplace(lr, axis=0)
            h = f["wm_e"] @ ec
            h += (f["wm_s"] @ sv.T) @ att_r
        h += f["bm"]
        np.maximum(h, 0.0, out=h)
        return f["adv_w"] @ h + f["adv_b"]

    def _folded_np(self) -> dict:
        """:meth:`_folded` as float32 numpy arrays (made anew whenever the folded weights are)."""
        f = self._folded()
        cache = self.__dict__.get("_folded_np_cache")
        if cache is not None and cache[0] is f:
            return cache[1]
        out = {k: (v.detach().numpy().astype(np.float32, copy=True) if isinstance(v, torch.Tensor) else np.float32(v))
               for k, v in f.items()}
        self.__dict__["_folded_np_cache"] = (f, out)
        return out

    def _folded(self) -> dict:
        """The inference weights of :meth:`score_parts`, cached while no parameter changes (their versions)."""
        slots = self.__dict__.get("_param_slots")
        if slots is None:  # where each parameter lives: read again on every call, so a replaced one is seen
            slots = self.__dict__["_param_slots"] = [(m._parameters, k) for m in self.modules() for k in m._parameters]
        params = tuple(d[k] for d, k in slots)
        try:
            versions = tuple(p._version for p in params)
        except RuntimeError:  # made under inference_mode: no version counter, so no cache
            versions = None
        cache = self.__dict__.get("_folded_cache")
        if (versions is not None and cache is not None and cache[1] == versions and len(cache[0]) == len(params)
                and all(a is b for a, b in zip(cache[0], params))):  # the same tensors (held), unchanged
            return cache[2]
        with torch.no_grad():
            nn_ = self.n_features - self.n_context
            e1, e2, mix = self.embed[0], self.embed[2], self.mix[0]
            f = {"w1n": e1.weight[:, :nn_].contiguous(), "w1c": e1.weight[:, nn_:].contiguous(), "b1": e1.bias.clone(),
                 "w2": e2.weight.clone(), "b2": e2.bias.unsqueeze(1).clone(), "bm": mix.bias.unsqueeze(1).clone(),
                 "wm": mix.weight.clone(), "adv_w": self.adv.weight[0].clone(), "adv_b": self.adv.bias.clone()}
            if self.attention:
                dk, hd = self.dk, e2.weight.shape[0]
                scale = 1.0 / math.sqrt(dk)
                wk, wv = self.pool_kv.weight[:dk], self.pool_kv.weight[dk:]
                bk, bv = self.pool_kv.bias[:dk], self.pool_kv.bias[dk:]
                f.update(a_pool=torch.mm(self.seeds, wk) * scale,
                         bk=(torch.mv(self.seeds, bk) * scale).unsqueeze(1), bv=bv.clone(), wv_t=wv.t().contiguous(),
                         sum_b=self.sum_kv.bias.clone(), sum_w_t=self.sum_kv.weight.t().contiguous(),
                         row_w=self.row_q.weight.clone(), row_b=self.row_q.bias.clone(), scale=scale,
                         wm_s=mix.weight[:, hd:].contiguous(), wm_e=mix.weight[:, :hd].contiguous())
        if versions is not None:
            self.__dict__["_folded_cache"] = (params, versions, f)
        return f

    def forward(self, x: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor | None = None,
                counts: torch.Tensor | None = None) -> torch.Tensor:
        """Q of every row. ``counts`` (..., N): how many identical nodes each row stands for (None: one each);
        a compacted state (:func:`compact_state`) then gives the Q values of the full one."""
        e = self.embed(x)
        logw = None if counts is None else torch.log(counts.clamp_min(1.0))
        s = self._summaries(e, valid, logw) if self.attention else None
        h = self._heads(e, s)
        a = self.adv(h).squeeze(-1)
        m, cnt = _feasible_weights(mask, counts, h.dtype)
        pooled = (h * m.unsqueeze(-1)).sum(-2) / cnt
        ctx = x[..., 0, self.n_features - self.n_context:]
        v = self.value(torch.cat((ctx, pooled), -1))
        a_mean = (a * m).sum(-1, keepdim=True) / cnt
        return (v + a - a_mean).masked_fill(~mask, NEG)


def _feasible_weights(mask: torch.Tensor, counts: torch.Tensor | None, dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's weight in the dueling head's means over the feasible nodes (its node count where it is
    feasible, else 0), and their sum (at least 1)."""
    m = mask.to(dtype)
    if counts is not None:
        m = m * counts.to(dtype)
    return m, m.sum(-1, keepdim=True).clamp_min(1.0)


def _softmax_inplace(x: np.ndarray, axis: int) -> np.ndarray:
    """Softmax of ``x`` along ``axis``, written over ``x``."""
    x -= x.max(axis=axis, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=axis, keepdims=True)
    return x


#: (process id, threads) of the last BLAS cap this process applied: the call scans the loaded libraries (~1 ms).
_blas_cap: tuple[int, int] | None = None


def limit_threads(n: int) -> None:
    """Run inference on ``n`` threads: torch's intra-op pool (OpenMP's count is per calling thread) and numpy's
    BLAS pool (process-wide; the decision path's matmuls are numpy's, :meth:`SetQNetwork.score_parts_np`).
    OpenBLAS's default pool of one thread per core busy-waits between the small calls of a decision, beside a
    live scheduler's informer and binding threads or a sibling worker process (docs/live.md, third pass)."""
    global _blas_cap
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    if _blas_cap != (os.getpid(), n):
        threadpool_limits(limits=n, user_api="blas")
        _blas_cap = (os.getpid(), n)


def make_network(cfg: DQNConfig) -> nn.Module:
    """The network a config asks for: schema 1's :class:`QNetwork` or schema 2's :class:`SetQNetwork`."""
    if cfg.feature_schema == 1:
        return QNetwork(cfg.hidden)
    nf, nc = n_features(cfg.feature_schema)
    return SetQNetwork(nf, nc, cfg.hidden, attention=cfg.attention, inducing=cfg.inducing_points,
                       attention_dim=cfg.attention_dim, head_hidden=cfg.head_hidden)


class ReplayBatch(NamedTuple):
    obs: torch.Tensor  # (B, N, F) float32
    mask: torch.Tensor  # (B, N) bool
    actions: torch.Tensor  # (B,) int64: rows of obs
    returns: torch.Tensor  # (B,) float32, the discounted n-step reward sum
    next_obs: torch.Tensor  # (B, N', F)
    next_mask: torch.Tensor
    discounts: torch.Tensor  # (B,) float32: prod of per-step gammas over the n steps; 0 when terminated
    valid: torch.Tensor | None = None  # (B, N) bool: real rows (not padding), for the attention
    teacher: torch.Tensor | None = None  # (B,) int64: the teacher heuristic's choice (a row of obs), -1 when none
    next_valid: torch.Tensor | None = None  # (B, N') bool; None: ``valid``
    counts: torch.Tensor | None = None  # (B, N) float32: nodes each row stands for (0: padding); None: one each
    next_counts: torch.Tensor | None = None


#: Odd 64-bit multipliers of :func:`compact_state`'s row hash (fixed: the same rows hash alike in every process).
_ROW_HASH = np.random.default_rng(0x6A6F756C).integers(1, 2**63, size=1024, dtype=np.uint64) | np.uint64(1)


def compact_state(rows: np.ndarray, mask: np.ndarray, dedup: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One state as its distinct (row, feasible) pairs: ``(rows, mask, counts, inverse)``, rows in the order
    of their first node, ``counts`` the nodes each stands for, ``inverse`` each node's row.

    A cluster's empty nodes of one kind and power state have identical rows (1,523 OpenB nodes make about 35
    distinct ones), and the networks read a row with its count exactly as its copies (:meth:`SetQNetwork.forward`),
    so the replay stores and trains on these. Keyed on the rows themselves, not on
    :attr:`FeatureBuilder.node_class` (which the decision path uses to skip empty twins): what is merged is then
    exactly what is stored, busy nodes with equal rows included. ``dedup=False``: every node its own row (the
    layout before)."""
    n, f = rows.shape
    if not dedup or n < 2:
        return rows, mask, np.ones(n, dtype=np.int32), np.arange(n)
    key = np.empty((n, f + 1), dtype=np.uint16)
    key[:, :f] = np.ascontiguousarray(rows, dtype=np.float16).view(np.uint16)
    key[:, f] = mask
    if f + 1 <= _ROW_HASH.size:  # a 64-bit hash per row, checked below: a collision falls back to the exact sort
        _, first, inv = np.unique(key.astype(np.uint64) @ _ROW_HASH[:f + 1], return_index=True, return_inverse=True)
    else:
        first, inv = np.arange(0), np.arange(0)
    if first.size == 0 or not np.array_equal(key[first[inv]], key):
        _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    first, inv = first[order], rank[inv]
    return rows[first], mask[first], np.bincount(inv, minlength=first.size).astype(np.int32), inv


class Transitions(NamedTuple):
    """One episode's n-step transitions as a rollout returns them: each of its ``T + 1`` states once, compacted
    (:func:`compact_state`; state ``k`` is ``rows[offsets[k]:offsets[k + 1]]``), the step each n-step target
    looks at (``next_index``), the actions and teacher's choices as node indices and as rows of their state."""

    rows: np.ndarray  # (R, F) float16
    row_mask: np.ndarray  # (R,) bool: the row's nodes are feasible
    row_count: np.ndarray  # (R,) int32: the nodes a row stands for
    offsets: np.ndarray  # (T + 2,) int64
    actions: np.ndarray  # (T,) int64 node indices
    action_rows: np.ndarray  # (T,) int64 rows of their state
    returns: np.ndarray  # (T,) float32
    discounts: np.ndarray  # (T,) float32
    next_index: np.ndarray  # (T,) int64
    teacher: np.ndarray  # (T,) int64 node indices, -1 none
    teacher_rows: np.ndarray  # (T,) int64, -1 none

    @property
    def n_states(self) -> int:
        return self.offsets.size - 1

    def state(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """State ``k``'s (rows, mask, counts)."""
        a, b = self.offsets[k], self.offsets[k + 1]
        return self.rows[a:b], self.row_mask[a:b], self.row_count[a:b]

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(self, f).nbytes) for f in self._fields)


class ReplayBuffer:
    """Circular storage of n-step transitions that point at their episode's states (:class:`Transitions`, kept
    once, float16: features are bounded in [-1, 4]).

    ``capacity`` transitions; with ``memory_bytes``, the oldest are dropped while the episodes they hold exceed
    it. Besides the transition it keeps each state's row count (padding rows are not nodes: the attention must not
    read them) and the teacher heuristic's choice in its state (the margin loss, agent/train.py)."""

    def __init__(self, capacity: int, memory_bytes: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity, self.memory_bytes = capacity, memory_bytes
        self.episode = np.full(capacity, -1, dtype=np.int64)
        self.step = np.zeros(capacity, dtype=np.int64)
        self.episodes: dict[int, Transitions] = {}
        self._refs: dict[int, int] = {}
        self.bytes = 0
        self.size = 0
        self.pos = 0  # the next slot written
        self._eid = 0
        self.over_cap_warned = False

    @staticmethod
    def bytes_per_transition(max_nodes: int, n_features: int) -> int:
        """Bytes of one transition of uncompacted ``max_nodes`` rows (the state and the next one's share)."""
        return 2 * max_nodes * (2 * n_features + 1) + 48

    def __len__(self) -> int:
        return self.size

    def _release(self, slot: int) -> None:
        eid = int(self.episode[slot])
        if eid < 0:
            return
        self.episode[slot] = -1
        self._refs[eid] -= 1
        if self._refs[eid] == 0:
            self.bytes -= self.episodes.pop(eid).nbytes
            del self._refs[eid]

    def add_many(self, t: Transitions) -> None:
        """Append an episode's transitions (rollout order)."""
        n = int(t.actions.size)
        if n == 0:
            return
        eid, self._eid = self._eid, self._eid + 1
        self.episodes[eid], self._refs[eid] = t, 0
        self.bytes += t.nbytes
        for k in range(n):
            i = self.pos
            self._refs[eid] += 1  # before the release: the slot may hold this episode's own first steps
            self._release(i)
            self.episode[i], self.step[i] = eid, k
            self.pos = (i + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)
        # Over the memory cap: drop the oldest transitions (their episodes go with the last of them), never the new
        # episode's own: its states are freed only with its last transition, so dropping some of them saves
        # nothing, and trimming into it left a buffer of one transition, every batch 128 copies of it.
        while self.memory_bytes is not None and self.bytes > self.memory_bytes and self.size > n:
            self._release((self.pos - self.size) % self.capacity)
            self.size -= 1
        if self.memory_bytes is not None and t.nbytes > self.memory_bytes and not self.over_cap_warned:
            self.over_cap_warned = True
            log.warning("one episode's transitions take %.1f MiB, more than replay_memory_mb (%.1f MiB): the replay "
                        "holds that episode alone; raise dqn.replay_memory_mb", t.nbytes / 2**20,
                        self.memory_bytes / 2**20)

    def sample(self, batch_size: int, rng: np.random.Generator) -> ReplayBatch:
        r = rng.integers(self.size, size=batch_size)
        slots = r if self.size == self.capacity else (self.pos - self.size + r) % self.capacity
        states, nexts, act, ret, disc, teach = [], [], [], [], [], []
        for i in slots:
            t, k = self.episodes[int(self.episode[i])], int(self.step[i])
            states.append(t.state(k))
            nexts.append(t.state(int(t.next_index[k])))
            act.append(t.action_rows[k])
            ret.append(t.returns[k])
            disc.append(t.discounts[k])
            teach.append(t.teacher_rows[k])
        obs, mask, valid, counts = _pad(states)
        nobs, nmask, nvalid, ncounts = _pad(nexts)
        uniform = all(int(c.max(initial=1)) == 1 for _, _, c in states + nexts)
        tt = torch.from_numpy
        return ReplayBatch(tt(obs), tt(mask), tt(np.asarray(act, dtype=np.int64)), tt(np.asarray(ret, np.float32)),
                           tt(nobs), tt(nmask), tt(np.asarray(disc, np.float32)), tt(valid),
                           tt(np.asarray(teach, dtype=np.int64)), tt(nvalid),
                           None if uniform else tt(counts), None if uniform else tt(ncounts))


def _pad(states: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """States of different row counts as (B, N, F) float32 rows, masks, valid rows and counts (0 on padding)."""
    n = max(r.shape[0] for r, _, _ in states)
    f = states[0][0].shape[1]
    obs = np.zeros((len(states), n, f), dtype=np.float32)
    mask = np.zeros((len(states), n), dtype=bool)
    counts = np.zeros((len(states), n), dtype=np.float32)
    for b, (r, m, c) in enumerate(states):
        obs[b, :r.shape[0]] = r
        mask[b, :m.size] = m
        counts[b, :c.size] = c
    return obs, mask, counts > 0, counts


def margin_loss(q: torch.Tensor, teacher: torch.Tensor, margin: float,
                counts: torch.Tensor | None = None, twins: bool = True) -> torch.Tensor:
    """DQfD's large-margin loss (Hester et al., AAAI 2018): ``max_a [Q(s, a) + margin 1(a != a_T)] - Q(s, a_T)``
    over the feasible actions (``q`` holds -1e9 elsewhere), averaged over rows with a teacher action.

    With ``counts`` (compacted states: a row stands for that many identical nodes) and ``twins`` the teacher's
    row keeps the margin when it stands for more than one node: its other nodes are actions other than the
    teacher's, with the same Q, as they were when each node had its own row (``dqn.bc_margin_twins``)."""
    has = teacher >= 0
    if not bool(has.any()):
        return q.sum() * 0.0
    q, t = q[has], teacher[has].unsqueeze(-1)
    q_t = q.gather(-1, t).squeeze(-1)
    own = torch.zeros_like(q_t)
    if counts is not None and twins:
        own = margin * (counts[has].gather(-1, t).squeeze(-1) > 1).to(q.dtype)
    bonus = torch.full_like(q, margin).scatter(-1, t, own.unsqueeze(-1))
    return ((q + bonus).max(-1).values - q_t).mean()


class DQN:
    """Online and target networks, the optimizer, and the masked Double DQN update."""

    def __init__(self, cfg: DQNConfig, seed: int = 0) -> None:
        self.cfg = cfg
        torch.manual_seed(seed)
        self.q = make_network(cfg)
        self.q_target = make_network(cfg)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.learning_rate)
        self.updates = 0

    @property
    def schema(self) -> int:
        return self.cfg.feature_schema

    @torch.inference_mode()
    def greedy(self, rows: np.ndarray, mask: np.ndarray) -> int:
        """argmax of Q over the feasible rows (rows (N, F) float32, mask (N,) bool)."""
        idx = np.flatnonzero(mask)
        if idx.size == 1:
            return int(idx[0])
        a = self.q.score(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)), torch.from_numpy(idx))
        return int(idx[int(torch.argmax(a))])

    def update(self, b: ReplayBatch, bc_weight: float = 0.0, td_weight: float = 1.0) -> float:
        """One gradient step of masked Double DQN with Huber loss, plus ``bc_weight`` times the margin loss
        toward the teacher's choices; returns the loss."""
        with torch.no_grad():
            # (a terminal next state is all zeros, and its value unused)
            nv = b.valid if b.next_valid is None else b.next_valid
            next_online = self.q(b.next_obs, b.next_mask, nv, b.next_counts)
            best = next_online.argmax(-1, keepdim=True)
            next_q = self.q_target(b.next_obs, b.next_mask, nv, b.next_counts).gather(-1, best).squeeze(-1)
            has_next = b.next_mask.any(-1)
            next_q = torch.where(has_next, next_q, torch.zeros_like(next_q))
            target = b.returns + b.discounts * next_q
        q_all = self.q(b.obs, b.mask, b.valid, b.counts)
        q = q_all.gather(-1, b.actions.unsqueeze(-1)).squeeze(-1)
        loss = td_weight * F.huber_loss(q, target, delta=self.cfg.huber_delta)
        if bc_weight > 0 and b.teacher is not None:
            loss = loss + bc_weight * margin_loss(q_all, b.teacher, self.cfg.bc_margin, b.counts,
                                                   self.cfg.bc_margin_twins)
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
