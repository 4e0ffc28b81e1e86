"""Kubernetes objects (as the JSON dicts the API returns) turned into what the scheduler needs.

Pod requests are kube's ``PodRequests`` (``k8s.io/component-helpers/resource``), resource by resource: the sum
of the containers' and sidecars' (init containers with ``restartPolicy: Always``, KEP-753) requests, raised to
the largest ``init container + the sidecars declared before it``; a pod-level request
(``spec.resources.requests``, KEP-2837: cpu, memory, ``hugepages-*``) replaces that sum; then
``spec.overhead`` is added. A resource nothing requests is ``None`` (kube-scheduler's non-zero default applies
when scoring); an explicit 0 stays 0. Scoring's non-zero requests are worked out per container, as kube's
``NonMissingContainerRequests`` does: 100m / 200 MiB for each container (init containers included) without a
request, before the sum and the maximum. Every other requested resource (extended resources, ``ephemeral-storage``, ``hugepages-*``; a
container's limit stands for its missing request, as the apiserver defaults it) goes to ``named``, and the
host ports of the containers and sidecars to ``host_ports``: the filter chain checks both.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from kubernetes.utils import parse_quantity

from joulesched.cluster import nodepower as pw  # the node power controller's annotations and labels
from joulesched.cluster.filters import (
    ANY_HOST_IP,
    GPU_MODEL_ANNOTATION,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_SHARE_ANNOTATION,
    MODELLED_RESOURCES,
    NODE_FILTERS,
    NamedResourcesFit,
    NodeFilter,
    NodeSelectorTerm,
    NodeTraits,
    PodConstraints,
    Requirement,
    Taint,
    Toleration,
    node_reason,
    pod_constraints,
)
from joulesched.cluster.state import DEFAULT_CPU_REQUEST_M, DEFAULT_MEMORY_REQUEST_MIB, PodRequest
from joulesched.cluster.workload import QOS_CLASSES, SERVICE_OWNERS, PodMeta
from joulesched.core.errors import UsageError
from joulesched.power.curves import SPECPOWER, validate_curve

#: Annotation with the node's 11-point power curve, JSON: ``"[41.6, 46.7, ..., 113]"`` (watts at 0..100 %).
POWER_WATTS_ANNOTATION = "joulesched.io/power-watts"
#: Label or annotation naming a profile: a SPECpower table (``ibm-x3250-x3470``) or one from the profiles file.
POWER_PROFILE_KEY = "joulesched.io/power-profile"

TERMINAL_PHASES = ("Succeeded", "Failed")
#: The node power controller's taint and state annotation (joulesched.cluster.nodepower has the full set).
ASLEEP_TAINT = "joulesched.io/asleep"
POWER_STATE_ANNOTATION = "joulesched.io/power-state"
WAKE_FAILED_ANNOTATION = "joulesched.io/wake-failed"  # set while a wake of this node has failed: do not wait for it


class ObjectError(UsageError):
    """A node or pod that cannot be used as given (bad quantity, bad power curve)."""


class GpuShareError(ObjectError):
    """A malformed GPU-share annotation (``alibabacloud.com/gpu-milli``): no apiserver validates annotations, so
    the watch drops only the share, not the pod's whole request."""


_pod_log = logging.getLogger("joulesched.kube.pods")


@functools.lru_cache(maxsize=4096)
def _warn_gpu_share(key: str, uid: str, message: str) -> None:
    """Once per pod and message (bounded memo): the watch parses a pod again on each of its events."""
    _pod_log.warning("pod %s: %s; its GPU share is ignored", key, message)


def cpu_millis(q: str | int | float | None) -> int:
    """``"500m"`` -> 500, ``"2"`` -> 2000, rounded up as the apiserver does for millicores."""
    if isinstance(q, str) and len(q) <= _CACHED_LEN:  # quantities repeat across pods: parse each string once
        return _cached_quantity(q, "cpu", True)
    return _cpu_millis(q)


#: kube's bound on a quantity's magnitude (``resource.Quantity``: "no quantity may represent a number greater
#: than 2^63-1 in magnitude ... numbers larger will be capped").
MAX_QUANTITY = Decimal(2**63 - 1)


def parse_finite_quantity(q: str | int | float | None, what: str = "") -> Decimal:
    """``parse_quantity``, refusing what no apiserver stores (``inf``, ``NaN``, a JSON ``1e400`` read as a float
    infinity: :class:`ObjectError` naming ``what``, a resource name) and capping the magnitude at
    :data:`MAX_QUANTITY` as kube does: ``"1e999999999"`` would otherwise become a billion-digit integer."""
    name = f"{what} quantity" if what else "quantity"
    try:
        v = parse_quantity(q)
    except (ValueError, TypeError, ArithmeticError) as e:
        raise ObjectError(f"bad {name} {str(q)[:40]!r}: {str(e)[:80]}") from None
    if not v.is_finite():
        raise ObjectError(f"bad {name} {str(q)[:40]!r}: not a finite number")
    return max(-MAX_QUANTITY, min(v, MAX_QUANTITY))


def _cpu_millis(q: str | int | float | None) -> int:
    return int(math.ceil(parse_finite_quantity(q, "cpu") * 1000))


