"""Feature schema 3: schema 2's columns plus what a GPU cluster adds (issue 25, item 4).

Schema 2 (agent/features.py) sees CPU, memory, pod slots and CPU watts only; on the OpenB trace that lets a
model put a CPU pod on an 8-GPU node or split a whole-GPU pod's node into shares. Schema 3 appends, to each
part of a row:

* node (:data:`NODE_FEATURES_GPU`): whether the node has GPUs, how many (relative to the cluster's most), the
  free share of its GPUs (every GPU's free milli-GPU summed / 1000 x count) and its whole free GPUs (/ count),
  what the pod would leave after placement (the tightest fit: for a share, the free share left on the GPU it
  would take, :func:`~joulesched.cluster.state.gpu_take`'s best fit; for whole GPUs, the whole free GPUs left
  / count), the GPUs' idle and peak draw and the marginal GPU watts of the pod (power/gpu.py's curves, from
  the sleep draw when the node is asleep: waking it turns every GPU on at its idle), whether its model is one
  the pod allows, and where ``gpu-best-fit`` (agent/gpu_policies.py, sleep-aware) would put the pod;
* pod (:data:`POD_FEATURES_GPU`): GPUs asked (/ 8, capped at 1), the share of each (/ 1000), whether it needs
  a GPU at all, whether it names allowed models;
* context (:data:`CONTEXT_FEATURES_GPU`): the cluster's allocated GPU share, its whole free GPUs and the
  fraction of nodes with GPUs.

GPU watts are relative to the cluster's largest node peak counting its GPUs (CPU peak + every GPU's peak), so
they stay within the observation box on an 8 x 300 W node. On a cluster without GPUs every GPU column is 0.

Row layout: ``[schema 2 node | GPU node | schema 2 pod + context | GPU pod | GPU context]``: the trailing
``n_features(3)[1]`` columns are the pod and context part the value head reads, as in schema 2.
:class:`FeatureBuilderV3` computes schema 2's part with :meth:`FeatureBuilderV2.parts` and appends its own.
"""

from __future__ import annotations

import numpy as np

from joulesched.agent.features import (CONTEXT_FEATURES_V2, NODE_FEATURES_V2, POD_FEATURES_V2, FeatureBuilderV2,
                                       _lexmin)
from joulesched.agent.features_gpu_columns import CONTEXT_FEATURES_GPU, NODE_FEATURES_GPU, POD_FEATURES_GPU
from joulesched.cluster.state import ASLEEP, ClusterState, PodRequest

SCHEMA = 3
GPU_MILLI = 1000
#: GPUs per pod that read as 1 in ``pod_gpu`` (OpenB's largest pods ask for 8).
POD_GPU_SCALE = 8

NODE_FEATURES_V3 = NODE_FEATURES_V2 + NODE_FEATURES_GPU
CTX_FEATURES_V3 = POD_FEATURES_V2 + CONTEXT_FEATURES_V2 + POD_FEATURES_GPU + CONTEXT_FEATURES_GPU
N_NODE_V2, N_CTX_V2 = len(NODE_FEATURES_V2), len(POD_FEATURES_V2) + len(CONTEXT_FEATURES_V2)
N_NODE_V3, N_CTX_V3 = len(NODE_FEATURES_V3), len(CTX_FEATURES_V3)
N_FEATURES_V3 = N_NODE_V3 + N_CTX_V3
_G = N_NODE_V2  # first GPU node column
_C = N_CTX_V2  # first GPU pod column in the context part


def feature_names_v3() -> list[str]:
    return list(NODE_FEATURES_V3 + CTX_FEATURES_V3)


