"""`joulesched node-power`: the node power controller. It puts idle nodes to sleep, wakes them for pending pods,
and optionally consolidates, deciding with the same core the twin runs (:mod:`joulesched.cluster.nodepower`).

Each reconcile (on informer events, and every ``resync_s``), as leader only:

1. **wake**: pods pending that fit no awake node (or that our scheduler nominated for a sleeping node,
   ``status.nominatedNodeName``) wake the node the core chooses. Waking = the actuator's ``wake``, then wait
   for the node to turn ``Ready``, then remove the taint ``joulesched.io/asleep:NoSchedule`` and uncordon.
   A failed wake (actuator error, or not Ready within ``wake_timeout_s``) is reported and the node is left
   out for a backoff, so the next reconcile tries the next candidate.
2. **sleep**: a node with no workload pod (DaemonSet and mirror pods do not count) for ``sleep_after_s``, not
   protected (control plane, ``joulesched.io/never-sleep``, cordoned by someone else, no power address), that
   the core lets go (``min_awake``, ``spare_cpu_m``) is cordoned and tainted, annotated
   ``joulesched.io/power-state: sleeping``, checked empty once more with a fresh read, and handed to the
   actuator; then annotated ``asleep``. Any failure uncordons and untaints it, records a Warning Event, and
   retries after a doubling backoff.
3. **consolidate** (optional, every ``consolidate_interval_s``): the core picks an awake node whose pods all
   fit elsewhere and none is protected (a PDB with no disruption left, local storage, ``safe-to-evict:
   "false"``, no controller, a kube-system pod without a PDB); it is cordoned (``draining``) and its pods are
   evicted through the Eviction API. A 429 (a PDB) stops the drain and uncordons the node. An emptied node
   sleeps at once.

State lives on the nodes (annotations ``joulesched.io/power-state`` and ``-since``, the taint, the cordon),
so a new leader picks up where the last one stopped. Every write is preceded by a leadership check; with
leader election two replicas never both act. ``dry_run`` logs each action it would take and writes nothing
(no Lease either).

``/metrics``: nodes by power state, wake latency (histogram), sleep and wake failures, evictions, estimated
joules saved (the idle-minus-sleep draw of each sleeping node, integrated). ``/healthz``: the loop is turning;
``/readyz``: the informers have synced.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from joulesched.cluster.kube.cache import ACTIVE_PODS_SELECTOR
from joulesched.cluster.kube.informer import Informer
from joulesched.cluster.kube.objects import (
    WAKE_FAILED_ANNOTATION,
    CurveResolver,
    NodeInfo,
    PodInfo,
    node_gate_reason,
    parse_node,
    parse_pod,
)
from joulesched.cluster.nodepower import (
    ASLEEP_TAINT,
    CONTROL_PLANE_LABELS,
    NEVER_SLEEP_ANNOTATION,
    POWER_ADDRESS_ANNOTATION,
    POWER_SINCE_ANNOTATION,
    POWER_STATE_ANNOTATION,
    SAFE_TO_EVICT_ANNOTATIONS,
    MovablePod,
    NodePowerCore,
    PowerPolicy,
)
from joulesched.cluster.state import ASLEEP, ON, WAKING, ClusterState
from joulesched.live.actuators.base import OFF, UNKNOWN, AddressError, PowerAddress, Target, parse_address
from joulesched.live.httpd import BackgroundHTTPServer, reply
from joulesched.live.leader import LeaderElector, default_identity

log = logging.getLogger("joulesched.nodepower")

AWAKE, SLEEPING, ASLEEP_STATE, WAKING_STATE, DRAINING = "awake", "sleeping", "asleep", "waking", "draining"
POWER_STATES = (AWAKE, SLEEPING, ASLEEP_STATE, WAKING_STATE, DRAINING)
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
WAKE_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600)


@dataclass
class NodePowerConfig:
    """Settings of one controller replica.

    :param policy: the decision core's parameters (sleep_after_s, min_awake, spare_cpu_m, consolidation).
    :param dry_run: log every action, write nothing. :param resync_s: reconcile at least this often.
    :param wake_timeout_s: a woken node must be Ready within this. :param drain_timeout_s: a drained node must
        empty within this, else it is uncordoned.
    :param retry_initial_s, retry_max_s: backoff after a failed sleep or wake of a node (doubling).
    :param sleep_watts: estimated draw of a sleeping node (for the joules-saved estimate).
    :param addresses: node name -> power address, for nodes without the annotation (a ConfigMap).
    :param settle_s: after cordoning and tainting a node, wait this long (more than the schedulers' informer
        latency) before the last check that it is empty, so a binding decided before the taint was seen lands first.
    :param scheduler_name: our scheduler's pods wake the node it nominates (it chose a sleeping node); only
        when none is nominated within ``nominate_grace_s`` are they treated like any other pending pod, which
        wakes the most efficient sleeping node that fits.
    """

    policy: PowerPolicy = field(default_factory=PowerPolicy)
    dry_run: bool = False
    resync_s: float = 5.0
    wake_timeout_s: float = 600.0
    drain_timeout_s: float = 300.0
    retry_initial_s: float = 10.0
    retry_max_s: float = 600.0
    sleep_watts: float = 10.0
    addresses: dict[str, str] = field(default_factory=dict)
    leader_elect: bool = True
    lease_namespace: str = "joulesched"
    lease_name: str = "joulesched-node-power"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = field(default_factory=default_identity)
    request_timeout_s: float = 10.0
    workers: int = 4
    settle_s: float = 2.0
    scheduler_name: str = "joulesched"
    nominate_grace_s: float = 10.0
    component: str = "joulesched-node-power"
    event_namespace: str = "default"  # where kube puts Events about nodes


class NodePowerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.nodes = Gauge("joulesched_node_power_nodes", "Nodes by power state.", ["state"], registry=registry)
        for s in POWER_STATES:
            self.nodes.labels(s)
        self.wake_latency = Histogram("joulesched_node_power_wake_latency_seconds",
                                      "From the wake request to the node Ready and uncordoned.",
                                      buckets=WAKE_BUCKETS, registry=registry)
        self.failures = Counter("joulesched_node_power_failures", "Failed sleeps and wakes.", ["op"],
                                registry=registry)
        for op in ("sleep", "wake", "drain"):
            self.failures.labels(op)
        self.evictions = Counter("joulesched_node_power_evictions", "Evictions by result (evicted, refused: a PDB "
                                 "said 429, gone).", ["result"], registry=registry)
        for r in ("evicted", "refused", "gone"):
            self.evictions.labels(r)
        self.actions = Counter("joulesched_node_power_actions", "Sleeps and wakes started (or, in dry-run, "
                               "announced).", ["action"], registry=registry)
        self.joules_saved = Counter("joulesched_node_power_joules_saved",
                                    "Estimated joules saved: idle minus sleep draw, integrated over sleeping nodes.",
                                    registry=registry)
        self.leader = Gauge("joulesched_node_power_leader", "1 while this replica acts.", registry=registry)


@dataclass
class _Pod:
    info: PodInfo
    daemon: bool  # DaemonSet or mirror pod: does not keep a node awake, is never evicted
    blocker: str  # why it may not be evicted ("" = it may)
    labels: dict
    nominated: str


@dataclass
class _NodeRec:
    empty_since: float | None = None
    retry_at: float = 0.0
    failures: int = 0
    drain_started: float = 0.0


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rv(obj: dict | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def node_ready(obj: dict) -> bool:
    """The node's Ready condition is True (a node reporting no conditions counts as ready)."""
    conds = (obj.get("status") or {}).get("conditions") or []
    for c in conds:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return True


