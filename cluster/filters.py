"""The filter chain: which nodes a pod may go to. One implementation for the twin, :class:`ClusterState`, the
live cache and the node power controller's "would this pod fit if that node woke" question.

Modelled on kube-scheduler's Filter extension point: small named filters, run in kube's plugin order, the
first failing one giving the node's reason in kube's words.

* Node filters look only at what a node *is* (its :class:`NodeTraits`: labels, taints, cordon, Ready, asleep)
  and what a pod *asks* (its :class:`PodConstraints`: nodeSelector, tolerations, required node affinity):
  ``NodeUnschedulable``, ``TaintToleration``, ``NodeAffinity``, then, in joulesched's own profile,
  ``NodeReady`` (a node that is NotReady without being asleep, i.e. down, booting or failed to wake, takes no
  pod: nothing would wake it; kube-scheduler has no such filter, see :func:`node_ready`;
  :data:`KUBE_NODE_FILTERS` is kube's set, for the extender). They are judged once per distinct node traits
  (nodes are encoded as integer ids of their distinct traits, :class:`NodeTable`) and cached per distinct pod
  constraints, so a pod's cost is a dict lookup and one ``&``; a pod without constraints on nodes that admit
  it costs nothing at all.
* ``PowerState`` decides how a sleeping node is judged: under a profile that wakes nodes (the twin; the live
  scheduler with node power) as it will be once awake, without the node power controller's taint and cordon;
  otherwise as it is, gated by them.
* Resource filters look at the free capacity a :class:`ClusterState` keeps: ``NodePorts`` (host ports, kube's
  plugin of that name), ``NodeResourcesFit`` (cpu, memory and the pod count, kube's ``Insufficient cpu`` /
  ``Insufficient memory`` / ``Too many pods``), ``GpuFit`` (whole GPUs, a shared GPU's milli-share on one GPU,
  the allowed GPU models; docs/twin.md, "GPUs") and ``NamedResourcesFit`` (every other requested resource:
  extended resources, ``ephemeral-storage``, ``hugepages-*``). The last three are kube's one NodeResourcesFit
  plugin (their reasons are listed together); only a pod that asks host ports or named resources pays for
  their two filters. A new resource is one more object with the same methods in :data:`RESOURCE_FILTERS`.

:class:`FilterChain` composes them once per profile; :meth:`FilterChain.bind` gives a state its ``feasible``
function. Policies only ever choose among the nodes of that mask, so a filter a policy does not know about
still applies.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

#: The node power controller's taint on a sleeping node (joulesched.cluster.kube.objects re-exports it).
ASLEEP_TAINT = "joulesched.io/asleep"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
#: Taint effects the filter honours (PreferNoSchedule only lowers a score in kube).
GATING_EFFECTS = ("NoSchedule", "NoExecute")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_OPERATORS = ("Equal", "Exists")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

# kube-scheduler's words (pkg/scheduler/framework/plugins/*): the FailedScheduling message counts these.
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_NOT_READY = "node(s) were not ready"  # kube's old CheckNodeCondition predicate's words
REASON_CPU, REASON_MEMORY, REASON_PODS = "Insufficient cpu", "Insufficient memory", "Too many pods"
# Extended resources read as kube's NodeResourcesFit names them ("Insufficient <resource name>").
GPU_RESOURCE = "nvidia.com/gpu"  # whole GPUs (the NVIDIA device plugin)
GPU_SHARE_ANNOTATION = "alibabacloud.com/gpu-milli"  # a shared GPU's share, 1..1000 (the gpushare convention)
GPU_MODEL_ANNOTATION = "alibabacloud.com/gpu-card-model"  # a pod's allowed models, "A|B" (the trace's gpu_spec)
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # a node's GPU model (GPU feature discovery sets it)
REASON_GPU = f"Insufficient {GPU_RESOURCE}"
REASON_GPU_SHARE = f"Insufficient {GPU_SHARE_ANNOTATION}"
REASON_GPU_MODEL = "node(s) didn't match Pod's GPU model"
#: One GPU's whole share, milli-GPU.
GPU_MILLI = 1000
REASON_PORTS = "node(s) didn't have free ports for the requested pod ports"
#: Resources a pod's ``named`` requests never list: the ones NodeResourcesFit and GpuFit model.
MODELLED_RESOURCES = frozenset({"cpu", "memory", "pods", GPU_RESOURCE})
#: A host port's IP that binds every address (kube's DefaultBindAllHostIP; an empty hostIP means it too).
ANY_HOST_IP = "0.0.0.0"
_BY_ANY = "*"  # NodeExtras.ports' key for a port's use by any IP


def insufficient(resource: str) -> str:
    """kube's NodeResourcesFit reason for ``resource``."""
    return f"Insufficient {resource}"


def untolerated_taint_reason(taint: "Taint") -> str:
    return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"


# ---- what nodes are and what pods ask ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """kube's Toleration. An empty ``key`` with ``Exists`` tolerates every taint; an empty ``effect`` every effect."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """kube's ``Toleration.ToleratesTaint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if not self.key and self.operator != "Exists":
            return False
        return self.operator == "Exists" or self.value == taint.value


_INT = re.compile(r"^[-+]?[0-9]+\Z")


