"""Online, honest prediction of pod lifetimes and node load for the DQN's feature schema 2.

LAVA-style (Barbalho et al., "LAVA: Lifetime-Aware VM Allocation with Learned Distributions and Adaptation to
Mispredictions", MLSys 2024): what a pod has left to live is predicted from the distribution of the lifetimes
of pods like it, *conditioned on its age*, and re-read as it ages, so a pod that outlives its first prediction
is re-predicted from the tail of the distribution instead of being trusted to leave.

Honesty: the predictor learns only from what a backend reports while the run goes on (a pod bound to a node at
time t, a pod that ended at time t), never from a workload's durations. ``tests/agent/test_predictor.py``
shuffles the true durations of pods that have not ended yet and checks that no decision made before then moves.

* **Keys, with fallbacks.** A pod's key is its app/owner key (namespace, owner kind, app), its priority, QoS
  class and kind. Lifetimes are pooled at four levels (that key; kind, owner kind, priority and QoS; kind and
  QoS; kind) and over all pods. Each level's estimate is shrunk toward the next more general one by its
  number of observations (``n m + k e_parent) / (n + k)``), so an unseen key predicts what its class does and a
  key with many finished pods predicts what it has done.
* **The distribution.** Per key, a histogram of finished lifetimes on log-spaced bins (1 s to about 4 months)
  with the sum of the lifetimes per bin. For age ``a`` in bin ``j`` the remaining life is the mean lifetime of
  the key's pods that lived at least the bin's lower edge, minus ``a``. Where no finished pod ever lived that
  long the prior is Lindy's (a pod that has lived ``a`` lives about ``a`` more, at least ``prior_s`` at age 0):
  that is what makes long-running services look long-running before one of them has ended.
* **Nodes.** Per node: the predicted time until it holds no pod (the largest remaining life of its pods) and
  the share of its requested CPU predicted to be still there in ``horizon_s`` (times its demand now: the
  predicted load). Kept incrementally (issue 28): a pod's prediction is ``max(T - age, max(1, age / 20))``
  with ``T`` its key's table entry for its age bin, so between two changes of its bin (or of the table) the
  node's largest remaining life is ``max(max_p (t0_p + T_p) - now, 1, (now - min_p t0_p) / 20)`` and its
  "still there in ``horizon_s``" flag changes only at two known times. Per node the view keeps the pod count,
  the requested CPU, the CPU still there, ``max (t0 + T)`` and ``min t0``; a bind or an end patches its node
  (O(1), a node's max recomputed from its own pods when the pod that held it leaves), and each pod keeps the
  time of its next change (bin edge, flag flip), so a decision re-evaluates only the pods whose bin or flag
  changed since the last one (one compiled pass over the pods' next-change times finds them: a heap cost more
  in its Python pops than the scan, agent/fused.py). A new table (more pods ended) recomputes the view once, vectorised.
  :meth:`PodPredictor.nodes_scratch` is the from-scratch computation it equals (up to float rounding;
  ``tests/agent/test_predictor_incremental.py``).
* **Arrivals.** Exponentially weighted rates of placements (requested CPU per second) over 5 minutes and an
  hour: the offered load (Little's law: rate x mean predicted life / cluster CPU) and its trend.

Two feeds: the twin calls :meth:`PodPredictor.bound` / :meth:`PodPredictor.ended` (``Twin.add_pod_observer``);
on a cluster :class:`KubePodFeed` turns the scheduler cache's pod events (``KubeCache.add_pod_listener``) into
the same calls.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence

import numpy as np

from joulesched.agent import fused

#: Log-spaced lifetime bins: edge k is 2 ** (k / 2) seconds (1 s ... 2 ** 23.5 s, about 135 days).
N_BINS = 48
_EDGES = 2.0 ** (np.arange(N_BINS + 1) / 2.0)
_LOG2 = math.log(2.0)
#: Key levels, most specific first; the last one pools every pod.
N_LEVELS = 5
_NO_META_KEY = ("job", "", "default", "", 0, "BestEffort")


def _bin_of(life: float) -> int:
    if life < 1.0:
        return 0
    return min(N_BINS - 1, int(2.0 * math.log(life) / _LOG2))


def _bins_of(ages: np.ndarray) -> np.ndarray:
    """Vectorised :func:`_bin_of`."""
    with np.errstate(divide="ignore"):
        j = (2.0 / _LOG2) * np.log(np.maximum(ages, 1.0))
    return np.minimum(j.astype(np.int64), N_BINS - 1)


def level_keys(meta) -> tuple[Hashable, ...]:
    """The pod's keys, most specific first (``meta`` is a :class:`~joulesched.cluster.workload.PodMeta` or
    None). The last one, ``()``, pools every pod."""
    if meta is None:
        kind, owner, ns, app, prio, qos = _NO_META_KEY
    else:
        kind, owner, ns, app, prio, qos = (meta.kind, meta.owner_kind, meta.namespace, meta.app, meta.priority,
                                           meta.qos_class)
    return ((kind, owner, ns, app, prio, qos), (kind, owner, prio, qos), (kind, qos), (kind,), ())


class _Level:
    """Histograms of one key level: per key, counts and summed lifetimes per bin."""

    def __init__(self) -> None:
        self.index: dict[Hashable, int] = {}
        self.counts = np.zeros((4, N_BINS))
        self.sums = np.zeros((4, N_BINS))

    def row(self, key: Hashable) -> int:
        r = self.index.get(key)
        if r is None:
            r = self.index[key] = len(self.index)
            if r >= self.counts.shape[0]:
                self.counts = np.concatenate((self.counts, np.zeros_like(self.counts)))
                self.sums = np.concatenate((self.sums, np.zeros_like(self.sums)))
        return r

    def conditional(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per key (every one, or ``rows``) and bin ``j``: (number of lifetimes >= edge j, their mean)."""
        counts, sums = (self.counts[:len(self.index)], self.sums[:len(self.index)]) if rows is None else \
            (self.counts[rows], self.sums[rows])
        c = np.cumsum(counts[:, ::-1], axis=1)[:, ::-1]
        s = np.cumsum(sums[:, ::-1], axis=1)[:, ::-1]
        with np.errstate(invalid="ignore", divide="ignore"):
            m = np.where(c > 0, s / np.maximum(c, 1e-300), 0.0)
        return c, m


