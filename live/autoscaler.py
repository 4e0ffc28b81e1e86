"""`joulesched autoscaler-provider`: cluster-autoscaler's ``externalgrpc`` cloud provider over the node power
controller, so that a stock cluster-autoscaler scales bare-metal and VM node groups by waking and sleeping them.

cluster-autoscaler has no bare-metal provider; its ``externalgrpc`` provider calls a gRPC ``CloudProvider``
service (``live/protos/externalgrpc.proto``, the published interface). Here:

- **Node groups** come from the operator's configuration (:class:`ProviderConfig`): a label selector and/or
  node names, sizes, autoscaling options. A node is in a group only if it has a ``spec.providerID`` (the
  autoscaler matches instances to nodes by it) and no control-plane label; a node two groups claim is in
  neither (logged). The power address of each node is the node power controller's (the operator's map).
- **Instances** are the group's nodes that are awake (``instanceRunning``), being woken (``instanceCreating``)
  or being put to sleep (``instanceDeleting``). A sleeping node is no instance: to the autoscaler it is a
  machine that was deleted and can be created again. The target size is running plus creating.
- ``NodeGroupIncreaseSize`` wakes that many sleeping nodes of the group, most efficient first (the twin's order,
  :meth:`NodePowerCore.efficiency`); ``NodeGroupDeleteNodes`` puts the named nodes to sleep once the autoscaler
  has drained them (a node with a workload pod left is refused). Both go through the node power controller's
  own actions (:meth:`NodePowerController.request_wake` / ``request_sleep``): the same cordon, taint, fresh
  emptiness check, actuator deadlines, leadership and recovery rules as ``joulesched node-power``.
- ``PricingNodePrice`` is the node's energy cost over the period (its power curve at ``pricing_utilization``,
  times ``price_per_kwh``), so the autoscaler's ``price`` expander prefers efficient groups;
  ``PricingPodPrice`` is the pod's CPU share of the most efficient node's cost.

**Never both acting on one group**: the controller this process runs treats every node of a configured group as
*delegated* (its own sleep, wake and consolidation passes skip them), and every action needs the controller's
Lease; run the provider with the same Lease name as ``node-power`` and at most one of them acts at a time.

Errors follow the gRPC codes the autoscaler understands: an unknown group or node is ``NOT_FOUND``, a size out
of range ``INVALID_ARGUMENT``, a refused action ``FAILED_PRECONDITION``, a replica that is not the leader
``UNAVAILABLE`` (the autoscaler retries on its next loop).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ConfigDict, Field, StrictInt, ValidationError, model_validator

from joulesched.cluster.kube.objects import NodeInfo
from joulesched.cluster.nodepower import ASLEEP_TAINT, NodePowerCore
from joulesched.cluster.scenario import NoLaxModel
from joulesched.cluster.state import ClusterState
from joulesched.core.errors import JouleschedError, UsageError, validation_summary
from joulesched.core.fsio import read_text_input
from joulesched.power.curves import interp

log = logging.getLogger("joulesched.autoscaler")

PROTOS = Path(__file__).with_name("protos")
#: The autoscaler's own taints (it adds them before deleting a node and may leave them on a node it deleted);
#: removed when a node of a group is woken, so that the woken node takes pods.
AUTOSCALER_TAINTS = ("ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler")
#: Annotation on template nodes: which group a priced template node belongs to.
GROUP_ANNOTATION = "joulesched.io/node-group"
#: cluster-autoscaler's InstanceErrorClass for errors that are not out-of-resources.
OTHER_ERROR_CLASS = 99
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class ProviderError(JouleschedError):
    """A call the provider refuses; ``code`` is the gRPC status code's name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---- configuration -------------------------------------------------------------------------------------------
#: The longest duration an option may give: cluster-autoscaler's own defaults are minutes (10 min unneeded, 15
#: min provisioning), so anything past 30 days is a typo or a unit mistake. It also keeps the value far inside
#: what a protobuf Duration (int64 seconds) and the autoscaler's Go ``time.Duration`` (int64 ns, ~292 years)
#: can carry; ``.inf`` or ``1e300`` used to fail every NodeGroupGetOptions call instead of the start-up.
MAX_DURATION_S = 30 * 24 * 3600.0
#: Node group sizes are int32 in the externalgrpc protocol (``NodeGroup.minSize``, ``maxSize``).
MAX_GROUP_SIZE = 2**31 - 1


def _duration(gt: bool = False) -> Any:
    bound = {"gt": 0} if gt else {"ge": 0}
    return Field(None, **bound, le=MAX_DURATION_S, allow_inf_nan=False)