def memory_mib(q: str | int | float | None, *, round_up: bool = True) -> int:
    """``"512Mi"`` -> 512, ``"1Gi"`` -> 1024, ``"1G"`` -> 954 (bytes / 2^20, rounded up for requests and down
    for allocatable so that a fit in MiB implies a fit in bytes)."""
    if isinstance(q, str) and len(q) <= _CACHED_LEN:
        return _cached_quantity(q, "memory", round_up)
    return _memory_mib(q, round_up)


def _memory_mib(q: str | int | float | None, round_up: bool = True) -> int:
    mib = parse_finite_quantity(q, "memory") / Decimal(1 << 20)
    return int(math.ceil(mib)) if round_up else int(math.floor(mib))


def quantity_value(q: str | int | float | None) -> int:
    """A quantity as kube's ``Quantity.Value()``: the integer, rounded up (``"1Gi"`` -> 1073741824)."""
    if isinstance(q, str) and len(q) <= _CACHED_LEN:
        return _cached_quantity(q, "value", True)
    return _value(q)


def _value(q: str | int | float | None) -> int:
    return int(math.ceil(parse_finite_quantity(q)))


#: Longer strings are parsed each time, never kept: the cache holds at most 4,096 short keys, whatever an
#: extender caller sends (a real quantity is a few characters; a 4 MB one per entry would hold gigabytes).
_CACHED_LEN = 64


@functools.lru_cache(maxsize=4096)
def _cached_quantity(q: str, res: str, round_up: bool) -> int:
    if res == "value":
        return _value(q)
    return _cpu_millis(q) if res == "cpu" else _memory_mib(q, round_up)  # errors propagate, uncached


def _requests(container: dict) -> dict:
    return ((container.get("resources") or {}).get("requests") or {})


def _is_sidecar(container: dict) -> bool:
    """An init container that keeps running beside the containers (KEP-753: ``restartPolicy: Always``)."""
    return container.get("restartPolicy") == "Always"


def _pod_level(resource: str) -> bool:
    """A resource kube takes from pod-level requests (component-helpers' ``IsSupportedPodLevelResource``)."""
    return resource in ("cpu", "memory") or resource.startswith("hugepages-")


def _aggregate(spec: dict, res: str, conv: Callable[[str | int | float], int], from_limit: bool,
               default: int | None = None) -> int | None:
    """kube's ``AggregateContainerRequests`` for one resource: containers and sidecars summed, raised to the
    largest regular init container plus the sidecars declared before it. ``from_limit``: a container's limit
    stands for its missing request (the apiserver's defaulting). ``default``: what a container without a request
    counts (``NonMissingContainerRequests``). None when no container requests it (and there is no default)."""
    def value(c: dict) -> int | None:
        q = _requests(c).get(res)
        q = _limits(c).get(res) if q is None and from_limit else q
        return default if q is None else conv(q)

    seen, total = False, 0
    for c in spec.get("containers") or []:
        v = value(c)
        if v is not None:
            seen, total = True, total + v
    sidecars = init = 0
    for c in spec.get("initContainers") or []:
        v = value(c)
        seen = seen or v is not None
        v = v or 0
        if _is_sidecar(c):
            sidecars += v
            total += v
        else:
            init = max(init, v + sidecars)
    return max(total, init) if seen else None


def _resource_request(spec: dict, res: str, conv: Callable[[str | int | float], int],
                      from_limit: bool = False, default: int | None = None) -> int | None:
    """One resource of kube's ``PodRequests``: the pod-level request if set, else the containers' (``default``
    for each container without one); plus overhead."""
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    v = conv(pod_level[res]) if res in pod_level and _pod_level(res) \
        else _aggregate(spec, res, conv, from_limit, default)
    over = (spec.get("overhead") or {}).get(res)
    return v if over is None else (v or 0) + conv(over)


def _named_requests(spec: dict) -> tuple[tuple[str, int], ...]:
    """Every requested resource the chain does not model on its own, with its non-zero request (sorted)."""
    names: set[str] = set()
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        names.update(_requests(c), _limits(c))
    names.update(r for r in (spec.get("resources") or {}).get("requests") or {} if _pod_level(r))
    names.update(spec.get("overhead") or {})
    out = []
    for r in sorted(names - MODELLED_RESOURCES):
        v = _resource_request(spec, r, quantity_value, from_limit=True)
        if v:
            out.append((r, v))
    return tuple(out)


def pod_host_ports(spec: dict) -> tuple[tuple[str, str, int], ...]:
    """``(protocol, host IP, port)`` of the host ports of the pod's containers and sidecars (kube's
    ``GetHostPorts``), with kube's defaults: TCP, and the any-address IP for an empty ``hostIP``. Sorted. A
    ``hostPort`` that is not an integer 0..65535 (0: none), as the apiserver validates it, is an :class:`ObjectError`
    (a JSON ``1e400`` arrives as a float infinity)."""
    out: set[tuple[str, str, int]] = set()
    for c in [*(c for c in spec.get("initContainers") or [] if _is_sidecar(c)), *(spec.get("containers") or [])]:
        for p in c.get("ports") or []:
            port = p.get("hostPort") if isinstance(p, dict) else None
            if port is None:
                continue
            if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
                raise ObjectError(f"container {str(c.get('name'))[:63]!r}: hostPort {str(port)[:40]} is not a "
                                  "port number (1..65535, or 0 for none)")
            if port > 0:
                out.add((str(p.get("protocol") or "TCP"), str(p.get("hostIP") or ANY_HOST_IP), port))
    return tuple(sorted(out))