@dataclass(frozen=True, slots=True)
class Requirement:
    """A node selector requirement: ``key`` ``operator`` ``values`` (kube's NodeSelectorRequirement)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op, v = self.operator, labels.get(self.key)
        if op == "In":
            return v is not None and v in self.values
        if op == "NotIn":
            return v is None or v not in self.values
        if op == "Exists":
            return v is not None
        if op == "DoesNotExist":
            return v is None
        # Gt / Lt: both sides integers (kube: a label that is not one does not match).
        if v is None or len(self.values) != 1 or not _INT.match(v) or not _INT.match(self.values[0]):
            return False
        return int(v) > int(self.values[0]) if op == "Gt" else int(v) < int(self.values[0])


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements ANDed; an empty term matches no node (kube). ``match_fields`` read ``metadata.name``."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str], fields: Mapping[str, str]) -> bool:
        if not self.match_expressions and not self.match_fields:
            return False
        return all(r.matches(labels) for r in self.match_expressions) and \
            all(r.matches(fields) for r in self.match_fields)


@dataclass(frozen=True, slots=True)
class PodConstraints:
    """What a pod asks of a node beyond resources. ``required_terms`` is
    requiredDuringSchedulingIgnoredDuringExecution's nodeSelectorTerms (ORed); ``None``: no required affinity.
    Build it with :func:`pod_constraints`, which returns ``None`` for a pod that asks nothing."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    required_terms: tuple[NodeSelectorTerm, ...] | None = None
    uses_fields: bool = field(default=False, init=False, compare=False, repr=False)
    _hash: int = field(default=0, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uses_fields", any(t.match_fields for t in self.required_terms or ()))
        # Hashed once: the chain looks a pod's constraints up in its verdict cache on every decision.
        object.__setattr__(self, "_hash", hash((self.node_selector, self.tolerations, self.required_terms)))

    def __hash__(self) -> int:
        return self._hash


def pod_constraints(node_selector: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
                    tolerations: Iterable[Toleration] = (),
                    required_terms: Iterable[NodeSelectorTerm] | None = None) -> PodConstraints | None:
    """The pod's constraints, canonical (sorted selector, tuples); ``None`` when it asks nothing."""
    items = node_selector.items() if isinstance(node_selector, Mapping) else (node_selector or ())
    sel = tuple(sorted((str(k), str(v)) for k, v in items))
    tol = tuple(tolerations)
    terms = None if required_terms is None else tuple(required_terms)
    if not sel and not tol and terms is None:
        return None
    return PodConstraints(sel, tol, terms)


@dataclass(frozen=True, slots=True)
class NodeTraits:
    """What the node filters read of a node. ``asleep``: the node power controller put it to sleep (its
    taint ``joulesched.io/asleep`` is the controller's, and so is its cordon unless ``foreign_cordon``: someone
    else's, which the wake leaves in place; see :meth:`awake`)."""

    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    asleep: bool = False
    foreign_cordon: bool = False

    @classmethod
    def of(cls, labels: Mapping[str, str] | None = None, taints: Iterable[Taint] = (), *,
           unschedulable: bool = False, ready: bool = True, asleep: bool = False,
           foreign_cordon: bool = False) -> "NodeTraits":
        return cls(tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items())), tuple(taints),
                   bool(unschedulable), bool(ready), bool(asleep), bool(unschedulable and foreign_cordon))

    def awake(self) -> "NodeTraits":
        """The node as it will be once awake: without the controller's taint and cordon, Ready. A cordon that is
        not the controller's stays: the wake does not lift it (live/nodepower.py), so the node takes no pod."""
        return replace(self, unschedulable=self.foreign_cordon, ready=True, asleep=False,
                       taints=tuple(t for t in self.taints if t.key != ASLEEP_TAINT))

    @property
    def plain(self) -> bool:
        """Admits a pod without constraints and matches no selector: what every twin node was before labels."""
        return self == _PLAIN


_PLAIN = NodeTraits()


# ---- the node filters, in kube-scheduler's plugin order ---------------------------------------------------
NodeFilter = Callable[[NodeTraits, "PodConstraints | None", Mapping[str, str]], str]


def node_unschedulable(node: NodeTraits, pod: PodConstraints | None, fields: Mapping[str, str]) -> str:
    """NodeUnschedulable: a cordoned node takes only pods tolerating ``node.kubernetes.io/unschedulable``."""
    if node.unschedulable and not any(t.tolerates(_UNSCHEDULABLE) for t in (pod.tolerations if pod else ())):
        return REASON_UNSCHEDULABLE
    return ""


_UNSCHEDULABLE = Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")
_NOT_READY = Taint(NOT_READY_TAINT, "", "NoSchedule")


def taint_toleration(node: NodeTraits, pod: PodConstraints | None, fields: Mapping[str, str]) -> str:
    """TaintToleration: every NoSchedule/NoExecute taint tolerated. A NotReady node counts as tainted
    ``node.kubernetes.io/not-ready:NoSchedule`` (TaintNodesByCondition's taint) even before the node lifecycle
    controller adds it, so that nothing lands on a node that is off or booting unless it tolerates that
    taint, as in kube-scheduler (a pod that does meets :func:`node_ready` in joulesched's own profile)."""
    tols = pod.tolerations if pod else ()
    taints = node.taints if node.ready else (*node.taints, _NOT_READY)
    for taint in taints:
        if taint.effect in GATING_EFFECTS and not any(t.tolerates(taint) for t in tols):
            return untolerated_taint_reason(taint)
    return ""


