"""GPU-aware heuristics: the baselines of the FGD paper and FGD itself, each sleep-aware.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
USENIX ATC 2023, compare FGD with five baselines on the OpenB trace (as its simulator,
hkust-adsl/kubernetes-scheduler-simulator, scores them). Here each is the inner key of the sleep-aware frame
(:mod:`joulesched.agent.sleep_aware`): it orders the awake (on or waking) candidates; a sleeping node is woken
only when no awake one fits, the most efficient first. Vectors are normalised by the node's own capacity
(the simulator's ``NormByNode``) over CPU and GPU share; a node without GPUs has a GPU share of 0.

* ``gpu-random``: random fit among awake nodes.
* ``gpu-best-fit``: the node left with the least CPU plus GPU share free after placement, each share of the
  node's own capacity. (The simulator's ``best_fit_score.go`` divides by fixed cluster-wide maxima, weights
  0.5/0.5, and truncates to an integer score: not reproduced, so this baseline can choose another node.)
* ``gpu-dot-product``: Tetris' alignment as the simulator scores it: the smallest dot product of the node's
  free vector and the pod's request.
* ``gpu-packing``: a shared-GPU pod to a node with a partly used GPU it fits, then to a node already running
  GPU pods, then to an idle one (best fit on GPUs inside each tier); a whole-GPU pod the same without the
  first tier. A pod without GPUs gets the same tiers (so it too goes to nodes already running GPU pods), where
  the simulator gives it no preference.
* ``gpu-clustering``: a pod to the nodes whose GPU pods are of its kind (shared or whole GPUs), away from
  nodes that run the other kind.
* ``gpu-energy`` (ours, not the paper's): PABFD that knows GPU power: the least CPU plus GPU watts added among
  awake nodes, then GPU packing; it wakes the node with the fewest watts per GPU (per core for a CPU pod).
* ``fgd``: fragmentation gradient descent: the node whose GPU fragmentation (below) grows least. The target
  workload is what the policy has seen so far: the popularity of pod shapes (CPU to the core, GPU count, share
  to 50 milli, allowed models), the most common :data:`FGD_TYPES` of them.

Fragmentation of a node for a pod shape (the paper's §4): its free GPU share that the shape cannot use, i.e.
all of it when the shape does not fit the node at all (CPU, GPUs or model), else the free share of every GPU
with less free than the shape's share (for whole GPUs: every partly used GPU). A node's fragmentation is the
popularity-weighted sum over shapes; :func:`cluster_fragmentation` sums it over the cluster.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from joulesched.agent.sleep_aware import _SleepAware, free_cpu_share, power_increase, watts_per_core
from joulesched.cluster.state import ClusterState, PodRequest
from joulesched.power.curves import interp_many

MILLI = 1000
#: The pod shapes FGD weighs (the most popular seen so far).
FGD_TYPES = 32


def _cpu_cap(st: ClusterState, idx: np.ndarray) -> np.ndarray:
    return np.maximum(st.alloc_cpu[idx], 1).astype(np.float64)


def _gpu_cap(st: ClusterState, idx: np.ndarray) -> np.ndarray:
    return np.maximum(st.alloc_gpu[idx] * MILLI, 1).astype(np.float64)


def share_gpu(free: np.ndarray, milli: int) -> tuple[np.ndarray, np.ndarray]:
    """Where a share of ``milli`` goes on each row of per-GPU free shares, as the cluster assigns it (the fullest
    GPU it fits, :func:`~joulesched.cluster.state.gpu_take`): whether the row fits it, and that GPU's index."""
    fit = free >= milli
    return fit.any(axis=1), np.argmin(np.where(fit, free, MILLI + 1), axis=1)