class GroupOptions(NoLaxModel):
    """Per-group overrides of the autoscaler's NodeGroupAutoscalingOptions (absent: the autoscaler's defaults).
    Durations are seconds, at most :data:`MAX_DURATION_S`."""

    model_config = ConfigDict(extra="forbid")
    scale_down_utilization_threshold: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    scale_down_gpu_utilization_threshold: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    scale_down_unneeded_s: float | None = _duration()
    scale_down_unready_s: float | None = _duration()
    max_node_provision_s: float | None = _duration(gt=True)
    max_node_startup_s: float | None = _duration(gt=True)
    ignore_daemonsets_utilization: bool | None = None


class NodeGroupSpec(NoLaxModel):
    """One node group. Prefer selector labels a kubelet cannot set on itself (``node-restriction.kubernetes.io/``
    prefix) or explicit ``nodes``: membership decides which machines the autoscaler may switch."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    selector: dict[str, str] = Field(default_factory=dict)
    nodes: list[str] = Field(default_factory=list)
    # Strict: YAML's `true` or `1.5` is no size (pydantic would take true as 1).
    min_size: StrictInt = Field(0, ge=0, le=MAX_GROUP_SIZE)
    max_size: StrictInt | None = Field(None, ge=0, le=MAX_GROUP_SIZE)
    options: GroupOptions = Field(default_factory=GroupOptions)

    @model_validator(mode="after")
    def _check(self) -> "NodeGroupSpec":
        if not self.selector and not self.nodes:
            raise ValueError("a group needs a selector or a list of nodes")
        if self.max_size is not None and self.max_size < self.min_size:
            raise ValueError(f"max_size {self.max_size} < min_size {self.min_size}")
        return self

    def matches(self, name: str, labels: dict) -> bool:
        if name in self.nodes:
            return True
        return bool(self.selector) and all(labels.get(k) == v for k, v in self.selector.items())


class ProviderConfig(NoLaxModel):
    """The provider's configuration file (YAML): node groups and pricing."""

    model_config = ConfigDict(extra="forbid")
    groups: list[NodeGroupSpec] = Field(min_length=1)
    # 1e6 per kWh is past any tariff in any currency unit; a larger finite one overflowed prices to inf.
    price_per_kwh: float = Field(0.30, gt=0, le=1e6, allow_inf_nan=False,
                                 description="Price of one kWh, in the autoscaler's price unit.")
    pricing_utilization: float = Field(0.5, ge=0, le=1, allow_inf_nan=False,
                                       description="CPU utilisation a priced node runs at.")
    gpu_label: str = "nvidia.com/gpu.product"

    @model_validator(mode="after")
    def _unique(self) -> "ProviderConfig":
        dup = [g for g, c in Counter(g.id for g in self.groups).items() if c > 1]
        if dup:
            raise ValueError(f"group id {dup[0]!r} appears twice")
        return self


def load_provider_config(path: str | Path) -> ProviderConfig:
    """Read and validate the configuration; :class:`UsageError` (exit 2) naming the problem."""
    import yaml

    from joulesched.core import yamlio

    try:
        data = yamlio.load(read_text_input(path, "an autoscaler provider config"))
    except yaml.YAMLError as e:
        raise UsageError(f"--config {path}: not YAML: {e}".replace("\n", " ")) from None
    try:
        return ProviderConfig.model_validate(data)
    except ValidationError as e:
        raise UsageError(f"--config {path}: {validation_summary(e)}") from None


# ---- the provider's logic (no gRPC types: tested directly and through the server) ---------------------------
@dataclass(frozen=True)
class Instance:
    provider_id: str
    name: str
    state: str  # running | creating | deleting
    error: str = ""


