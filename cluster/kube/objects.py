"""Kubernetes objects (as the JSON dicts the API returns) turned into what the scheduler needs.

Pod requests follow kube-scheduler's ``pkg/scheduler/util/pod_resources.go`` at pod level: the sum of the
containers' requests, raised to the largest init container's request, plus ``spec.overhead``. A resource no
container requests is ``None`` (kube-scheduler's non-zero default applies when scoring); an explicit 0 stays 0.
The per-container non-zero rule (100m / 200 MiB for each container without a request) is approximated at pod
level, because :class:`~cluster.state.PodRequest` carries one value per resource.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from decimal import Decimal

from kubernetes.utils import parse_quantity

from joulesched.cluster.state import PodRequest
from joulesched.core.errors import UsageError
from joulesched.power.curves import SPECPOWER, validate_curve

#: Annotation with the node's 11-point power curve, JSON: ``"[41.6, 46.7, ..., 113]"`` (watts at 0..100 %).
POWER_WATTS_ANNOTATION = "joulesched.io/power-watts"
#: Label or annotation naming a profile: a SPECpower table (``ibm-x3250-x3470``) or one from the profiles file.
POWER_PROFILE_KEY = "joulesched.io/power-profile"

TERMINAL_PHASES = ("Succeeded", "Failed")


class ObjectError(UsageError):
    """A node or pod that cannot be used as given (bad quantity, bad power curve)."""


def cpu_millis(q: str | int | float | None) -> int:
    """``"500m"`` -> 500, ``"2"`` -> 2000, rounded up as the apiserver does for millicores."""
    try:
        return int(math.ceil(parse_quantity(q) * 1000))
    except ValueError as e:
        raise ObjectError(f"bad cpu quantity {q!r}: {e}") from None


def memory_mib(q: str | int | float | None, *, round_up: bool = True) -> int:
    """``"512Mi"`` -> 512, ``"1Gi"`` -> 1024, ``"1G"`` -> 954 (bytes / 2^20, rounded up for requests and down
    for allocatable so that a fit in MiB implies a fit in bytes)."""
    try:
        mib = parse_quantity(q) / Decimal(1 << 20)
    except ValueError as e:
        raise ObjectError(f"bad memory quantity {q!r}: {e}") from None
    return int(math.ceil(mib)) if round_up else int(math.floor(mib))


def _requests(container: dict) -> dict:
    return ((container.get("resources") or {}).get("requests") or {})


def pod_request(pod: dict) -> PodRequest:
    """The pod's effective requests as a :class:`PodRequest` (see module docstring)."""
    spec = pod.get("spec") or {}
    out: dict[str, int | None] = {}
    for res, conv in (("cpu", cpu_millis), ("memory", memory_mib)):
        vals = [conv(_requests(c)[res]) for c in spec.get("containers") or [] if res in _requests(c)]
        init = [conv(_requests(c)[res]) for c in spec.get("initContainers") or [] if res in _requests(c)]
        over = (spec.get("overhead") or {}).get(res)
        if not vals and not init and over is None:
            out[res] = None
            continue
        total = max(sum(vals), max(init, default=0))
        if over is not None:
            total += conv(over)
        out[res] = total
    return PodRequest(cpu_m=out["cpu"], memory_mib=out["memory"])


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Counts against its node's capacity (not terminated)."""
        return self.phase not in TERMINAL_PHASES


def parse_pod(pod: dict) -> PodInfo:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    try:
        req = pod_request(pod)
    except ObjectError:
        req = PodRequest(None, None)  # a malformed request cannot come from a real apiserver; count it as none
    try:
        rv = int(meta.get("resourceVersion") or 0)
    except ValueError:
        rv = 0  # opaque versions: ordering checks are skipped
    return PodInfo(rv=rv, uid=meta.get("uid", ""), namespace=meta.get("namespace", ""), name=meta.get("name", ""),
                   node_name=spec.get("nodeName") or "", scheduler_name=spec.get("schedulerName") or "",
                   request=req, phase=status.get("phase") or "Pending",
                   deleting=bool(meta.get("deletionTimestamp")),
                   node_selector=dict(spec.get("nodeSelector") or {}),
                   tolerations=tuple(tuple(sorted((k, str(v)) for k, v in t.items())) for t in
                                     spec.get("tolerations") or []))


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