def packing_tier(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
    """GPU packing's tiers: 0 a partly used GPU the (shared-GPU) pod fits, 1 a node already running GPU pods, 2
    the others."""
    free = st.gpu_free[idx]
    busy = (st.gpu_share_pods[idx] + st.gpu_whole_pods[idx]) > 0
    if pod.gpu and pod.gpu_milli < MILLI:
        partly = ((free >= pod.gpu_milli) & (free < MILLI)).any(axis=1)
        return np.where(partly, 0, np.where(busy, 1, 2))
    return np.where(busy, 1, 2)


def _free_gpu(st: ClusterState, idx: np.ndarray) -> np.ndarray:
    """Free milli-GPU per candidate (every GPU's free share summed)."""
    return np.clip(st.gpu_free[idx], 0, None).sum(axis=1).astype(np.float64)


class GpuRandom(_SleepAware):
    """Random fit (the FGD paper's baseline): a uniformly random awake node that fits; a sleeping node only
    when none does, the most efficient first. ``headroom`` as awake-first's."""

    name = "gpu-random"

    def _inner(self, st, pod, idx):
        return {}  # every awake candidate ties: the run's generator picks


class GpuBestFit(_SleepAware):
    """Best fit on CPU and GPUs (after the FGD paper's baseline): the awake node left with the smallest free share
    of its CPU plus of its GPUs after placement, each of the node's own capacity (the simulator normalises by
    cluster-wide maxima instead; module docstring); wakes as awake-first does."""

    name = "gpu-best-fit"

    def _inner(self, st, pod, idx):
        cpu = (st.alloc_cpu[idx] - st.req_cpu[idx] - pod.filter_cpu) / _cpu_cap(st, idx)
        gpu = (_free_gpu(st, idx) - pod.gpu_share_milli) / _gpu_cap(st, idx) * (st.alloc_gpu[idx] > 0)
        return {"FreeShareAfter": np.round(cpu + gpu, 12)}


class GpuDotProduct(_SleepAware):
    """Dot product (Tetris, as the FGD paper's simulator scores it): the awake node whose free (CPU, GPU)
    vector has the smallest dot product with the pod's request, both over the node's capacity; wakes as
    awake-first does."""

    name = "gpu-dot-product"

    def _inner(self, st, pod, idx):
        ccap, gcap = _cpu_cap(st, idx), _gpu_cap(st, idx)
        has = st.alloc_gpu[idx] > 0
        dot = ((st.alloc_cpu[idx] - st.req_cpu[idx]) / ccap) * (pod.filter_cpu / ccap) + \
            (_free_gpu(st, idx) / gcap) * (pod.gpu_share_milli / gcap) * has
        return {"DotProduct": np.round(dot, 12)}


class GpuPacking(_SleepAware):
    """GPU packing (the FGD paper's baseline): a shared-GPU pod first to a node with a partly used GPU that
    fits it, then to a node already running GPU pods, then to a node with idle GPUs only; a whole-GPU pod to a
    node running GPU pods before an idle one; inside a tier the fewest free GPUs. Wakes as awake-first does."""

    name = "gpu-packing"

    def _inner(self, st, pod, idx):
        return {"GpuPackingTier": packing_tier(st, pod, idx).astype(np.float64),
                "FreeGpuShare": _free_gpu(st, idx) / _gpu_cap(st, idx)}


class GpuClustering(_SleepAware):
    """GPU clustering (the FGD paper's baseline): pods of one kind together: a shared-GPU pod to the node with
    the fewest whole-GPU pods and then the most shared ones, a whole-GPU pod the other way round (pods without
    GPUs by best fit on CPU). Wakes as awake-first does."""

    name = "gpu-clustering"

    def _inner(self, st, pod, idx):
        share, whole = st.gpu_share_pods[idx], st.gpu_whole_pods[idx]
        same, other = (share, whole) if pod.gpu and pod.gpu_milli < MILLI else (whole, share)
        if not pod.gpu:
            same, other = np.zeros(len(idx)), np.zeros(len(idx))
        cpu = (st.alloc_cpu[idx] - st.req_cpu[idx] - pod.filter_cpu) / _cpu_cap(st, idx)
        return {"OtherKindPods": other.astype(np.float64), "SameKindPods": -same.astype(np.float64),
                "FreeCpuShare": cpu}


def shape_of(pod: PodRequest) -> tuple:
    """The pod shape FGD counts: CPU to the core, GPU count, share to 50 milli, allowed models."""
    milli = MILLI if pod.gpu_milli >= MILLI else max(50, int(round(pod.gpu_milli / 50.0)) * 50)
    return (int(round(pod.filter_cpu / 1000.0)) * 1000, pod.gpu, min(milli, MILLI) if pod.gpu else MILLI,
            pod.gpu_models)


def fragmentation(st: ClusterState, idx: np.ndarray, free: np.ndarray, free_cpu: np.ndarray,
                  shapes: list[tuple], weights: np.ndarray) -> np.ndarray:
    """Popularity-weighted GPU fragmentation (milli-GPU) of nodes ``idx`` with per-GPU free share ``free``
    (rows aligned with ``idx``) and free CPU ``free_cpu`` (module docstring)."""
    pos = np.clip(free, 0, None)
    total = pos.sum(axis=1).astype(np.float64)
    out = np.zeros(len(idx))
    whole_free = (free == MILLI).sum(axis=1)
    partial = np.where((free > 0) & (free < MILLI), free, 0).sum(axis=1)
    for (cpu, count, milli, models), w in zip(shapes, weights.tolist()):
        fits = free_cpu >= cpu
        if models is not None:
            fits &= st.gpu_model_mask(models)[idx]
        if count == 0:
            frag = np.where(fits, 0.0, total)  # a CPU-only shape uses no GPU: it strands GPUs only by CPU
        elif milli >= MILLI:
            fits &= whole_free >= count
            frag = np.where(fits, partial, total)
        else:
            fits &= (free >= milli).any(axis=1)
            frag = np.where(fits, np.where((free > 0) & (free < milli), free, 0).sum(axis=1), total)
        out += w * frag
    return out


def cluster_fragmentation(st: ClusterState, shapes: list[tuple], weights: np.ndarray) -> float:
    """The cluster's GPU fragmentation: the sum over nodes (milli-GPU)."""
    idx = np.arange(len(st))
    return float(fragmentation(st, idx, st.gpu_free, st.free_cpu, shapes, weights).sum())


class FGD(_SleepAware):
    """FGD, fragmentation gradient descent (Weng et al., USENIX ATC 2023): the awake node whose GPU
    fragmentation grows least when the pod lands there, measured against the pod shapes seen so far (their
    popularity is the target workload); ties by best fit. Wakes as awake-first does. A shared-GPU pod is
    assumed on the GPU the cluster gives it (the fullest that fits), whole GPUs on the first free ones."""

    name = "fgd"

    def __init__(self, headroom: str | float = "1", empty: str = "awake") -> None:
        super().__init__(headroom, empty)
        self.seen: Counter = Counter()

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        super().reset(state, rng)
        self.seen = Counter()

    def choose(self, st: ClusterState, pod: PodRequest, mask: np.ndarray) -> int:
        self.seen[shape_of(pod)] += 1
        return super().choose(st, pod, mask)

    def _shapes(self) -> tuple[list[tuple], np.ndarray]:
        top = self.seen.most_common(FGD_TYPES)
        w = np.array([c for _, c in top], dtype=np.float64)
        return [s for s, _ in top], w / max(w.sum(), 1.0)

    def _inner(self, st, pod, idx):
        shapes, w = self._shapes()
        free0, cpu0 = st.gpu_free[idx], st.free_cpu[idx]
        before = fragmentation(st, idx, free0, cpu0, shapes, w)
        free1 = free0.copy()
        if pod.gpu and pod.gpu_milli < MILLI:
            fits, best = share_gpu(free1, pod.gpu_milli)
            rows = np.flatnonzero(fits)
            free1[rows, best[rows]] -= pod.gpu_milli
        elif pod.gpu:
            empty = free1 == MILLI
            take = empty & (np.cumsum(empty, axis=1) <= pod.gpu)
            free1[take] = 0
        after = fragmentation(st, idx, free1, cpu0 - pod.filter_cpu, shapes, w)
        cpu = (st.alloc_cpu[idx] - st.req_cpu[idx] - pod.filter_cpu) / _cpu_cap(st, idx)
        return {"FragIncrease": np.round(after - before, 9), "FreeCpuShare": cpu}


def gpu_watts_added(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
    """GPU watts ``pod`` adds on each candidate awake node, on the GPUs the cluster would give it (a share on the
    fullest GPU it fits, whole GPUs on free ones), read on the node's own GPU curve; 0 for a pod without GPUs
    and where it does not fit."""
    out = np.zeros(len(idx))
    if not pod.gpu or not st.has_gpus:
        return out
    curves = np.asarray(st.gpu_curves[idx], dtype=np.float64)
    free = st.gpu_free[idx]
    if pod.gpu_milli >= MILLI:  # whole GPUs go from idle to full
        return np.where((free == MILLI).sum(axis=1) >= pod.gpu, pod.gpu * (curves[:, 10] - curves[:, 0]), 0.0)
    fits, best = share_gpu(free, pod.gpu_milli)
    u0 = (MILLI - free[np.arange(len(idx)), best].astype(np.float64)) / MILLI
    add = interp_many(curves, u0 + pod.gpu_milli / MILLI) - interp_many(curves, u0)
    return np.where(fits, add, 0.0)


def gpu_energy_keys(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> dict[str, np.ndarray]:
    """``gpu-energy``'s keys for awake candidates, lower first: CPU plus GPU watts added, GPU packing's tier,
    then the free GPU and CPU shares left (best fit)."""
    dp = power_increase(st, pod, idx) + gpu_watts_added(st, pod, idx)
    tier = packing_tier(st, pod, idx) if pod.gpu else np.zeros(len(idx), dtype=np.int64)
    # Rounded so that equal increases on equal hardware tie and the packing keys decide.
    return {"PowerIncreaseW": np.round(dp, 6), "GpuPackingTier": tier.astype(np.float64),
            "FreeGpuShare": (_free_gpu(st, idx) - pod.gpu_share_milli) / _gpu_cap(st, idx) * (st.alloc_gpu[idx] > 0),
            "FreeCpuShare": free_cpu_share(st, pod, idx)}


def gpu_wake_key(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
    """``gpu-energy``'s waking order, lower first: watts at full load per GPU for a GPU pod (the CPU's and every
    GPU's peak over the GPUs), per core for a pod without (the CPU's peak and every GPU's idle, which waking
    turns on, over the cores)."""
    count = st.alloc_gpu[idx].astype(np.float64)
    curves = st.gpu_curves[idx]  # zeros on a node without GPUs
    if pod.gpu:
        return (st.peak_watts[idx] + count * curves[:, 10]) / np.maximum(count, 1.0)
    return watts_per_core(st, idx) + count * curves[:, 0] / np.maximum(st.alloc_cpu[idx], 1) * 1000.0


def node_idle_watts(st: ClusterState, idx: np.ndarray) -> np.ndarray:
    """What each node draws awake and idle: its CPU side's idle plus every GPU's idle (0 without GPUs)."""
    return st.idle_watts[idx] + st.alloc_gpu[idx] * np.asarray(st.gpu_curves[idx], dtype=np.float64)[:, 0]


class GpuEnergy(_SleepAware):
    """GPU-aware PABFD: what a power-aware packer does when it knows each node's GPU power, as the schema-3 DQN
    does (its ``gpu_marginal_watts`` and ``gpu_idle_watts`` columns). Among awake nodes the least power increase
    (the CPU curve at requests, as ``pabfd``, plus the GPU curve on the GPUs the pod would take), then GPU
    packing's tiers (a partly used GPU it fits, a node already running GPU pods), then the least free GPU and
    CPU share (best fit). Only when no awake node fits, wake the sleeping node with the fewest watts at full load
    per unit of what the pod asks for: per GPU for a GPU pod (the CPU's and every GPU's peak over the GPUs), per
    core for a pod without (the CPU's peak and every GPU's idle, which waking turns on, over the cores); ties
    toward the larger node. ``headroom`` as awake-first's.
    """

    name = "gpu-energy"
    wake_label = "WattsPerUnit"

    def _inner(self, st, pod, idx):
        return gpu_energy_keys(st, pod, idx)

    def _wake_key(self, st, pod, idx):
        return gpu_wake_key(st, pod, idx)
