"""An in-process **emulator** of the Kubernetes API server, over real HTTP, for tests and benchmarks.

Why an emulator: no kube-apiserver, kubelet, kind, k3s or minikube can be installed on our machines (Debian
bookworm, PyPI and npm carry none; see machines.md). So the live scheduler is tested against this emulator,
spoken to by the real ``kubernetes`` Python client over real HTTP/1.1 and JSON on 127.0.0.1. The real-cluster
path is ``tests/e2e/``: it runs the same scenarios when ``JOULESCHED_E2E_KUBECONFIG`` is set and skips visibly
otherwise. Nothing here is a Kubernetes implementation; it is the subset of REST semantics the scheduler
relies on, made as faithful as we could:

- ``/api/v1/nodes`` and ``/api/v1/pods`` (plus the namespaced forms): list and watch with a global
  ``resourceVersion``; a watch from a version older than the kept history answers a ``410 Gone`` ERROR event,
  as etcd compaction does. Watches stream chunked JSON lines ``{"type":"ADDED","object":{...}}``; an object
  that moves out of a field selector is sent as DELETED, one that moves in as ADDED.
- field selectors ``spec.schedulerName``, ``spec.nodeName``, ``status.phase``, ``metadata.name``,
  ``metadata.namespace`` with ``=``, ``==`` and ``!=``.
- ``POST pods/{name}/binding``: 409 Conflict when the pod is already assigned (or its uid does not match, or
  it still has ``spec.schedulingGates``), 404 when the pod is gone. Like the real apiserver it does *not*
  check that the target node exists.
- ``PATCH pods/{name}/status`` with merge or strategic merge patch (conditions merge by ``type``).
- ``POST events`` (core/v1) and coordination.k8s.io/v1 Leases with optimistic concurrency (409 on a stale
  ``resourceVersion``).
- ``PATCH nodes/{name}``, ``pods/{name}`` and ``events/{name}`` with a JSON merge patch (``null`` deletes a field; a
  ``metadata.resourceVersion`` in the patch is a precondition: 409 when stale), as ``kubectl cordon`` and the
  node power controller write nodes.
- RBAC, once a test grants rules (:meth:`KubeEmulator.grant`, say a shipped ClusterRole's): a request no rule
  allows is answered 403, as kube's authorizer answers it; and keep-alive connections idle for
  ``idle_timeout_s`` are closed, as kube-apiserver closes them after 90 s.
- discovery (``/api``, ``/apis``, ``/api/v1`` and the two groups' resource lists), so the real ``kubectl`` can
  get, annotate and cordon nodes (the kube_node role's power-address task is tested that way).
- generic objects (:data:`GENERIC`): what manifests hold (Namespaces, ServiceAccounts, ConfigMaps, Secrets,
  Services, Deployments, DaemonSets, RBAC, NetworkPolicies, ValidatingAdmissionPolicies), so ``kubectl apply`` of the rendered kustomize
  overlays lands, and the custom resources of bare-metal power owners (Metal3 ``BareMetalHost``, Tinkerbell
  Rufio ``Machine``, ``Job``, ``Task``): create, get, list, watch, merge PATCH (of the object and of
  ``status``), PUT and DELETE, with no controller behind them (a test plays the operator).
- policy/v1 PodDisruptionBudgets (list, get, create; ``status`` computed on read from the pods the selector
  matches: bound, not terminating pods count as healthy) and the ``pods/{name}/eviction`` subresource:
  ``201`` and the pod deleted when every PDB covering it allows a disruption, ``429 TooManyRequests`` when one
  does not, ``404`` when the pod is gone. A pod owned by a ReplicaSet is replaced by a new pending pod, as its
  controller would.

Fault injection (:class:`Fault`): 500s, 409s, a response lost after the write was applied, slow responses, a
watch stream cut in the middle of an event, a ``410 Gone`` watch, and the bind target node deleted between
the scheduler's decision and the binding.

Run it standalone (``python -m cluster.kube_emulator --nodes 100``) to try ``joulesched serve`` by hand.
"""

from __future__ import annotations

import argparse
import bisect
import fnmatch
import json
import random
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

LEASE_PREFIX = "/apis/coordination.k8s.io/v1"
POLICY_PREFIX = "/apis/policy/v1"


def _resources(group_version: str, rows: list[tuple[str, str, bool, list[str]]]) -> dict:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [{"name": n, "singularName": "", "namespaced": ns, "kind": k, "verbs": v}
                          for n, k, ns, v in rows]}