def pod_request(pod: dict, *, strict: bool = True) -> PodRequest:
    """The pod's effective requests as a :class:`PodRequest` (see module docstring). Without ``strict`` (the
    watch), a malformed GPU-share annotation is logged (once per pod) and only the share is dropped."""
    spec = pod.get("spec") or {}
    if strict:
        _check_quantities(spec)
    cpu, mem = _resource_request(spec, "cpu", cpu_millis), _resource_request(spec, "memory", memory_mib)
    # Scoring's non-zero requests, per container (kube's calculatePodResourceRequest and the node's NonZeroRequested)
    extra = dict(named=_named_requests(spec), host_ports=pod_host_ports(spec),
                 nz_cpu_m=_resource_request(spec, "cpu", cpu_millis, default=DEFAULT_CPU_REQUEST_M),
                 nz_memory_mib=_resource_request(spec, "memory", memory_mib, default=DEFAULT_MEMORY_REQUEST_MIB))
    try:
        gpu, milli, models = pod_gpus(pod)
    except GpuShareError as e:
        if strict:
            raise
        meta = pod.get("metadata") or {}
        _warn_gpu_share(f"{meta.get('namespace', '')}/{meta.get('name', '')}", str(meta.get("uid", "")), str(e))
        gpu, milli, models = pod_gpus(pod, share=False)
    if gpu:
        return PodRequest(cpu_m=cpu, memory_mib=mem, gpu=gpu, gpu_milli=milli, gpu_models=models, **extra)
    return PodRequest(cpu_m=cpu, memory_mib=mem, **extra)


def _check_quantities(spec: dict) -> None:
    """Every request, limit and overhead of ``spec`` is a quantity the apiserver would store: a string or number
    (not a boolean) that is not negative (its ``ValidateNonnegativeQuantity``). Only a direct caller (the
    extender's) can send another; its Pod is refused, not read as asking for less."""
    blocks = [spec.get("overhead"), (spec.get("resources") or {}).get("requests"),
              (spec.get("resources") or {}).get("limits")]
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        blocks += [_requests(c), _limits(c)]
    for block in blocks:
        for name, q in (block or {}).items():
            if isinstance(q, bool) or not isinstance(q, (str, int, float)):
                raise ObjectError(f"bad {name} quantity {str(q)[:40]!r}: not a string or number")
            if parse_finite_quantity(q, str(name)) < 0:
                raise ObjectError(f"bad {name} quantity {str(q)[:40]!r}: negative")


def _gpus(q: str | int | float) -> int:
    return int(parse_finite_quantity(q, GPU_RESOURCE))


def pod_gpus(pod: dict, *, share: bool = True) -> tuple[int, int, frozenset[str] | None]:
    """The pod's GPUs (docs/twin.md, "GPUs on a cluster"): whole GPUs, ``nvidia.com/gpu`` as kube's PodRequests
    counts it (containers and sidecars summed, raised to the largest init container plus the sidecars before
    it; an extended resource's request is its limit when only the limit is set); a share of one GPU from the
    annotation ``alibabacloud.com/gpu-milli`` (1..1000, the gpushare convention of the OpenB trace: a pod that
    gives it without nvidia.com/gpu asks for one shared GPU; ignored without ``share``); the allowed models from
    ``alibabacloud.com/gpu-card-model`` (``A|B``, matched against nodes' ``nvidia.com/gpu.product``).
    A malformed share annotation raises :class:`GpuShareError`, a bad quantity :class:`ObjectError`."""
    spec, ann = pod.get("spec") or {}, (pod.get("metadata") or {}).get("annotations") or {}
    count = _resource_request(spec, GPU_RESOURCE, _gpus, from_limit=True) or 0
    milli_s = ann.get(GPU_SHARE_ANNOTATION) if share else None
    milli = 1000
    if milli_s is not None:
        try:
            milli = int(str(milli_s))
        except ValueError:
            raise GpuShareError(f"annotation {GPU_SHARE_ANNOTATION} {milli_s!r} is not an integer") from None
        if not 1 <= milli <= 1000:
            raise GpuShareError(f"annotation {GPU_SHARE_ANNOTATION} {milli} is outside 1..1000")
        count = max(count, 1)
        if count > 1 and milli < 1000:
            raise GpuShareError(f"annotation {GPU_SHARE_ANNOTATION} {milli} is a share of one GPU, not {count}")
    models = frozenset(m.strip() for m in str(ann.get(GPU_MODEL_ANNOTATION, "")).split("|") if m.strip()) or None
    return count, milli, (models if count else None)