class CurveResolver:
    """Where a node's power curve comes from, in this order:

    1. annotation ``joulesched.io/power-watts`` (an 11-point JSON list, e.g. written by ``power calibrate``);
    2. label or annotation ``joulesched.io/power-profile`` naming a profile in ``profiles`` (a ConfigMap
       mounted as a file, see :func:`load_profiles`) or a SPECpower table in :data:`power.curves.SPECPOWER`;
    3. ``profiles`` keyed by the node's own name;
    4. the default curve.

    A malformed curve is reported once per node (``errors``) and the next source is used.
    """

    def __init__(self, profiles: dict[str, tuple[float, ...]] | None = None,
                 default: tuple[float, ...] = SPECPOWER["ibm-x3250-x3470"]) -> None:
        self.profiles = dict(profiles or {})
        self.default = validate_curve(default)
        self.errors: dict[str, str] = {}

    def resolve(self, name: str, labels: dict, annotations: dict) -> tuple[tuple[float, ...], str]:
        text = annotations.get(POWER_WATTS_ANNOTATION)
        if text:
            try:
                return parse_curve(text), "annotation"
            except ObjectError as e:
                self.errors[name] = f"{POWER_WATTS_ANNOTATION}: {e}"
        prof = labels.get(POWER_PROFILE_KEY) or annotations.get(POWER_PROFILE_KEY)
        if prof:
            if prof in self.profiles:
                return self.profiles[prof], f"profile:{prof}"
            if prof in SPECPOWER:
                return validate_curve(SPECPOWER[prof]), f"specpower:{prof}"
            self.errors[name] = f"{POWER_PROFILE_KEY}: unknown profile {prof!r}"
        if name in self.profiles:
            return self.profiles[name], "profile:node"
        return self.default, "default"


def load_profiles(path: str) -> dict[str, tuple[float, ...]]:
    """A profiles file: YAML/JSON mapping ``name: [11 watts]``, or ``name: {power_watts: [...]}`` (the node
    group ``power calibrate`` writes). A ConfigMap mounted as a volume provides it in a cluster."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ObjectError(f"cannot read power profiles {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ObjectError(f"power profiles {path} is not YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ObjectError(f"power profiles {path}: expected a mapping of name to 11 watts")
    out = {}
    for name, v in data.items():
        if isinstance(v, dict):
            v = v.get("power_watts")
        if isinstance(v, str):
            v = json.loads(v)
        try:
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
        pods = int(parse_quantity(alloc.get("pods", 110)))
    except (ObjectError, ValueError):
        cpu, mem, pods = 0, 0, 0  # unusable allocatable: the node takes no pods
    taints = tuple(Taint(t.get("key", ""), t.get("value", "") or "", t.get("effect", ""))
                   for t in spec.get("taints") or [])
    return NodeInfo(name=name, cpu_m=max(cpu, 0), memory_mib=max(mem, 0), max_pods=max(pods, 0), curve=curve,
                    curve_source=source, labels=dict(labels), taints=taints,
                    unschedulable=bool(spec.get("unschedulable")))


def tolerates(tolerations: tuple, taint: Taint) -> bool:
    """kube's ``Toleration.ToleratesTaint``."""
    for tol in tolerations:
        t = dict(tol)
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        op = t.get("operator") or "Equal"
        key = t.get("key") or ""
        if key and key != taint.key:
            continue
        if not key and op != "Exists":
            continue
        if op == "Exists" or (t.get("value") or "") == taint.value:
            return True
    return False


def node_gate_reason(node: NodeInfo, pod: PodInfo) -> str:
    """The first non-resource filter the node fails, in kube-scheduler's plugin order, as kube words it;
    "" when it passes. NodeUnschedulable, TaintToleration (NoSchedule/NoExecute), NodeAffinity (nodeSelector)."""
    if node.unschedulable and not tolerates(pod.tolerations, Taint("node.kubernetes.io/unschedulable", "",
                                                                   "NoSchedule")):
        return "node(s) were unschedulable"
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerates(pod.tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    for k, v in pod.node_selector.items():
        if node.labels.get(k) != v:
            return "node(s) didn't match Pod's node affinity/selector"
    return ""