_RW = ["create", "delete", "get", "list", "patch", "update", "watch"]
#: Stored and served with no semantics of their own: group/version -> [(plural, kind, namespaced)]. A grouped
#: resource is stored as ``PLURAL.GROUP`` (``jobs.bmc.tinkerbell.org``), a core one as ``PLURAL``.
GENERIC = {
    "v1": [("namespaces", "Namespace", False), ("serviceaccounts", "ServiceAccount", True),
           ("configmaps", "ConfigMap", True), ("secrets", "Secret", True), ("services", "Service", True),
           ("persistentvolumes", "PersistentVolume", False),
           ("persistentvolumeclaims", "PersistentVolumeClaim", True)],
    "apps/v1": [("deployments", "Deployment", True), ("daemonsets", "DaemonSet", True)],
    "rbac.authorization.k8s.io/v1": [("clusterroles", "ClusterRole", False),
                                     ("clusterrolebindings", "ClusterRoleBinding", False),
                                     ("roles", "Role", True), ("rolebindings", "RoleBinding", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
    "admissionregistration.k8s.io/v1": [("validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
                                        ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
                                         False)],
    "metal3.io/v1alpha1": [("baremetalhosts", "BareMetalHost", True)],
    "bmc.tinkerbell.org/v1alpha1": [("machines", "Machine", True), ("jobs", "Job", True), ("tasks", "Task", True)],
}


def generic_key(group_version: str, plural: str) -> str:
    """The store's name of a :data:`GENERIC` resource."""
    return f"{plural}.{group_version.split('/')[0]}" if "/" in group_version else plural


#: store name -> (group/version, kind, namespaced)
GENERIC_RESOURCES = {generic_key(gv, p): (gv, k, ns) for gv, rows in GENERIC.items() for p, k, ns in rows}
#: Discovery documents (what ``kubectl`` reads before any request) for the resources the emulator serves.
DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}}
        for g in ("coordination.k8s.io", "policy")] + [
        {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
         "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}} for gv in GENERIC if "/" in gv]},
    "/api/v1": _resources("v1", [("nodes", "Node", False, _RW), ("pods", "Pod", True, _RW),
                                 ("pods/binding", "Binding", True, ["create"]),
                                 ("pods/eviction", "Eviction", True, ["create"]),
                                 ("pods/status", "Pod", True, ["get", "patch"]), ("events", "Event", True, _RW)]
                         + [(p, k, ns, _RW) for p, k, ns in GENERIC["v1"]]),
    LEASE_PREFIX: _resources("coordination.k8s.io/v1", [("leases", "Lease", True, _RW)]),
    POLICY_PREFIX: _resources("policy/v1", [("poddisruptionbudgets", "PodDisruptionBudget", True,
                                             ["create", "get", "list", "watch"])]),
    **{f"/apis/{gv}": _resources(gv, [(p, k, ns, _RW) for p, k, ns in rows]) for gv, rows in GENERIC.items()
       if "/" in gv},
}


def now_rfc3339(micro: bool = False) -> str:
    t = datetime.now(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if micro else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _copy(o: Any) -> Any:
    """A deep copy of a JSON tree (dicts, lists, scalars): what every stored object is, at a few times the
    speed of ``copy.deepcopy``. Stored objects are never changed in place once committed (a write stores a new
    object), so readers serialise them without copying."""
    if type(o) is dict:
        return {k: _copy(v) for k, v in o.items()}
    if type(o) is list:
        return [_copy(v) for v in o]
    return o


def status_body(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success" if code < 400 else "Failure",
            "message": message, "reason": reason, "code": code}


# ---- objects ----------------------------------------------------------------------------------------------
def make_node(name: str, cpu: str = "4", memory: str = "8Gi", pods: str = "110", *,
              labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
              unschedulable: bool = False) -> dict:
    """A v1 Node with the given allocatable (quantities as Kubernetes writes them: ``"4"``, ``"8Gi"``)."""
    res = {"cpu": cpu, "memory": memory, "pods": pods}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                         "annotations": dict(annotations or {})},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"capacity": dict(res), "allocatable": dict(res),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def make_pod(name: str, namespace: str = "default", *, cpu: str | None = None, memory: str | None = None,
             scheduler_name: str = "joulesched", node_name: str = "", containers: int = 1,
             labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             owner: str = "", volumes: list[dict] | None = None, node_selector: dict[str, str] | None = None,
             affinity: dict | None = None, tolerations: list[dict] | None = None) -> dict:
    """A pending v1 Pod; ``cpu``/``memory`` are per-container requests (None = no request). ``owner`` is the
    kind of its controller (``ReplicaSet``, ``DaemonSet``, ``Job``, ...; "" = none); ``node_selector``,
    ``affinity`` and ``tolerations`` go to its spec as given."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [{"name": f"c{k}", "image": "registry.invalid/pause:3.9",
                        "resources": {"requests": dict(requests)} if requests else {}} for k in range(containers)]}
    if node_name:
        spec["nodeName"] = node_name
    if volumes:
        spec["volumes"] = list(volumes)
    for key, v in (("nodeSelector", node_selector), ("affinity", affinity), ("tolerations", tolerations)):
        if v:
            spec[key] = _copy(v)
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner",
                                    "uid": f"owner-{name}", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


# ---- faults -----------------------------------------------------------------------------------------------
FAULT_KINDS = ("500", "403", "409", "lost-response", "slow", "cut", "gone", "delete-node")


@dataclass
class Fault:
    """One injected fault.

    :param kind: ``500`` (answer 500 before doing anything), ``403`` (answer Forbidden, as RBAC does when a
        verb is not granted), ``409`` (answer Conflict before doing anything),
        ``lost-response`` (apply the write, then answer 500: the client cannot know it succeeded), ``slow``
        (sleep ``delay_s`` then serve), ``cut`` (watch: send half an event then drop the connection; other
        requests: drop the connection without answering), ``gone`` (watch: answer a 410 Gone ERROR event),
        ``delete-node`` (bind: delete the target node, then apply the binding, as when a node disappears
        between scoring and binding).
    :param op: glob over operation names: ``list:nodes``, ``watch:pods``, ``get:pods``, ``bind``,
        ``patch-status:pods``, ``create:events``, ``get:leases``, ``create:leases``, ``update:leases``, ...
    :param times: how many times it fires (-1 = forever).
    :param probability: chance to fire on each matching request (drawn from the emulator's seeded generator).
    """

    kind: str
    op: str
    times: int = 1
    probability: float = 1.0
    delay_s: float = 0.0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(FAULT_KINDS)}")


class FaultInjector:
    def __init__(self, seed: int = 0) -> None:
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.log: list[tuple[str, str]] = []  # (kind, op) of every fault that fired

    def add(self, kind: str, op: str, times: int = 1, probability: float = 1.0, delay_s: float = 0.0) -> Fault:
        f = Fault(kind, op, times, probability, delay_s)
        with self._lock:
            self._faults.append(f)
        return f

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, op: str, kinds: Iterable[str]) -> Fault | None:
        """The first armed fault of one of ``kinds`` matching ``op`` that decides to fire, consumed."""
        with self._lock:
            for f in self._faults:
                if f.kind in kinds and f.times != 0 and fnmatch.fnmatchcase(op, f.op):
                    if f.probability < 1.0 and self._rng.random() >= f.probability:
                        continue
                    if f.times > 0:
                        f.times -= 1
                    f.fired += 1
                    self.log.append((f.kind, op))
                    return f
        return None


# ---- field selectors --------------------------------------------------------------------------------------
def _field(obj: dict, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def parse_field_selector(sel: str | None) -> list[tuple[str, bool, str]]:
    """``a=b,c!=d`` into [(path, equal, value)]."""
    out = []
    for term in filter(None, (sel or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            out.append((k.strip(), False, v.strip()))
        elif "==" in term:
            k, v = term.split("==", 1)
            out.append((k.strip(), True, v.strip()))
        elif "=" in term:
            k, v = term.split("=", 1)
            out.append((k.strip(), True, v.strip()))
        else:
            raise ValueError(f"invalid field selector term {term!r}")
    return out


def matches(obj: dict | None, sel: list[tuple[str, bool, str]]) -> bool:
    if obj is None:
        return False
    return all((_field(obj, k) == v) == eq for k, eq, v in sel)


def _merge(dst: dict, patch: dict, strategic: bool) -> dict:
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v, strategic)
        elif strategic and k == "conditions" and isinstance(v, list) and isinstance(dst.get(k), list):
            by_type = {c.get("type"): c for c in dst[k]}
            for c in v:
                if c.get("type") in by_type:
                    by_type[c["type"]].update(c)
                else:
                    dst[k].append(c)
                    by_type[c.get("type")] = c
        else:
            dst[k] = _copy(v)
    return dst


class _Cut(Exception):
    """Drop the connection without an answer."""


# ---- the store --------------------------------------------------------------------------------------------
class KubeEmulator:
    """The emulated apiserver. Use as a context manager, or ``start()`` / ``stop()``.

    Direct methods (``add_node``, ``add_pod``, ``delete_node``, ...) change the store as a controller or
    kubectl would and produce watch events like HTTP writes do. ``bindings`` records every accepted binding
    (namespace, name, uid, node, time), ``bind_requests`` counts binding POSTs that reached the store.

    :param history: watch events kept; a watch from an older resourceVersion gets 410 Gone.
    :param seed: seeds the fault injector's generator.
    :param event_ttl_s: Events are deleted this long after they were created (kube-apiserver's ``--event-ttl``,
        1 h by default; measured from creation here, not from the last update).
    :param idle_timeout_s: a keep-alive connection that brings no new request for this long is closed
        (kube-apiserver's IdleTimeout: 90 s); None: kept open.

    :meth:`grant` turns RBAC on: from then on a request no granted rule allows is answered 403 and recorded in
    ``denied``.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, history: int = 100_000, seed: int = 0,
                 event_ttl_s: float = 3600.0, idle_timeout_s: float | None = None) -> None:
        self.host, self._port = host, port
        self.idle_timeout_s = idle_timeout_s
        self._rbac: list[tuple[str, dict]] | None = None  # (namespace, rule); "" = cluster-wide; None = off
        self.denied: list[tuple[str, str, str, str]] = []  # (verb, API group, resource[/subresource], name)
        self.history = history
        self.event_ttl_s = event_ttl_s
        self._event_times: deque[tuple[float, tuple[str, str]]] = deque()  # (created, key), oldest first
        self.faults = FaultInjector(seed)
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._rv = 1
        self._store: dict[str, dict[tuple[str, str], dict]] = {"nodes": {}, "pods": {}, "events": {}, "leases": {},
                                                             "poddisruptionbudgets": {},
                                                             **{r: {} for r in GENERIC_RESOURCES}}
        # One condition per resource on the store's lock: a write wakes only the watches of its resource (a
        # binding does not wake the node watches; an Event, usually none).
        self._watch_cv = {r: threading.Condition(self._mutex) for r in self._store}
        self._log: list[tuple[int, str, str, dict | None, dict | None]] = []  # (rv, resource, type, old, new)
        self._log_base = 2  # rv of _log[0]
        self._min_watch_rv = 1
        self.bindings: list[tuple[str, str, str, str, float]] = []
        self.bind_requests = 0
        self._bind_times: dict[str, list[float]] = {}  # namespace ("" = all) -> monotonic times of bindings
        self.conflicts: list[tuple[str, str]] = []  # bindings refused because the pod was already assigned
        self.deleted_nodes: dict[str, float] = {}
        self.evictions: list[tuple[str, str, int, float]] = []  # (namespace, pod, HTTP code, monotonic time)
        self.node_patches: list[tuple[str, dict, float]] = []  # (node, patch, monotonic time) of every node PATCH
        #: HTTP requests by operation (``list:nodes``, ``watch:pods``, ``get:leases``, ``bind``...), counted as they
        #: arrive: what a test asks of a client's traffic (how many lists and watches it opens, say).
        self.requests: Counter[str] = Counter()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._conns: set[socket.socket] = set()
        self._watch_conns: set[socket.socket] = set()
        self._conn_lock = threading.Lock()

    def grant(self, rules: Iterable[dict], namespace: str = "") -> None:
        """Enforce RBAC with these rules added (a Role's in ``namespace``, a ClusterRole's without): ``apiGroups``,
        ``resources`` (``pods/binding``), ``verbs`` and ``resourceNames`` as kube's authorizer matches them
        (a rule with resourceNames never allows create or list)."""
        with self._mutex:
            self._rbac = [*(self._rbac or []), *((namespace, dict(r)) for r in rules)]

    def allowed(self, verb: str, group: str, resource: str, namespace: str, name: str) -> bool:
        """RBAC is off, or a granted rule allows the request."""
        with self._mutex:
            rbac = self._rbac
        return rbac is None or any(
            (not ns or ns == namespace) and {group, "*"} & set(r.get("apiGroups") or ())
            and {resource, "*"} & set(r.get("resources") or ()) and {verb, "*"} & set(r.get("verbs") or ())
            and (not r.get("resourceNames") or name in r["resourceNames"]) for ns, r in rbac)

    # ---- lifecycle ----
    def start(self) -> "KubeEmulator":
        emu = self

        class Handler(_Handler):
            emulator = emu
            timeout = emu.idle_timeout_s  # socketserver's: a read that waits longer ends the connection

        class Server(ThreadingHTTPServer):
            daemon_threads = False
            block_on_close = True
            request_queue_size = 128

        self._server = Server((self.host, self._port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kube-emulator", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "emulator not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop serving, end every watch and keep-alive connection, and join all handler threads."""
        if self._server is None:
            return
        self._stopping = True
        self._notify_watches()
        self._server.shutdown()
        with self._conn_lock:
            conns = list(self._conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join(5)
        self._server = None

    def __enter__(self) -> "KubeEmulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig pointing at this emulator (plain HTTP on loopback: no TLS, no credentials)."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "emulator",
               "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
               "users": [{"name": "emulator", "user": {}}],
               "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}]}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        return path

    # ---- store primitives (callers hold no lock) ----
    def _commit(self, resource: str, key: tuple[str, str], new: dict | None, etype: str | None = None) -> dict | None:
        """Write ``new`` (None deletes) under a fresh resourceVersion and log the watch event. Lock held."""
        store = self._store[resource]
        old = store.get(key)
        if new is None and old is None:
            return None  # nothing to delete: no new version (watch cursors rely on versions being contiguous)
        self._rv += 1
        if new is None:
            gone = _copy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            del store[key]
            self._log.append((self._rv, resource, "DELETED", old, gone))
            result = gone
        else:
            new["metadata"]["resourceVersion"] = str(self._rv)
            store[key] = new
            self._log.append((self._rv, resource, etype or ("ADDED" if old is None else "MODIFIED"), old, new))
            result = new
        if len(self._log) > self.history:
            drop = len(self._log) - self.history
            del self._log[:drop]
            self._log_base += drop
            self._min_watch_rv = self._log_base - 1
        self._watch_cv[resource].notify_all()
        return result

    def _notify_watches(self) -> None:
        with self._lock:
            for cv in self._watch_cv.values():
                cv.notify_all()

    def drop_watches(self) -> int:
        """Cut every open watch connection (as an apiserver restart or a load balancer would); returns how many."""
        with self._conn_lock:
            conns = list(self._watch_conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(conns)

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: every running or new watch older than now gets 410."""
        with self._lock:
            self._log_base += len(self._log)
            self._log.clear()
            self._min_watch_rv = self._rv
        self._notify_watches()

    @property
    def resource_version(self) -> int:
        return self._rv

    def _create(self, resource: str, obj: dict, namespace: str = "", *, copy_result: bool = True) -> dict:
        meta = obj.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        generated = not meta.get("name") and bool(meta.get("generateName"))
        if not meta.get("name") and not generated:
            raise _ApiError(422, "Invalid", "metadata.name: Required value")
        with self._lock:
            for _ in range(8):  # a generated name that is taken is drawn again, as the apiserver retries it
                if generated:
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                key = (meta.get("namespace", ""), meta["name"])
                if not generated or key not in self._store[resource]:
                    break
            if key in self._store[resource]:
                raise _ApiError(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists')
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if resource == "pods":
                obj.setdefault("spec", {}).setdefault("schedulerName", "default-scheduler")
                obj.setdefault("status", {}).setdefault("phase", "Pending")
            new = self._commit(resource, key, obj)
            if resource == "events":
                self._expire_events(key)
            return _copy(new) if copy_result else new

    def _expire_events(self, key: tuple[str, str]) -> None:
        """Delete the Events older than ``event_ttl_s`` (kube-apiserver's ``--event-ttl``: etcd drops them then);
        lock held."""
        now = time.monotonic()
        self._event_times.append((now, key))
        while self._event_times and now - self._event_times[0][0] > self.event_ttl_s:
            _, old = self._event_times.popleft()
            if old in self._store["events"]:
                self._commit("events", old, None)

    # ---- direct API for tests ----
    def add_node(self, name: str, cpu: str = "4", memory: str = "8Gi", pods: str = "110", **kw: Any) -> dict:
        return self._create("nodes", make_node(name, cpu, memory, pods, **kw))

    def delete_node(self, name: str) -> None:
        with self._lock:
            if self._commit("nodes", ("", name), None) is not None:
                self.deleted_nodes[name] = time.monotonic()

    def add_pod(self, name: str, namespace: str = "default", **kw: Any) -> dict:
        """A pod (:func:`make_pod`). With ``owner="DaemonSet"`` as the DaemonSet controller makes one: its
        DaemonSet (``<name>-owner``) is created too, the pod carries its selector's label and its uid."""
        pod = make_pod(name, namespace, **kw)
        if kw.get("owner") == "DaemonSet":
            ds_name = f"{name}-owner"
            sel = {"joulesched.test/daemonset": ds_name}
            ds = self.get("daemonsets.apps", ds_name, namespace) or self._create(
                "daemonsets.apps", {"apiVersion": "apps/v1", "kind": "DaemonSet",
                                    "metadata": {"name": ds_name, "namespace": namespace},
                                    "spec": {"selector": {"matchLabels": dict(sel)},
                                             "template": {"metadata": {"labels": dict(sel)}}}})
            pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **sel}
            pod["metadata"]["ownerReferences"][0]["uid"] = ds["metadata"]["uid"]
        return self._create("pods", pod)

    def add_object(self, resource: str, obj: dict, namespace: str = "") -> dict:
        """Create an object of any stored resource (``baremetalhosts.metal3.io``, ``configmaps``...) as its
        controller or kubectl would."""
        return self._create(resource, _copy(obj), namespace)

    def renew_node_lease(self, name: str) -> None:
        """What a live kubelet does every 10 s: renew its Lease ``kube-node-lease/<name>`` (created on first use)."""
        with self._lock:
            key = ("kube-node-lease", name)
            lease = _copy(self._store["leases"].get(key))
            spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_rfc3339(micro=True)}
            if lease is None:
                self._create("leases", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                        "metadata": {"name": name}, "spec": spec}, "kube-node-lease")
            else:
                lease["spec"] = spec
                self._commit("leases", key, lease)

    def set_node_ready(self, name: str, ready: bool) -> None:
        """What the node's kubelet (or its absence) reports: Ready True, or Unknown once it stops posting."""
        with self._lock:
            node = _copy(self._store["nodes"][("", name)])
            conds = [c for c in node["status"].get("conditions", []) if c.get("type") != "Ready"]
            conds.append({"type": "Ready", "status": "True" if ready else "Unknown",
                          "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                          "lastTransitionTime": now_rfc3339()})
            node["status"]["conditions"] = conds
            self._commit("nodes", ("", name), node)

    def add_pdb(self, name: str, namespace: str = "default", *, match_labels: dict[str, str],
                min_available: int | str | None = None, max_unavailable: int | str | None = None) -> dict:
        """A policy/v1 PodDisruptionBudget over the pods with ``match_labels``."""
        spec: dict[str, Any] = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        return self._create("poddisruptionbudgets", {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                                     "metadata": {"name": name}, "spec": spec}, namespace)

    def _pdb_status(self, pdb: dict) -> dict:
        """The disruption controller's status for ``pdb`` now (lock held)."""
        ns = pdb["metadata"].get("namespace", "")
        sel = (pdb.get("spec") or {}).get("selector", {}).get("matchLabels") or {}
        pods = [p for (pns, _), p in self._store["pods"].items() if pns == ns
                and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
        healthy = sum(1 for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                      and p["status"].get("phase") not in ("Succeeded", "Failed"))
        expected = len(pods)

        def count(v: int | str) -> int:
            if isinstance(v, str) and v.endswith("%"):
                return -(-int(v[:-1]) * expected // 100)  # rounded up, as the disruption controller does
            return int(v)

        spec = pdb.get("spec") or {}
        if "maxUnavailable" in spec:
            desired = max(0, expected - count(spec["maxUnavailable"]))
        else:
            desired = count(spec.get("minAvailable", 1))
        return {"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                "disruptionsAllowed": max(0, healthy - desired), "observedGeneration": 1}

    def evict(self, namespace: str, name: str, body: dict) -> dict:
        """The Eviction subresource: 429 while a PDB covering the pod allows no disruption, else delete it."""
        with self._lock:
            pod = self._store["pods"].get((namespace, name))
            if pod is None:
                self.evictions.append((namespace, name, 404, time.monotonic()))
                raise _ApiError(404, "NotFound", f'pods "{name}" not found')
            want = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
            if want and want != pod["metadata"]["uid"]:
                raise _ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {want}")
            labels = pod["metadata"].get("labels") or {}
            for (pns, _), pdb in self._store["poddisruptionbudgets"].items():
                sel = (pdb.get("spec") or {}).get("selector", {}).get("matchLabels") or {}
                if pns == namespace and all(labels.get(k) == v for k, v in sel.items()):
                    if self._pdb_status(pdb)["disruptionsAllowed"] <= 0:
                        self.evictions.append((namespace, name, 429, time.monotonic()))
                        raise _ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                        "disruption budget.")
            # As the apiserver does (PodDisruptionConditions, GA in 1.31): the DisruptionTarget condition first,
            # seen by watchers as an update, then the deletion.
            marked = _copy(pod)
            marked.setdefault("status", {}).setdefault("conditions", []).append(
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                 "message": "Eviction API: evicting"})
            self._commit("pods", (namespace, name), marked)
            self._commit("pods", (namespace, name), None)
            self.evictions.append((namespace, name, 201, time.monotonic()))
            owners = pod["metadata"].get("ownerReferences") or []
            if any(o.get("kind") == "ReplicaSet" for o in owners):  # its controller makes a replacement
                new = _copy(pod)
                new["metadata"] = {k: v for k, v in pod["metadata"].items()
                                   if k in ("namespace", "labels", "annotations", "ownerReferences")}
                new["metadata"]["name"] = f"{name.rsplit('-r', 1)[0]}-r{uuid.uuid4().hex[:5]}"
                new["spec"].pop("nodeName", None)
                new["status"] = {"phase": "Pending"}
                self._create("pods", new, namespace)
        return status_body(201, "", "")

    def patch(self, resource: str, namespace: str, name: str, patch: dict) -> dict:
        """A JSON merge patch (RFC 7386) of the object; ``metadata.resourceVersion`` in it is a precondition."""
        with self._lock:
            obj = self._store[resource].get((namespace, name))
            if obj is None:
                raise _ApiError(404, "NotFound", f'{resource} "{name}" not found')
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv and rv != obj["metadata"]["resourceVersion"]:
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object '
                                "has been modified; please apply your changes to the latest version and try again")
            obj = _copy(obj)
            _merge(obj, _copy(patch), strategic=False)
            if resource == "nodes":
                self.node_patches.append((name, _copy(patch), time.monotonic()))
            return _copy(self._commit(resource, (namespace, name), obj))

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._commit("pods", (namespace, name), None)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        with self._lock:
            pod = _copy(self._store["pods"][(namespace, name)])
            pod["status"]["phase"] = phase
            self._commit("pods", (namespace, name), pod)

    def get(self, resource: str, name: str, namespace: str = "") -> dict | None:
        with self._lock:
            obj = self._store[resource].get((namespace, name))
            return _copy(obj) if obj is not None else None

    def stats(self) -> dict:
        """Counts for checks from another process: bindings, pods bound more than once, pending pods, faults."""
        with self._lock:
            names = Counter((b[0], b[1]) for b in self.bindings)
            pods = self._store["pods"].values()
            return {"bindings": len(self.bindings), "pods_bound_twice": sum(1 for c in names.values() if c > 1),
                    "pods": len(pods), "pending": sum(1 for p in pods if not p["spec"].get("nodeName")),
                    "bound": sum(1 for p in pods if p["spec"].get("nodeName")), "conflicts": len(self.conflicts),
                    "bind_requests": self.bind_requests,
                    "first_binding": self.bindings[0][4] if self.bindings else None,
                    "last_binding": self.bindings[-1][4] if self.bindings else None,
                    "faults": dict(Counter(f"{k} {op}" for k, op in self.faults.log))}

    def binding_times(self, namespace: str = "", since: int = 0) -> dict:
        """Monotonic times of the accepted bindings (of pods in ``namespace``, or all), from the ``since``-th on:
        ``{"count": total, "times": [...]}``. Cheap to poll: no pod is looked at."""
        with self._lock:
            times = self._bind_times.setdefault(namespace, [])
            return {"count": len(times), "times": times[since:]}

    def list(self, resource: str) -> list[dict]:
        with self._lock:
            return [_copy(o) for o in self._store[resource].values()]

    def changes(self, resource: str) -> list[tuple[str, dict]]:
        """The watch events of ``resource`` still in the history, oldest first: what a watch from the oldest
        kept version would replay (``(type, object)``; each write of an object is one entry)."""
        with self._lock:
            return [(etype, _copy(new)) for _rv, res, etype, _old, new in self._log if res == resource]

    # ---- request-level operations (called by the handler) ----
    def bind(self, namespace: str, name: str, body: dict, fault: Fault | None) -> dict:
        target = ((body.get("target") or {}).get("name")) or ""
        if not target:
            raise _ApiError(422, "Invalid", "target.name: Required value")
        if fault is not None and fault.kind == "delete-node":
            self.delete_node(target)
        with self._lock:
            self.bind_requests += 1
            pod = self._store["pods"].get((namespace, name))
            if pod is None:
                raise _ApiError(404, "NotFound", f'pods "{name}" not found')
            want_uid = (body.get("metadata") or {}).get("uid")
            if want_uid and want_uid != pod["metadata"]["uid"]:
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                                f'Precondition failed: UID in precondition: {want_uid}, UID in object meta: '
                                f'{pod["metadata"]["uid"]}')
            if pod["spec"].get("nodeName"):
                self.conflicts.append((namespace, name))
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod '
                                f'{name} is already assigned to node "{pod["spec"]["nodeName"]}"')
            if pod["metadata"].get("deletionTimestamp"):
                raise _ApiError(409, "Conflict", f'pod {name} is being deleted, cannot be assigned to a host')
            if pod["spec"].get("schedulingGates"):  # a scheduling-gated pod is not ready to be scheduled
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod '
                                f'{name} has non-empty .spec.schedulingGates')
            # Copy on write of what changes (metadata gets the new resourceVersion); the rest is shared with
            # the old version, which nothing changes in place.
            pod = {**pod, "metadata": dict(pod["metadata"]), "spec": {**pod["spec"], "nodeName": target},
                   "status": dict(pod["status"])}
            conds = [c for c in pod["status"].get("conditions", []) if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now_rfc3339()})
            pod["status"]["conditions"] = conds
            self._commit("pods", (namespace, name), pod)
            t = time.monotonic()
            self.bindings.append((namespace, name, pod["metadata"]["uid"], target, t))
            self._bind_times.setdefault("", []).append(t)
            self._bind_times.setdefault(namespace, []).append(t)
        return status_body(201, "", "")

    def patch_status(self, resource: str, namespace: str, name: str, patch: dict, strategic: bool) -> dict:
        with self._lock:
            obj = self._store[resource].get((namespace, name))
            if obj is None:
                raise _ApiError(404, "NotFound", f'{resource} "{name}" not found')
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv and rv != obj["metadata"]["resourceVersion"]:  # a precondition, as on the main resource
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object '
                                "has been modified; please apply your changes to the latest version and try again")
            uid = (patch.get("metadata") or {}).get("uid")
            if uid and uid != obj["metadata"]["uid"]:  # a uid may not change: the patch names another object
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": '
                                f'Precondition failed: UID in precondition: {uid}, UID in object meta: '
                                f'{obj["metadata"]["uid"]}')
            obj = _copy(obj)
            if "status" in patch:
                obj.setdefault("status", {})
                _merge(obj["status"], patch["status"] or {}, strategic)
            return _copy(self._commit(resource, (namespace, name), obj))

    def replace(self, resource: str, namespace: str, name: str, body: dict) -> dict:
        with self._lock:
            old = self._store[resource].get((namespace, name))
            if old is None:
                raise _ApiError(404, "NotFound", f'{resource} "{name}" not found')
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object '
                                "has been modified; please apply your changes to the latest version and try again")
            body = _copy(body)
            meta = body.setdefault("metadata", {})
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            meta["namespace"], meta["name"] = namespace, name
            return _copy(self._commit(resource, (namespace, name), body))

    def delete(self, resource: str, namespace: str, name: str) -> dict:
        with self._lock:
            gone = self._commit(resource, (namespace, name), None)
            if gone is None:
                raise _ApiError(404, "NotFound", f'{resource} "{name}" not found')
            if resource == "nodes":
                self.deleted_nodes[name] = time.monotonic()
            return _copy(gone)

    def list_objects(self, resource: str, namespace: str, sel: list) -> dict:
        with self._lock:
            items = [o for (ns, _), o in self._store[resource].items()
                     if (not namespace or ns == namespace) and matches(o, sel)]
            rv = str(self._rv)
        if resource in GENERIC_RESOURCES:
            gv, kind, _ = GENERIC_RESOURCES[resource]
            return {"kind": f"{kind}List", "apiVersion": gv, "metadata": {"resourceVersion": rv}, "items": items}
        kind = {"nodes": "NodeList", "pods": "PodList", "events": "EventList", "leases": "LeaseList",
                "poddisruptionbudgets": "PodDisruptionBudgetList"}[resource]
        if resource == "poddisruptionbudgets":
            with self._lock:
                items = [{**o, "status": self._pdb_status(o)} for o in items]
        return {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}