def parse_controller_pod(obj: dict) -> _Pod:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    ann = meta.get("annotations") or {}
    owners = meta.get("ownerReferences") or []
    daemon = any(o.get("kind") == "DaemonSet" for o in owners) or MIRROR_ANNOTATION in ann
    blocker = ""
    if any(str(ann.get(k, "")).lower() == "false" for k in SAFE_TO_EVICT_ANNOTATIONS):
        blocker = "safe-to-evict: false"
    elif any("emptyDir" in v or "hostPath" in v for v in spec.get("volumes") or []):
        blocker = "local storage"
    elif not owners:
        blocker = "no controller"
    return _Pod(parse_pod(obj), daemon, blocker, dict(meta.get("labels") or {}),
                (obj.get("status") or {}).get("nominatedNodeName") or "")


def _selector_matches(sel: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against labels."""
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and labels.get(k) in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


class NodePowerController:
    """The controller over an API client (see the module docstring).

    :param actuator: anything with ``sleep``/``wake``/``state`` (:mod:`joulesched.live.actuators`).
    :param leader: share another component's elector (``serve --node-power`` shares the scheduler's Lease);
        None = its own Lease when ``cfg.leader_elect``.
    :param delegated: ``(name, node object) -> bool``: nodes whose sleep and wake someone else decides (the
        cluster-autoscaler provider's node groups, :mod:`joulesched.live.autoscaler`). The controller's own passes
        never sleep, wake or drain them; :meth:`request_wake` and :meth:`request_sleep` act on them with every
        safety rule of the controller's own actions.
    """

    def __init__(self, api_client: k8s.ApiClient, actuator: Any, cfg: NodePowerConfig | None = None, *,
                 curves: CurveResolver | None = None, registry: CollectorRegistry | None = None,
                 leader: LeaderElector | None = None, clock: Callable[[], float] = time.monotonic,
                 delegated: Callable[[str, dict], bool] | None = None) -> None:
        self.cfg = cfg or NodePowerConfig()
        self.delegated = delegated
        self._delegated: set[str] = set()
        self.api, self.actuator, self.clock = api_client, actuator, clock
        self.core_api = k8s.CoreV1Api(api_client)
        self.policy_api = k8s.PolicyV1Api(api_client)
        self.curves = curves or CurveResolver()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = NodePowerMetrics(self.registry)
        self.core = NodePowerCore(self.cfg.policy)
        self._lock = threading.Condition(threading.RLock())
        self._nodes: dict[str, dict] = {}
        self._pods: dict[str, _Pod] = {}
        self._recs: dict[str, _NodeRec] = {}
        self._busy: dict[str, str] = {}  # nodes with an action in flight -> the action
        self._stop = threading.Event()
        self._kick = False
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.cfg.workers, thread_name_prefix="node-power")
        self._alive = clock()
        self._last_account = clock()
        self._next_consolidation = clock() + self.cfg.policy.consolidate_interval_s
        self._announced: set[tuple[str, str]] = set()
        self._first_seen: dict[str, float] = {}
        #: (monotonic time, action, node) of every action taken, or announced in dry-run (tests read it).
        self.actions: list[tuple[float, str, str]] = []
        self._own_leader = leader is None and self.cfg.leader_elect and not self.cfg.dry_run
        self.leader = leader
        if self._own_leader:
            self.leader = LeaderElector(api_client, self.cfg.lease_namespace, self.cfg.lease_name,
                                        identity=self.cfg.identity, lease_duration_s=self.cfg.lease_duration_s,
                                        renew_deadline_s=self.cfg.renew_deadline_s,
                                        retry_period_s=self.cfg.retry_period_s, clock=clock)
        self.node_informer = Informer("nodes", self.core_api.list_node, self._replace_nodes, self._node_event)
        self.pod_informer = Informer("pods", self.core_api.list_pod_for_all_namespaces, self._replace_pods,
                                     self._pod_event, field_selector=ACTIVE_PODS_SELECTOR)

    # ---- lifecycle ----
    def start(self) -> "NodePowerController":
        self.node_informer.start()
        self.pod_informer.start()
        if self._own_leader:
            self.leader.start()
        self._thread = threading.Thread(target=self._loop, name="node-power", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(10)
        self._pool.shutdown(wait=True)
        if self._own_leader:
            self.leader.stop(release=True)
        self.pod_informer.stop()
        self.node_informer.stop()

    @property
    def synced(self) -> bool:
        return self.node_informer.synced.is_set() and self.pod_informer.synced.is_set()

    def healthy(self) -> bool:
        return not self._stop.is_set() and self.clock() - self._alive < max(30.0, 3 * self.cfg.resync_s)

    def is_leader(self) -> bool:
        if self.cfg.dry_run and self.leader is None:
            return True
        return self.leader is None or self.leader.is_leader()

    def _may_write(self, stopping_ok: bool = False) -> bool:
        return not self.cfg.dry_run and self.is_leader() and (stopping_ok or not self._stop.is_set())

    # ---- informer callbacks (only update the stores and kick the loop) ----
    def _replace_nodes(self, items: list[dict]) -> None:
        with self._lock:
            self._nodes = {(o.get("metadata") or {}).get("name", ""): o for o in items}
            self._kick_locked()

    def _node_event(self, etype: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        with self._lock:
            if etype == "DELETED":
                self._nodes.pop(name, None)
            elif _rv(obj) >= _rv(self._nodes.get(name)):  # our own writes may already be newer than the watch
                self._nodes[name] = obj
            self._kick_locked()

    def _replace_pods(self, items: list[dict]) -> None:
        with self._lock:
            self._pods = {}
            for o in items:
                p = parse_controller_pod(o)
                if p.info.uid:
                    self._pods[p.info.uid] = p
            self._kick_locked()

    def _pod_event(self, etype: str, obj: dict) -> None:
        p = parse_controller_pod(obj)
        if not p.info.uid:
            return
        with self._lock:
            if etype == "DELETED" or not p.info.active:
                self._pods.pop(p.info.uid, None)
            else:
                self._pods[p.info.uid] = p
            self._kick_locked()

    def _kick_locked(self) -> None:
        self._kick = True
        self._lock.notify_all()

    # ---- the loop ----
    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._kick:
                    self._lock.wait(self.cfg.resync_s)
                self._kick = False
            self._alive = self.clock()
            leading = self.is_leader()
            self.metrics.leader.set(1 if leading else 0)
            if self._stop.is_set() or not self.synced or not leading:
                continue
            try:
                self.reconcile()
            except Exception:  # an unexpected error must not stop the controller
                log.exception("reconcile failed")
            time.sleep(0.01)  # coalesce bursts of events

    # ---- the view the core decides on ----
    def state_of(self, obj: dict) -> str:
        s = ((obj.get("metadata") or {}).get("annotations") or {}).get(POWER_STATE_ANNOTATION, AWAKE)
        return s if s in POWER_STATES else AWAKE

    def address_of(self, name: str, obj: dict) -> PowerAddress | None:
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(POWER_ADDRESS_ANNOTATION) or \
            self.cfg.addresses.get(name)
        if not text:
            return PowerAddress("none", raw="none") if getattr(self.actuator, "name", "") == "none" else None
        try:
            return parse_address(text)
        except AddressError as e:
            self._announce_once("bad-address", name, f"{name}: {e}")
            return None

    def _announce_once(self, what: str, node: str, msg: str) -> None:
        if (what, node) not in self._announced:
            self._announced.add((what, node))
            log.warning("%s", msg)

    def _view(self) -> tuple[ClusterState, list[str], list[NodeInfo], list[str], np.ndarray, list[_Pod], dict]:
        """(state, names, infos, power states, workload pods per node, pending pods, pods by node index)."""
        with self._lock:
            nodes = dict(self._nodes)
            pods = list(self._pods.values())
        names = sorted(nodes)
        infos = [parse_node(nodes[n], self.curves) for n in names]
        index = {n: k for k, n in enumerate(names)}
        st = ClusterState(names, [i.cpu_m for i in infos], [i.memory_mib for i in infos],
                          [i.max_pods for i in infos], [i.curve for i in infos],
                          sleep_watts=[self.cfg.sleep_watts] * len(names), can_sleep=True)
        states = [self.state_of(nodes[n]) for n in names]
        protected = np.zeros(len(names), dtype=bool)
        delegated = {n for n in names if self.delegated is not None and self.delegated(n, nodes[n])}
        self._delegated = delegated
        for k, (n, info, s) in enumerate(zip(names, infos, states)):
            obj = nodes[n]
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            ours = any(t.key == ASLEEP_TAINT for t in info.taints) or s != AWAKE
            if s in (SLEEPING, ASLEEP_STATE):
                st.power_state[k] = ASLEEP
            elif s in (WAKING_STATE, DRAINING) or not node_ready(obj) or (info.unschedulable and not ours):
                st.power_state[k] = WAKING  # awake but not a place for pods (or for our decisions)
            if (any(lbl in info.labels for lbl in CONTROL_PLANE_LABELS)
                    or str(ann.get(NEVER_SLEEP_ANNOTATION, "")).lower() not in ("", "false")
                    or (info.unschedulable and not ours) or self.address_of(n, obj) is None or n in delegated):
                protected[k] = True
        self.core.protected = protected
        workload = np.zeros(len(names), dtype=np.int64)
        pending: list[_Pod] = []
        by_node: dict[int, list[_Pod]] = {}
        for p in pods:
            if p.info.node_name:
                k = index.get(p.info.node_name)
                if k is None:
                    continue
                st.bind(k, p.info.request)
                if not p.daemon:
                    workload[k] += 1
                    by_node.setdefault(k, []).append(p)
            elif not p.info.deleting:
                pending.append(p)
        pending.sort(key=lambda p: (p.info.rv, p.info.uid))
        return st, names, infos, states, workload, pending, by_node

    # ---- reconcile ----
    def reconcile(self) -> None:
        """One pass: account, wake, sleep, consolidate (see the module docstring)."""
        now = self.clock()
        st, names, infos, states, workload, pending, by_node = self._view()
        self._account(st, states, now)
        with self._lock:
            busy = dict(self._busy)
        for n in names:
            self._recs.setdefault(n, _NodeRec())
        self._adopt_addresses(names)
        wanted = self._wake_pass(st, names, infos, pending, busy, now)
        self._sleep_pass(st, names, states, workload, busy, now, wanted)
        if self.cfg.policy.consolidate and now >= self._next_consolidation:
            self._next_consolidation = now + self.cfg.policy.consolidate_interval_s
            self._consolidate(st, names, states, by_node, busy, now)
        counts = {s: 0 for s in POWER_STATES}
        for s in states:
            counts[s] += 1
        for s, c in counts.items():
            self.metrics.nodes.labels(s).set(c)

    def _adopt_addresses(self, names: list[str]) -> None:
        """Write the address map's entry onto a node that has no ``joulesched.io/power`` annotation, so that
        ``kubectl get node`` shows where its power is switched (once per node)."""
        if not self.cfg.addresses or not self._may_write():
            return
        for name in names:
            addr = self.cfg.addresses.get(name)
            if not addr or ("adopt", name) in self._announced:
                continue
            with self._lock:
                ann = ((self._nodes.get(name) or {}).get("metadata") or {}).get("annotations") or {}
            if POWER_ADDRESS_ANNOTATION in ann:
                continue
            self._announced.add(("adopt", name))
            try:
                self.core_api.patch_node(name, {"metadata": {"annotations": {POWER_ADDRESS_ANNOTATION: addr}}},
                                         _content_type="application/merge-patch+json", _preload_content=False,
                                         _request_timeout=self.cfg.request_timeout_s)
            except Exception as e:
                log.info("could not annotate node %s with its power address: %s", name, type(e).__name__)

    def _account(self, st: ClusterState, states: list[str], now: float) -> None:
        dt = now - self._last_account
        self._last_account = now
        asleep = np.array([s == ASLEEP_STATE for s in states], dtype=bool)
        if dt > 0 and asleep.any():
            self.metrics.joules_saved.inc(float(np.maximum(st.idle_watts[asleep] - self.cfg.sleep_watts, 0).sum()) * dt)

    def _wake_pass(self, st, names, infos, pending, busy, now) -> np.ndarray:
        """Wake nodes for pending pods; returns the awake nodes some pending pod fits (they must not sleep)."""
        seen = self._first_seen
        live = {p.info.uid for p in pending}
        for uid in [u for u in seen if u not in live]:
            del seen[uid]
        grace = self.cfg.nominate_grace_s
        # Our scheduler's pods: the node it nominates, or, if it says nothing within the grace, the core's choice.
        pending = [p for p in pending if p.nominated or p.info.scheduler_name != self.cfg.scheduler_name
                   or now - seen.setdefault(p.info.uid, now) >= grace]
        if not pending:
            return np.zeros(len(names), dtype=bool)
        n = len(names)
        fits = np.zeros((len(pending), n), dtype=bool)
        for j, info in enumerate(infos):
            if busy.get(names[j]) == "wake" or (st.power_state[j] == WAKING and info.waking):
                st.power_state[j] = WAKING  # on its way: its room counts, nothing more to wake for it
                info, usable = info.awake_view(), True
            elif st.power_state[j] == ASLEEP:  # gate it as it will be once awake: without our taint and cordon
                info = info.awake_view()
                usable = (self._recs[names[j]].retry_at <= now and names[j] not in busy
                          and names[j] not in self._delegated)
            else:
                usable = st.power_state[j] == ON
            if not usable:
                continue
            for k, p in enumerate(pending):
                fits[k, j] = not node_gate_reason(info, p.info)
        index = {nm: k for k, nm in enumerate(names)}
        nominated: list[int] = []
        rest: list[int] = []  # pods whose wake is not already taken care of
        for k, p in enumerate(pending):
            j = index.get(p.nominated, -1)
            if j >= 0 and st.power_state[j] == ASLEEP and fits[k, j]:
                nominated.append(j)  # the scheduler's choice
            elif j >= 0 and (st.power_state[j] != ASLEEP or names[j] in busy):
                pass  # its node is waking (or awake): nothing to do for it
            else:
                rest.append(k)
        for j in self.core.choose_wake(st, [pending[k].info.request for k in rest], nominated, fits[rest]):
            name = names[j]
            if name in busy:
                continue
            self._start(name, "wake", self._do_wake)
        return fits.any(axis=0) & (st.power_state == ON)

    def _sleep_pass(self, st, names, states, workload, busy, now, wanted) -> None:
        sleep_after = self.cfg.policy.sleep_after_s
        for i, name in enumerate(names):
            rec = self._recs[name]
            if workload[i]:
                rec.empty_since = None
                self._announced.discard(("sleep", name))
                if states[i] == DRAINING and now - rec.drain_started > self.cfg.drain_timeout_s and name not in busy:
                    self._start(name, "undrain", self._do_undrain)
                continue
            if rec.empty_since is None:
                rec.empty_since = now
            if name in busy or rec.retry_at > now:
                continue
            if states[i] == DRAINING:  # emptied by consolidation: sleeps at once
                st.power_state[i] = ASLEEP
                self._start(name, "sleep", self._do_sleep)
                continue
            if states[i] != AWAKE or now - rec.empty_since < sleep_after or wanted[i]:
                continue  # (a pending pod fits it: it would only be woken again)
            verdict = self.core.may_sleep(st, i, 0)
            if verdict:
                continue
            st.power_state[i] = ASLEEP  # later verdicts in this pass count it as asleep
            self._start(name, "sleep", self._do_sleep)

    def _consolidate(self, st, names, states, by_node, busy, now) -> None:
        try:
            pdbs = json.loads(self.policy_api.list_pod_disruption_budget_for_all_namespaces(
                _preload_content=False, _request_timeout=self.cfg.request_timeout_s).data).get("items") or []
        except Exception as e:
            log.info("consolidation skipped: cannot list PodDisruptionBudgets (%s)", type(e).__name__)
            return
        movable: dict[int, list[MovablePod]] = {}
        for i, pods in by_node.items():
            if st.power_state[i] != ON or names[i] in busy or states[i] != AWAKE:
                continue
            ms = []
            for p in pods:
                blocker = p.blocker
                covering = [b for b in pdbs if (b.get("metadata") or {}).get("namespace") == p.info.namespace
                            and _selector_matches((b.get("spec") or {}).get("selector") or {}, p.labels)]
                if not blocker and any(int((b.get("status") or {}).get("disruptionsAllowed") or 0) <= 0
                                       for b in covering):
                    blocker = "pdb"
                if not blocker and p.info.namespace == "kube-system" and not covering:
                    blocker = "kube-system pod without a PDB"
                ms.append(MovablePod(p.info.uid, p.info.request, float(p.info.request.filter_cpu), 0.0, blocker))
            movable[i] = ms
        plan = self.core.plan(st, now, movable)
        if plan is None:
            return
        name = names[plan.node]
        pods = [(p.info.namespace, p.info.name, p.info.uid) for p in by_node[plan.node]]
        log.info("consolidating %s: %d pods to move, predicted saving %.0f J against %.0f J to restart them",
                 name, len(pods), plan.saving_j, plan.cost_j)
        self._start(name, "drain", lambda n: self._do_drain(n, pods))

    # ---- what an external decider calls (the autoscaler provider) ----
    def nodes_snapshot(self) -> dict[str, dict]:
        """The informer's Node objects by name (a shallow copy: read, never modify)."""
        with self._lock:
            return dict(self._nodes)

    def action_of(self, name: str) -> str | None:
        """The action in flight on ``name`` (``wake``, ``sleep``, ``drain``...), or None."""
        with self._lock:
            return self._busy.get(name)

    def request_wake(self, name: str) -> bool:
        """Wake ``name`` as the controller's own wakes do (actuator, wait Ready, untaint, uncordon). False when
        it is not asleep, has an action in flight or is backing off after a failure."""
        with self._lock:
            obj = self._nodes.get(name)
        rec = self._recs.setdefault(name, _NodeRec())
        if obj is None or self.state_of(obj) != ASLEEP_STATE or name in self._busy or rec.retry_at > self.clock():
            return False
        self._start(name, "wake", self._do_wake)
        return True

    def request_sleep(self, name: str) -> bool:
        """Put ``name`` to sleep as the controller's own sleeps do (cordon, taint, settle, a fresh check that no
        workload pod is left, actuator); the checks refuse it as they would refuse their own. False when it is
        not awake, has an action in flight, or has no power address."""
        with self._lock:
            obj = self._nodes.get(name)
        if obj is None or self.state_of(obj) != AWAKE or name in self._busy or self.address_of(name, obj) is None:
            return False
        meta = obj.get("metadata") or {}
        if (any(lbl in (meta.get("labels") or {}) for lbl in CONTROL_PLANE_LABELS)
                or str((meta.get("annotations") or {}).get(NEVER_SLEEP_ANNOTATION, "")).lower() not in ("", "false")):
            return False  # protected whoever asks
        self._start(name, "sleep", self._do_sleep)
        return True

    # ---- actions (in the worker pool; at most one per node) ----
    def _start(self, name: str, action: str, fn: Callable[[str], None]) -> None:
        if self.cfg.dry_run:
            if (action, name) not in self._announced:
                self._announced.add((action, name))
                self.actions.append((self.clock(), action, name))
                self.metrics.actions.labels(action).inc()
                log.info("dry-run: would %s node %s", action, name)
            return
        with self._lock:
            if name in self._busy:
                return
            self._busy[name] = action
        self.actions.append((self.clock(), action, name))
        self.metrics.actions.labels(action).inc()

        def run() -> None:
            try:
                fn(name)
            except Exception:
                log.exception("%s of node %s failed", action, name)
            finally:
                with self._lock:
                    self._busy.pop(name, None)
                    self._kick_locked()

        self._pool.submit(run)

    def _target(self, name: str) -> Target | None:
        with self._lock:
            obj = self._nodes.get(name)
        if obj is None:
            return None
        addr = self.address_of(name, obj)
        return Target(name, addr) if addr is not None else None

    def _backoff(self, name: str) -> float:
        rec = self._recs.setdefault(name, _NodeRec())
        rec.failures += 1
        delay = min(self.cfg.retry_initial_s * 2 ** (rec.failures - 1), self.cfg.retry_max_s)
        rec.retry_at = self.clock() + delay
        return delay

    def _do_sleep(self, name: str) -> None:
        target = self._target(name)
        if target is None or not self._may_write():
            return
        if not self._patch_node(name, state=SLEEPING, cordon=True, taint=True):
            return
        self._event(name, "Normal", "NodeSleeping", f"Node {name} is idle: cordoned and tainted, going to sleep")
        if self._stop.wait(self.cfg.settle_s):  # stopping: leave the node as it was, not half asleep
            self._patch_node(name, state=AWAKE, cordon=False, taint=False, stopping_ok=True)
            return
        left = self._workload_pods_on(name)
        if left is None or left:
            why = "could not check its pods" if left is None else f"{left[0]} landed on it"
            self._patch_node(name, state=AWAKE, cordon=False, taint=False)
            self._event(name, "Normal", "NodeSleepAborted", f"Not sleeping node {name}: {why}")
            return
        try:
            self.actuator.sleep(target)
        except Exception as e:
            delay = self._backoff(name)
            self.metrics.failures.labels("sleep").inc()
            self._patch_node(name, state=AWAKE, cordon=False, taint=False)
            self._event(name, "Warning", "NodeSleepFailed",
                        f"{self.actuator.name} could not put {name} to sleep: {e}; uncordoned, retrying in {delay:g} s")
            log.warning("sleep of %s failed: %s (retry in %g s)", name, e, delay)
            return
        self._recs[name].failures = 0
        self._patch_node(name, state=ASLEEP_STATE)
        self._event(name, "Normal", "NodeAsleep", f"Node {name} is asleep ({self.actuator.name})")
        log.info("node %s asleep", name)

    def _do_wake(self, name: str) -> None:
        target = self._target(name)
        if target is None or not self._may_write():
            return
        t0 = self.clock()
        self._patch_node(name, state=WAKING_STATE)
        self._event(name, "Normal", "NodeWaking", f"Pods are waiting: waking node {name}")
        try:
            self.actuator.wake(target)
            self._wait_ready(name, target, t0 + self.cfg.wake_timeout_s)
        except Exception as e:
            delay = self._backoff(name)
            self.metrics.failures.labels("wake").inc()
            self._patch_node(name, state=ASLEEP_STATE, wake_failed=True)  # schedulers stop waiting for it
            self._event(name, "Warning", "NodeWakeFailed", f"{self.actuator.name} could not wake {name}: {e}; "
                        f"trying another node, retrying this one in {delay:g} s")
            log.warning("wake of %s failed: %s", name, e)
            return
        if not self._patch_node(name, state=AWAKE, cordon=False, taint=False, wake_failed=False):
            return
        self._recs[name].failures = 0
        self._recs[name].empty_since = None
        self.metrics.wake_latency.observe(self.clock() - t0)
        self._event(name, "Normal", "NodeAwake", f"Node {name} is Ready: untainted and uncordoned")
        log.info("node %s awake after %.1f s", name, self.clock() - t0)

    def _wait_ready(self, name: str, target: Target, deadline: float) -> None:
        while True:
            with self._lock:
                obj = self._nodes.get(name)
                ready = obj is not None and node_ready(obj)
            if ready:
                try:
                    st = self.actuator.state(target)
                except Exception:
                    st = UNKNOWN
                if st != OFF:
                    return
            if self._stop.is_set():
                raise TimeoutError("the controller is stopping")
            if self.clock() >= deadline:
                raise TimeoutError(f"not Ready within {self.cfg.wake_timeout_s:g} s")
            with self._lock:
                self._lock.wait(min(0.5, max(0.01, deadline - self.clock())))

    def _do_drain(self, name: str, pods: list[tuple[str, str, str]]) -> None:
        if not self._may_write():
            return
        self._recs[name].drain_started = self.clock()
        if not self._patch_node(name, state=DRAINING, cordon=True):
            return
        self._event(name, "Normal", "NodeConsolidating", f"Evicting {len(pods)} pods: they fit on other nodes "
                    f"and node {name} can then sleep")
        evicted = 0
        for ns, pod, uid in pods:
            if not self._may_write():
                break
            body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns},
                    "deleteOptions": {"preconditions": {"uid": uid}}}
            try:
                self.core_api.create_namespaced_pod_eviction(pod, ns, body, _preload_content=False,
                                                             _request_timeout=self.cfg.request_timeout_s)
                evicted += 1
                self.metrics.evictions.labels("evicted").inc()
            except ApiException as e:
                if e.status == 404:
                    self.metrics.evictions.labels("gone").inc()
                    continue
                self.metrics.evictions.labels("refused").inc()
                self.metrics.failures.labels("drain").inc()
                self.core.record_evictions(self.clock(), evicted)
                self._patch_node(name, state=AWAKE, cordon=False)
                why = "a PodDisruptionBudget does not allow it now" if e.status == 429 else f"HTTP {e.status}"
                self._event(name, "Warning", "NodeConsolidationAborted",
                            f"Eviction of {ns}/{pod} refused ({why}); node {name} uncordoned")
                self._backoff(name)
                return
            except Exception as e:
                self.metrics.failures.labels("drain").inc()
                log.info("eviction of %s/%s: %s", ns, pod, type(e).__name__)
        self.core.record_evictions(self.clock(), evicted)

    def _do_undrain(self, name: str) -> None:
        if self._may_write() and self._patch_node(name, state=AWAKE, cordon=False):
            self.metrics.failures.labels("drain").inc()
            self._event(name, "Warning", "NodeConsolidationAborted",
                        f"Node {name} did not empty within {self.cfg.drain_timeout_s:g} s; uncordoned")

    # ---- API writes ----
    def _workload_pods_on(self, name: str) -> list[str] | None:
        """A fresh (not cached) list of the workload pods on ``name``; None when the read fails."""
        try:
            resp = self.core_api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name},{ACTIVE_PODS_SELECTOR}", _preload_content=False,
                _request_timeout=self.cfg.request_timeout_s)
            items = json.loads(resp.data).get("items") or []
        except Exception:
            return None
        return [f"{p.info.namespace}/{p.info.name}" for p in map(parse_controller_pod, items) if not p.daemon]

    def _patch_node(self, name: str, *, state: str, cordon: bool | None = None, taint: bool | None = None,
                    wake_failed: bool | None = None, stopping_ok: bool = False) -> bool:
        """Set the power-state annotation (and the cordon and our taint) with the node's resourceVersion as a
        precondition; re-read and retry on a conflict. False when it could not be written."""
        for _ in range(5):
            if not self._may_write(stopping_ok):
                return False
            try:
                obj = json.loads(self.core_api.read_node(name, _preload_content=False,
                                                         _request_timeout=self.cfg.request_timeout_s).data)
            except ApiException as e:
                if e.status == 404:
                    return False
                time.sleep(0.1)
                continue
            except Exception:
                time.sleep(0.1)
                continue
            patch: dict[str, Any] = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"],
                                                  "annotations": {POWER_STATE_ANNOTATION: state,
                                                                  POWER_SINCE_ANNOTATION: _now_rfc3339()}}}
            if wake_failed is not None:
                patch["metadata"]["annotations"][WAKE_FAILED_ANNOTATION] = _now_rfc3339() if wake_failed else None
            spec: dict[str, Any] = {}
            if cordon is not None:
                spec["unschedulable"] = True if cordon else None
            if taint is not None:
                taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if t.get("key") != ASLEEP_TAINT]
                if taint:
                    taints.append({"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule",
                                   "timeAdded": _now_rfc3339()})
                spec["taints"] = taints or None
            if spec:
                patch["spec"] = spec
            try:
                resp = self.core_api.patch_node(name, patch, _content_type="application/merge-patch+json",
                                                _preload_content=False, _request_timeout=self.cfg.request_timeout_s)
                new = json.loads(resp.data)
                with self._lock:  # the informer will say the same; acting on it now avoids a stale next pass
                    if name in self._nodes and _rv(new) >= _rv(self._nodes[name]):
                        self._nodes[name] = new
                return True
            except ApiException as e:
                if e.status == 404:
                    return False
                time.sleep(0.05)  # 409: someone else wrote the node; read it again
            except Exception:
                time.sleep(0.1)
        log.warning("could not update node %s (state %s)", name, state)
        return False

    def _event(self, node: str, etype: str, reason: str, message: str) -> None:
        if not self._may_write():
            return
        with self._lock:
            uid = ((self._nodes.get(node) or {}).get("metadata") or {}).get("uid", "")
        now = _now_rfc3339()
        ns = self.cfg.event_namespace
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{node}.{time.time_ns():x}", "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
                "reason": reason, "message": message, "type": etype,
                "source": {"component": self.cfg.component}, "reportingComponent": self.cfg.component,
                "reportingInstance": self.cfg.identity, "action": reason,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.core_api.create_namespaced_event(ns, body, _preload_content=False, _request_timeout=5)
        except Exception as e:  # events are best effort
            log.debug("event %s for %s dropped: %s", reason, node, e)