def node_affinity(node: NodeTraits, pod: PodConstraints | None, fields: Mapping[str, str]) -> str:
    """NodeAffinity: the nodeSelector's labels all present, and one required nodeSelectorTerm matched."""
    if pod is None:
        return ""
    labels = dict(node.labels)
    if any(labels.get(k) != v for k, v in pod.node_selector):
        return REASON_AFFINITY
    if pod.required_terms is not None and not any(t.matches(labels, fields) for t in pod.required_terms):
        return REASON_AFFINITY
    return ""


def node_ready(node: NodeTraits, pod: PodConstraints | None, fields: Mapping[str, str]) -> str:
    """NodeReady, joulesched's own profile (the twin, ``serve``, the node power controller's "would it fit"): a
    node that is NotReady without being asleep (down, booting, a wake that failed) takes no pod, even one that
    tolerates every taint: nothing would wake it, ``serve`` binds only to Ready nodes, and a policy looking for
    empty nodes would favour exactly the dead ones. A sleeping node passes (judged awake under a profile that
    wakes nodes, else gated by the controller's taint and cordon). kube-scheduler has no such filter (a pod
    tolerating ``node.kubernetes.io/not-ready`` may go to a NotReady node: a booting node's CNI pod must), so
    :data:`KUBE_NODE_FILTERS`, the extender's, leaves it out. Runs after kube's node filters, so a node they
    reject keeps their reason."""
    return "" if node.ready or node.asleep else REASON_NOT_READY


NODE_FILTERS: tuple[tuple[str, NodeFilter], ...] = (
    ("NodeUnschedulable", node_unschedulable),
    ("TaintToleration", taint_toleration),
    ("NodeAffinity", node_affinity),
    ("NodeReady", node_ready),
)
#: kube-scheduler's node filters: readiness only through the not-ready taint. The extender's profile: it must
#: pass what kube-scheduler passes, or a tolerate-all pod that has to run before any node is Ready (a CNI's
#: DaemonSet, an operator such as tigera-operator) would never be placed while the extender is attached.
KUBE_NODE_FILTERS: tuple[tuple[str, NodeFilter], ...] = tuple(f for f in NODE_FILTERS if f[0] != "NodeReady")


def node_reason(node: NodeTraits, pod: PodConstraints | None, name: str = "",
                filters: Sequence[tuple[str, NodeFilter]] = NODE_FILTERS) -> str:
    """The first node filter ``node`` fails for ``pod``, in kube's words; "" when it passes them all."""
    fields = {"metadata.name": name}
    for _, f in filters:
        r = f(node, pod, fields)
        if r:
            return r
    return ""


def power_state_view(node: NodeTraits, wake_sleeping: bool) -> NodeTraits:
    """PowerState: what the node filters judge of a sleeping node. Waking it is part of binding to it when the
    profile wakes nodes: then it is judged awake; otherwise the controller's taint and cordon gate it."""
    return node.awake() if wake_sleeping and node.asleep else node


# ---- resource filters ---------------------------------------------------------------------------------------
class ClusterState(Protocol):
    """What the filters read of :class:`joulesched.cluster.state.ClusterState` (which imports this module)."""

    names: list[str]
    alloc_cpu: np.ndarray
    alloc_mem: np.ndarray
    alloc_pods: np.ndarray
    free_cpu: np.ndarray
    free_mem: np.ndarray
    free_pods: np.ndarray
    full_nodes: int
    alloc_gpu: np.ndarray
    gpu_whole_free: np.ndarray
    gpu_max_free: np.ndarray
    extras: "NodeExtras"

    def __len__(self) -> int: ...

    def gpu_model_mask(self, models: frozenset[str]) -> np.ndarray: ...


class PodRequest(Protocol):
    """What the filters read of :class:`joulesched.cluster.state.PodRequest`: requests (absent = 0), constraints."""

    filter_cpu: int
    filter_mem: int
    constraints: PodConstraints | None
    gpu: int
    gpu_milli: int
    gpu_models: frozenset[str] | None
    named: tuple[tuple[str, int], ...]
    host_ports: tuple[tuple[str, str, int], ...]
    extra: bool


class ResourceFilter(Protocol):
    """A filter over a ClusterState's free capacity: a mask over nodes, one node's reasons, and (for pods
    that fit no node even when the cluster is empty) the fit against empty nodes, vectorised over pods.

    Optional: ``plugin``, the kube plugin it is part of (default its ``name``: the chain lists the reasons of
    the first plugin a node fails, as kube does); ``reason_masks(st, pod)``, every node's reasons at once as
    ``[(reason, mask)]`` (else :meth:`FilterChain.reason_counts` asks :meth:`reasons` node by node)."""

    name: str

    def mask(self, st: ClusterState, pod: PodRequest) -> np.ndarray: ...

    def reasons(self, st: ClusterState, i: int, pod: PodRequest) -> list[str]: ...

    def fits_empty(self, st: ClusterState, nodes: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                   gpu: "GpuDemand | None" = None) -> np.ndarray: ...

    def fits_node(self, st: ClusterState, i: int, pod: PodRequest) -> bool: ...