class _Headers(dict):
    """Request headers by lower-cased name; ``get`` and ``[]`` take any case (``[]`` is None when missing, as
    on ``email.message.Message``)."""

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> Any:
        return dict.get(self, key.lower())


class _ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# ---- HTTP ---------------------------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    emulator: KubeEmulator
    protocol_version = "HTTP/1.1"
    server_version = "joulesched-kube-emulator/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def parse_request(self) -> bool:
        """HTTP/1.x request line and headers, as BaseHTTPRequestHandler's, without the ``email`` parser it
        uses for headers (which cost the emulator more than everything else a binding does)."""
        self.command, self.request_version, self.close_connection = None, "HTTP/0.9", True
        self.requestline = line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if not words:
            return False
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(400, f"Bad request syntax ({line!r})")
            return False
        self.command, self.path, self.request_version = words
        if self.path.startswith("//"):
            self.path = "/" + self.path.lstrip("/")
        headers = _Headers()
        for _ in range(101):
            h = self.rfile.readline(65537)
            if len(h) > 65536:
                self.send_error(431, "Line too long")
                return False
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("iso-8859-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        else:
            self.send_error(431, "Too many headers")
            return False
        self.headers = headers  # type: ignore[assignment]
        conn = headers.get("Connection", "").lower()
        self.close_connection = conn == "close" or (self.request_version == "HTTP/1.0" and conn != "keep-alive")
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the client went away (or stop() shut the socket): nothing to answer
            self.close_connection = True

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.emulator._conn_lock:
            self.emulator._conns.add(self.connection)

    def finish(self) -> None:
        with self.emulator._conn_lock:
            self.emulator._conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # -- plumbing --
    def _send_json(self, code: int, body: dict) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:  # the client asked (or spoke HTTP/1.0): say so, as Go's net/http does
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _ApiError(400, "BadRequest", f"invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise _ApiError(400, "BadRequest", "body must be a JSON object")
        return body

    def _cut(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- routing --
    def _route(self, method: str, path: str) -> tuple[str, str, str, str, str]:
        """(op verb, resource, namespace, name, subresource) for a path."""
        parts = [p for p in path.split("/") if p]
        group_version = "/".join(parts[1:3]) if parts[:1] == ["apis"] else "v1"
        generic = {generic_key(group_version, p) for p, _, _ in GENERIC.get(group_version, ())}
        if parts[:1] == ["apis"] and generic:
            rest = parts[3:]
            resource_group = True
        elif path.startswith(LEASE_PREFIX + "/") or path.startswith(POLICY_PREFIX + "/"):
            rest = parts[3:]
            resource_group = True
        elif parts[:2] == ["api", "v1"]:
            rest = parts[2:]
            resource_group = False
        else:
            raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns = ""
        if len(rest) >= 2 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        resource, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
        if generic_key(group_version, resource) in generic:
            resource = generic_key(group_version, resource)
            if GENERIC_RESOURCES[resource][2] != bool(ns) and not (method == "GET" and not name):
                raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return method, resource, ns, name, sub
        allowed = ({"leases"} if path.startswith(LEASE_PREFIX) else {"poddisruptionbudgets"}) if resource_group \
            else {"nodes", "pods", "events"}
        if resource not in allowed:
            raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return method, resource, ns, name, sub

    def _dispatch(self, method: str) -> None:
        emu = self.emulator
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if url.path == "/version":
                self._send_json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-joulesched-emulator"})
                return
            if method == "GET" and url.path.rstrip("/") in DISCOVERY:  # kubectl's discovery
                self._send_json(200, DISCOVERY[url.path.rstrip("/")])
                return
            if url.path == "/emulator/stats":  # not Kubernetes: lets a bench in another process check the store
                self._send_json(200, emu.stats())
                return
            if url.path == "/emulator/bindings":  # not Kubernetes: binding times, for throughput benches
                self._send_json(200, emu.binding_times(q.get("namespace", ""), int(q.get("since") or 0)))
                return
            if url.path in ("/healthz", "/readyz", "/livez"):
                data = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(data)
                return
            method, resource, ns, name, sub = self._route(method, url.path)
            watch = method == "GET" and not name and q.get("watch") in ("true", "1")
            verb = {"GET": "watch" if watch else ("get" if name else "list"), "POST": "create", "PUT": "update",
                    "PATCH": "patch", "DELETE": "delete"}[method]
            if sub == "binding" and method == "POST":
                op = "bind"
            elif sub:
                op = f"{verb}-{sub}:{resource}"
            else:
                op = f"{verb}:{resource}"
            with emu._mutex:
                emu.requests[op] += 1
            body = self._body() if method in ("POST", "PUT", "PATCH") else {}
            group = url.path.split("/")[2] if url.path.startswith("/apis/") else ""
            rbac_res = resource.split(".")[0] + (f"/{sub}" if sub else "")
            if not emu.allowed(verb, group, rbac_res, ns, name):
                with emu._mutex:
                    emu.denied.append((verb, group, rbac_res, name))
                where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
                raise _ApiError(403, "Forbidden", f'{rbac_res} "{name}" is forbidden: User "system:serviceaccount:'
                                f'joulesched:joulesched" cannot {verb} resource "{rbac_res}" in API group "{group}"'
                                f'{where}')
            f = emu.faults.take(op, ("slow",))
            if f is not None:
                time.sleep(f.delay_s)
            f = emu.faults.take(op, ("500", "403", "409", "cut", "gone", "lost-response", "delete-node"))
            if f is not None and f.kind == "500":
                raise _ApiError(500, "InternalError", "Internal error occurred: injected fault")
            if f is not None and f.kind == "403":
                raise _ApiError(403, "Forbidden", f'{resource} "{name}" is forbidden: User '
                                '"system:serviceaccount:joulesched:joulesched" cannot ' + op + ': injected fault')
            if f is not None and f.kind == "409":
                raise _ApiError(409, "Conflict", f"Operation cannot be fulfilled on {resource} \"{name}\": "
                                "injected conflict")
            if f is not None and f.kind == "cut" and not watch:
                raise _Cut()
            if watch:
                self._watch(resource, ns, q, f)
                return
            result, code = self._do(op, method, resource, ns, name, sub, body, q, f)
            if f is not None and f.kind == "lost-response":
                raise _ApiError(500, "InternalError", "Internal error occurred: injected fault after commit")
            self._send_json(code, result)
        except _Cut:
            self._cut()
        except _ApiError as e:
            self._send_json(e.code, status_body(e.code, e.reason, e.message))
        except ValueError as e:
            self._send_json(400, status_body(400, "BadRequest", str(e)))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _do(self, op: str, method: str, resource: str, ns: str, name: str, sub: str, body: dict, q: dict,
            fault: Fault | None) -> tuple[dict, int]:
        emu = self.emulator
        if op == "bind":
            return emu.bind(ns, name, body, fault), 201
        if method == "POST" and sub == "eviction" and resource == "pods":
            return emu.evict(ns, name, body), 201
        if method == "PATCH" and name and not sub and (resource in ("nodes", "pods", "events")
                                                       or resource in GENERIC_RESOURCES):
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype != "application/merge-patch+json":
                raise _ApiError(415, "UnsupportedMediaType", f"the emulator supports merge patches of {resource}, "
                                f"not {ctype}")
            return emu.patch(resource, ns, name, body), 200
        if method == "GET" and not name:
            return emu.list_objects(resource, ns, parse_field_selector(q.get("fieldSelector"))), 200
        if method == "GET":
            obj = emu.get(resource, name, ns)
            if obj is None:
                raise _ApiError(404, "NotFound", f'{resource} "{name}" not found')
            return obj, 200
        if method == "POST" and not name:
            if resource in ("pods", "events", "leases", "poddisruptionbudgets") and not ns:
                raise _ApiError(404, "NotFound", f"{resource} are namespaced")
            return emu._create(resource, body, ns, copy_result=False), 201
        if method == "PATCH" and sub == "status":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                raise _ApiError(415, "UnsupportedMediaType", f"the emulator does not support {ctype} patches")
            return emu.patch_status(resource, ns, name, body, ctype.startswith("application/strategic")), 200
        if method == "PUT" and name and not sub:
            return emu.replace(resource, ns, name, body), 200
        if method == "DELETE" and name and not sub:
            return emu.delete(resource, ns, name), 200
        raise _ApiError(405, "MethodNotAllowed", f"{method} {op} is not supported by the emulator")

    def _watch(self, resource: str, ns: str, q: dict, fault: Fault | None) -> None:
        emu = self.emulator
        sel = parse_field_selector(q.get("fieldSelector"))
        timeout = float(q.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        rv_param = q.get("resourceVersion") or ""
        with emu._conn_lock:
            emu._watch_conns.add(self.connection)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def line(etype: str, obj: dict) -> bytes:
            return json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"

        def gone(msg: str) -> None:  # the ERROR event ends the stream, as the apiserver does
            chunk(line("ERROR", status_body(410, "Expired", msg)))
            chunk(b"")

        try:
            if fault is not None and fault.kind == "gone":
                gone("too old resource version: injected fault")
                return
            with emu._lock:
                if rv_param in ("", "0"):
                    cursor = emu._rv
                    initial = [o for (ons, _), o in emu._store[resource].items()
                               if (not ns or ons == ns) and matches(o, sel)]
                else:
                    cursor = int(rv_param)
                    initial = []
                    if cursor < emu._min_watch_rv:
                        initial = None
            if initial is None:
                gone(f"too old resource version: {rv_param} ({emu._min_watch_rv})")
                return
            if initial:
                chunk(b"".join(line("ADDED", o) for o in initial))
            while not emu._stopping:
                with emu._lock:
                    while cursor >= emu._rv and not emu._stopping:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        emu._watch_cv[resource].wait(min(left, 0.5))
                    if emu._stopping or time.monotonic() >= deadline:
                        break
                    if cursor < emu._min_watch_rv:
                        expired = True
                        batch = []
                    else:
                        expired = False
                        start = bisect.bisect_right(emu._log, cursor, key=lambda entry: entry[0])
                        batch = emu._log[start:]
                        cursor = emu._rv
                if expired:
                    gone(f"too old resource version: {cursor} ({emu._min_watch_rv})")
                    return
                out = []
                for _rv, res, etype, old, new in batch:
                    if res != resource:
                        continue
                    obj_ns = (new or old or {}).get("metadata", {}).get("namespace", "")
                    if ns and obj_ns != ns:
                        continue
                    was, now = matches(old, sel), matches(new, sel) if etype != "DELETED" else False
                    if etype == "DELETED":
                        if was:
                            out.append(line("DELETED", new))
                    elif now and not was:
                        out.append(line("ADDED", new))
                    elif now and was:
                        out.append(line(etype, new))
                    elif was and not now:
                        out.append(line("DELETED", new))
                if out and fault is not None and fault.kind == "cut":
                    data = out[0]
                    chunk(data[: max(1, len(data) // 2)])
                    self._cut()
                    return
                if out:
                    chunk(b"".join(out))
            chunk(b"")  # end of stream: the zero-length chunk
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            with emu._conn_lock:
                emu._watch_conns.discard(self.connection)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Kubernetes API emulator for trying joulesched without a cluster.")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--pods", type=int, default=0, help="pending pods for scheduler 'joulesched'")
    ap.add_argument("--kubeconfig", default="", help="write a kubeconfig for the emulator here")
    ap.add_argument("--node-cpu", default="8")
    ap.add_argument("--node-memory", default="32Gi")
    ap.add_argument("--pod-cpu", default="500m")
    ap.add_argument("--pod-memory", default="512Mi")
    ap.add_argument("--fault", action="append", default=[], metavar="KIND:OP:PROBABILITY",
                    help="inject a fault forever with this probability, e.g. 500:bind:0.02 (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="do not print each binding (benchmarks)")
    ap.add_argument("--event-ttl", type=float, default=3600.0, help="seconds an Event is kept (--event-ttl)")
    a = ap.parse_args(argv)
    emu = KubeEmulator(port=a.port, seed=a.seed, event_ttl_s=a.event_ttl)
    for spec in a.fault:
        kind, rest = spec.split(":", 1)
        op, prob = rest.rsplit(":", 1)
        emu.faults.add(kind, op, times=-1, probability=float(prob), delay_s=0.05)
    emu.start()
    for i in range(a.nodes):
        emu.add_node(f"node-{i:04d}", cpu=a.node_cpu, memory=a.node_memory)
    for i in range(a.pods):
        emu.add_pod(f"pod-{i:05d}", cpu=a.pod_cpu, memory=a.pod_memory)
    if a.kubeconfig:
        emu.kubeconfig(a.kubeconfig)
    print(f"emulator on {emu.url} ({a.nodes} nodes, {a.pods} pending pods); Ctrl-C stops it", flush=True)
    import signal

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    shown = 0
    try:
        while not done.wait(0.5):
            # Every binding as it happens, so a first-time user sees the scheduler place pods.
            if not a.quiet:
                for b in emu.bindings[shown:]:
                    print(f"bound {b[0]}/{b[1]} to {b[3]}", flush=True)
                shown = len(emu.bindings)
    except KeyboardInterrupt:
        pass
    finally:
        emu.stop()


if __name__ == "__main__":
    main()