@dataclass(frozen=True)
class NodeInfo:
    """A node as the scheduler sees it. Allocatable in millicores, MiB and pod slots; ``curve`` in watts."""

    name: str
    cpu_m: int
    memory_mib: int
    max_pods: int
    curve: tuple[float, ...]
    curve_source: str
    labels: dict = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True  # the Ready condition is True (or the node reports none)
    asleep: bool = False  # the node power controller put it to sleep (its taint ``joulesched.io/asleep``)
    waking: bool = False  # ... and is waking it (annotation ``joulesched.io/power-state: waking``)
    # What the node power controller reads (parsed here once, for the scheduler and the controller alike).
    power_state: str = "awake"  # joulesched.io/power-state (an unknown value reads as awake)
    power_since: str = ""  # joulesched.io/power-state-since (RFC 3339)
    power_owner: str = ""  # joulesched.io/power-owner: the replica that set an intermediate state
    power_address: str = ""  # joulesched.io/power, as the node claims it (the operator's policy decides)
    never_sleep: bool = False  # joulesched.io/never-sleep, any value but "false"
    control_plane: bool = False  # a control-plane role label
    provider_id: str = ""  # spec.providerID (immutable once set)
    wake_failed: bool = False  # joulesched.io/wake-failed
    cordoned_by_us: bool = False  # joulesched.io/cordoned: the cordon is the controller's own
    off_requested: bool = False  # joulesched.io/power-off-requested: a power-off may be under way
    gpu_count: int = 0  # allocatable nvidia.com/gpu
    gpu_model: str = ""  # label nvidia.com/gpu.product (GPU feature discovery)
    #: allocatable of every other resource (extended, ephemeral-storage, hugepages-*), as Quantity.Value(), sorted
    named: tuple[tuple[str, int], ...] = ()
    # Changes on every kubelet heartbeat: not compared, so a heartbeat alone does not rebuild the cache's state.
    heartbeat: str = field(default="", compare=False)  # the Ready condition's heartbeat and transition times
    rv: int = field(default=0, compare=False)

    @functools.cached_property
    def named_alloc(self) -> dict[str, int]:
        """:attr:`named` as a mapping."""
        return dict(self.named)

    @functools.cached_property
    def traits(self) -> NodeTraits:
        """What the filter chain reads of this node (:mod:`joulesched.cluster.filters`)."""
        return NodeTraits.of(self.labels, self.taints, unschedulable=self.unschedulable, ready=self.ready,
                             asleep=self.asleep, foreign_cordon=not self.cordoned_by_us)

    def awake_view(self) -> "NodeInfo":
        """The node as it will be once awake: without the controller's taint and cordon (a cordon not ours
        stays: the wake does not lift it), Ready."""
        return replace(self, unschedulable=self.unschedulable and not self.cordoned_by_us, ready=True,
                       asleep=False, waking=False, taints=tuple(t for t in self.taints if t.key != ASLEEP_TAINT))


@dataclass(frozen=True)
class PodInfo:
    """A pod in the cache: identity, where it runs (``node_name``, "" when pending), its requests."""

    uid: str
    namespace: str
    name: str
    node_name: str
    scheduler_name: str
    request: PodRequest
    phase: str
    deleting: bool
    node_selector: dict = field(default_factory=dict)
    tolerations: tuple = ()
    rv: int = 0  # metadata.resourceVersion as an integer (0 when it is not one)
    meta: PodMeta = field(default_factory=PodMeta)  # the pod model's metadata, as the twin has it (pod_meta)
    labels: dict = field(default_factory=dict)
    owner_name: str = ""  # the workload's name (a ReplicaSet's Deployment, see pod_meta)
    nominated_node: str = ""  # status.nominatedNodeName
    gated: bool = False  # spec.schedulingGates is not empty: no scheduler may take it (kube's SchedulingGated)
    daemon: bool = False  # a DaemonSet or mirror (static) pod, as the pod says: keeps no node awake, never evicted
    # (name, uid) of the DaemonSet its controller reference names: the node power controller checks that it
    # exists and selects the pod before taking the pod's word (anyone who creates pods can write the reference)
    daemonset: tuple[str, str] = ()
    mirror: bool = False  # a static pod's mirror (the kubelet's own manifests: on a control plane, etcd and the API)
    safe_to_evict: str = ""  # the cluster-autoscaler / joulesched safe-to-evict annotation, lower-cased
    local_storage: bool = False  # an emptyDir or hostPath volume
    claims: tuple[str, ...] = ()  # names of its PersistentVolumeClaims (their PVs may pin it to nodes)
    # Condition DisruptionTarget=True: evicted, preempted or its node going away (kube 1.26+), not a life run out
    disrupted: bool = False
    #: a required inter-pod (anti-)affinity or a DoNotSchedule topology spread: where it may run depends on the
    #: other pods, which the node power controller's plan does not model
    inter_pod: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Counts against its node's capacity (not terminated)."""
        return self.phase not in TERMINAL_PHASES