class AutoscalerProvider:
    """The node groups over a :class:`~joulesched.live.nodepower.NodePowerController` (``controller``): its
    cache's :class:`NodeInfo` (``node_infos()``), its actions (``request_wake``, ``request_sleep``,
    ``action_of``, ``workload_pods_on``) and its leadership."""

    def __init__(self, controller: Any, cfg: ProviderConfig) -> None:
        self.ctl, self.cfg = controller, cfg
        self.groups = {g.id: g for g in cfg.groups}
        self._lock = threading.Lock()
        # One resize at a time: the size checks (min, max) and the sleeps or wakes they allow are one step, or two
        # of cluster-autoscaler's concurrent DeleteNodes calls could each pass the min-size check.
        self._resize = threading.Lock()
        self._wake_requested: dict[str, float] = {}  # nodes this provider woke -> when (their failures are reported)
        self._warned: set[str] = set()
        self._shared: tuple[float, frozenset[str]] = (-math.inf, frozenset())  # (when counted, shared providerIDs)
        controller.delegated = self.delegated

    # ---- membership ----
    def _claim(self, info: NodeInfo) -> NodeGroupSpec | None:
        """The one group whose selector takes the node, or None (no providerID, a control plane, no group, or two
        groups)."""
        if not info.provider_id or info.control_plane:
            return None
        found = [g for g in self.cfg.groups if g.matches(info.name, info.labels)]
        if len(found) > 1:
            self._warn(info.name, "node %s is claimed by groups %s: it is in none of them", info.name,
                       ", ".join(g.id for g in found))
            return None
        return found[0] if found else None

    def _warn(self, name: str, msg: str, *args: Any) -> None:
        if name not in self._warned and len(self._warned) < 10_000:
            self._warned.add(name)
            log.warning(msg, *args)

    def _membership(self) -> dict[str, tuple[NodeGroupSpec, NodeInfo]]:
        """Every group member: node name -> (its group, its info). A providerID is the instance the autoscaler
        names in DeleteNodes, and the kubelet writes it: nodes that share one (a cloned kubelet config) are in no
        group, so that a request for one instance can never put another machine to sleep."""
        infos = self.ctl.node_infos()
        owners = Counter(i.provider_id for i in infos.values() if i.provider_id)
        shared = frozenset(p for p, n in owners.items() if n > 1)
        with self._lock:
            self._shared = (time.monotonic(), shared)
        out = {}
        for name, info in infos.items():
            g = self._claim(info)
            if g is None:
                continue
            if info.provider_id in shared:
                self._warn(name, "node %s shares providerID %s with another node: it is in no node group", name,
                           info.provider_id)
                continue
            out[name] = (g, info)
        return out

    def _shared_ids(self) -> frozenset[str]:
        """The providerIDs more than one node has, counted at most once a second: the read-only questions
        (NodeGroupForNode for every node, prices) would otherwise count all nodes for each node. What changes
        machines (DeleteNodes, IncreaseSize) goes through :meth:`members`, which always counts afresh."""
        with self._lock:
            at, shared = self._shared
        if time.monotonic() - at < SHARED_IDS_TTL_S:
            return shared
        self._membership()
        with self._lock:
            return self._shared[1]

    def group_of(self, info: NodeInfo) -> NodeGroupSpec | None:
        """The one group the node is in, or None (no providerID, a control plane, no group, two groups, or a
        providerID another node has too)."""
        g = self._claim(info)
        if g is None or info.provider_id not in self._shared_ids():
            return g
        self._warn(info.name, "node %s shares providerID %s with another node: it is in no node group", info.name,
                   info.provider_id)
        return None

    def delegated(self, info: NodeInfo) -> bool:
        """The controller's predicate: every node a configured group claims is the autoscaler's to decide, even
        one that is not a member (claimed twice, no providerID), so that the controller never acts on it either."""
        return any(g.matches(info.name, info.labels) for g in self.cfg.groups)

    def members(self, group_id: str) -> dict[str, NodeInfo]:
        group = self._group(group_id)
        return {n: i for n, (g, i) in self._membership().items() if g is group}

    def _group(self, group_id: str) -> NodeGroupSpec:
        g = self.groups.get(group_id)
        if g is None:
            raise ProviderError("NOT_FOUND", f"no node group {group_id!r}")
        return g

    # ---- sizes and instances ----
    def _instance(self, info: NodeInfo) -> Instance | None:
        action = self.ctl.action_of(info.name)
        state = info.power_state
        if action == "wake" or state == "waking":
            return Instance(info.provider_id, info.name, "creating")
        if action == "sleep" or state == "sleeping":
            return Instance(info.provider_id, info.name, "deleting")
        if state == "asleep":
            with self._lock:
                asked = info.name in self._wake_requested
            if asked and info.wake_failed:  # a scale-up that failed: the autoscaler must hear of it
                return Instance(info.provider_id, info.name, "creating", "the node did not wake")
            return None
        return Instance(info.provider_id, info.name, "running")

    def instances(self, group_id: str) -> list[Instance]:
        return [i for _, info in sorted(self.members(group_id).items()) if (i := self._instance(info)) is not None]

    def max_size(self, group_id: str) -> int:
        g = self._group(group_id)
        n = len(self.members(group_id))
        return n if g.max_size is None else min(g.max_size, n)

    def target_size(self, group_id: str) -> int:
        return sum(1 for i in self.instances(group_id) if i.state in ("running", "creating"))

    def _leading(self) -> None:
        if self.ctl.cfg.dry_run:
            raise ProviderError("FAILED_PRECONDITION", "the provider runs in dry-run: it changes no node")
        if not self.ctl.is_leader():
            raise ProviderError("UNAVAILABLE", "this replica does not hold the node power Lease")

    def increase_size(self, group_id: str, delta: int) -> list[str]:
        """Wake ``delta`` sleeping nodes of the group, most efficient first; the names woken."""
        with self._resize:
            return self._increase_size(group_id, delta)

    def _increase_size(self, group_id: str, delta: int) -> list[str]:
        if delta <= 0:
            raise ProviderError("INVALID_ARGUMENT", f"delta must be positive, got {delta}")
        target, top = self.target_size(group_id), self.max_size(group_id)
        if target + delta > top:
            raise ProviderError("INVALID_ARGUMENT", f"size increase too large: {target} + {delta} > max {top}")
        self._leading()
        members = self.members(group_id)
        asleep = [i for _, i in sorted(members.items()) if self._instance(i) is None]
        woken: list[str] = []
        for info in self._by_efficiency(asleep):
            if len(woken) == delta:
                break
            self._clear_autoscaler_taints(info)
            if self.ctl.request_wake(info.name):
                with self._lock:
                    self._wake_requested[info.name] = time.monotonic()
                woken.append(info.name)
        if len(woken) < delta:
            raise ProviderError("FAILED_PRECONDITION", f"woke {len(woken)} of {delta} nodes of {group_id}: the "
                                "others are backing off after a failure or already changing state")
        log.info("autoscaler: waking %s (group %s)", ", ".join(woken), group_id)
        return woken

    @staticmethod
    def _by_efficiency(infos: list[NodeInfo]) -> list[NodeInfo]:
        if not infos:
            return []
        st = ClusterState([i.name for i in infos], [i.cpu_m for i in infos], [i.memory_mib for i in infos],
                          [i.max_pods for i in infos], [i.curve for i in infos])
        eff = NodePowerCore.efficiency(st)
        return [infos[k] for k in np.lexsort((np.arange(len(infos)), eff))]

    def delete_nodes(self, group_id: str, nodes: list[tuple[str, str]]) -> list[str]:
        """Put the named nodes (``(providerID, name)`` pairs) of the group to sleep; the names."""
        with self._resize:
            return self._delete_nodes(group_id, nodes)

    def _delete_nodes(self, group_id: str, nodes: list[tuple[str, str]]) -> list[str]:
        members = self.members(group_id)
        by_pid = {i.provider_id: n for n, i in members.items()}
        names: list[str] = []
        for pid, name in nodes:
            found = by_pid.get(pid) if pid else (name if name in members else None)
            if found is None or (name and found != name):
                raise ProviderError("NOT_FOUND", f"node {name or pid} is not in node group {group_id}")
            names.append(found)
        dup = next((n for n, c in Counter(names).items() if c > 1), None)
        if dup is not None:  # refused before any sleep starts: the second one would fail after the first began
            raise ProviderError("INVALID_ARGUMENT", f"node {dup} is listed twice")
        instances = {n: self._instance(i) for n, i in members.items()}
        waking = next((n for n in names if (i := instances[n]) is not None and i.state == "creating" and not i.error),
                      None)
        if waking is not None:  # reported deleted and left to wake, it would stay (and the target with it)
            raise ProviderError("FAILED_PRECONDITION", f"node {waking} is being woken: it can be put to sleep once "
                                "it is up")
        running = [n for n in names if (i := instances[n]) is not None and i.state == "running"]
        # What the group has or will have: running machines and wakes under way, not a wake that failed (the
        # target counts it, so that the autoscaler hears of it; a review: it let the last running node go)
        capacity = sum(1 for i in instances.values()
                       if i is not None and (i.state == "running" or (i.state == "creating" and not i.error)))
        floor = self._group(group_id).min_size
        if capacity - len(running) < floor:
            raise ProviderError("FAILED_PRECONDITION", f"deleting {len(running)} nodes would take {group_id} "
                                f"below its min size {floor} ({capacity} running or waking)")
        self._leading()
        for n in running:  # every node checked before any sleep starts: a refusal leaves none half done
            left = self.ctl.workload_pods_on(n)
            if left is None:
                raise ProviderError("UNAVAILABLE", f"cannot read the pods of {n} or a DaemonSet they name; nothing "
                                    "was done to it")
            if left:
                raise ProviderError("FAILED_PRECONDITION", f"node {n} still runs {len(left)} workload pods "
                                    f"(first {left[0]}): drain it first")
        for n in names:
            if n not in running:  # asleep (a failed wake the autoscaler gives up on) or already going
                with self._lock:
                    self._wake_requested.pop(n, None)
                continue
            if not self.ctl.request_sleep(n):
                raise ProviderError("FAILED_PRECONDITION", f"node {n} cannot be put to sleep now (protected, no "
                                    "power address, another action in flight, or max_sleeps_per_hour reached)")
            with self._lock:
                self._wake_requested.pop(n, None)
        log.info("autoscaler: putting %s to sleep (group %s)", ", ".join(running) or "nothing", group_id)
        return names

    def decrease_target_size(self, group_id: str, delta: int) -> None:
        """Only requests not yet fulfilled may go; here those are wakes in flight, which are not cancelled (the
        controller's wake deadline ends a wake that does not come Ready)."""
        if delta >= 0:
            raise ProviderError("INVALID_ARGUMENT", f"delta must be negative, got {delta}")
        inst = self.instances(group_id)
        running = sum(1 for i in inst if i.state == "running")
        target = sum(1 for i in inst if i.state in ("running", "creating"))
        if target + delta < running:
            raise ProviderError("FAILED_PRECONDITION", f"attempt to delete existing nodes: target {target} + "
                                f"{delta} < {running} running")
        raise ProviderError("FAILED_PRECONDITION", f"{target - running} wakes in flight are not cancelled; they "
                            f"finish or fail within {self.ctl.cfg.wake_timeout_s:g} s")

    # ---- templates, options, prices ----
    def template_node(self, group_id: str) -> dict:
        """An empty node of the group as it is when awake (a sleeping member preferred: it is what a scale-up
        brings), as a Node object."""
        members = self.members(group_id)
        if not members:
            raise ProviderError("NOT_FOUND", f"node group {group_id} has no node to take a template from")
        asleep = [i for _, i in sorted(members.items()) if self._instance(i) is None]
        info = (asleep or [members[n] for n in sorted(members)])[0]
        drop = {ASLEEP_TAINT, *AUTOSCALER_TAINTS, "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                "node.kubernetes.io/unschedulable"}
        room = {"cpu": f"{info.cpu_m}m", "memory": f"{info.memory_mib}Mi", "pods": str(info.max_pods)}
        return {"metadata": {"name": f"template-{group_id}", "labels": dict(info.labels),
                             "annotations": {GROUP_ANNOTATION: group_id}},
                "spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect}
                                    for t in info.taints if t.key not in drop]},
                "status": {"capacity": dict(room), "allocatable": dict(room),
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}

    def options(self, group_id: str, defaults: dict) -> dict:
        o = self._group(group_id).options
        out = dict(defaults)
        for key, value in o.model_dump().items():
            if value is not None:
                out[key] = value
        return out

    def _watts(self, info: NodeInfo) -> float:
        return interp(info.curve, self.cfg.pricing_utilization)

    def _price(self, watts: float, seconds: float) -> float:
        return watts * max(seconds, 0.0) / 3.6e6 * self.cfg.price_per_kwh

    def node_price(self, name: str, provider_id: str, annotations: dict, seconds: float) -> float:
        """Energy cost of ``name`` (a node of a group, or a group's template node) over ``seconds``."""
        nodes = self.ctl.node_infos()
        info = nodes.get(name)
        if info is None and provider_id:
            info = next((i for i in nodes.values() if i.provider_id == provider_id), None)
        if info is None and annotations.get(GROUP_ANNOTATION) in self.groups:
            members = self.members(annotations[GROUP_ANNOTATION])
            info = members[min(members)] if members else None
        if info is None or self.group_of(info) is None:
            raise ProviderError("NOT_FOUND", f"node {name or provider_id} is in no node group")
        return self._price(self._watts(info), seconds)

    def pod_price(self, cpu_m: int, seconds: float) -> float:
        """The pod's CPU share of the most efficient group node's energy cost over ``seconds``."""
        per_m = [self._watts(i) / i.cpu_m for _, i in self._membership().values() if i.cpu_m > 0]
        if not per_m:
            raise ProviderError("NOT_FOUND", "no node group has a node to price a pod on")
        return self._price(min(per_m) * max(cpu_m, 0), seconds)

    def gpu_types(self) -> list[str]:
        seen = {i.labels.get(self.cfg.gpu_label) for _, i in self._membership().values()}
        return sorted(s for s in seen if s)

    def _clear_autoscaler_taints(self, info: NodeInfo) -> None:
        """Remove the autoscaler's deletion taints from a sleeping node about to wake, with the node's
        resourceVersion as a precondition (a concurrent change to its taints is never lost; on a conflict it
        is read again)."""
        if not any(t.key in AUTOSCALER_TAINTS for t in info.taints):
            return
        api, timeout = self.ctl.core_api, self.ctl.cfg.request_timeout_s
        for _ in range(5):
            try:
                obj = json.loads(api.read_node(info.name, _preload_content=False, _request_timeout=timeout).data)
                taints = (obj.get("spec") or {}).get("taints") or []
                keep = [t for t in taints if t.get("key") not in AUTOSCALER_TAINTS]
                if len(keep) == len(taints):
                    return
                patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                         "spec": {"taints": keep or None}}
                api.patch_node(info.name, patch, _content_type="application/merge-patch+json",
                               _preload_content=False, _request_timeout=timeout)
                return
            except Exception as e:  # 409: the node changed since it was read
                last = e
                time.sleep(0.05)
        # The wake goes on; the autoscaler removes its own taints when it restarts.
        log.warning("could not remove the autoscaler's taints from %s: %s", info.name, type(last).__name__)


