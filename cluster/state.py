"""ClusterState: what a policy sees of the cluster, as numpy arrays over nodes.

Both backends (the twin and the live Kubernetes backend) fill the same arrays, so a policy never knows which
one it runs on. Units: CPU in millicores, memory in MiB, power in watts, time in seconds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from joulesched.cluster.filters import DEFAULT_CHAIN, FilterChain, NodeTraits, PodConstraints
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
    the filter chain (:mod:`joulesched.cluster.filters`) reads.

    The derived views are computed once: the filter's (absent = 0) and kube-scheduler's scoring defaults
    (absent = 100m / 200 MiB). They are plain attributes because the twin reads them on every placement.
    """

    cpu_m: int | None = None
    memory_mib: int | None = None
    constraints: PodConstraints | None = None
    filter_cpu: int = field(init=False, repr=False, compare=False)
    filter_mem: int = field(init=False, repr=False, compare=False)
    nz_cpu: int = field(init=False, repr=False, compare=False)
    nz_mem: int = field(init=False, repr=False, compare=False)
    best_effort: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        c, m = self.cpu_m, self.memory_mib
        for name, v in (("filter_cpu", c or 0), ("filter_mem", m or 0),
                        ("nz_cpu", DEFAULT_CPU_REQUEST_M if c is None else c),
                        ("nz_mem", DEFAULT_MEMORY_REQUEST_MIB if m is None else m),
                        ("best_effort", c is None and m is None)):
            object.__setattr__(self, name, v)


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

    ``traits`` (labels, taints, cordon, Ready, asleep per node; default: none) and ``chain`` (the filter
    profile) make :meth:`feasible`, composed once here (:mod:`joulesched.cluster.filters`).
    """

    def __init__(self, names: Sequence[str], cpu_m: Sequence[int], memory_mib: Sequence[int],
                 max_pods: Sequence[int], curves: Sequence[Sequence[float]], *, sleep_watts: Sequence[float] | None = None,
                 group: Sequence[int] | None = None, group_names: Sequence[str] | None = None,
                 wake_s: float = 0.0, can_sleep: bool = False, traits: Sequence[NodeTraits] | None = None,
                 chain: FilterChain = DEFAULT_CHAIN) -> None:
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
        self.chain = chain
        self.filter_table = chain.table(self.names, traits)
        self.feasible = chain.bind(self, self.filter_table)  # shadows the method below: one call per decision

    def __len__(self) -> int:
        return len(self.names)

    # ---- what policies call -------------------------------------------------------------------------------
    def feasible(self, pod: PodRequest) -> np.ndarray:  # replaced per instance by the chain's composed function
        """Nodes that pass every filter of the chain for ``pod`` (:meth:`FilterChain.bind
        <joulesched.cluster.filters.FilterChain.bind>`): NodeUnschedulable, TaintToleration, NodeAffinity,
        PowerState and NodeResourcesFit with the pod count."""
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

    def unschedulable_message(self, pod: PodRequest) -> str:
        """The FailedScheduling message, e.g. ``0/5 nodes are available: 3 Insufficient cpu.``"""
        counts: Counter[str] = Counter()
        for i in range(len(self)):
            counts.update(self.filter_reasons(i, pod))
        parts = ", ".join(f"{c} {r}" for r, c in sorted(counts.items(), key=lambda rc: (-rc[1], rc[0])))
        return f"0/{len(self)} nodes are available: {parts}." if parts else f"0/{len(self)} nodes are available."

    # ---- what backends call -------------------------------------------------------------------------------
    def bind(self, i: int, pod: PodRequest) -> None:
        """Account ``pod``'s requests on node ``i``."""
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

    def unbind(self, i: int, pod: PodRequest) -> None:
        """Release ``pod``'s requests from node ``i``."""
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
