"""What the DQN sees: one normalised feature row per node, the same for 3 nodes or 5,000.

Each row is ``[node features | pod features | cluster context]`` (the pod and context parts are repeated on
every row), so one shared network scores every node from (node, pod, cluster). Every number is a fraction of
something the node or the cluster has, so nothing depends on the node count or on absolute watts:

* capacities: fractions of the node's allocatable CPU, memory and pod slots;
* watts: relative to the largest peak draw in the cluster (so a node's idle and marginal watts compare across
  node types), plus idle/peak of the node's own curve;
* efficiency: millicores per watt at full load, relative to the cluster's most efficient node;
* power state flags (asleep, waking, empty) and the time to the node's next known pod departure, squashed as
  ``dt / (dt + 600 s)`` (1 = nothing will leave).

Two schemas. Version 1 (:class:`FeatureBuilder`) is what ``models/small.pt`` was trained on; its
``departure_soon`` column reads the twin's own departure times. Version 2 (:class:`FeatureBuilderV2`, the
default since the learned scheduler of issue 15) reads nothing a cluster would not show: the time a node needs
to empty and its load in ten minutes come from the online predictor (agent/predictor.py); it adds the pod's
predicted life and kind, the recent arrival rate and its trend, and where the two sleep-aware heuristics would
put the pod. Checkpoints record the schema; a model of a schema this code does not know is refused
(agent/checkpoint.py). Bump a version whenever a column changes meaning or order.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from joulesched.agent import fused
from joulesched.agent.features_gpu_columns import CONTEXT_FEATURES_GPU, NODE_FEATURES_GPU, POD_FEATURES_GPU
from joulesched.cluster.state import ASLEEP, WAKING, ClusterState, PodRequest

#: Schema 1's version number (the original columns; :data:`LATEST_SCHEMA` is what new models use).
SCHEMA_VERSION = 1
LATEST_SCHEMA = 2
#: Schema 3 (agent/features_gpu.py) adds GPU columns to schema 2's; it is opt-in (``--feature-schema 3``).
GPU_SCHEMA = 3

NODE_FEATURES = (
    "req_cpu_frac",  # sum of real CPU requests / allocatable
    "req_mem_frac",  # sum of real memory requests / allocatable
    "pods_frac",  # bound pods / pod slots
    "util",  # demanded CPU / allocatable, clipped to [0, 2] (> 1: pods are throttled)
    "util_after",  # util with the pod's non-zero CPU request added, clipped to [0, 2]
    "over_after",  # max(0, util_after - 1)
    "nz_cpu_after",  # kube non-zero CPU requests incl. this pod / allocatable (MostAllocated's view), <= 1.5
    "nz_mem_after",  # same for memory
    "watts_now",  # current draw / cluster max peak
    "marginal_watts",  # draw after adding the pod's request - draw now (from the sleep draw if asleep) / max peak
    "idle_watts",  # 0 % draw / cluster max peak
    "peak_watts",  # 100 % draw / cluster max peak
    "idle_over_peak",  # the node's own idle / peak
    "sleep_saving",  # (idle - sleep draw) / cluster max peak: what emptying the node saves (0 if always on)
    "efficiency",  # (allocatable millicores / peak watts) / cluster max of the same
    "cpu_size",  # allocatable CPU / cluster max
    "asleep",
    "waking",
    "empty",  # no pod bound
    "departure_soon",  # squashed time to the next departure: dt / (dt + 600 s), 1 when none
    "pod_cpu_share",  # the pod's non-zero CPU request / allocatable, <= 1.5
)
POD_FEATURES = (
    "pod_cpu",  # non-zero CPU request / mean allocatable CPU, <= 4
    "pod_mem",  # non-zero memory request / mean allocatable memory, <= 4
    "best_effort",  # the pod requests nothing (its real usage is invisible to the filter)
)
CONTEXT_FEATURES = (
    "frac_asleep",
    "frac_waking",
    "cluster_util",  # total demanded CPU / total allocatable
    "cluster_req",  # total requested CPU / total allocatable
    "frac_feasible",  # feasible nodes / nodes
    "cluster_watts",  # total draw / total peak
)
N_NODE, N_POD, N_CONTEXT = len(NODE_FEATURES), len(POD_FEATURES), len(CONTEXT_FEATURES)
N_FEATURES = N_NODE + N_POD + N_CONTEXT
#: Columns of a row that hold the pod and cluster context (the same on every row), read by the value head.
CONTEXT_SLICE = slice(N_NODE, N_FEATURES)
DEPARTURE_SCALE_S = 600.0


class FeatureBuilder:
    """Builds the (N, :data:`N_FEATURES`) float32 matrix for a state. Static per-node columns are computed once.

    Build one per cluster (``reset``); :meth:`matches` says whether a state still has the same nodes.
    """

    n: int
    static: np.ndarray

    def __init__(self, state: ClusterState) -> None:
        self.n = n = len(state)
        # A weak reference, not id(): a rebuilt state (live, on node changes) can reuse a freed one's id with
        # the same node count, and the static columns would then be another cluster's.
        self._state_ref = weakref.ref(state)
        self.cap_cpu = np.maximum(state.alloc_cpu, 1).astype(np.float64)
        self.cap_mem = np.maximum(state.alloc_mem, 1).astype(np.float64)
        self.cap_pods = np.maximum(state.alloc_pods, 1).astype(np.float64)
        self.inv_cpu = 1.0 / self.cap_cpu
        self.inv_mem = 1.0 / self.cap_mem
        self.inv_pods = 1.0 / self.cap_pods
        self.curves = state.curves
        self.max_peak = float(max(state.peak_watts.max(), 1e-9))
        self.inv_max_peak = 1.0 / self.max_peak
        self.total_cap = float(self.cap_cpu.sum())
        self.total_peak = float(max(state.peak_watts.sum(), 1e-9))
        self.mean_cpu = float(self.cap_cpu.mean())
        self.mean_mem = float(self.cap_mem.mean())
        self.rows = np.arange(n)
        eff = state.alloc_cpu / np.maximum(state.peak_watts, 1e-9)
        self.static = np.stack([
            state.idle_watts * self.inv_max_peak,
            state.peak_watts * self.inv_max_peak,
            state.idle_watts / np.maximum(state.peak_watts, 1e-9),
            (np.maximum(state.idle_watts - state.sleep_watts, 0.0) if state.can_sleep
             else np.zeros(len(state))) * self.inv_max_peak,
            eff / max(float(eff.max()), 1e-12),
            state.alloc_cpu / max(float(state.alloc_cpu.max()), 1.0),
        ], axis=1)
        self._out = np.zeros((n, N_FEATURES), dtype=np.float32)
        # Nodes with the same allocatable, pod slots, curve and sleep draw: when empty and in the same power state
        # their rows are identical, so a policy may score one of them (the lowest index) for all.
        sig = np.column_stack((state.alloc_cpu, state.alloc_mem, state.alloc_pods, state.curves, state.sleep_watts))
        _, inv = np.unique(sig, axis=0, return_inverse=True)
        self.node_class = inv.reshape(-1).astype(np.int64)

    def candidates(self, st: ClusterState, idx: np.ndarray) -> np.ndarray:
        """``idx`` (sorted feasible nodes) without the empty nodes whose rows repeat a lower-index empty node's
        row (same class and power state). Scoring the result gives the same argmax, lowest index on ties."""
        empty = st.pods[idx] == 0
        if np.count_nonzero(empty) < 2:
            return idx
        e_idx = idx[empty]
        key = self.node_class[e_idx] * 3 + st.power_state[e_idx]
        _, first = np.unique(key, return_index=True)
        if first.size == e_idx.size:
            return idx
        out = np.concatenate((idx[~empty], e_idx[first]))
        out.sort()
        return out

    def matches(self, state: ClusterState) -> bool:
        return self._state_ref() is state and len(state) == self.n

    def _watts(self, u: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Watts of every node (or of nodes ``rows``) at utilisation ``u`` (linear between the 10 % points), as
        power.curves."""
        rows = self.rows if rows is None else rows
        x = np.clip(u, 0.0, 1.0) * 10.0
        i = np.minimum(x.astype(np.int64), 9)
        lo = self.curves[rows, i]
        return lo + (x - i) * (self.curves[rows, i + 1] - lo)

    def build(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Feature rows for every node. Writes into ``out`` (N, N_FEATURES) if given, else an internal buffer
        that the next call overwrites."""
        o = self._out if out is None else out
        pc, pm = float(pod.nz_cpu), float(pod.nz_mem)
        asleep = st.power_state == ASLEEP
        waking = st.power_state == WAKING
        u = st.usage_cpu * self.inv_cpu
        share = pc * self.inv_cpu
        ua = u + share
        w_now = np.where(asleep, st.sleep_watts, self._watts(u))
        w_after = self._watts(ua)
        dt = st.next_departure_at - st.now
        o[:, 0] = st.req_cpu * self.inv_cpu
        o[:, 1] = st.req_mem * self.inv_mem
        o[:, 2] = st.pods * self.inv_pods
        np.minimum(u, 2.0, out=o[:, 3])
        np.minimum(ua, 2.0, out=o[:, 4])
        np.clip(ua - 1.0, 0.0, 1.0, out=o[:, 5])
        np.minimum((st.nz_cpu + pc) * self.inv_cpu, 1.5, out=o[:, 6])
        np.minimum((st.nz_mem + pm) * self.inv_mem, 1.5, out=o[:, 7])
        o[:, 8] = w_now * self.inv_max_peak
        o[:, 9] = (w_after - w_now) * self.inv_max_peak
        o[:, 10:16] = self.static
        o[:, 16] = asleep
        o[:, 17] = waking
        o[:, 18] = st.pods == 0
        with np.errstate(invalid="ignore"):
            o[:, 19] = np.where(np.isfinite(dt), np.maximum(dt, 0.0) / (np.maximum(dt, 0.0) + DEPARTURE_SCALE_S), 1.0)
        np.minimum(share, 1.5, out=o[:, 20])
        # Pod and context columns: the same value on every row.
        k = N_NODE
        o[:, k] = min(pc / self.mean_cpu, 4.0)
        o[:, k + 1] = min(pm / self.mean_mem, 4.0)
        o[:, k + 2] = float(pod.best_effort)
        n = self.n
        o[:, k + 3] = asleep.sum() / n
        o[:, k + 4] = waking.sum() / n
        o[:, k + 5] = float(st.usage_cpu.sum()) / self.total_cap
        o[:, k + 6] = float(st.req_cpu.sum()) / self.total_cap
        o[:, k + 7] = np.count_nonzero(mask) / n
        o[:, k + 8] = float(w_now.sum()) / self.total_peak
        return o


# ---- schema 2 ----------------------------------------------------------------------------------------------------
NODE_FEATURES_V2 = NODE_FEATURES[:19] + (
    "pred_empty",  # predicted time until the node holds no pod, log-squashed (0: empty); agent/predictor.py
    "pred_load",  # util x the predicted share of its requested CPU still there in 10 minutes, <= 2
    "extends",  # how long this pod would outlive the node's other pods (predicted), log-squashed
    "pod_cpu_share",  # the pod's non-zero CPU request / allocatable, <= 1.5
    "pick_awake_first",  # 1 where awake-first:fit=efficient would put the pod (ties: every tied node)
    "pick_pabfd",  # 1 where pabfd would
    "feasible",  # the node passes the filter (the attention reads infeasible nodes too)
)
POD_FEATURES_V2 = POD_FEATURES + (
    "pod_life",  # the pod's predicted life, log-squashed
    "service",  # a service (no work; it lives until its Deployment scales in)
    "guaranteed",  # QoS class Guaranteed
)
CONTEXT_FEATURES_V2 = CONTEXT_FEATURES + (
    "offered_load",  # requested CPU arriving per second x mean predicted life / cluster CPU, x / (1 + x)
    "arrival_trend",  # log(5-minute / 1-hour placement rate) / 2, clipped to [-1, 1]
    "pred_cluster_load",  # sum of the nodes' predicted load / cluster CPU
    "wake_time",  # wake_s / (wake_s + 60 s)
)
#: Columns that come from the predictor: zero when a model is trained without prediction (the ablation).
PREDICTED_V2 = ("pred_empty", "pred_load", "extends", "pod_life", "offered_load", "arrival_trend",
                "pred_cluster_load")
N_NODE_V2, N_POD_V2, N_CONTEXT_V2 = len(NODE_FEATURES_V2), len(POD_FEATURES_V2), len(CONTEXT_FEATURES_V2)
N_FEATURES_V2 = N_NODE_V2 + N_POD_V2 + N_CONTEXT_V2
LIFE_SCALE_S = 60.0
_LIFE_NORM = 1.0 / np.log1p(1440.0)  # a day is 1


def life_squash(dt):
    """Seconds to [0, 1.5]: log1p(dt / 60 s) / log1p(1440), so a minute, an hour and a day stay apart."""
    return np.minimum(np.log1p(np.maximum(dt, 0.0) / LIFE_SCALE_S) * _LIFE_NORM, 1.5)


def feature_names(schema: int) -> list[str]:
    """Column names of a feature schema (1, 2 or 3)."""
    if schema == GPU_SCHEMA:
        return list(NODE_FEATURES_V2 + NODE_FEATURES_GPU + POD_FEATURES_V2 + CONTEXT_FEATURES_V2 + POD_FEATURES_GPU
                    + CONTEXT_FEATURES_GPU)
    if schema == 1:
        return list(NODE_FEATURES + POD_FEATURES + CONTEXT_FEATURES)
    if schema == 2:
        return list(NODE_FEATURES_V2 + POD_FEATURES_V2 + CONTEXT_FEATURES_V2)
    raise ValueError(f"unknown feature schema {schema!r}")


def n_features(schema: int) -> tuple[int, int]:
    """(columns of a row, of which pod + context columns) of a schema."""
    if schema == 1:
        return N_FEATURES, N_POD + N_CONTEXT
    if schema == GPU_SCHEMA:
        n_ctx = N_POD_V2 + N_CONTEXT_V2 + len(POD_FEATURES_GPU) + len(CONTEXT_FEATURES_GPU)
        return N_NODE_V2 + len(NODE_FEATURES_GPU) + n_ctx, n_ctx
    return N_FEATURES_V2, N_POD_V2 + N_CONTEXT_V2


def _lexmin(idx: np.ndarray, keys: list[np.ndarray]) -> np.ndarray:
    """The members of ``idx`` minimal under the lexicographic order of ``keys`` (aligned with idx)."""
    sel = np.arange(idx.size)
    for k in keys:
        v = k[sel]
        sel = sel[v == v.min()]
        if sel.size == 1:
            break
    return idx[sel]


class PickTables:
    """What :func:`heuristic_picks` reads of a cluster, laid out for flat gathers: allocatable CPU as a float (at
    least 1), the curves row-major and beside them each 10 % segment's rise (``curves[:, k+1] - curves[:, k]``,
    the subtraction the interpolation does; 0 after the last point), so a node's draw at ``x`` is two 1-D takes
    at one index. Every node's draw at its current non-zero CPU requests (pabfd's "before") is kept between
    calls and recomputed only where ``nz_cpu`` changed (:meth:`at_requests`)."""

    def __init__(self, st: ClusterState) -> None:
        self.n = len(st)
        self.cap = np.maximum(st.alloc_cpu, 1).astype(np.float64)
        self.flat = np.ascontiguousarray(st.curves).reshape(-1)
        rise = np.zeros_like(st.curves)
        rise[:, :-1] = st.curves[:, 1:] - st.curves[:, :-1]
        self.rise = rise.reshape(-1)
        self.base = np.arange(self.n, dtype=np.int64) * 11
        self._nz: np.ndarray | None = None
        self._p0 = np.zeros(0)

    def draw(self, base: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Watts of the nodes whose rows start at ``base`` (node x 11) at ``x`` = utilisation x 10, in [0, 10]."""
        i = np.minimum(x.astype(np.int64), 9)
        k = base + i
        return self.flat.take(k) + (x - i) * self.rise.take(k)

    def requests_x(self, nz: np.ndarray, cpu: np.ndarray) -> np.ndarray:
        return np.minimum(nz / cpu, 1.0) * 10.0

    def draw_scratch(self, st: ClusterState) -> np.ndarray:
        return self.draw(self.base, self.requests_x(st.nz_cpu, self.cap))

    def at_requests(self, st: ClusterState) -> np.ndarray:
        """Every node's draw at its non-zero CPU requests (an array this table owns: read it, do not write it)."""
        nz = st.nz_cpu
        if self._nz is None or self._nz.shape != nz.shape:
            self._p0, self._nz = self.draw_scratch(st), nz.copy()
            return self._p0
        ch = np.flatnonzero(nz != self._nz)
        if ch.size:
            self._p0[ch] = self.draw(self.base[ch], self.requests_x(nz[ch], self.cap[ch]))
            self._nz[ch] = nz[ch]
        return self._p0