def parse_pod(pod: dict, *, strict: bool = False) -> PodInfo:
    """A Pod as the scheduler sees it. A malformed request (a bad quantity or host port) cannot come from a real
    apiserver: the watch counts it as none; with ``strict`` (a request's Pod, the extender's) it raises
    :class:`ObjectError`. A malformed GPU-share annotation, which the apiserver does not validate, costs the
    watch only the share (:func:`pod_request`)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    try:
        req = pod_request(pod, strict=strict)
    except ObjectError:
        if strict:
            raise
        req = PodRequest(None, None)
    where = parse_constraints(spec)
    if where is not None:
        req = replace(req, constraints=where)
    try:
        rv = int(meta.get("resourceVersion") or 0)
    except ValueError:
        rv = 0  # opaque versions: ordering checks are skipped
    return PodInfo(rv=rv, uid=meta.get("uid", ""), namespace=meta.get("namespace", ""), name=meta.get("name", ""),
                   node_name=spec.get("nodeName") or "", scheduler_name=spec.get("schedulerName") or "",
                   request=req, phase=status.get("phase") or "Pending", gated=bool(spec.get("schedulingGates")),
                   deleting=bool(meta.get("deletionTimestamp")),
                   node_selector=dict(spec.get("nodeSelector") or {}),
                   tolerations=tuple(tuple(sorted((k, str(v)) for k, v in t.items())) for t in
                                     spec.get("tolerations") or []),
                   meta=pod_meta(pod), labels=dict(meta.get("labels") or {}), owner_name=pod_owner(pod)[1],
                   disrupted=any(isinstance(c, dict) and c.get("type") == "DisruptionTarget"
                                 and c.get("status") == "True" for c in status.get("conditions") or []),
                   **_pod_power_fields(meta, spec, status))


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def selector_matches(selector: object, labels: dict, *, empty_matches: bool) -> bool:
    """A LabelSelector (``matchLabels`` and ``matchExpressions``, ANDed) against ``labels``. Only a label
    selector's operators (In, NotIn, Exists, DoesNotExist); another one matches nothing. An empty selector
    matches everything where ``empty_matches`` (a PodDisruptionBudget's), nothing otherwise (a DaemonSet's, which
    apps/v1 requires non-empty); a missing or malformed one matches nothing."""
    if not isinstance(selector, dict):
        return False
    ml = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not isinstance(ml, dict) or not isinstance(exprs, list):
        return False
    if not ml and not exprs:
        return empty_matches
    if any(labels.get(str(k)) != str(v) for k, v in ml.items()):
        return False
    for e in exprs:
        op = e.get("operator") if isinstance(e, dict) else None
        if op not in _SELECTOR_OPERATORS:
            return False
        k, vals = str(e.get("key") or ""), [str(v) for v in e.get("values") or []]
        if not Requirement(k, op, tuple(vals)).matches(labels):
            return False
    return True


def _pod_power_fields(meta: dict, spec: dict, status: dict) -> dict:
    """What the node power controller needs of a pod (whether it keeps its node awake, may be evicted)."""
    ann = meta.get("annotations") or {}
    volumes = spec.get("volumes") or []
    refs = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
    ds = next((o for o in refs if o.get("kind") == "DaemonSet" and o.get("controller")), None)
    aff = spec.get("affinity") if isinstance(spec.get("affinity"), dict) else {}
    spread = spec.get("topologySpreadConstraints")
    inter_pod = any(isinstance(aff.get(k), dict) and aff[k].get("requiredDuringSchedulingIgnoredDuringExecution")
                    for k in ("podAffinity", "podAntiAffinity")) or any(
        isinstance(c, dict) and c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
        for c in (spread if isinstance(spread, list) else []))
    return dict(nominated_node=status.get("nominatedNodeName") or "", inter_pod=inter_pod,
                daemon=any(o.get("kind") == "DaemonSet" for o in refs) or MIRROR_ANNOTATION in ann,
                daemonset=(str(ds.get("name") or ""), str(ds.get("uid") or "")) if ds else (),
                mirror=MIRROR_ANNOTATION in ann,
                safe_to_evict=next((str(ann[k]).lower() for k in pw.SAFE_TO_EVICT_ANNOTATIONS if k in ann), ""),
                local_storage=any("emptyDir" in v or "hostPath" in v for v in volumes),
                claims=tuple(str((v.get("persistentVolumeClaim") or {}).get("claimName") or "") for v in volumes
                             if v.get("persistentVolumeClaim")))


# ---- the pod model's metadata (the same PodMeta the twin's workloads give a policy) -------------------------
#: kube's built-in PriorityClasses (pkg/apis/scheduling), for a pod whose spec.priority the admission plugin
#: has not filled in (an object that did not come through a real apiserver).
SYSTEM_PRIORITIES = {"system-node-critical": 2_000_001_000, "system-cluster-critical": 2_000_000_000}
#: Koordinator's QoS label (LSE, LSR, LS, BE, SYSTEM): Alibaba's classes, which its traces carry as ``qos``.
SLO_CLASS_LABEL = "koordinator.sh/qosClass"
APP_LABELS = ("app.kubernetes.io/name", "app", "k8s-app")


def pod_owner(pod: dict) -> tuple[str, str]:
    """``(kind, name)`` of the pod's workload: its controller ownerReference, with a ReplicaSet resolved to its
    Deployment by the Deployment controller's naming convention (the ReplicaSet is ``<deployment>-<hash>`` and
    the pod carries the label ``pod-template-hash: <hash>``), so no ReplicaSet has to be fetched. A ReplicaSet
    without that label (not made by a Deployment) stays a ReplicaSet. ``("", "")`` for a bare pod."""
    meta = pod.get("metadata") or {}
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict)]
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is None:
        return "", ""
    kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
    h = (meta.get("labels") or {}).get("pod-template-hash")
    if kind == "ReplicaSet" and h and name.endswith(f"-{h}") and len(name) > len(h) + 1:
        return "Deployment", name[: -len(h) - 1]
    return kind, name


def _limits(container: dict) -> dict:
    return ((container.get("resources") or {}).get("limits") or {})


def pod_limits(pod: dict) -> tuple[int | None, int | None]:
    """Pod-level CPU (millicores) and memory (MiB) limits: a resource is limited only when every container
    limits it (one unlimited container leaves the pod unbounded); the sum is raised to the largest init
    container's limit, plus ``spec.overhead``. ``None``: no limit."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    out: list[int | None] = []
    for res, conv in (("cpu", cpu_millis), ("memory", memory_mib)):
        try:
            if not containers or any(res not in _limits(c) for c in containers):
                out.append(None)
                continue
            total = sum(conv(_limits(c)[res]) for c in containers)
            init = [conv(_limits(c)[res]) for c in spec.get("initContainers") or [] if res in _limits(c)]
            total = max(total, max(init, default=0))
            over = (spec.get("overhead") or {}).get(res)
            out.append(total + (conv(over) if over is not None else 0))
        except ObjectError:
            out.append(None)  # a malformed quantity cannot come from a real apiserver
    return out[0], out[1]