class FeatureBuilderV3(FeatureBuilderV2):
    """Schema 3's rows: :class:`FeatureBuilderV2`'s and the GPU columns (module docstring); ``build`` is schema
    2's, over this schema's node columns."""

    n_node = N_NODE_V3

    def __init__(self, state: ClusterState, prediction: bool = True) -> None:
        super().__init__(state, prediction=prediction)
        n = self.n
        self._out = np.zeros((n, N_FEATURES_V3), dtype=np.float32)
        self._node3 = np.zeros((N_NODE_V3, n), dtype=np.float32)
        self._ctx3 = np.zeros(N_CTX_V3, dtype=np.float32)
        self.has_gpus = bool(state.has_gpus)
        count = state.alloc_gpu.astype(np.float64)
        self.gpu_count = count
        self.inv_gpu_cap = np.where(count > 0, 1.0 / np.maximum(count * GPU_MILLI, 1.0), 0.0)
        self.inv_count = np.where(count > 0, 1.0 / np.maximum(count, 1.0), 0.0)
        curves = np.asarray(state.gpu_curves, dtype=np.float64)
        gpu_idle = count * curves[:, 0]
        gpu_peak = count * curves[:, 10]
        self.gpu_idle = gpu_idle
        # Watts per milli-GPU allocated (the curve's end points: power/gpu.py's curves are linear by default).
        self.gpu_slope = np.where(count > 0, (curves[:, 10] - curves[:, 0]) / GPU_MILLI, 0.0)
        inv = 1.0 / max(float((state.peak_watts + gpu_peak).max()), 1e-9)
        self.inv_gpu_peak = inv
        self.total_milli = float(count.sum()) * GPU_MILLI
        self.total_gpus = float(count.sum())
        self.gpu_nodes = count > 0
        node_t = self._node3
        node_t[_G] = self.gpu_nodes
        node_t[_G + 1] = count / max(float(count.max()), 1.0)
        node_t[_G + 5] = gpu_idle * inv
        node_t[_G + 6] = gpu_peak * inv
        self._ctx3[-1] = np.count_nonzero(self.gpu_nodes) / max(n, 1)
        # Empty nodes are interchangeable only with the same GPUs too (schema 2's classes know no GPUs).
        model_code = np.unique(np.asarray(state.gpu_model, dtype=object).astype(str), return_inverse=True)[1]
        sig = np.column_stack((state.alloc_cpu, state.alloc_mem, state.alloc_pods, state.curves, state.sleep_watts,
                               count, model_code.reshape(-1), curves))
        _, cls = np.unique(sig, axis=0, return_inverse=True)
        self.node_class = cls.reshape(-1).astype(np.int64)

    def parts(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, *, meta=None,
              predictor=None) -> tuple[np.ndarray, np.ndarray]:
        """``(N_NODE_V3, N)`` node columns and ``(N_CTX_V3,)`` pod and context columns: schema 2's
        (:meth:`FeatureBuilderV2.parts`) with the GPU columns appended. Buffers the next call overwrites."""
        node2, ctx2 = super().parts(st, pod, mask, meta=meta, predictor=predictor)
        o, ctx = self._node3, self._ctx3
        o[:_G] = node2
        ctx[:_C] = ctx2
        if not self.has_gpus:
            return o, ctx  # the GPU columns stay 0
        g = pod.gpu
        ctx[_C] = min(g / POD_GPU_SCALE, 1.0)
        ctx[_C + 1] = pod.gpu_milli / GPU_MILLI if g else 0.0
        ctx[_C + 2] = g > 0
        ctx[_C + 3] = g > 0 and pod.gpu_models is not None
        free = np.clip(st.gpu_free, 0, None)
        free_sum = free.sum(axis=1, dtype=np.int64).astype(np.float64)
        whole = st.gpu_whole_free.astype(np.float64)
        np.multiply(free_sum, self.inv_gpu_cap, out=o[_G + 2], casting="unsafe")
        np.multiply(whole, self.inv_count, out=o[_G + 3], casting="unsafe")
        asleep = st.power_state == ASLEEP
        if g:
            if pod.gpu_milli >= GPU_MILLI:
                left = (whole - g) * self.inv_count
                fits = whole >= g
            else:
                cand = np.where(st.gpu_free >= pod.gpu_milli, st.gpu_free, GPU_MILLI + 1)
                best = cand.min(axis=1)
                fits = best <= GPU_MILLI
                left = (best - pod.gpu_milli) / GPU_MILLI
            np.copyto(o[_G + 4], np.where(fits, left, 0.0), casting="unsafe")
            ok = self.gpu_nodes if pod.gpu_models is None else st.gpu_model_mask(pod.gpu_models) & self.gpu_nodes
            o[_G + 8] = ok
            add = pod.gpu_share_milli * self.gpu_slope
        else:
            o[_G + 4] = 0.0
            o[_G + 8] = 0.0
            add = 0.0
        np.multiply(np.where(asleep, self.gpu_idle, 0.0) + add, self.inv_gpu_peak, out=o[_G + 7], casting="unsafe")
        o[_G + 9] = 0.0
        idx = np.flatnonzero(mask)
        if idx.size:
            o[_G + 9, self._best_fit(st, pod, idx, free_sum, asleep)] = 1.0
        ctx[-3] = 1.0 - float(free_sum.sum()) / self.total_milli
        ctx[-2] = float(whole.sum()) / self.total_gpus
        return o, ctx

    def _best_fit(self, st: ClusterState, pod: PodRequest, idx: np.ndarray, free_sum: np.ndarray,
                  asleep: np.ndarray) -> np.ndarray:
        """The feasible nodes that gpu-best-fit (headroom 1) ranks first: tier (awake within the CPU, asleep,
        awake past it), then, awake, the CPU plus GPU share free after placement; asleep, watts per core, then
        the larger node (agent/sleep_aware.py's frame, agent/gpu_policies.py's key). Every tied node."""
        sl = asleep[idx]
        fits = st.req_cpu[idx] + pod.filter_cpu <= st.alloc_cpu[idx]
        tier = np.where(sl, 1, np.where(fits, 0, 2)).astype(np.float64)
        cap = np.maximum(st.alloc_cpu[idx], 1).astype(np.float64)
        cpu = (st.alloc_cpu[idx] - st.req_cpu[idx] - pod.filter_cpu) / cap
        gpu = (free_sum[idx] - pod.gpu_share_milli) * self.inv_gpu_cap[idx]
        key = np.round(cpu + gpu, 12)
        wpc = self.wpc[idx]
        return _lexmin(idx, [tier, np.where(sl, 0.0, key), np.where(sl, wpc, 0.0),
                             np.where(sl, -st.alloc_cpu[idx].astype(np.float64), 0.0)])
