"""ClusterState: what a policy sees of the cluster, as numpy arrays over nodes.

Both backends (the twin and the live Kubernetes backend) fill the same arrays, so a policy never knows which
one it runs on. Units: CPU in millicores, memory in MiB, power in watts, time in seconds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from joulesched.cluster.filters import DEFAULT_CHAIN, GPU_MILLI, FilterChain, NodeExtras, NodeTraits, PodConstraints
from joulesched.power.curves import interp_many, validate_curve

# Node power states.
ON, ASLEEP, WAKING = 0, 1, 2

# kube-scheduler's non-zero defaults for scoring (pkg/scheduler/util/pod_resources.go).
DEFAULT_CPU_REQUEST_M = 100
DEFAULT_MEMORY_REQUEST_MIB = 200


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod's requests as the scheduler sees them. ``None`` = no request; ``0`` = an explicit zero.
    ``constraints``: its nodeSelector, tolerations and required node affinity (``None``: it asks nothing), which
    the filter chain (:mod:`joulesched.cluster.filters`) reads. GPUs: ``gpu`` GPUs of ``gpu_milli`` milli-GPU
    each (1000: whole GPUs; below 1000 only with ``gpu`` 1, a share of one GPU), on a node whose model is in
    ``gpu_models`` (``None``: any model). ``named``: ``(resource, quantity)`` of every other resource it requests
    (extended resources, ``ephemeral-storage``, ``hugepages-*``; integers as kube's ``Quantity.Value()``), and
    ``host_ports``: ``(protocol, host IP, port)`` of its host ports; both sorted, empty for most pods.

    The derived views are computed once: the filter's (absent = 0) and kube-scheduler's scoring defaults
    (absent = 100m / 200 MiB). They are plain attributes because the twin reads them on every placement.
    """

    cpu_m: int | None = None
    memory_mib: int | None = None
    constraints: PodConstraints | None = None
    gpu: int = 0
    gpu_milli: int = GPU_MILLI
    gpu_models: frozenset[str] | None = None
    named: tuple[tuple[str, int], ...] = ()
    host_ports: tuple[tuple[str, str, int], ...] = ()
    # kube's non-zero requests when worked out per container (cluster.kube.objects: 100m / 200 MiB for each
    # container without a request); None: from the pod's requests as a whole, as a twin pod has one container.
    nz_cpu_m: int | None = None
    nz_memory_mib: int | None = None
    filter_cpu: int = field(init=False, repr=False, compare=False)
    filter_mem: int = field(init=False, repr=False, compare=False)
    nz_cpu: int = field(init=False, repr=False, compare=False)
    nz_mem: int = field(init=False, repr=False, compare=False)
    best_effort: bool = field(init=False, repr=False, compare=False)
    extra: bool = field(init=False, repr=False, compare=False)  # asks named resources or host ports

    def __post_init__(self) -> None:
        c, m = self.cpu_m, self.memory_mib
        for name, v in (("filter_cpu", c or 0), ("filter_mem", m or 0),
                        ("nz_cpu", self.nz_cpu_m if self.nz_cpu_m is not None
                         else DEFAULT_CPU_REQUEST_M if c is None else c),
                        ("nz_mem", self.nz_memory_mib if self.nz_memory_mib is not None
                         else DEFAULT_MEMORY_REQUEST_MIB if m is None else m),
                        ("best_effort", c is None and m is None),
                        ("extra", bool(self.named or self.host_ports))):
            object.__setattr__(self, name, v)
        if self.gpu:
            check_gpu_request(self.gpu, self.gpu_milli)

    @property
    def gpu_share_milli(self) -> int:
        """The pod's milli-GPUs in all (count x share)."""
        return self.gpu * self.gpu_milli