def qos_class(pod: dict) -> str:
    """The pod's QoS class: ``status.qosClass`` when set, else computed as kube's ``ComputePodQOS``
    (pkg/apis/core/helper/qos) does, container by container (init containers included): only quantities > 0
    count, and a container's missing request defaults to its limit as the apiserver does. *Guaranteed*: every
    container limits CPU and memory and every request equals its limit; *BestEffort*: nothing requested or
    limited; otherwise *Burstable*."""
    given = (pod.get("status") or {}).get("qosClass")
    if given in QOS_CLASSES:
        return given
    spec = pod.get("spec") or {}
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        lim_c = _limits(c)
        req_c = {**lim_c, **_requests(c)}  # apiserver defaulting: a missing request is the limit
        found = set()
        for res, conv in (("cpu", cpu_millis), ("memory", memory_mib)):
            try:
                if res in req_c and (v := conv(req_c[res])) > 0:
                    requests[res] = requests.get(res, 0) + v
                if res in lim_c and (v := conv(lim_c[res])) > 0:
                    found.add(res)
                    limits[res] = limits.get(res, 0) + v
            except ObjectError:
                continue
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(limits.get(r) == v for r, v in requests.items()) and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def pod_priority(pod: dict) -> int:
    """``spec.priority`` (the Priority admission plugin resolves ``priorityClassName`` into it); without it,
    kube's built-in system classes by name, else 0 (the default when no class is named)."""
    spec = pod.get("spec") or {}
    p = spec.get("priority")
    if isinstance(p, int) and not isinstance(p, bool):
        return p
    return SYSTEM_PRIORITIES.get(str(spec.get("priorityClassName") or ""), 0)


