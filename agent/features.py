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

Bump :data:`SCHEMA_VERSION` whenever a column changes meaning or order: checkpoints record it and a model
trained on another schema is refused.
"""

from __future__ import annotations

import numpy as np

from joulesched.cluster.state import ASLEEP, WAKING, ClusterState, PodRequest

SCHEMA_VERSION = 1

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
        self._state_id = id(state)
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
        return id(state) == self._state_id and len(state) == self.n

    def _watts(self, u: np.ndarray) -> np.ndarray:
        """Watts of every node at utilisation ``u`` (linear between the 10 % points), as power.curves."""
        x = np.clip(u, 0.0, 1.0) * 10.0
        i = np.minimum(x.astype(np.int64), 9)
        lo = self.curves[self.rows, i]
        return lo + (x - i) * (self.curves[self.rows, i + 1] - lo)

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