class NodeResourcesFit:
    """kube's NodeResourcesFit on real requests (absent = 0), and the pod-count limit."""

    name = plugin = "NodeResourcesFit"

    @staticmethod
    def mask(st: ClusterState, pod: PodRequest) -> np.ndarray:
        return fits_free(st.free_cpu, st.free_mem, st.free_pods, pod, st.full_nodes)

    @staticmethod
    def reason_masks(st: ClusterState, pod: PodRequest) -> list[tuple[str, np.ndarray]]:
        out = []
        if pod.filter_cpu:
            out.append((REASON_CPU, st.free_cpu < pod.filter_cpu))
        if pod.filter_mem:
            out.append((REASON_MEMORY, st.free_mem < pod.filter_mem))
        return out + [(REASON_PODS, st.free_pods <= 0)]

    @staticmethod
    def reasons(st: ClusterState, i: int, pod: PodRequest) -> list[str]:
        out = []
        if pod.filter_cpu and st.free_cpu[i] < pod.filter_cpu:
            out.append(REASON_CPU)
        if pod.filter_mem and st.free_mem[i] < pod.filter_mem:
            out.append(REASON_MEMORY)
        if st.free_pods[i] <= 0:
            out.append(REASON_PODS)
        return out

    @staticmethod
    def fits_node(st: ClusterState, i: int, pod: PodRequest) -> bool:
        return st.free_pods[i] > 0 and pod.filter_cpu <= st.free_cpu[i] and pod.filter_mem <= st.free_mem[i]

    @staticmethod
    def fits_empty(st: ClusterState, nodes: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                   gpu: "GpuDemand | None" = None) -> np.ndarray:
        """Per pod (requests ``cpu``, ``mem``, -1 = none): fits one of the empty ``nodes`` (a bool mask)."""
        cpu, mem = np.maximum(cpu, 0), np.maximum(mem, 0)
        ok = np.zeros(len(cpu), dtype=bool)
        if not nodes.any():
            return ok
        for c, m in set(zip(st.alloc_cpu[nodes].tolist(), st.alloc_mem[nodes].tolist())):
            ok |= (cpu <= c) & (mem <= m)
        return ok & (st.alloc_pods[nodes].max() > 0)


def fits_free(free_cpu: np.ndarray, free_mem: np.ndarray, free_pods: np.ndarray, pod: PodRequest,
              any_full: bool | int = True) -> np.ndarray:
    """NodeResourcesFit over explicit free capacity (a state's, or the copies a what-if plan decrements):
    three comparisons, fewer when a request is absent or no node is full (``any_full`` False)."""
    c, m = pod.filter_cpu, pod.filter_mem
    if not (c or m):
        return free_pods > 0
    ok = free_cpu >= c if c else free_mem >= m
    if c and m:
        ok &= free_mem >= m
    if any_full:  # the pod-slot comparison only matters once some node is full
        ok &= free_pods > 0
    return ok


@dataclass(frozen=True)
class GpuDemand:
    """Pods' GPU requests, vectorised (what :meth:`FilterChain.placeable` hands the filters): ``count`` GPUs of
    ``milli`` each (``count`` 0: none; ``milli`` < 1000 only with one GPU, a shared one), ``spec`` codes into
    ``specs`` (the allowed models; code 0 = any)."""

    count: np.ndarray
    milli: np.ndarray
    spec: np.ndarray
    specs: tuple[frozenset[str] | None, ...] = (None,)


class GpuFit:
    """GPUs as kube's NodeResourcesFit reads extended resources, per GPU: a whole-GPU pod needs ``gpu`` GPUs
    with nothing on them; a shared-GPU pod (one GPU, ``gpu_milli`` < 1000) needs one GPU with that much share
    free (a share never straddles two GPUs); either needs the node's model among the pod's allowed ones.
    A pod without GPUs passes every node (the chain never calls this for it, see :meth:`FilterChain.bind`)."""

    name = "GpuFit"
    plugin = "NodeResourcesFit"

    @staticmethod
    def mask(st: ClusterState, pod: PodRequest) -> np.ndarray:
        if not pod.gpu:
            return np.ones(len(st), dtype=bool)
        if pod.gpu_milli >= GPU_MILLI:
            ok = st.gpu_whole_free >= pod.gpu
        else:
            ok = st.gpu_max_free >= pod.gpu_milli
        if pod.gpu_models is not None:
            ok &= st.gpu_model_mask(pod.gpu_models)
        return ok

    @staticmethod
    def reason_masks(st: ClusterState, pod: PodRequest) -> list[tuple[str, np.ndarray]]:
        if not pod.gpu:
            return []
        model = None if pod.gpu_models is None else st.gpu_model_mask(pod.gpu_models)
        if pod.gpu_milli >= GPU_MILLI:
            short, reason = st.gpu_whole_free < pod.gpu, REASON_GPU
        else:
            short, reason = st.gpu_max_free < pod.gpu_milli, REASON_GPU_SHARE
        if model is None:
            return [(reason, short)]
        return [(REASON_GPU_MODEL, ~model), (reason, short & model)]

    @staticmethod
    def reasons(st: ClusterState, i: int, pod: PodRequest) -> list[str]:
        if not pod.gpu:
            return []
        if pod.gpu_models is not None and not st.gpu_model_mask(pod.gpu_models)[i]:
            return [REASON_GPU_MODEL]
        if pod.gpu_milli >= GPU_MILLI:
            return [REASON_GPU] if st.gpu_whole_free[i] < pod.gpu else []
        return [REASON_GPU_SHARE] if st.gpu_max_free[i] < pod.gpu_milli else []

    @staticmethod
    def fits_node(st: ClusterState, i: int, pod: PodRequest) -> bool:
        if not pod.gpu:
            return True
        if pod.gpu_models is not None and not st.gpu_model_mask(pod.gpu_models)[i]:
            return False
        if pod.gpu_milli >= GPU_MILLI:
            return bool(st.gpu_whole_free[i] >= pod.gpu)
        return bool(st.gpu_max_free[i] >= pod.gpu_milli)

    @staticmethod
    def fits_empty(st: ClusterState, nodes: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                   gpu: GpuDemand | None = None) -> np.ndarray:
        """Per pod: its GPUs fit one of the empty ``nodes`` (every GPU free), model included."""
        if gpu is None or not (gpu.count > 0).any():
            return np.ones(len(cpu), dtype=bool)
        ok = gpu.count <= 0
        for code in np.unique(gpu.spec[~ok]).tolist():
            models = gpu.specs[code]
            where = nodes if models is None else nodes & st.gpu_model_mask(models)
            most = int(st.alloc_gpu[where].max()) if where.any() else 0
            sel = (gpu.spec == code) & ~ok
            ok[sel] = gpu.count[sel] <= most
        return ok