_ROUND_MARGIN = fused.ROUND_MARGIN  # pabfd's rounding margin, one value for both implementations


def heuristic_picks(st: ClusterState, pod: PodRequest, idx: np.ndarray,
                    wpc: np.ndarray | None = None, tables: PickTables | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The feasible nodes (of sorted ``idx``) that awake-first:fit=efficient and pabfd rank first
    (agent/sleep_aware.py with headroom 1; an exact tie names every tied node, where the policies draw one).
    Successive minima over the keys, not a sort; a later key is computed only on the earlier keys' ties.
    ``wpc``: every node's watts per core at full load, ``tables`` the cluster's :class:`PickTables`, if known.
    The free shares are the unclipped ones the models trained with; the policies clip them at 0 since 2026-12-07
    (``free_cpu_share``), so the two can differ only where a node's non-zero requests exceed its allocatable."""
    if idx.size == 0:
        return idx, idx
    if wpc is None:
        wpc = st.peak_watts / np.maximum(st.alloc_cpu, 1) * 1000.0
    awake = st.power_state[idx] != ASLEEP
    if not awake.any():
        wake = _lexmin(idx, [wpc[idx], -st.alloc_cpu[idx].astype(np.float64)])
        return wake, wake
    a = idx[awake] if not awake.all() else idx
    if tables is None or tables.n != len(st):
        tables = PickTables(st)
    # Where most nodes are candidates, every node's keys are computed in place (contiguous passes, no gathers)
    # and the others masked out with +inf; else on the candidates alone. Either way each node's key is the same.
    dense = 2 * a.size >= len(st)
    if dense:
        ok = np.zeros(len(st), dtype=bool)
        ok[a] = True
        cpu, nz, rows = tables.cap, st.nz_cpu, None
        w = np.where(ok, wpc, np.inf)
    else:
        cpu, nz, rows = tables.cap[a], st.nz_cpu[a], a
        w = wpc[a]
    # awake-first:fit=efficient: watts per core, then the smallest free CPU share, then memory share.
    best = np.flatnonzero(w == w.min())
    best = best if dense else a[best]
    if best.size > 1:
        cb = np.maximum(st.alloc_cpu[best], 1).astype(np.float64)
        mb = np.maximum(st.alloc_mem[best], 1).astype(np.float64)
        best = _lexmin(best, [(st.alloc_cpu[best] - st.nz_cpu[best] - pod.nz_cpu) / cb,
                              (st.alloc_mem[best] - st.nz_mem[best] - pod.nz_mem) / mb])
    # pabfd: the least power increase on the node's curve at its requests (rounded to 1e-9 W), then the tighter fit.
    p0 = tables.at_requests(st)
    x1 = tables.requests_x(nz + pod.nz_cpu, cpu)
    if dense:
        d = np.where(ok, tables.draw(tables.base, x1) - p0, np.inf)
    else:
        d = tables.draw(rows * 11, x1) - p0[rows]
    near = np.flatnonzero(d <= d.min() + _ROUND_MARGIN)
    r = np.round(d[near], 9)
    tie = near[r == r.min()]
    if tie.size > 1:
        c_t, nz_t = cpu[tie], nz[tie]
        fit = (c_t - nz_t - pod.nz_cpu) / c_t
        tie = tie[fit == fit.min()]
    return best, (tie if dense else a[tie])


class NodeWatts:
    """Every node's utilisation (usage / allocatable) and draw now (its curve at that utilisation, the sleep draw
    when asleep), as :meth:`FeatureBuilder._watts` computes them, kept between decisions: :meth:`update` compares
    the usage and power state with the values it last saw and recomputes only the nodes that differ, so a
    decision costs two comparisons over the nodes instead of the curve lookups (the same numbers: each node's
    value depends on its own usage and state only). :meth:`scratch` is the from-scratch computation."""

    def __init__(self, feat: FeatureBuilder) -> None:
        self._feat = feat
        self._usage: np.ndarray | None = None
        self._ps = np.zeros(0, dtype=np.int8)
        self.u = np.zeros(0)
        self.w = np.zeros(0)
        self.n_asleep = self.n_waking = 0

    def scratch(self, st: ClusterState) -> tuple[np.ndarray, np.ndarray, int, int]:
        """What :meth:`update` returns, computed afresh."""
        u = st.usage_cpu * self._feat.inv_cpu
        ps = st.power_state
        return (u, np.where(ps == ASLEEP, st.sleep_watts, self._feat._watts(u)), int(np.count_nonzero(ps == ASLEEP)),
                int(np.count_nonzero(ps == WAKING)))

    def update(self, st: ClusterState) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(utilisation, watts, nodes asleep, nodes waking) of every node: the arrays are this view's (read them,
        do not write them)."""
        usage, ps = st.usage_cpu, st.power_state
        if self._usage is None or self._usage.shape != usage.shape:
            self.u, self.w, self.n_asleep, self.n_waking = self.scratch(st)
            self._usage, self._ps = usage.astype(np.float64, copy=True), ps.copy()
            return self.u, self.w, self.n_asleep, self.n_waking
        ch = np.flatnonzero((usage != self._usage) | (ps != self._ps))  # NaN usage differs always: recomputed
        if ch.size:
            old = self._ps[ch]
            self.n_asleep -= int(np.count_nonzero(old == ASLEEP))
            self.n_waking -= int(np.count_nonzero(old == WAKING))
            if ch.size <= 4:  # one bind or end: Python floats (the same IEEE operations) beat numpy's per-call cost
                self._patch_few(st, ch.tolist())
            else:
                uc = usage[ch] * self._feat.inv_cpu[ch]
                self.u[ch] = uc
                self.w[ch] = np.where(ps[ch] == ASLEEP, st.sleep_watts[ch], self._feat._watts(uc, ch))
            self._usage[ch] = usage[ch]
            new = ps[ch]
            self._ps[ch] = new
            self.n_asleep += int(np.count_nonzero(new == ASLEEP))
            self.n_waking += int(np.count_nonzero(new == WAKING))
        return self.u, self.w, self.n_asleep, self.n_waking

    def _patch_few(self, st: ClusterState, nodes: list[int]) -> None:
        """:meth:`FeatureBuilder._watts`'s arithmetic for a few nodes, one at a time."""
        curves, inv = self._feat.curves, self._feat.inv_cpu
        for i in nodes:
            u = float(st.usage_cpu[i]) * float(inv[i])
            self.u[i] = u
            if not math.isfinite(u):  # as numpy has it (int(nan) would raise)
                self.w[i] = np.where(st.power_state[i] == ASLEEP, st.sleep_watts[i],
                                     self._feat._watts(np.array([u]), np.array([i])))[0]
            elif st.power_state[i] == ASLEEP:
                self.w[i] = st.sleep_watts[i]
            else:
                x = min(max(u, 0.0), 1.0) * 10.0
                k = min(int(x), 9)
                lo = float(curves[i, k])
                self.w[i] = lo + (x - k) * (float(curves[i, k + 1]) - lo)