# ---- the gRPC service -----------------------------------------------------------------------------------------
def load_protos() -> tuple[Any, Any, Any]:
    """(messages, services, Kubernetes messages), generated from ``live/protos/*.proto`` by grpcio-tools when
    first imported; nothing generated is kept in the repository."""
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
    except ImportError:
        raise UsageError("the autoscaler provider needs grpcio and grpcio-tools: "
                         "pip install 'joulesched[autoscaler]'") from None
    import grpc

    sys.path.insert(0, str(PROTOS))
    try:
        pb, svc = grpc.protos_and_services("externalgrpc.proto")
        k8s = grpc.protos("k8s_core_v1.proto")
    finally:
        sys.path.remove(str(PROTOS))
    return pb, svc, k8s


def node_to_proto(k8s: Any, obj: dict) -> bytes:
    """A Node object as Kubernetes' protobuf encoding of v1.Node (what the autoscaler's ``Unmarshal`` reads)."""
    node = k8s.Node()
    meta = obj.get("metadata") or {}
    node.metadata.name = meta.get("name", "")
    node.metadata.labels.update(meta.get("labels") or {})
    node.metadata.annotations.update(meta.get("annotations") or {})
    for t in (obj.get("spec") or {}).get("taints") or []:
        node.spec.taints.add(key=t.get("key", ""), value=t.get("value", "") or "", effect=t.get("effect", ""))
    status = obj.get("status") or {}
    for field_name in ("capacity", "allocatable"):
        for k, v in (status.get(field_name) or {}).items():
            getattr(node.status, field_name)[k].string = str(v)
    for c in status.get("conditions") or []:
        node.status.conditions.add(type=c.get("type", ""), status=c.get("status", ""), reason=c.get("reason", ""))
    return node.SerializeToString()