class NodeExtras:
    """What a state keeps per node beyond cpu, memory, pods and GPUs, updated as pods are bound and unbound
    (:meth:`add`): each named resource's allocatable and requested sum (an int64 array over nodes per resource
    name; a resource a node does not list is 0 there, as in kube), and the host ports in use, per
    ``(protocol, port)`` as counts per node: by any IP (key ``*``), and by each IP (the any-address one too)."""

    def __init__(self, n: int, alloc: Sequence[Mapping[str, int]] | None = None) -> None:
        self.n = n
        self.alloc: dict[str, np.ndarray] = {}
        for i, a in enumerate(alloc or ()):
            for r, v in a.items():
                self._row(self.alloc, r)[i] = v
        self.used: dict[str, np.ndarray] = {}
        self.ports: dict[tuple[str, int], dict[str, np.ndarray]] = {}  # (protocol, port) -> ip or "" -> counts

    def _row(self, d: dict[str, np.ndarray], key: str) -> np.ndarray:
        a = d.get(key)
        if a is None:
            a = d[key] = np.zeros(self.n, dtype=np.int64)
        return a

    def add(self, i: int, pod: PodRequest, sign: int) -> None:
        """Account (``sign`` 1) or release (-1) ``pod``'s named requests and host ports on node ``i``."""
        for r, q in pod.named:
            self._row(self.used, r)[i] += sign * q
        for proto, ip, port in pod.host_ports:
            use = self.ports.setdefault((proto, port), {})
            by_any = self._row(use, _BY_ANY)
            by_any[i] += sign
            self._row(use, ip or ANY_HOST_IP)[i] += sign
            if sign < 0 and not by_any.any():  # the port's last user left: free its arrays (n int64 each)
                del self.ports[(proto, port)]

    def free(self, resource: str) -> np.ndarray:
        """Allocatable minus requested of ``resource``, per node."""
        a, u = self.alloc.get(resource), self.used.get(resource)
        if a is None:
            return np.zeros(self.n, dtype=np.int64) if u is None else -u
        return a if u is None else a - u

    def free_at(self, resource: str, i: int) -> int:
        a, u = self.alloc.get(resource), self.used.get(resource)
        return (0 if a is None else int(a[i])) - (0 if u is None else int(u[i]))

    def port_conflicts(self, pod: PodRequest) -> np.ndarray | None:
        """Nodes where one of ``pod``'s host ports is taken (kube's ``HostPortInfo.CheckConflict``: the same
        protocol and port, and IPs that overlap; the any-address IP overlaps every IP); None: no node."""
        out = None
        for use, keys in self._port_uses(pod):
            for key in keys:
                a = use.get(key)
                if a is not None:
                    out = a > 0 if out is None else out | (a > 0)
        return out

    def port_taken_at(self, pod: PodRequest, i: int) -> bool:
        """:meth:`port_conflicts` on node ``i`` alone."""
        return any(use[key][i] > 0 for use, keys in self._port_uses(pod) for key in keys if key in use)

    def _port_uses(self, pod: PodRequest) -> Iterable[tuple[dict[str, np.ndarray], tuple[str, ...]]]:
        """Per host port of ``pod`` that some node uses: its counts, and which of them conflict with it."""
        for proto, ip, port in pod.host_ports:
            use = self.ports.get((proto, port))
            if use is not None:
                ip = ip or ANY_HOST_IP
                yield use, ((_BY_ANY,) if ip == ANY_HOST_IP else (ANY_HOST_IP, ip))