def gpu_take(free: np.ndarray, pod: PodRequest) -> tuple[tuple[int, int], ...] | None:
    """Take ``pod``'s GPUs from one node's per-GPU free share ``free`` (modified in place): a share goes to the
    fullest GPU it fits (best fit, lowest index on a tie), whole GPUs to the first free ones. Returns the
    ``(gpu, milli)`` taken, or ``None`` (nothing taken) when they do not fit."""
    if pod.gpu_milli >= GPU_MILLI:
        idx = np.flatnonzero(free == GPU_MILLI)[:pod.gpu]
        if len(idx) < pod.gpu:
            return None
        took = tuple((int(g), GPU_MILLI) for g in idx)
    else:
        cand = np.flatnonzero(free >= pod.gpu_milli)
        if not len(cand):
            return None
        took = ((int(cand[np.argmin(free[cand])]), pod.gpu_milli),)
    for g, m in took:
        free[g] -= m
    return took


def check_gpu_request(count: int, milli: int) -> None:
    """A GPU request is ``count`` >= 1 whole GPUs, or one GPU's share of 1..1000 milli-GPU (ValueError)."""
    if count < 0:
        raise ValueError(f"a GPU count must be >= 0, got {count}")
    if not 1 <= milli <= GPU_MILLI:
        raise ValueError(f"a GPU share must be 1..{GPU_MILLI} milli-GPU, got {milli}")
    if count > 1 and milli != GPU_MILLI:
        raise ValueError(f"a share of {milli} milli-GPU is a share of one GPU, not of {count}")