def pod_cpu_request_m(k8s: Any, data: bytes) -> int:
    """The pod's effective CPU request in millicores from its protobuf bytes: the larger of the sum over its
    containers and the largest init container (kube-scheduler's rule)."""
    from joulesched.cluster.kube.objects import cpu_millis

    pod = k8s.Pod()
    try:
        pod.ParseFromString(data)
    except Exception:
        raise ProviderError("INVALID_ARGUMENT", "pod_bytes is not a protobuf v1.Pod") from None

    def cpu(c: Any) -> int:
        q = c.resources.requests.get("cpu")
        try:
            return cpu_millis(q.string) if q is not None and q.string else 0
        except Exception:
            raise ProviderError("INVALID_ARGUMENT", f"container {c.name!r}: bad cpu request") from None

    main = sum(cpu(c) for c in pod.spec.containers)
    init = max((cpu(c) for c in pod.spec.initContainers), default=0)
    return max(main, init)


#: How long a count of the providerIDs that nodes share answers read-only questions (:meth:`_shared_ids`).
SHARED_IDS_TTL_S = 1.0
#: protobuf's Duration range (duration.proto): what a well-formed one holds.
PROTO_DURATION_S = 315_576_000_000


def _seconds(start: Any, end: Any) -> float:
    try:  # ToSeconds refuses a Timestamp outside years 1..9999 with a ValueError: the caller's, not ours
        return max(0.0, end.ToSeconds() + end.nanos / 1e9 - start.ToSeconds() - start.nanos / 1e9)
    except ValueError as e:
        raise ProviderError("INVALID_ARGUMENT", f"bad startTimestamp or endTimestamp: {e}") from None