class NodePorts:
    """kube's NodePorts: every host port of the pod free on the node, counting the pods bound (or assumed)
    there. A pod without host ports passes every node (the chain never calls this for it)."""

    name = plugin = "NodePorts"

    @staticmethod
    def mask(st: ClusterState, pod: PodRequest) -> np.ndarray:
        taken = st.extras.port_conflicts(pod) if pod.host_ports else None
        return np.ones(len(st), dtype=bool) if taken is None else ~taken

    @staticmethod
    def reason_masks(st: ClusterState, pod: PodRequest) -> list[tuple[str, np.ndarray]]:
        taken = st.extras.port_conflicts(pod) if pod.host_ports else None
        return [] if taken is None else [(REASON_PORTS, taken)]

    @classmethod
    def reasons(cls, st: ClusterState, i: int, pod: PodRequest) -> list[str]:
        return [] if cls.fits_node(st, i, pod) else [REASON_PORTS]

    @staticmethod
    def fits_node(st: ClusterState, i: int, pod: PodRequest) -> bool:
        return not (pod.host_ports and st.extras.port_taken_at(pod, i))

    @staticmethod
    def fits_empty(st: ClusterState, nodes: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                   gpu: GpuDemand | None = None) -> np.ndarray:
        return np.ones(len(cpu), dtype=bool)  # an empty node holds no port (vectorised demands carry none)


class NamedResourcesFit:
    """kube's NodeResourcesFit for every requested resource the other filters do not model (extended resources
    such as ``example.com/foo``, ``ephemeral-storage``, ``hugepages-2Mi``): the node's allocatable minus its
    pods' requests at least the pod's request; a node that does not list the resource has none of it. A pod
    without such requests passes every node (the chain never calls this for it)."""

    name = "NamedResourcesFit"
    plugin = "NodeResourcesFit"

    @staticmethod
    def mask(st: ClusterState, pod: PodRequest) -> np.ndarray:
        ok = np.ones(len(st), dtype=bool)
        for r, q in pod.named:
            ok &= st.extras.free(r) >= q
        return ok

    @staticmethod
    def reason_masks(st: ClusterState, pod: PodRequest) -> list[tuple[str, np.ndarray]]:
        return [(insufficient(r), st.extras.free(r) < q) for r, q in pod.named]

    @staticmethod
    def reasons(st: ClusterState, i: int, pod: PodRequest) -> list[str]:
        return [insufficient(r) for r, q in pod.named if st.extras.free_at(r, i) < q]

    @staticmethod
    def fits_node(st: ClusterState, i: int, pod: PodRequest) -> bool:
        return all(st.extras.free_at(r, i) >= q for r, q in pod.named)

    @staticmethod
    def beyond_allocatable(alloc: Mapping[str, int], pod: PodRequest) -> str:
        """The reason when ``pod`` asks more of a named resource than a node with allocatable ``alloc`` has at
        all, whatever runs there (kube's unresolvable NodeResourcesFit: no eviction makes room); "" otherwise."""
        return next((insufficient(r) for r, q in pod.named if q > alloc.get(r, 0)), "")

    @staticmethod
    def fits_empty(st: ClusterState, nodes: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
                   gpu: GpuDemand | None = None) -> np.ndarray:
        return np.ones(len(cpu), dtype=bool)  # vectorised demands (the twin's) carry no named resources


#: In kube's plugin order: NodePorts, then NodeResourcesFit (cpu, memory, pods; GPUs; the named resources).
RESOURCE_FILTERS: tuple[ResourceFilter, ...] = (NodePorts(), NodeResourcesFit(), GpuFit(), NamedResourcesFit())
#: The filters a pod pays for only when it asks for what they check (GPUs, host ports, named resources).
_ON_DEMAND = (GpuFit, NodePorts, NamedResourcesFit)