class FeatureBuilderV2(FeatureBuilder):
    """Schema 2's rows (:data:`NODE_FEATURES_V2`, :data:`POD_FEATURES_V2`, :data:`CONTEXT_FEATURES_V2`).

    :param prediction: False zeroes the :data:`PREDICTED_V2` columns (the "without prediction" ablation).
    The predictor is the caller's (the policy's or the env's): :meth:`build` reads it, never a duration.
    """

    #: Node columns of a row (a subclass that appends columns, schema 3, sets its own).
    n_node = N_NODE_V2

    def __init__(self, state: ClusterState, prediction: bool = True) -> None:
        super().__init__(state)
        self.prediction = prediction
        self._out = np.zeros((self.n, N_FEATURES_V2), dtype=np.float32)
        self._node_t = np.zeros((N_NODE_V2, self.n), dtype=np.float32)
        self._node_t[10:16] = self.static.T  # the per-node constants
        self._ctx = np.zeros(N_POD_V2 + N_CONTEXT_V2, dtype=np.float32)
        self.wake_col = float(state.wake_s / (state.wake_s + 60.0))
        self.wpc = state.peak_watts / np.maximum(state.alloc_cpu, 1) * 1000.0  # the sleep-aware policies' key
        self.pick_tables = PickTables(state)
        self.watts_now = NodeWatts(self)

    def groups(self, st: ClusterState, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(representative rows, multiplicities): empty nodes of one class, power state and feasibility have
        identical rows (the predictor has nothing on them either; the heuristics' picks tie among them), so the
        attention may read one of them with its count. Each group's representative is its lowest index, so the
        feasible ones are exactly :meth:`candidates`' choice (an empty node the filter rejected, e.g. cordoned or
        outside a sampled subset, is never another one's stand-in)."""
        # One compiled pass with the keys as table indices (agent/fused.py): no sort of every empty node's key.
        reps, cnt, n_empty, n_groups = fused.empty_groups(st.pods, self.node_class, st.power_state, mask)
        if n_empty < 2 or n_groups == n_empty:
            return self.rows, np.ones(self.n)
        return reps, cnt

    def build(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, out: np.ndarray | None = None, *,
              meta=None, predictor=None) -> np.ndarray:
        """Feature rows for every node, ``(N, N_FEATURES_V2)`` (into ``out`` if given, else a buffer the next call
        overwrites). ``meta`` is the pod's :class:`~joulesched.cluster.workload.PodMeta` (None: unknown),
        ``predictor`` the run's :class:`~joulesched.agent.predictor.PodPredictor` (None: the predicted columns
        are zero)."""
        node_t, ctx = self.parts(st, pod, mask, meta=meta, predictor=predictor)
        o = self._out if out is None else out
        o[:, :self.n_node] = node_t.T
        o[:, self.n_node:] = ctx
        return o

    def parts(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, *, meta=None,
              predictor=None) -> tuple[np.ndarray, np.ndarray]:
        """The rows as inference reads them: the node columns transposed, ``(N_NODE_V2, N)`` (each column
        written contiguously), and the pod and context columns once, ``(N_POD_V2 + N_CONTEXT_V2,)``. Both are
        buffers the next call overwrites."""
        return self._parts(st, pod, mask, None, meta, predictor, None)

    def parts_at(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, cols: np.ndarray, *, meta=None,
                 predictor=None, picks: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`parts` for the nodes ``cols`` only: ``(N_NODE_V2, len(cols))`` (a new array), equal to
        ``parts(...)[0][:, cols]``, and the same context columns (the cluster's sums still read every node, a
        few vector operations). ``picks``: :func:`heuristic_picks` of the feasible nodes, if known."""
        return self._parts(st, pod, mask, cols, meta, predictor, picks)

    def compiled_picks(self, st: ClusterState, pod: PodRequest, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`heuristic_picks` of the nodes where ``mask`` holds, in one compiled pass (agent/fused.py)."""
        t = self.pick_tables
        return fused.picks(mask, st.power_state, self.wpc, st.alloc_cpu, st.alloc_mem, st.nz_cpu, st.nz_mem, t.cap,
                           t.flat, t.rise, pod.nz_cpu, pod.nz_mem)

    def _full_node_columns(self, o: np.ndarray, st: ClusterState, pod: PodRequest, mask: np.ndarray,
                           u: np.ndarray, w_now: np.ndarray) -> int:
        """Every node's columns but the predicted ones into ``o``, in numpy (what fused.node_columns computes for
        a sample); returns the number of feasible nodes."""
        pc, pm = float(pod.nz_cpu), float(pod.nz_mem)
        ps = st.power_state
        asleep = ps == ASLEEP
        inv_cpu = self.inv_cpu
        share = pc * inv_cpu
        ua = u + share
        w_after = self._watts(ua)
        pods = st.pods
        np.multiply(st.req_cpu, inv_cpu, out=o[0], casting="unsafe")
        np.multiply(st.req_mem, self.inv_mem, out=o[1], casting="unsafe")
        np.multiply(pods, self.inv_pods, out=o[2], casting="unsafe")
        np.minimum(u, 2.0, out=o[3], casting="unsafe")
        np.minimum(ua, 2.0, out=o[4], casting="unsafe")
        np.clip(ua - 1.0, 0.0, 1.0, out=o[5], casting="unsafe")
        np.minimum((st.nz_cpu + pc) * inv_cpu, 1.5, out=o[6], casting="unsafe")
        np.minimum((st.nz_mem + pm) * self.inv_mem, 1.5, out=o[7], casting="unsafe")
        np.multiply(w_now, self.inv_max_peak, out=o[8], casting="unsafe")
        np.multiply(w_after - w_now, self.inv_max_peak, out=o[9], casting="unsafe")
        o[16] = asleep
        o[17] = ps == WAKING
        o[18] = pods == 0
        np.minimum(share, 1.5, out=o[22], casting="unsafe")
        idx = np.flatnonzero(mask)
        af, pb = heuristic_picks(st, pod, idx, self.wpc, self.pick_tables)
        o[23:25] = 0.0
        o[23, af] = 1.0
        o[24, pb] = 1.0
        o[25] = mask
        return idx.size

    def _parts(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, cols: np.ndarray | None, meta,
               predictor, picks) -> tuple[np.ndarray, np.ndarray]:
        ctx = self._ctx
        pc, pm = float(pod.nz_cpu), float(pod.nz_mem)
        ps = st.power_state
        u_all, w_all, n_asleep, n_waking = self.watts_now.update(st)
        if cols is not None:  # the sampled path: one compiled loop (agent/fused.py), the same numbers
            o, sel, rows = np.empty((N_NODE_V2, cols.size), dtype=np.float32), cols, cols
            if picks is None:
                picks = self.compiled_picks(st, pod, mask)
            fused.node_columns(o, cols, mask, ps, st.pods, st.req_cpu, st.req_mem, st.nz_cpu, st.nz_mem,
                               self.inv_cpu, self.inv_mem, self.inv_pods, u_all, w_all, self.curves, self.static,
                               self.inv_max_peak, pc, pm, picks[0], picks[1])
            n_feasible = int(np.count_nonzero(mask))
        else:
            o, sel, rows = self._node_t, slice(None), None
            n_feasible = self._full_node_columns(o, st, pod, mask, u_all, w_all)
        ctx[0] = min(pc / self.mean_cpu, 4.0)
        ctx[1] = min(pm / self.mean_mem, 4.0)
        ctx[2] = float(pod.best_effort)
        ctx[4] = meta is not None and meta.kind == "service"
        ctx[5] = meta is not None and meta.qos_class == "Guaranteed"
        c = N_POD_V2
        n = self.n
        ctx[c] = n_asleep / n
        ctx[c + 1] = n_waking / n
        ctx[c + 2] = float(st.usage_cpu.sum()) / self.total_cap
        ctx[c + 3] = float(st.req_cpu.sum()) / self.total_cap
        ctx[c + 4] = n_feasible / n
        ctx[c + 5] = float(w_all.sum()) / self.total_peak
        ctx[c + 9] = self.wake_col
        if self.prediction and predictor is not None:
            empty_in, stay = predictor.nodes(st.now, n, at=rows)
            life = predictor.pod_remaining(meta, 0.0)
            o[19] = life_squash(empty_in)
            pl_all = np.minimum(u_all * stay, 2.0)
            o[20] = pl_all[sel]
            o[21] = life_squash(np.maximum(life - empty_in, 0.0))
            ctx[3] = float(life_squash(life))
            load, trend = predictor.arrivals(st.now, self.total_cap)
            ctx[c + 6] = load
            ctx[c + 7] = trend
            ctx[c + 8] = float(np.dot(pl_all, self.cap_cpu)) / self.total_cap
        else:
            o[19:22] = 0.0
            ctx[3] = 0.0
            ctx[c + 6:c + 9] = 0.0
        return o, ctx