def _duration_s(dur: Any, name: str) -> float:
    """A Duration argument in seconds; out of protobuf's range (so that it could not be written back) refused."""
    if not (abs(dur.seconds) <= PROTO_DURATION_S and abs(dur.nanos) <= 999_999_999):
        raise ProviderError("INVALID_ARGUMENT", f"defaults.{name} is not a valid Duration")
    return dur.seconds + dur.nanos / 1e9


def make_servicer(provider: AutoscalerProvider, pb: Any, svc: Any, k8s: Any) -> Any:
    """The ``CloudProvider`` servicer: each RPC calls the provider and maps :class:`ProviderError` to its code."""
    import grpc
    from google.protobuf import duration_pb2

    State = pb.InstanceStatus

    def rpc(fn):
        def handler(self, request, context):
            try:
                return fn(request)
            except ProviderError as e:
                log.info("%s refused: %s", fn.__name__, e)
                context.abort(getattr(grpc.StatusCode, e.code), str(e))
            except grpc.RpcError:
                raise
            except Exception as e:  # a bug or a cluster failure: say so generically, log the details
                log.exception("%s failed", fn.__name__)
                context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__} failed: {type(e).__name__}")
        handler.__name__ = fn.__name__
        return handler

    def group_msg(g: NodeGroupSpec) -> Any:
        return pb.NodeGroup(id=g.id, minSize=g.min_size, maxSize=provider.max_size(g.id),
                            debug=f"{g.id}: selector {g.selector or '-'}, nodes {len(provider.members(g.id))}")

    def NodeGroups(req):
        return pb.NodeGroupsResponse(nodeGroups=[group_msg(g) for g in provider.cfg.groups])

    def NodeGroupForNode(req):
        nodes = provider.ctl.node_infos()
        info = nodes.get(req.node.name)
        if info is None and req.node.providerID:
            info = next((i for i in nodes.values() if i.provider_id == req.node.providerID), None)
        g = provider.group_of(info) if info is not None else None
        return pb.NodeGroupForNodeResponse(nodeGroup=group_msg(g) if g else pb.NodeGroup(id=""))

    def PricingNodePrice(req):
        return pb.PricingNodePriceResponse(price=provider.node_price(
            req.node.name, req.node.providerID, dict(req.node.annotations),
            _seconds(req.startTimestamp, req.endTimestamp)))

    def PricingPodPrice(req):
        cpu = pod_cpu_request_m(k8s, req.pod_bytes)
        return pb.PricingPodPriceResponse(price=provider.pod_price(cpu, _seconds(req.startTimestamp,
                                                                                 req.endTimestamp)))

    def GPULabel(req):
        return pb.GPULabelResponse(label=provider.cfg.gpu_label)

    def GetAvailableGPUTypes(req):
        from google.protobuf import any_pb2

        return pb.GetAvailableGPUTypesResponse(gpuTypes={t: any_pb2.Any() for t in provider.gpu_types()})

    def Cleanup(req):
        return pb.CleanupResponse()

    def Refresh(req):  # the controller's informers keep the state current: nothing to fetch
        return pb.RefreshResponse()

    def NodeGroupTargetSize(req):
        return pb.NodeGroupTargetSizeResponse(targetSize=provider.target_size(req.id))

    def NodeGroupIncreaseSize(req):
        provider.increase_size(req.id, req.delta)
        return pb.NodeGroupIncreaseSizeResponse()

    def NodeGroupDeleteNodes(req):
        provider.delete_nodes(req.id, [(n.providerID, n.name) for n in req.nodes])
        return pb.NodeGroupDeleteNodesResponse()

    def NodeGroupDecreaseTargetSize(req):
        provider.decrease_target_size(req.id, req.delta)
        return pb.NodeGroupDecreaseTargetSizeResponse()

    def NodeGroupNodes(req):
        states = {"running": State.instanceRunning, "creating": State.instanceCreating,
                  "deleting": State.instanceDeleting}
        out = []
        for i in provider.instances(req.id):
            status = State(instanceState=states[i.state])
            if i.error:
                status.errorInfo.errorCode = "WakeFailed"
                status.errorInfo.errorMessage = i.error
                status.errorInfo.instanceErrorClass = OTHER_ERROR_CLASS
            out.append(pb.Instance(id=i.provider_id, status=status))
        return pb.NodeGroupNodesResponse(instances=out)

    def NodeGroupTemplateNodeInfo(req):
        return pb.NodeGroupTemplateNodeInfoResponse(nodeBytes=node_to_proto(k8s, provider.template_node(req.id)))

    def NodeGroupGetOptions(req):
        d = req.defaults
        base = {"scale_down_utilization_threshold": d.scaleDownUtilizationThreshold,
                "scale_down_gpu_utilization_threshold": d.scaleDownGpuUtilizationThreshold,
                "scale_down_unneeded_s": _duration_s(d.scaleDownUnneededDuration, "scaleDownUnneededDuration"),
                "scale_down_unready_s": _duration_s(d.scaleDownUnreadyDuration, "scaleDownUnreadyDuration"),
                "max_node_provision_s": _duration_s(d.MaxNodeProvisionDuration, "MaxNodeProvisionDuration"),
                "max_node_startup_s": _duration_s(d.maxNodeStartupDuration, "maxNodeStartupDuration"),
                "ignore_daemonsets_utilization": d.ignoreDaemonSetsUtilization}
        o = provider.options(req.id, base)

        def dur(s: float) -> Any:
            return duration_pb2.Duration(seconds=int(s), nanos=int(round((s - int(s)) * 1e9)))

        opts = pb.NodeGroupAutoscalingOptions(
            scaleDownUtilizationThreshold=o["scale_down_utilization_threshold"],
            scaleDownGpuUtilizationThreshold=o["scale_down_gpu_utilization_threshold"],
            zeroOrMaxNodeScaling=d.zeroOrMaxNodeScaling, ignoreDaemonSetsUtilization=o["ignore_daemonsets_utilization"],
            scaleDownUnneededDuration=dur(o["scale_down_unneeded_s"]),
            scaleDownUnreadyDuration=dur(o["scale_down_unready_s"]),
            MaxNodeProvisionDuration=dur(o["max_node_provision_s"]),
            maxNodeStartupDuration=dur(o["max_node_startup_s"]),
            allowNonAtomicScaleUpToMax=d.allowNonAtomicScaleUpToMax)
        return pb.NodeGroupAutoscalingOptionsResponse(nodeGroupAutoscalingOptions=opts)

    fns = [NodeGroups, NodeGroupForNode, PricingNodePrice, PricingPodPrice, GPULabel, GetAvailableGPUTypes, Cleanup,
           Refresh, NodeGroupTargetSize, NodeGroupIncreaseSize, NodeGroupDeleteNodes, NodeGroupDecreaseTargetSize,
           NodeGroupNodes, NodeGroupTemplateNodeInfo, NodeGroupGetOptions]
    cls = type("JouleschedCloudProvider", (svc.CloudProviderServicer,), {f.__name__: rpc(f) for f in fns})
    return cls()