# ---- composition --------------------------------------------------------------------------------------------
class NodeTable:
    """A node set's traits as integer ids of their distinct values, and the node filters' verdicts cached per
    distinct pod constraints (a mask over nodes, or ``None`` when every node passes)."""

    MAX_CACHED = 4096  # distinct constraints remembered (a live cache sees new pods forever)

    def __init__(self, names: Sequence[str], traits: Sequence[NodeTraits] | None, *, wake_sleeping: bool = True,
                 filters: Sequence[tuple[str, NodeFilter]] = NODE_FILTERS) -> None:
        n = len(names)
        judged = [_PLAIN] * n if traits is None else [power_state_view(t, wake_sleeping) for t in traits]
        if len(judged) != n:
            raise ValueError(f"{len(judged)} node traits for {n} nodes")
        ids: dict[NodeTraits, int] = {}
        self.ids = np.array([ids.setdefault(t, len(ids)) for t in judged], dtype=np.int64)
        self.classes = list(ids)
        self.names = list(names)
        self.filters = tuple(filters)
        self.plain = self.classes == [_PLAIN] or not n
        #: Per trait class, its PreferNoSchedule taints: no filter reads them, kube's TaintToleration scores them
        #: (agent/baselines.py); () when no node has any.
        prefer = [tuple(t for t in c.taints if t.effect == "PreferNoSchedule") for c in self.classes]
        self.prefer_no_schedule: list[tuple[Taint, ...]] | tuple = prefer if any(prefer) else ()
        self._untolerated: dict[tuple[Toleration, ...], np.ndarray] = {}
        self._cache: dict[PodConstraints | None, np.ndarray | None] = {}
        self._reasons: dict[PodConstraints | None, tuple[Counter[str], np.ndarray | None]] = {}
        self.open = self.mask(None)  # the verdict for a pod that asks nothing

    def mask(self, pod: PodConstraints | None) -> np.ndarray | None:
        try:
            return self._cache[pod]
        except KeyError:
            pass
        if pod is not None and pod.uses_fields:  # matchFields read the node's name: judged node by node
            ok = np.array([not node_reason(self.classes[c], pod, nm, self.filters)
                           for c, nm in zip(self.ids.tolist(), self.names)], dtype=bool)
        else:
            per = np.array([not node_reason(t, pod, "", self.filters) for t in self.classes], dtype=bool)
            ok = per[self.ids]
        out = None if ok.all() else ok
        if len(self._cache) >= self.MAX_CACHED:
            self._cache.clear()
        self._cache[pod] = out
        return out

    def untolerated_prefer_no_schedule(self, tolerations: tuple[Toleration, ...]) -> np.ndarray | None:
        """Per node, its PreferNoSchedule taints that ``tolerations`` do not tolerate (kube's TaintToleration
        score before normalising); None where no node has any. Counted once per trait class and cached per
        distinct tolerations, as the filters' verdicts are: a decision only indexes it."""
        if not self.prefer_no_schedule:
            return None
        per_node = self._untolerated.get(tolerations)
        if per_node is None:
            per_class = np.array([sum(not any(tol.tolerates(t) for tol in tolerations) for t in taints)
                                  for taints in self.prefer_no_schedule], dtype=np.int64)
            per_node = per_class[self.ids]
            if len(self._untolerated) >= self.MAX_CACHED:
                self._untolerated.clear()
            self._untolerated[tolerations] = per_node
        return per_node

    def verdict(self, pod: PodConstraints | None) -> np.ndarray | None:
        """:meth:`mask`, with the pod that asks nothing answered without a lookup."""
        return self.open if pod is None else self.mask(pod)

    def reason(self, i: int, pod: PodConstraints | None) -> str:
        return node_reason(self.classes[int(self.ids[i])], pod, self.names[i], self.filters)

    def reason_counts(self, pod: PodConstraints | None) -> tuple[Counter[str], np.ndarray | None]:
        """Every node's :meth:`reason` counted, and the nodes that pass (None: all): from the cached verdict,
        asking only the failing nodes' distinct traits; cached per distinct constraints too (a pod that fits
        nowhere is asked again and again)."""
        try:
            return self._reasons[pod]
        except KeyError:
            pass
        ok = self.verdict(pod)
        counts: Counter[str] = Counter()
        if ok is not None:
            bad = np.flatnonzero(~ok)
            if pod is not None and pod.uses_fields:  # matchFields read each node's name
                counts.update(self.reason(i, pod) for i in bad.tolist())
            else:
                ids, hits = np.unique(self.ids[bad], return_counts=True)
                for c, k in zip(ids.tolist(), hits.tolist()):
                    counts[node_reason(self.classes[c], pod, "", self.filters)] += k
        if len(self._reasons) >= self.MAX_CACHED:
            self._reasons.clear()
        self._reasons[pod] = counts, ok
        return counts, ok