class NodePowerStatusServer(BackgroundHTTPServer):
    """``GET /metrics``, ``/healthz`` (the loop turns) and ``/readyz`` (informers synced) on loopback by default."""

    def __init__(self, ctl: NodePowerController, host: str = "127.0.0.1", port: int = 10262) -> None:
        class H(BaseHTTPRequestHandler):
            timeout = 10

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    reply(self, 200, generate_latest(ctl.registry), CONTENT_TYPE_LATEST)
                    return
                checks = {"/healthz": ctl.healthy, "/livez": ctl.healthy, "/readyz": lambda: ctl.synced}
                if path in checks:
                    good = checks[path]()
                    reply(self, 200 if good else 503, b"ok" if good else b"not ready", "text/plain")
                else:
                    reply(self, 404, b"not found", "text/plain")

        super().__init__(H, host, port, "node-power-status")


# ---- the daemon: options checked, then started and stopped together -----------------------------------------
def load_addresses(path: str | None) -> dict[str, str]:
    """A node -> power address map (YAML/JSON mapping; a ConfigMap mounted as a file). Every address is
    parsed, so a bad one is named before anything starts."""
    if not path:
        return {}
    import yaml

    from joulesched.live.daemon import DaemonInputError

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise DaemonInputError(f"--addresses {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise DaemonInputError(f"--addresses {path}: not YAML: {e}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise DaemonInputError(f"--addresses {path}: expected a mapping of node name to power address")
    out = {}
    for node, text in data.items():
        try:
            parse_address(str(text))
        except AddressError as e:
            raise DaemonInputError(f"--addresses {path}: node {node}: {e}") from None
        out[str(node)] = str(text)
    return out


class NodePowerDaemon:
    """``joulesched node-power`` (and ``serve --node-power``): the controller plus /metrics, /healthz, /readyz.

    Every option is checked in the constructor; ``with`` starts it and stops it. ``leader`` shares another
    component's Lease (the scheduler's, inside ``serve``); ``api_client`` reuses its connection settings.
    """

    def __init__(self, *, actuator: str = "none", policy: PowerPolicy | None = None, dry_run: bool = False,
                 listen: str = "127.0.0.1:10262", leader_elect: bool = True, lease_namespace: str | None = None,
                 kubeconfig: str | None = None, context: str | None = None, credentials: str | None = None,
                 addresses: str | None = None, power_profiles: str | None = None, sleep_watts: float = 10.0,
                 resync_s: float = 5.0, wake_timeout_s: float = 600.0, scheduler_name: str = "joulesched",
                 actuator_options: dict | None = None, leader: LeaderElector | None = None,
                 api_client: k8s.ApiClient | None = None, status: bool = True) -> None:
        from joulesched.cluster.kube.client import load_api_client
        from joulesched.cluster.kube.objects import load_profiles
        from joulesched.core.net import parse_listen
        from joulesched.live.actuators import NAMES, ActuatorOptions, make_actuator
        from joulesched.live.actuators.credentials import Credentials
        from joulesched.live.daemon import DaemonInputError, _listen, default_namespace

        if actuator not in NAMES:
            raise DaemonInputError(f"--actuator {actuator!r}: known: {', '.join(NAMES)}")
        if status:
            parse_listen(listen)
        opts = ActuatorOptions(credentials=Credentials.load(credentials), **(actuator_options or {}))
        self.actuator = make_actuator(actuator, opts)
        self.cfg = NodePowerConfig(policy=policy or PowerPolicy(), dry_run=dry_run, resync_s=resync_s,
                                   wake_timeout_s=wake_timeout_s, sleep_watts=sleep_watts,
                                   addresses=load_addresses(addresses), leader_elect=leader_elect,
                                   lease_namespace=lease_namespace or default_namespace(),
                                   scheduler_name=scheduler_name)
        curves = CurveResolver(load_profiles(power_profiles) if power_profiles else None)
        api = api_client or load_api_client(kubeconfig, context)
        self.controller = NodePowerController(api, self.actuator, self.cfg, curves=curves, leader=leader)
        self.status = _listen(listen, NodePowerStatusServer, self.controller) if status else None

    @property
    def port(self) -> int:
        return self.status.port if self.status else 0

    def __enter__(self) -> "NodePowerDaemon":
        p = self.cfg.policy
        log.info("node power: actuator %s%s, sleep after %g s, min awake %d, consolidation %s, identity %s",
                 self.actuator.name, " (dry run: nothing is changed)" if self.cfg.dry_run else "", p.sleep_after_s,
                 p.min_awake, "on" if p.consolidate else "off", self.cfg.identity)
        if self.status:
            self.status.start()
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()
        if self.status:
            self.status.stop()

    def wait_ready(self, timeout: float = 30.0) -> None:
        from joulesched.live.daemon import NotReady

        deadline = time.monotonic() + timeout
        while not self.controller.synced:
            if time.monotonic() > deadline:
                raise NotReady(f"node power controller caches not synced after {timeout:.0f} s")
            time.sleep(0.05)