@dataclass
class TLSFiles:
    """The server's certificate and key, and the CA its clients' certificates must chain to (mTLS)."""

    cert: str
    key: str
    client_ca: str

    def credentials(self) -> Any:
        import grpc

        key, cert, ca = self.check()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    def check(self) -> tuple[bytes, bytes, bytes]:
        """The key, certificate and CA as PEM, each parsed (gRPC otherwise reports any of them as "Failed to bind
        to address", after the controller has started) and the key the certificate's. :class:`UsageError`."""
        from cryptography import x509
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives import serialization

        def read(label: str, path: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as e:
                raise UsageError(f"--{label} {path}: {e.strerror}") from None

        key, cert, ca = read("tls-key", self.key), read("tls-cert", self.cert), read("client-ca", self.client_ca)
        try:
            k = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as e:
            raise UsageError(f"--tls-key {self.key}: not an unencrypted PEM private key ({e})") from None
        for label, path, data in (("tls-cert", self.cert, cert), ("client-ca", self.client_ca, ca)):
            try:
                certs = x509.load_pem_x509_certificates(data)
            except ValueError as e:
                raise UsageError(f"--{label} {path}: not a PEM certificate ({e})") from None
            if label == "tls-cert" and certs[0].public_key().public_bytes(
                    serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != k.public_key(
                    ).public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
                raise UsageError(f"--tls-key {self.key} is not the key of --tls-cert {self.cert}")
        return key, cert, ca


class ProviderServer:
    """The gRPC server: mTLS when ``tls`` is given (a client without a certificate from ``client_ca`` is refused),
    plaintext only on a loopback address."""

    def __init__(self, provider: AutoscalerProvider, listen: str = "127.0.0.1:8086", tls: TLSFiles | None = None,
                 workers: int = 8) -> None:
        import grpc

        from joulesched.core.net import is_loopback, parse_listen

        host, port = parse_listen(listen)
        if tls is None and not is_loopback(host):
            raise UsageError(f"--listen {listen}: plaintext gRPC only on loopback; give --tls-cert, --tls-key and "
                             "--client-ca to serve the autoscaler over mTLS")
        pb, svc, k8s = load_protos()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="autoscaler-grpc")
        self.server = grpc.server(self._pool,
                                  options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                           ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
                                  maximum_concurrent_rpcs=4 * workers)
        svc.add_CloudProviderServicer_to_server(make_servicer(provider, pb, svc, k8s), self.server)
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.port = (self.server.add_secure_port(addr, tls.credentials()) if tls
                     else self.server.add_insecure_port(addr))
        if not self.port:
            raise JouleschedError(f"cannot listen on {listen}")

    def start(self) -> "ProviderServer":
        self.server.start()
        return self

    def stop(self, grace: float = 2.0) -> None:
        self.server.stop(grace).wait(grace + 1)
        self._pool.shutdown(wait=True)


def describe(provider: AutoscalerProvider) -> str:
    """One line per group for the start-up log."""
    return json.dumps({g.id: {"nodes": len(provider.members(g.id)), "target": provider.target_size(g.id),
                              "min": g.min_size, "max": provider.max_size(g.id)} for g in provider.cfg.groups})


__all__ = ["AutoscalerProvider", "ProviderConfig", "ProviderError", "ProviderServer", "TLSFiles",
           "load_provider_config", "load_protos", "node_to_proto", "pod_cpu_request_m"]