@dataclass(frozen=True)
class FilterChain:
    """The filters of one profile, composed once. ``wake_sleeping``: sleeping nodes are judged as they will be
    once awake (PowerState). ``resources`` and ``node_filters`` default to every filter joulesched has."""

    wake_sleeping: bool = True
    resources: tuple[ResourceFilter, ...] = RESOURCE_FILTERS
    node_filters: tuple[tuple[str, NodeFilter], ...] = NODE_FILTERS

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.node_filters] + ["PowerState"] + [r.name for r in self.resources]

    def table(self, names: Sequence[str], traits: Sequence[NodeTraits] | None) -> NodeTable:
        return NodeTable(names, traits, wake_sleeping=self.wake_sleeping, filters=self.node_filters)

    def bind(self, st: ClusterState, table: NodeTable) -> Callable[[PodRequest], np.ndarray]:
        """``feasible(pod) -> mask`` over ``st``'s nodes: the resource filters on its free capacity, then the
        node filters' cached verdict for the pod's constraints (skipped when every node passes)."""
        res = self.resources
        gpu_fit, ports, named = (next((r for r in res if isinstance(r, kind)), None) for kind in _ON_DEMAND)

        if any(isinstance(r, NodeResourcesFit) for r in res) and all(isinstance(r, (NodeResourcesFit, *_ON_DEMAND))
                                                                     for r in res):
            # The common chain, flattened: today's three comparisons, the GPU filter only for a pod with GPUs,
            # host ports and named resources only for a pod that asks them, then one lookup when anything can
            # fail.
            def feasible(pod: PodRequest) -> np.ndarray:
                ok = fits_free(st.free_cpu, st.free_mem, st.free_pods, pod, st.full_nodes)
                if pod.gpu and gpu_fit is not None:
                    ok &= gpu_fit.mask(st, pod)
                if pod.extra:
                    if pod.host_ports and ports is not None:
                        ok &= ports.mask(st, pod)
                    if pod.named and named is not None:
                        ok &= named.mask(st, pod)
                k = pod.constraints
                s = table.open if k is None else table.mask(k)
                if s is not None:
                    ok &= s
                return ok
            return feasible

        def feasible_all(pod: PodRequest) -> np.ndarray:
            ok = np.logical_and.reduce([r.mask(st, pod) for r in self.resources])
            s = table.verdict(pod.constraints)
            return ok if s is None else ok & s
        return feasible_all

    def _plugins(self) -> list[list[ResourceFilter]]:
        """The resource filters grouped by kube plugin (``plugin``, default ``name``), in chain order."""
        groups: dict[str, list[ResourceFilter]] = {}
        for f in self.resources:
            groups.setdefault(getattr(f, "plugin", f.name), []).append(f)
        return list(groups.values())

    def reasons(self, st: ClusterState, table: NodeTable, i: int, pod: PodRequest) -> list[str]:
        """Why node ``i`` fails ``pod``, kube's words: the first node filter that fails, else the reasons of the
        first resource plugin that fails (NodePorts, then every resource NodeResourcesFit finds short); empty
        when it fits."""
        r = table.reason(i, pod.constraints)
        if r:
            return [r]
        for group in self._plugins():
            out = [x for f in group for x in f.reasons(st, i, pod)]
            if out:
                return out
        return []

    def reason_counts(self, st: ClusterState, table: NodeTable, pod: PodRequest) -> Counter[str]:
        """:meth:`reasons` of every node, counted (what kube's "0/N nodes are available" message lists), in
        one pass: the node filters from the table (:meth:`NodeTable.reason_counts`), the resource filters as
        masks over the nodes that pass them."""
        gated, ok = table.reason_counts(pod.constraints)
        counts = Counter(gated)
        left = np.ones(len(st), dtype=bool) if ok is None else ok.copy()
        for group in self._plugins():
            if not left.any():
                break
            failed = np.zeros(len(st), dtype=bool)
            for f in group:
                masks = getattr(f, "reason_masks", None)
                if masks is None:  # a filter without masks: asked node by node
                    for i in np.flatnonzero(left).tolist():
                        rs = f.reasons(st, i, pod)
                        counts.update(rs)
                        failed[i] |= bool(rs)
                    continue
                for r, m in masks(st, pod):
                    m = m & left
                    c = int(np.count_nonzero(m))
                    if c:
                        counts[r] += c
                        failed |= m
            left &= ~failed
        return counts

    def placeable(self, st: ClusterState, table: NodeTable, cpu: np.ndarray, mem: np.ndarray,
                  constraints: np.ndarray, table_of: Sequence[PodConstraints | None],
                  gpu: GpuDemand | None = None) -> np.ndarray:
        """Per pod: fits at least one node of ``st`` when that node is empty. ``constraints`` are codes into
        ``table_of`` (the pods' distinct constraints, code 0 = none); ``gpu`` the pods' GPU requests."""
        ok = np.zeros(len(cpu), dtype=bool)
        everyone = np.ones(len(st), dtype=bool)
        # Each filter answers "fits one of these nodes": asked over all nodes at once, a pod could pass the cpu
        # filter on one node and the GPU filter on another. So ask per shape (nodes alike in everything the
        # filters read) and take the shapes a pod passes every filter on.
        shape = np.unique(np.stack([st.alloc_cpu, st.alloc_mem, st.alloc_pods > 0, st.alloc_gpu,
                                    np.unique(st.gpu_model, return_inverse=True)[1].reshape(-1)]),
                          axis=1, return_inverse=True)[1].reshape(-1)
        for code in np.unique(constraints).tolist():
            sel = constraints == code
            s = table.mask(table_of[code])
            nodes = everyone if s is None else s
            g = None if gpu is None else GpuDemand(gpu.count[sel], gpu.milli[sel], gpu.spec[sel], gpu.specs)
            fit = np.zeros(int(sel.sum()), dtype=bool)
            for k in np.unique(shape[nodes]).tolist():
                alike = nodes & (shape == k)
                here = np.ones(len(fit), dtype=bool)
                for r in self.resources:
                    here &= r.fits_empty(st, alike, cpu[sel], mem[sel], g)
                fit |= here
            ok[sel] = fit
        return ok

    def retry(self, st: ClusterState, table: NodeTable, i: int, pending: list[int],
              reqs: Sequence[PodRequest]) -> tuple[list[int], list[int]]:
        """Split ``pending`` (indices into ``reqs``) into those that still fit nowhere new and those that now
        pass every filter on node ``i`` (order kept): what a departure from ``i`` may unblock."""
        if st.free_pods[i] <= 0:
            return pending, []
        keep, retry = [], []
        res = self.resources
        plain = tuple(f for f in res if not isinstance(f, _ON_DEMAND))  # what a pod that asks none of them meets
        for p in pending:
            r = reqs[p]
            ok = all(f.fits_node(st, i, r) for f in (res if r.gpu or r.extra else plain)) and \
                self.admits(table, i, r)
            (retry if ok else keep).append(p)
        return keep, retry

    def admits(self, table: NodeTable, i: int, pod: PodRequest) -> bool:
        """Node ``i`` passes the node filters for ``pod`` (resources aside): a table lookup."""
        s = table.verdict(pod.constraints)
        return s is None or bool(s[i])


#: The default profile: every filter, sleeping nodes judged awake (the twin; the live scheduler with node power).
DEFAULT_CHAIN = FilterChain()