class ClusterState:
    """Per-node arrays (length N). Policies read them; only a backend writes them.

    Attributes
    ----------
    alloc_cpu, alloc_mem, alloc_pods : int64
        Allocatable millicores, MiB and pod slots.
    req_cpu, req_mem, pods : int64
        Sums of the real requests of pods bound to the node, and their count.
    nz_cpu, nz_mem : int64
        Sums of the non-zero requests (kube-scheduler's scoring view: 100m / 200MiB for absent requests).
    usage_cpu : float64
        Demanded CPU of the pods running on the node (may exceed allocatable: then pods are throttled).
    curves : float64 (N, 11)
        Watts at 0, 10, ..., 100 % CPU.
    power_state : int8
        ON, ASLEEP or WAKING.
    sleep_watts : float64
        Draw while asleep (equal to the idle watts where nodes never sleep).
    next_departure_at : float64
        Absolute time of the node's next pod departure (inf when none is known).
    now : float
        Current time, seconds.

    gpu_free : int32 (N, G)
        Free milli-GPU of each of a node's GPUs (G the most GPUs of a node; slots past a node's count hold -1).
    alloc_gpu, gpu_whole_free, gpu_max_free : int64
        GPUs per node, its GPUs with nothing on them, and its largest free share (what the GPU filter reads).
    gpu_model : list[str]
        Each node's GPU model ("" without GPUs); ``gpu_curves`` (N, 11) one GPU's watts at 0..100 % of it.

    extras : :class:`~joulesched.cluster.filters.NodeExtras`
        Per node: allocatable of the resources a :class:`PodRequest` lists as ``named`` (``named_alloc``; one a
        node does not list is 0 there), its pods' requests of them, and the host ports its pods hold.

    ``traits`` (labels, taints, cordon, Ready, asleep per node; default: none) and ``chain`` (the filter
    profile) make :meth:`feasible`, composed once here (:mod:`joulesched.cluster.filters`).
    """

    def __init__(self, names: Sequence[str], cpu_m: Sequence[int], memory_mib: Sequence[int],
                 max_pods: Sequence[int], curves: Sequence[Sequence[float]], *, sleep_watts: Sequence[float] | None = None,
                 group: Sequence[int] | None = None, group_names: Sequence[str] | None = None,
                 wake_s: float = 0.0, can_sleep: bool = False, may_sleep: Sequence[bool] | None = None,
                 traits: Sequence[NodeTraits] | None = None,
                 chain: FilterChain = DEFAULT_CHAIN, gpu_count: Sequence[int] | None = None,
                 gpu_model: Sequence[str] | None = None,
                 gpu_curves: Sequence[Sequence[float]] | None = None,
                 named_alloc: Sequence[Mapping[str, int]] | None = None) -> None:
        n = len(names)
        if n == 0:
            raise ValueError("a cluster needs at least one node")
        if len(set(names)) != n:
            dup = [k for k, c in Counter(names).items() if c > 1][0]
            raise ValueError(f"node name {dup!r} appears twice")
        self.names = list(names)
        self.alloc_cpu = np.asarray(cpu_m, dtype=np.int64)
        self.alloc_mem = np.asarray(memory_mib, dtype=np.int64)
        self.alloc_pods = np.asarray(max_pods, dtype=np.int64)
        for label, arr in (("cpu_m", self.alloc_cpu), ("memory_mib", self.alloc_mem), ("max_pods", self.alloc_pods)):
            if arr.shape != (n,):
                raise ValueError(f"{label} has {arr.size} values for {n} nodes")
            if (arr < 0).any():
                raise ValueError(f"{label} must be >= 0")
        self.curves = np.array([validate_curve(c) for c in curves], dtype=np.float64).reshape(n, 11)
        self.idle_watts = self.curves[:, 0].copy()
        self.peak_watts = self.curves[:, 10].copy()
        self.sleep_watts = (self.idle_watts.copy() if sleep_watts is None
                            else np.asarray(sleep_watts, dtype=np.float64))
        self.group = np.zeros(n, dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
        self.group_names = list(group_names) if group_names is not None else ["nodes"]
        self.wake_s = float(wake_s)
        self.can_sleep = bool(can_sleep)
        # Which nodes are put to sleep once idle: every one where the cluster sleeps, but a protected node (a
        # control plane, never-sleep) stays awake. What `empty=asleep` reads (agent/sleep_aware.py).
        self.may_sleep = (np.full(n, self.can_sleep) if may_sleep is None else np.asarray(may_sleep, dtype=bool))
        if self.may_sleep.shape != (n,):
            raise ValueError(f"may_sleep has {self.may_sleep.size} values for {n} nodes")
        self.req_cpu = np.zeros(n, dtype=np.int64)
        self.req_mem = np.zeros(n, dtype=np.int64)
        self.pods = np.zeros(n, dtype=np.int64)
        self.nz_cpu = np.zeros(n, dtype=np.int64)
        self.nz_mem = np.zeros(n, dtype=np.int64)
        # Free capacity is kept alongside requested totals so that the filter is three comparisons.
        self.free_cpu = self.alloc_cpu.copy()
        self.free_mem = self.alloc_mem.copy()
        self.free_pods = self.alloc_pods.copy()
        self.full_nodes = int((self.free_pods <= 0).sum())  # nodes with no pod slot left
        self.usage_cpu = np.zeros(n, dtype=np.float64)
        self.power_state = np.zeros(n, dtype=np.int8)
        self.next_departure_at = np.full(n, np.inf)
        self.now = 0.0
        self._init_gpus(n, gpu_count, gpu_model, gpu_curves)
        self.extras = NodeExtras(n, named_alloc)
        self.chain = chain
        self.filter_table = chain.table(self.names, traits)
        self.feasible = chain.bind(self, self.filter_table)  # shadows the method below: one call per decision

    def _init_gpus(self, n: int, count: Sequence[int] | None, model: Sequence[str] | None,
                   curves: Sequence[Sequence[float]] | None) -> None:
        self.alloc_gpu = np.zeros(n, dtype=np.int64) if count is None else np.asarray(count, dtype=np.int64)
        if self.alloc_gpu.shape != (n,) or (self.alloc_gpu < 0).any():
            raise ValueError(f"gpu_count needs {n} values >= 0")
        self.gpu_model = [""] * n if model is None else [str(m) for m in model]
        if len(self.gpu_model) != n:
            raise ValueError(f"gpu_model has {len(self.gpu_model)} values for {n} nodes")
        self.has_gpus = bool(self.alloc_gpu.any())
        g = max(1, int(self.alloc_gpu.max()))
        self.gpu_free = np.where(np.arange(g)[None, :] < self.alloc_gpu[:, None], GPU_MILLI, -1).astype(np.int32)
        self.gpu_whole_free = self.alloc_gpu.copy()
        self.gpu_max_free = np.where(self.alloc_gpu > 0, GPU_MILLI, 0).astype(np.int64)
        self.gpu_curves = (np.zeros((n, 11)) if curves is None
                           else np.array([validate_curve(c, busy_draw=False) for c in curves],
                                         dtype=np.float64).reshape(n, 11))
        self._gpu_models: dict[frozenset[str], np.ndarray] = {}
        self.gpu_share_pods = np.zeros(n, dtype=np.int64)  # pods holding a share of one GPU, per node
        self.gpu_whole_pods = np.zeros(n, dtype=np.int64)  # pods holding whole GPUs, per node
        #: pod key -> (node, ((gpu index, milli), ...)): which GPUs a bound pod holds
        self.gpu_assign: dict[object, tuple[int, tuple[tuple[int, int], ...]]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def gpu_model_mask(self, models: frozenset[str]) -> np.ndarray:
        """Nodes whose GPU model is one of ``models`` (cached per set)."""
        m = self._gpu_models.get(models)
        if m is None:
            m = self._gpu_models[models] = np.array([x in models for x in self.gpu_model], dtype=bool)
        return m

    def gpu_used_milli(self) -> np.ndarray:
        """Allocated milli-GPU per GPU slot (N, G): 0 on a free GPU and on slots a node does not have."""
        return np.where(self.gpu_free >= 0, GPU_MILLI - self.gpu_free, 0)

    def gpu_power(self, i: int) -> float:
        """Node ``i``'s GPUs' watts while it is on: each GPU's curve at its allocated share (an allocated GPU
        is taken as busy at its share; a free one draws its idle watts)."""
        k = int(self.alloc_gpu[i])
        if not k:
            return 0.0
        u = (GPU_MILLI - self.gpu_free[i, :k]) / GPU_MILLI
        return float(np.interp(u * 10.0, np.arange(11), self.gpu_curves[i]).sum())

    def _gpu_take(self, i: int, pod: PodRequest, key: object) -> None:
        """Assign ``pod``'s GPUs on node ``i``: a share to the fullest GPU it fits (best fit, lowest index on a
        tie), whole GPUs to the first free ones. Raises ValueError when they do not fit."""
        took = gpu_take(self.gpu_free[i], pod)
        if took is None:
            raise ValueError(f"node {self.names[i]}'s GPUs do not fit {pod.gpu} x {pod.gpu_milli} milli-GPU")
        self.gpu_assign[key] = (i, took)
        (self.gpu_share_pods if pod.gpu_milli < GPU_MILLI else self.gpu_whole_pods)[i] += 1
        self._gpu_refresh(i)

    def gpu_fits(self, free: np.ndarray, rows: np.ndarray, pod: PodRequest) -> np.ndarray:
        """GpuFit on what-if room: ``free`` rows of per-GPU free share (a copy of :attr:`gpu_free` a plan
        decrements with :func:`gpu_take`) for nodes ``rows``; True for a pod without GPUs."""
        if not pod.gpu:
            return np.ones(len(rows), dtype=bool)
        f = free[rows]
        ok = ((f == GPU_MILLI).sum(axis=1) >= pod.gpu) if pod.gpu_milli >= GPU_MILLI \
            else (f >= pod.gpu_milli).any(axis=1)
        if pod.gpu_models is not None:
            ok &= self.gpu_model_mask(pod.gpu_models)[rows]
        return ok

    def _gpu_release(self, i: int, pod: PodRequest, key: object, strict: bool = True) -> None:
        if not strict and key not in self.gpu_assign:
            return  # accounted without GPUs (see bind)
        node, took = self.gpu_assign.pop(key)
        if node != i:
            raise ValueError(f"pod holds GPUs on node {self.names[node]}, not {self.names[i]}")
        free = self.gpu_free[i]
        for g, m in took:
            free[g] += m
        (self.gpu_share_pods if pod.gpu_milli < GPU_MILLI else self.gpu_whole_pods)[i] -= 1
        self._gpu_refresh(i)

    def _gpu_refresh(self, i: int) -> None:
        free = self.gpu_free[i]
        self.gpu_whole_free[i] = int((free == GPU_MILLI).sum())
        self.gpu_max_free[i] = max(0, int(free.max()))

    # ---- what policies call -------------------------------------------------------------------------------
    def feasible(self, pod: PodRequest) -> np.ndarray:  # replaced per instance by the chain's composed function
        """Nodes that pass every filter of the chain for ``pod`` (:meth:`FilterChain.bind
        <joulesched.cluster.filters.FilterChain.bind>`): NodeUnschedulable, TaintToleration, NodeAffinity,
        NodeReady, PowerState and NodeResourcesFit with the pod count."""
        return self.chain.bind(self, self.filter_table)(pod)

    def utilization(self) -> np.ndarray:
        """CPU utilisation u = min(1, usage / allocatable) per node."""
        return np.minimum(1.0, self.usage_cpu / np.maximum(self.alloc_cpu, 1))

    def power(self) -> np.ndarray:
        """Watts per node now: the curve at u, or the sleep draw."""
        w = interp_many(self.curves, self.utilization())
        return np.where(self.power_state == ASLEEP, self.sleep_watts, w)

    def filter_reasons(self, i: int, pod: PodRequest) -> list[str]:
        """kube-style reasons node ``i`` fails the filter (empty when it fits)."""
        return self.chain.reasons(self, self.filter_table, i, pod)

    def filter_reason_counts(self, pod: PodRequest) -> Counter[str]:
        """:meth:`filter_reasons` of every node, counted in one pass over the nodes."""
        return self.chain.reason_counts(self, self.filter_table, pod)

    def unschedulable_message(self, pod: PodRequest) -> str:
        """The FailedScheduling message, e.g. ``0/5 nodes are available: 3 Insufficient cpu.``"""
        counts = self.filter_reason_counts(pod)
        parts = ", ".join(f"{c} {r}" for r, c in sorted(counts.items(), key=lambda rc: (-rc[1], rc[0])))
        return f"0/{len(self)} nodes are available: {parts}." if parts else f"0/{len(self)} nodes are available."

    # ---- what backends call -------------------------------------------------------------------------------
    def bind(self, i: int, pod: PodRequest, key: object = None, strict: bool = True) -> None:
        """Account ``pod``'s requests on node ``i``. A pod with GPUs is given particular GPUs, remembered under
        ``key`` (default: the request object itself) until :meth:`unbind` with the same key. ``strict`` False
        (the live cache, which accounts what the apiserver says runs): GPUs that do not fit are not held."""
        if pod.gpu:
            try:
                self._gpu_take(i, pod, id(pod) if key is None else key)
            except ValueError:
                if strict:
                    raise
        c, m = pod.filter_cpu, pod.filter_mem
        self.req_cpu[i] += c
        self.req_mem[i] += m
        self.free_cpu[i] -= c
        self.free_mem[i] -= m
        self.pods[i] += 1
        self.free_pods[i] -= 1
        if self.free_pods[i] == 0:
            self.full_nodes += 1
        self.nz_cpu[i] += pod.nz_cpu
        self.nz_mem[i] += pod.nz_mem
        if pod.extra:
            self.extras.add(i, pod, 1)

    def unbind(self, i: int, pod: PodRequest, key: object = None, strict: bool = True) -> None:
        """Release ``pod``'s requests from node ``i`` (its GPUs by the ``key`` it was bound with)."""
        if pod.gpu:
            self._gpu_release(i, pod, id(pod) if key is None else key, strict)
        c, m = pod.filter_cpu, pod.filter_mem
        self.req_cpu[i] -= c
        self.req_mem[i] -= m
        self.free_cpu[i] += c
        self.free_mem[i] += m
        if self.free_pods[i] == 0:
            self.full_nodes -= 1
        self.pods[i] -= 1
        self.free_pods[i] += 1
        self.nz_cpu[i] -= pod.nz_cpu
        self.nz_mem[i] -= pod.nz_mem
        if pod.extra:
            self.extras.add(i, pod, -1)