#: From this many keys on, a new key's row, or a key whose own evidence grew, is computed alone instead of the
#: whole table: a rebuild costs O(keys), and a cluster's CronJobs (a new owner name per run) add a key per run
#: (a review: 35 ms a decision at 10,000 keys). Below it every rebuild stays whole (each
#: row then also follows the general levels' latest ends), which is what every figure in the docs measured.
INCREMENTAL_KEYS = 2048


class LifetimeModel:
    """The keyed, age-conditioned lifetime distribution (module docstring).

    :param shrink: pseudo-count ``k`` of the shrinkage toward the more general level.
    :param prior_s: the prior's remaining life at age 0, before any pod has ended.
    """

    def __init__(self, shrink: float = 3.0, prior_s: float = 600.0) -> None:
        self.shrink, self.prior_s = float(shrink), float(prior_s)
        self.levels = [_Level() for _ in range(N_LEVELS)]
        self.kid: dict[Hashable, int] = {}  # most specific key -> row of the table
        self._kid_rows: list[list[int]] = []  # per kid: its row at each level
        self.observed = 0
        self._fresh_at = -1  # self.observed when the table was last computed
        self._buf = np.zeros((1, N_BINS))  # the table's rows, with room for new keys
        self._table = self._buf[:0]
        self.mean_life = self.prior_s  # of an arriving pod, all pods pooled (updated with the table)
        self._kid_n: dict[int, int] = {}  # ends observed per key
        self._kid_stale_at: dict[int, int] = {}  # a key's count at which the table is stale for it
        # Lindy's prior per bin: E[L | L >= edge] = 2 edge, at least prior_s.
        self._prior = np.maximum(2.0 * _EDGES[:-1], self.prior_s)

    def key_id(self, meta) -> int:
        keys = level_keys(meta)
        k = self.kid.get(keys[0])
        if k is None:
            k = self.kid[keys[0]] = len(self.kid)
            self._kid_rows.append([lv.row(key) for lv, key in zip(self.levels, keys)])
            if self._fresh_at >= 0 and self._table.shape[0] == k and k >= INCREMENTAL_KEYS:
                # A fresh table gains the new key's row alone: rebuilding all of it for every new key made each
                # decision cost in proportion to the keys seen (a review: 35 ms at 10,000 keys, which a cluster's
                # CronJobs, a new owner name per run, reach), and nothing the new key knows changed the others.
                if k >= self._buf.shape[0]:  # room doubles: a copy per new key was O(keys) again
                    self._buf = np.concatenate((self._buf, np.empty_like(self._buf)))
                self._buf[k] = self._estimate(np.asarray([self._kid_rows[k]]))[0]
                self._table = self._buf[:k + 1]
            else:
                self._fresh_at = -1
        return k

    def _estimate(self, rows: np.ndarray) -> np.ndarray:
        """Rows of :meth:`table` for keys whose rows at each level are ``rows`` (keys x levels): each level's
        conditional means, shrunk from all pods to the key's own."""
        est = np.broadcast_to(self._prior, (rows.shape[0], N_BINS))
        for li in range(N_LEVELS - 1, -1, -1):  # from all pods to the pod's own key
            c, m = self.levels[li].conditional(rows[:, li])
            est = (c * m + self.shrink * est) / (c + self.shrink)
        return np.array(est, dtype=np.float64)  # (a copy: est may be the prior's broadcast view)

    def observe(self, kid: int, life_s: float) -> None:
        """A pod of key ``kid`` ended after ``life_s`` seconds."""
        b = _bin_of(life_s)
        for lv, r in zip(self.levels, self._kid_rows[kid]):
            lv.counts[r, b] += 1.0
            lv.sums[r, b] += life_s
        self.observed += 1
        self._kid_n[kid] = n = self._kid_n.get(kid, 0) + 1
        if n >= self._kid_stale_at.get(kid, 1):  # this key's own evidence grew by a quarter: its row is stale
            if self._fresh_at >= 0 and kid < self._table.shape[0] and len(self.kid) >= INCREMENTAL_KEYS:
                # That row alone, as a rebuild would compute it now (the others move with the general levels,
                # 5 % of all ends at a time): a whole rebuild per new key's first end cost O(keys) a decision.
                self._table[kid] = self._estimate(np.asarray([self._kid_rows[kid]]))[0]
                self._table = self._buf[:self._table.shape[0]]  # a new object: PodPredictor's node view, keyed on
                # the table's identity, is recomputed (a review: written in place, it kept the old predicted ends)
                self._kid_stale_at[kid] = n + max(1, n // 4)
            else:
                self._fresh_at = -1

    def table(self) -> np.ndarray:
        """``(keys, N_BINS)``: the predicted mean lifetime of a pod of each key that has reached each bin's lower
        edge. Recomputed when 5 % more pods (at least one) have ended since the last time, or a quarter more of
        one key's (so a new key's first few ends count at once)."""
        stale = self.observed - max(self._fresh_at, 0) >= max(1, self.observed // 20)
        if self._fresh_at >= 0 and not stale and self._table.shape[0] == len(self.kid):
            return self._table
        k = self.shrink
        self._table = self._buf = self._estimate(np.asarray(self._kid_rows, dtype=np.int64).reshape(-1, N_LEVELS))
        if self._buf.shape[0] == 0:
            self._buf = np.zeros((1, N_BINS))
            self._table = self._buf[:0]
        self._fresh_at = self.observed
        self._kid_stale_at = {kid: n + max(1, n // 4) for kid, n in self._kid_n.items()}
        c, m = self.levels[N_LEVELS - 1].conditional()  # all pods pooled, at age 0
        n = float(c[0, 0]) if c.shape[0] else 0.0
        self.mean_life = (n * (float(m[0, 0]) if n else 0.0) + k * self.prior_s) / (n + k)
        return self._table

    def remaining(self, kid: int, age: float) -> float:
        """Predicted remaining life of a pod of key ``kid`` at age ``age`` seconds."""
        return max(float(self.table()[kid, _bin_of(age)]) - age, max(1.0, 0.05 * age))


class _Rate:
    """An exponentially weighted event rate (per second) with time constant ``tau``."""

    __slots__ = ("tau", "value", "t")

    def __init__(self, tau: float) -> None:
        self.tau, self.value, self.t = tau, 0.0, 0.0

    def add(self, t: float, weight: float) -> None:
        if t > self.t:
            self.value *= math.exp(-(t - self.t) / self.tau)
            self.t = t
        self.value += weight / self.tau

    def at(self, t: float) -> float:
        return self.value * math.exp(-max(t - self.t, 0.0) / self.tau)


class PodPredictor:
    """Running pods, the lifetime model and the arrival rates of one run (module docstring).

    :param horizon_s: how far ahead the predicted load looks.
    :param shrink, prior_s: the :class:`LifetimeModel`'s.
    """

    SHORT_S, LONG_S = 300.0, 3600.0
    _POD_ARRAYS = ("_node", "_t0", "_kid", "_cpu", "_learn", "_end", "_stay", "_next")
    _NODE_ARRAYS = ("_n_cnt", "_n_total", "_n_stay", "_n_end", "_n_t0")

    def __init__(self, horizon_s: float = 600.0, shrink: float = 3.0, prior_s: float = 600.0) -> None:
        self.horizon_s = float(horizon_s)
        self._shrink, self._prior_s = shrink, prior_s
        self.names: list[str] | None = None
        self.node_index: dict[str, int] = {}  # name -> index in names (the cluster feed's lookup)
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new run learns from nothing."""
        self.model = LifetimeModel(self._shrink, self._prior_s)
        self._pos: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        cap = 64
        self._node = np.zeros(cap, dtype=np.int64)
        self._t0 = np.zeros(cap)
        self._kid = np.zeros(cap, dtype=np.int64)
        self._cpu = np.zeros(cap)
        self._learn = np.zeros(cap, dtype=bool)  # its start was seen: its lifetime may be learned from
        # The incremental node view (module docstring). Per pod: t0 + T (-inf until first evaluated), its
        # "still there in horizon_s" flag, and when its bin or flag may next change (-inf: at the next query).
        self._end = np.full(cap, -np.inf)
        self._stay = np.zeros(cap, dtype=bool)
        self._next = np.full(cap, -np.inf)
        self.m = 0
        self._new_nodes(0)
        self._table_seen: np.ndarray | None = None  # the table the view was computed with (None: recompute)
        self._t_view = -np.inf  # the time the view was last brought to
        self._t0_max = -np.inf  # no running pod started after this
        self._rate_s, self._rate_l = _Rate(self.SHORT_S), _Rate(self.LONG_S)
        self._cpu_rate_l = _Rate(self.LONG_S)
        self._meta_kid: dict[object, int] = {}

    def _new_nodes(self, n: int) -> None:
        """Per-node aggregates for ``n`` nodes, rebuilt from the running pods."""
        m = self.m
        n = max(n, int(self._node[:m].max()) + 1 if m else 0, 1)
        self._n_cnt = np.zeros(n, dtype=np.int64)
        self._n_total = np.zeros(n)
        self._n_stay = np.zeros(n)
        self._n_end = np.full(n, -np.inf)
        self._n_t0 = np.full(n, np.inf)
        self._members: list[set[int]] = [set() for _ in range(n)]
        if m:
            node = self._node[:m]
            for k, j in enumerate(node.tolist()):
                self._members[j].add(k)
            self._n_cnt[:] = np.bincount(node, minlength=n)
            self._n_total[:] = np.bincount(node, weights=self._cpu[:m], minlength=n)
            np.minimum.at(self._n_t0, node, self._t0[:m])
        self._table_seen = None  # the time-dependent parts are recomputed at the next query

    def _grow_nodes(self, n: int) -> None:
        old = self._n_cnt.size
        if n <= old:
            return
        n = max(n, 2 * old)
        for name, fill in zip(self._NODE_ARRAYS, (0, 0.0, 0.0, -np.inf, np.inf)):
            a = getattr(self, name)
            setattr(self, name, np.concatenate((a, np.full(n - old, fill, dtype=a.dtype))))
        self._members.extend(set() for _ in range(n - old))

    # ---- node identity (a live cluster's node set changes) ---------------------------------------------------
    def set_nodes(self, names: Sequence[str]) -> None:
        """The backend's node order changed: re-index the running pods by node name (a pod on a node that is
        gone is forgotten)."""
        new = {n: i for i, n in enumerate(names)}
        if self.names is not None and list(names) != self.names and self.m:
            old = self.names
            for k in range(self.m - 1, -1, -1):
                j = new.get(old[int(self._node[k])]) if int(self._node[k]) < len(old) else None
                if j is None:
                    self._remove(self._keys[k], per_node=False)
                else:
                    self._node[k] = j
            self._new_nodes(len(names))
        if self.names is None or list(names) != self.names:
            self.names = list(names)
            self.node_index = {n: i for i, n in enumerate(self.names)}

    # ---- observations -------------------------------------------------------------------------------------
    def kid_of(self, meta) -> int:
        """Key id of ``meta`` (PodMeta objects are frozen and hashable; the twin shares equal ones)."""
        try:
            k = self._meta_kid.get(meta)
        except TypeError:
            k = None
        if k is None:
            k = self.model.key_id(meta)
            try:
                self._meta_kid[meta] = k
            except TypeError:
                pass
        return k

    def bound(self, t: float, key: Hashable, node: int, meta, cpu_m: float, learn: bool = True) -> None:
        """Pod ``key`` was bound to ``node`` at ``t`` (its life starts: waiting for a waking node counts).
        ``learn=False`` for a pod first seen already running (its start is unknown, so its life is not)."""
        if key in self._pos:
            self._remove(key)
        k = self.m
        if k == self._node.size:
            for name in self._POD_ARRAYS:
                a = getattr(self, name)
                setattr(self, name, np.concatenate((a, np.zeros_like(a))))
        t, cpu_m, node = float(t), float(cpu_m), int(node)
        self._pos[key] = k
        self._keys.append(key)
        self._node[k], self._t0[k], self._kid[k], self._cpu[k] = node, t, self.kid_of(meta), cpu_m
        self._learn[k] = learn
        self._end[k], self._stay[k], self._next[k] = -np.inf, False, -np.inf  # evaluated at the next query
        self.m = k + 1
        if node >= self._n_cnt.size:
            self._grow_nodes(node + 1)
        self._n_cnt[node] += 1
        self._n_total[node] += cpu_m
        if t < self._n_t0[node]:
            self._n_t0[node] = t
        self._members[node].add(k)
        if t > self._t0_max:
            self._t0_max = t
        if learn:
            self._rate_s.add(t, 1.0)
            self._rate_l.add(t, 1.0)
            self._cpu_rate_l.add(t, cpu_m)

    def ended(self, t: float, key: Hashable, completed: bool = True) -> None:
        """Pod ``key`` left its node at ``t``: finished (``completed``, its lifetime is learned), or evicted or
        cut off (censored: nothing is learned)."""
        k = self._pos.get(key)
        if k is None:
            return
        if completed and self._learn[k]:
            self.model.observe(int(self._kid[k]), max(t - float(self._t0[k]), 0.0))
        self._remove(key)

    def _remove(self, key: Hashable, per_node: bool = True) -> None:
        """Forget pod ``key``; ``per_node=False`` while the nodes are re-indexed (the caller rebuilds them)."""
        k = self._pos.pop(key)
        j = int(self._node[k])
        held_end = held_t0 = False
        if per_node:
            held_end = self._end[k] == self._n_end[j] and self._end[k] > -np.inf
            held_t0 = self._t0[k] == self._n_t0[j]
            self._n_cnt[j] -= 1
            self._members[j].discard(k)
            if self._n_cnt[j] == 0:  # exactly empty, whatever the rounding of the sums
                self._n_total[j] = self._n_stay[j] = 0.0
            else:
                self._n_total[j] -= self._cpu[k]
                if self._stay[k]:
                    self._n_stay[j] -= self._cpu[k]
        last = self.m - 1
        if k != last:  # swap-remove keeps the running pods in [0, m)
            lk = self._keys[last]
            self._keys[k] = lk
            self._pos[lk] = k
            for name in self._POD_ARRAYS:
                a = getattr(self, name)
                a[k] = a[last]
            if per_node:
                lm = self._members[int(self._node[k])]
                lm.discard(last)
                lm.add(k)
        self._keys.pop()
        self.m = last
        if held_end or held_t0:
            self._recompute_node(j)

    def _recompute_node(self, j: int) -> None:
        members = self._members[j]
        if not members:
            self._n_end[j], self._n_t0[j] = -np.inf, np.inf
            return
        s = np.fromiter(members, dtype=np.int64, count=len(members))
        self._n_end[j] = self._end[s].max()
        self._n_t0[j] = self._t0[s].min()

    # ---- the incremental node view ------------------------------------------------------------------------
    def _evaluate(self, now: float, s: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For the pods in slots ``s`` at ``now``: t0 + T, the "still there in horizon_s" flag (the from-scratch
        formula, so the flag is exactly :meth:`nodes_scratch`'s), and when either may next change (a little
        early: a pod looked at again without a change costs nothing but the look)."""
        t0 = self._t0[s]
        age = np.maximum(now - t0, 0.0)
        b = _bins_of(age)
        tb = table[self._kid[s], b]
        rem = np.maximum(tb - age, np.maximum(1.0, 0.05 * age))
        h = self.horizon_s
        stay = rem > h
        edge = np.where(b < N_BINS - 1, t0 + _EDGES[np.minimum(b + 1, N_BINS)], np.inf)
        flips = (t0 + tb - h, t0 + h / 0.05)  # T - age falls to h; age / 20 passes h
        nxt = edge - 1e-12 * (np.abs(edge) + np.abs(t0) + 1.0)
        for c in flips:
            margin = 1e-12 * (np.abs(c) + np.abs(t0) + 1.0)
            nxt = np.where(c > now - margin, np.minimum(nxt, c - margin), nxt)
        nxt = np.where(nxt > now, nxt, np.nextafter(now, np.inf))
        return t0 + tb, stay, nxt

    def _recompute_view(self, now: float, table: np.ndarray) -> None:
        """Every pod evaluated afresh (a new table, a re-indexed node set): vectorised, O(running pods)."""
        m = self.m
        s = np.arange(m)
        end, stay, nxt = self._evaluate(now, s, table)
        self._end[:m], self._stay[:m], self._next[:m] = end, stay, nxt
        n = self._n_cnt.size
        node = self._node[:m]
        self._n_stay[:] = np.bincount(node, weights=self._cpu[:m] * stay, minlength=n)
        self._n_end[:] = -np.inf
        np.maximum.at(self._n_end, node, end)
        self._table_seen = table

    def _advance(self, now: float, table: np.ndarray) -> None:
        """Re-evaluate the pods whose bin or flag may have changed by ``now`` (and the new ones): one compiled
        pass over the running pods (agent/fused.py), the formulas of :meth:`_evaluate` one pod at a time."""
        m = self.m
        fell = fused.advance_view(float(now), m, self._t0, self._kid, self._cpu, self._node, self._end, self._stay,
                                  self._next, table, self._n_end, self._n_stay, self.horizon_s, _EDGES,
                                  2.0 / _LOG2)
        if fell.size:
            for j in np.unique(fell).tolist():
                self._recompute_node(j)

    # ---- predictions --------------------------------------------------------------------------------------
    def pod_remaining(self, meta, age: float = 0.0) -> float:
        """Predicted remaining life of a pod with metadata ``meta`` at ``age`` seconds (0: arriving)."""
        return self.model.remaining(self.kid_of(meta), age)

    def mean_life(self) -> float:
        """The predicted life of an arriving pod of no particular key (all pods pooled)."""
        if self.model.kid:
            self.model.table()
        return self.model.mean_life

    def nodes(self, now: float, n_nodes: int, at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per node: (predicted seconds until it holds no pod, 0 when empty; share of its pods' requested CPU
        predicted to be still there in ``horizon_s``, 1 when empty). From the incremental view (module
        docstring); the same as :meth:`nodes_scratch` up to float rounding. A query earlier than the last one,
        or earlier than a running pod's start, is answered from scratch (the view only moves forward).
        ``at``: the first array for those nodes only (``nodes(...)[0][at]``, computed there alone)."""
        if self.m == 0:
            return np.zeros(n_nodes if at is None else len(at)), np.ones(n_nodes)
        now = float(now)
        table = self.model.table()
        if now < self._t0_max or (now < self._t_view and table is self._table_seen):
            empty_in, share = self.nodes_scratch(now, n_nodes)
            return (empty_in if at is None else empty_in[at]), share
        if n_nodes > self._n_cnt.size:
            self._grow_nodes(n_nodes)
        if table is not self._table_seen:
            self._recompute_view(now, table)
        else:
            self._advance(now, table)
        self._t_view = now
        sel = slice(0, n_nodes) if at is None else at
        end, t0, cnt = self._n_end[sel], self._n_t0[sel], self._n_cnt[sel]
        empty_in = np.maximum(np.maximum(end - now, 1.0), 0.05 * (now - t0))
        empty_in[cnt == 0] = 0.0
        total = self._n_total[:n_nodes]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total > 0, self._n_stay[:n_nodes] / np.maximum(total, 1e-300), 1.0)
        return empty_in, share

    def nodes_scratch(self, now: float, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`nodes` computed from every running pod (O(running pods)): what the incremental view equals."""
        m = self.m
        empty_in = np.zeros(n_nodes)
        if m == 0:
            return empty_in, np.ones(n_nodes)
        node = self._node[:m]
        age = np.maximum(now - self._t0[:m], 0.0)
        table = self.model.table()
        rem = np.maximum(table[self._kid[:m], _bins_of(age)] - age, np.maximum(1.0, 0.05 * age))
        np.maximum.at(empty_in, node, rem)
        cpu = self._cpu[:m]
        total = np.bincount(node, weights=cpu, minlength=n_nodes)
        stay = np.bincount(node, weights=cpu * (rem > self.horizon_s), minlength=n_nodes)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total > 0, stay / np.maximum(total, 1e-300), 1.0)
        return empty_in, share

    def arrivals(self, now: float, total_cpu_m: float) -> tuple[float, float]:
        """(offered load: requested CPU arriving per second x the mean predicted life / cluster CPU, squashed
        x / (1 + x); trend: log of the 5-minute over the 1-hour placement rate, clipped to [-1, 1])."""
        life = self.mean_life()
        load = self._cpu_rate_l.at(now) * life / max(total_cpu_m, 1.0)
        s, lo = self._rate_s.at(now), self._rate_l.at(now)
        trend = 0.0 if s + lo <= 0 else max(-1.0, min(1.0, math.log((s + 1e-4) / (lo + 1e-4)) / 2.0))
        return load / (1.0 + load), trend

    @property
    def running(self) -> int:
        return self.m


class KubePodFeed:
    """The predictor's feed on a cluster: a ``KubeCache`` pod listener (``cache.add_pod_listener(feed)``).

    The cache calls listeners with its lock held, so :meth:`__call__` only appends to a queue; the policy drains
    it (:meth:`drain`) when it decides, translating the monotonic clock into the ClusterState's ``now``. A pod
    starts when it is first seen on a node (one first seen already on a node, e.g. at start-up, is followed for
    its node but its lifetime is not learned: its start is unknown) and ends when it is deleted or terminal
    (Succeeded: completed; Failed or deleted while running: also completed, as kube-scheduler's cache sees it;
    one carrying the DisruptionTarget condition, evicted or preempted, is censored, as the twin counts evictions).
    """

    MAX_QUEUE = 1_000_000

    def __init__(self, clock=time.monotonic) -> None:
        self._q: deque = deque(maxlen=self.MAX_QUEUE)
        self._clock = clock
        self._lock = threading.Lock()
        self._seen_pending: set[str] = set()

    def __call__(self, old, new) -> None:
        t = self._clock()
        with self._lock:
            if new is not None and new.node_name and new.active and not new.deleting:
                if old is None or not old.node_name or old.node_name != new.node_name:
                    learn = new.uid in self._seen_pending
                    self._seen_pending.discard(new.uid)
                    self._q.append(("bound", t, new.uid, new.node_name, new.meta, float(new.request.nz_cpu), learn))
            elif new is not None and not new.node_name and new.active:
                self._seen_pending.add(new.uid)
            elif old is not None and old.node_name:
                self._seen_pending.discard(old.uid)
                # An evicted pod (consolidation's, a preemption's: DisruptionTarget) did not live its life out:
                # censored, as the twin counts an eviction; it was learnt as a whole life (a review).
                # (The condition may come with the end itself, a kubelet's node-pressure eviction: new has it.)
                disrupted = getattr(old, "disrupted", False) or getattr(new, "disrupted", False)
                self._q.append(("ended", t, old.uid, not disrupted))
            elif old is not None:
                self._seen_pending.discard(old.uid)

    def drain(self, predictor: PodPredictor, now: float) -> int:
        """Apply the queued events to ``predictor``; ``now`` is the state's clock at this instant."""
        with self._lock:
            events = list(self._q)
            self._q.clear()
        if not events:
            return 0
        offset = self._clock() - now
        index = predictor.node_index
        for ev in events:
            if ev[0] == "bound":
                _, t, uid, node, meta, cpu, learn = ev
                i = index.get(node)
                if i is not None:
                    predictor.bound(t - offset, uid, i, meta, cpu, learn=learn)
            else:
                predictor.ended(ev[1] - offset, ev[2], completed=ev[3])
        return len(events)


class PredictorFeed:
    """An online :class:`PodPredictor` fed by the run's backend: the twin's ``add_pod_observer`` (beside any
    other observer) or a live cache's pod events (:class:`KubePodFeed`, subscribed once per cache: a cache
    cannot unsubscribe). A policy that reads
    predictions holds one and calls :meth:`attach` / :meth:`detach` from its own (``run_policy`` calls those)."""

    def __init__(self, predictor: PodPredictor | None) -> None:
        self.predictor = predictor
        self._feed: KubePodFeed | None = None
        self._source: object | None = None

    def attach(self, backend: object) -> None:
        if self.predictor is None:
            return
        self.predictor.reset()
        add = getattr(backend, "add_pod_observer", None)
        if add is not None:  # the twin: beside any other feed (a planner attaches several bases to one twin)
            add(self.predictor)
            self._feed = None
            return
        cache = getattr(backend, "cache", None)
        listen = getattr(cache, "add_pod_listener", None)
        if listen is not None and self._source is not cache:
            self._feed = KubePodFeed()
            self._source = cache
            listen(self._feed)

    def detach(self, backend: object) -> None:
        remove = getattr(backend, "remove_pod_observer", None)
        if remove is not None and self.predictor is not None:
            remove(self.predictor)

    def sync(self, state) -> PodPredictor | None:
        """The predictor, up to date at the ClusterState ``state``'s ``now`` (a live feed's queued events applied)."""
        if self._feed is not None and self.predictor is not None:
            self._feed.drain(self.predictor, state.now)
        return self.predictor


__all__ = ["KubePodFeed", "LifetimeModel", "PodPredictor", "PredictorFeed", "level_keys"]