def pod_meta(pod: dict) -> PodMeta:
    """The pod model's metadata from a Pod object, as :meth:`joulesched.cluster.workload.Workload.meta` gives it
    in the twin: kind (a service when a Deployment, StatefulSet, DaemonSet, ReplicaSet or ReplicationController
    owns it, or a bare pod restarts ``Always``; a job otherwise), owner kind (:func:`pod_owner`), priority
    (:func:`pod_priority`), QoS class (:func:`qos_class`), app (the labels ``app.kubernetes.io/name``, ``app``,
    ``k8s-app``, else the owning workload's name), namespace, the label ``koordinator.sh/qosClass`` as the
    service class, and the limits (:func:`pod_limits`)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = meta.get("labels") or {}
    owner, owner_name = pod_owner(pod)
    if owner:
        kind = "service" if owner in SERVICE_OWNERS else "job"
    else:
        kind = "service" if (spec.get("restartPolicy") or "Always") == "Always" else "job"
    app = next((str(labels[k]) for k in APP_LABELS if labels.get(k)), owner_name)
    cpu_lim, mem_lim = pod_limits(pod)
    return PodMeta(kind=kind, owner_kind=owner, priority=pod_priority(pod), qos_class=qos_class(pod), app=app,
                   namespace=meta.get("namespace") or "default", slo_class=str(labels.get(SLO_CLASS_LABEL) or ""),
                   cpu_limit_m=cpu_lim, memory_limit_mib=mem_lim)


def parse_curve(text: str) -> tuple[float, ...]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise ObjectError(f"power curve {text[:40]!r} is not JSON: {e}") from None
    if not isinstance(values, list):
        raise ObjectError("a power curve must be a JSON list of 11 watts (0%..100% CPU)")
    try:
        return validate_curve(values)
    except (ValueError, TypeError) as e:
        raise ObjectError(str(e)) from None


#: Labels under ``node-restriction.kubernetes.io/`` are the ones a kubelet can never set on its own Node (the
#: NodeRestriction admission plugin refuses it): only an admin can. A node's own power claims (the annotation
#: and ``joulesched.io/power-profile``, which its kubelet may write) count only with this label set to "true".
POWER_TRUSTED_LABEL = "node-restriction.kubernetes.io/joulesched-power-trusted"
#: The admin-only way to pick a profile for a node, always honoured.
ADMIN_PROFILE_LABEL = "node-restriction.kubernetes.io/joulesched-power-profile"

_curve_log = logging.getLogger("joulesched.kube.curves")


class CurveResolver:
    """Where a node's power curve comes from, in this order:

    1. annotation ``joulesched.io/power-watts`` (an 11-point JSON list, e.g. written by ``power calibrate``),
       only on a node labelled ``node-restriction.kubernetes.io/joulesched-power-trusted: "true"``;
    2. a profile named by the admin-only label ``node-restriction.kubernetes.io/joulesched-power-profile`` or,
       on a trusted node, by the label or annotation ``joulesched.io/power-profile``: one of ``profiles`` (a
       ConfigMap in the scheduler's namespace, mounted as a file, see :func:`load_profiles`) or a SPECpower
       table in :data:`power.curves.SPECPOWER`;
    3. ``profiles`` keyed by the node's own name;
    4. the default curve.

    A kubelet can write its own Node's annotations and ``joulesched.io/`` labels, so a compromised node could
    otherwise claim a tiny curve and attract pods; the trust label is one only admins can set (NodeRestriction).
    A claim from an untrusted node, or a malformed curve, is reported once per node (``errors``, and a WARNING
    log line) and the next source is used.
    """

    def __init__(self, profiles: dict[str, tuple[float, ...]] | None = None,
                 default: tuple[float, ...] = SPECPOWER["ibm-x3250-x3470"]) -> None:
        self.profiles = dict(profiles or {})
        self.default = validate_curve(default)
        self.errors: dict[str, str] = {}

    def _note(self, name: str, message: str) -> None:
        if self.errors.get(name) != message:
            _curve_log.warning("node %s: %s", name, message)
        self.errors[name] = message

    def resolve(self, name: str, labels: dict, annotations: dict) -> tuple[tuple[float, ...], str]:
        trusted = str(labels.get(POWER_TRUSTED_LABEL, "")).lower() == "true"
        text = annotations.get(POWER_WATTS_ANNOTATION)
        node_prof = labels.get(POWER_PROFILE_KEY) or annotations.get(POWER_PROFILE_KEY)
        ignored = [k for k, v in ((POWER_WATTS_ANNOTATION, text), (POWER_PROFILE_KEY, node_prof)) if v]
        if not trusted:
            text, node_prof = None, None
        if text:
            try:
                return parse_curve(text), "annotation"
            except ObjectError as e:
                self._note(name, f"{POWER_WATTS_ANNOTATION}: {e}")
        prof = labels.get(ADMIN_PROFILE_LABEL) or node_prof
        if prof:
            if prof in self.profiles:
                return self.profiles[prof], f"profile:{prof}"
            if prof in SPECPOWER:
                return validate_curve(SPECPOWER[prof]), f"specpower:{prof}"
            self._note(name, f"{POWER_PROFILE_KEY}: unknown profile {prof!r}")
        if ignored and not trusted:
            self._note(name, f"ignored {' and '.join(ignored)}: the node can write those itself, and it lacks the "
                             f"admin-only label {POWER_TRUSTED_LABEL}=true; using the next curve source")
        if name in self.profiles:
            return self.profiles[name], "profile:node"
        return self.default, "default"


def load_profiles(path: str) -> dict[str, tuple[float, ...]]:
    """A profiles file: YAML/JSON mapping ``name: [11 watts]``, or ``name: {power_watts: [...]}`` (the node
    group ``power calibrate`` writes). A ConfigMap mounted as a volume provides it in a cluster."""
    import yaml

    from joulesched.core import yamlio

    try:
        with open(path, encoding="utf-8") as f:
            data = yamlio.load(f)
    except OSError as e:
        raise ObjectError(f"cannot read power profiles {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ObjectError(f"power profiles {path}: not UTF-8 text (byte {e.start}); is this a profiles file?") from None
    except yaml.YAMLError as e:
        raise ObjectError(f"power profiles {path} is not YAML: {e}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ObjectError(f"power profiles {path}: expected a mapping of name to 11 watts")
    out = {}
    for name, v in data.items():
        if isinstance(v, dict):
            if "power_watts" not in v:  # a node group without its curve (validate_curve said: NoneType ...)
                raise ObjectError(f"power profiles {path}: profile {name!r}: a node group needs power_watts "
                                  "(11 watts, 0..100 % load)")
            v = v["power_watts"]
        if not isinstance(v, (str, list, tuple)):
            raise ObjectError(f"power profiles {path}: profile {name!r}: expected 11 watts (a list, or a JSON list "
                              f"in a string), got {type(v).__name__}")
        try:
            if isinstance(v, str):  # a ConfigMap's value: the 11 watts as a JSON list
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    raise ValueError(f"{v[:40]!r} is not a JSON list of 11 watts") from None
            out[str(name)] = validate_curve(v)
        except (ValueError, TypeError) as e:
            raise ObjectError(f"power profiles {path}: profile {name!r}: {e}") from None
    return out


def parse_node(node: dict, curves: CurveResolver) -> NodeInfo:
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    name = meta.get("name", "")
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    curve, source = curves.resolve(name, labels, annotations)
    try:
        cpu = cpu_millis(alloc.get("cpu", 0)) if "cpu" in alloc else 0
        mem = memory_mib(alloc["memory"], round_up=False) if "memory" in alloc else 0
        pods = int(parse_finite_quantity(alloc.get("pods", 110), "pods"))
    except ObjectError:
        cpu, mem, pods = 0, 0, 0  # unusable allocatable: the node takes no pods
    try:
        gpus = max(0, int(parse_finite_quantity(alloc.get(GPU_RESOURCE, 0), GPU_RESOURCE)))
    except ObjectError:
        gpus = 0
    named = []
    for r in sorted(set(alloc) - MODELLED_RESOURCES):
        try:
            named.append((str(r), max(0, quantity_value(alloc[r]))))
        except ObjectError:
            continue  # unusable: the node has none of it
    taints = tuple(Taint(t.get("key", ""), t.get("value", "") or "", t.get("effect", ""))
                   for t in spec.get("taints") or [])
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    ready = cond is None or cond.get("status") == "True"  # a node reporting no conditions counts as ready
    # A node whose wake failed is gated like any tainted node, so pods waiting for it choose another.
    asleep = any(t.key == ASLEEP_TAINT for t in taints) and WAKE_FAILED_ANNOTATION not in annotations
    state = annotations.get(POWER_STATE_ANNOTATION) or "awake"
    try:
        rv = int(meta.get("resourceVersion") or 0)
    except ValueError:
        rv = 0
    return NodeInfo(name=name, cpu_m=max(cpu, 0), memory_mib=max(mem, 0), max_pods=max(pods, 0), curve=curve,
                    curve_source=source, labels=dict(labels), taints=taints,
                    unschedulable=bool(spec.get("unschedulable")), ready=ready, asleep=asleep,
                    waking=asleep and state == "waking",
                    power_state=state if state in pw.POWER_STATES else "awake",
                    power_since=str(annotations.get(pw.POWER_SINCE_ANNOTATION) or ""),
                    power_owner=str(annotations.get(pw.POWER_OWNER_ANNOTATION) or ""),
                    power_address=str(annotations.get(pw.POWER_ADDRESS_ANNOTATION) or "").strip(),
                    never_sleep=str(annotations.get(pw.NEVER_SLEEP_ANNOTATION, "")).lower() not in ("", "false"),
                    control_plane=any(k in labels for k in pw.CONTROL_PLANE_LABELS),
                    provider_id=str(spec.get("providerID") or ""),
                    wake_failed=WAKE_FAILED_ANNOTATION in annotations,
                    cordoned_by_us=pw.CORDONED_ANNOTATION in annotations,
                    off_requested=pw.OFF_REQUESTED_ANNOTATION in annotations,
                    gpu_count=gpus, gpu_model=str(labels.get(GPU_PRODUCT_LABEL, "")) if gpus else "",
                    named=tuple(named),
                    heartbeat="" if cond is None else f"{cond.get('lastHeartbeatTime', '')}|"
                                                      f"{cond.get('lastTransitionTime', '')}|{cond.get('status')}",
                    rv=rv)


def _requirements(items: object) -> tuple[Requirement, ...]:
    return tuple(Requirement(str(r.get("key") or ""), str(r.get("operator") or ""),
                             tuple(str(v) for v in r.get("values") or ()))
                 for r in items or () if isinstance(r, dict)) if isinstance(items, list) else ()


def parse_constraints(spec: dict) -> PodConstraints | None:
    """A Pod spec's nodeSelector, tolerations and required node affinity as the filter chain reads them."""
    tols = [Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                       str(t.get("effect") or "")) for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = node_selector_terms(req.get("nodeSelectorTerms")) if isinstance(req, dict) else None
    return pod_constraints(spec.get("nodeSelector") or {}, tols, terms)


def node_selector_terms(raw: object) -> list[NodeSelectorTerm]:
    """A NodeSelector's ``nodeSelectorTerms`` (a pod's required node affinity, a PersistentVolume's node
    affinity) as the filter chain reads them: ORed terms, each an AND; an empty term matches no node (kube)."""
    if not isinstance(raw, list):
        return []
    return [NodeSelectorTerm(_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
            for t in raw if isinstance(t, dict)]


def node_gate_reason(node: NodeInfo, pod: PodInfo,
                     filters: Sequence[tuple[str, NodeFilter]] = NODE_FILTERS) -> str:
    """The first node filter of the chain (:mod:`joulesched.cluster.filters`: NodeUnschedulable,
    TaintToleration with the not-ready taint, NodeAffinity with nodeSelector and required node affinity,
    NodeReady; ``filters``: a profile's, such as a cache's :attr:`~KubeCache.node_filters`) that ``node`` fails
    for ``pod``, in kube's words; "" when it passes. Resources are not looked
    at, except a named resource (an extended one, ``ephemeral-storage``, ``hugepages-*``) the pod asks more of
    than the node has at all (:meth:`NamedResourcesFit.beyond_allocatable`): as in kube, no eviction makes
    room for it, and waking the node or moving the pod there would not help."""
    r = node_reason(node.traits, pod.request.constraints, node.name, filters)
    if r or not pod.request.named:
        return r
    return NamedResourcesFit.beyond_allocatable(node.named_alloc, pod.request)
