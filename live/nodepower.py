"""`joulesched node-power`: the node power controller. It puts idle nodes to sleep, wakes them for pending pods,
and optionally consolidates, deciding with the same core the twin runs (:mod:`joulesched.cluster.nodepower`).

It reads the cluster from the process's one informer-backed cache (:class:`~joulesched.cluster.kube.cache.
KubeCache`: inside ``serve --node-power`` the scheduler's own, so nodes and pods are listed and watched once)
and subscribes to its changes. Each reconcile (on a change, and every ``resync_s``), as leader only:

1. **recover**: a node left ``sleeping``, ``waking`` or ``draining`` with no action of this replica in flight
   (its owner crashed, stopped or lost the Lease) is resumed or rolled back, once the previous owner's last
   request has certainly ended (``takeover_grace_s`` after this replica became leader).
2. **wake**: pods pending that fit no awake node (or that our scheduler nominated for a sleeping node) wake the
   node the core chooses. Waking = the actuator's ``wake``, then wait for a *fresh* heartbeat (a node Lease
   renewal or a Ready change seen after the wake began, with Ready True, and the actuator reporting the machine
   on where it can say), then untaint and uncordon. A failed wake leaves the node asleep and annotated
   ``joulesched.io/wake-failed`` and backs off, so the next reconcile tries the next candidate.
3. **sleep**: a node with no workload pod for ``sleep_after_s``, not protected (control plane, never-sleep,
   cordoned by someone else, no usable power address), that the core lets go (``min_awake`` and ``spare_cpu_m``
   count Ready, schedulable workers only) is cordoned and tainted (``sleeping``), checked empty once more with a
   fresh read, and handed to the actuator; then ``asleep``. A failed sleep keeps the cordon and taint unless
   the actuator's ``state()`` confirms the machine is on.
4. **consolidate** (optional): the core picks an awake node whose pods all fit elsewhere *by their own
   constraints* (the cache's filters: selectors, affinity, taints and tolerations, plus their volumes' node
   affinity) and none is protected; it is cordoned (``draining``) and its pods evicted. Job pods are evicted
   only when marked ``safe-to-evict: "true"``.

Leadership bounds every action: it is checked before each API write, before each actuator request and in every
wait (:meth:`Target.checkpoint <joulesched.live.actuators.base.Target.checkpoint>`); a lost Lease aborts the
action and leaves the node's state, with its owner, for the next leader. Every actuator call has a deadline;
wakes and sleeps run on separate bounded pools, so dead BMCs cannot hold up every wake. The Lease is
``joulesched-node-power`` for ``node-power`` and ``serve --node-power`` alike, so the two never both act.

State lives on the nodes (``joulesched.io/power-state``, ``-since``, ``-owner``, the cordon marker
``joulesched.io/cordoned``, the taint), so a new leader picks up where the last one stopped. ``dry_run`` logs
each action it would take and writes nothing (no Lease either).

``/metrics``: nodes by power state, wake latency (histogram), sleep and wake failures, evictions, estimated
joules saved. ``/healthz``: the loop is turning; ``/readyz``: the cache has synced.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
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

from joulesched.cluster.filters import NodeSelectorTerm
from joulesched.cluster.kube.cache import ACTIVE_PODS_SELECTOR, KubeCache
from joulesched.cluster.kube.objects import (
    WAKE_FAILED_ANNOTATION,
    CurveResolver,
    NodeInfo,
    PodInfo,
    node_gate_reason,
    node_selector_terms,
    selector_matches,
)
from joulesched.cluster.nodepower import (
    ASLEEP_TAINT,
    CORDONED_ANNOTATION,
    DEFAULT_SLEEP_WATTS,
    OFF_REQUESTED_ANNOTATION,
    POWER_ADDRESS_ANNOTATION,
    POWER_OWNER_ANNOTATION,
    POWER_SINCE_ANNOTATION,
    POWER_STATE_ANNOTATION,
    POWER_STATES,
    MovablePod,
    NodePowerCore,
    PowerPolicy,
    SleepCap,
)
from joulesched.cluster.state import ASLEEP, ON, WAKING, ClusterState
from joulesched.live.actuators.access import AccessError, AddressPolicy, Resolved, machine_keys
from joulesched.live.actuators.base import (
    OFF,
    UNKNOWN,
    ActionAborted,
    AddressError,
    Target,
    off_requested,
    parse_address,
)
from joulesched.live.actuators.base import ON as POWER_ON
from joulesched.live.daemonsets import DaemonSetCheck
from joulesched.live.httpd import BackgroundHTTPServer, reply
from joulesched.live.leader import LeaderElector, default_identity
from joulesched.live.ratelog import RateLimitedLog

log = logging.getLogger("joulesched.nodepower")

AWAKE, SLEEPING, ASLEEP_STATE, WAKING_STATE, DRAINING = POWER_STATES
INTERMEDIATE = (SLEEPING, WAKING_STATE, DRAINING)
WAKE_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600)
NODE_LEASE_NAMESPACE = "kube-node-lease"
#: The Lease of the node power controller, whichever process runs it (node-power, or serve --node-power).
NODE_POWER_LEASE = "joulesched-node-power"


@dataclass
class NodePowerConfig:
    """Settings of one controller replica.

    :param policy: the decision core's parameters (sleep_after_s, min_awake, spare_cpu_m, consolidation).
    :param dry_run: log every action, write nothing. :param resync_s: reconcile at least this often.
    :param wake_timeout_s: a woken node must send a fresh heartbeat within this (the wake's deadline).
    :param sleep_timeout_s: the deadline of one sleep (every actuator request and poll of it).
    :param drain_timeout_s: a drained node must empty within this, else it is uncordoned.
    :param retry_initial_s, retry_max_s: backoff after a failed sleep or wake of a node (doubling).
    :param sleep_watts: estimated draw of a sleeping node (for the joules-saved estimate).
    :param addresses: node name -> power address: the operator's map (a ConfigMap), authoritative.
    :param addresses_file: where the map was read from; re-read when it changes (a ConfigMap update, the
        inventory's role adding a node), checked before each pass. A change that does not load keeps the last good
        map (logged); an action already under way keeps the address it started with.
    :param access: which annotated addresses may be used (by default none).
    :param settle_s: after cordoning and tainting a node, wait this long (more than the schedulers' informer
        latency) before the last check that it is empty, so a binding decided before the taint was seen lands first.
    :param scheduler_name: our scheduler's pods wake the node it nominates (it chose a sleeping node); only
        when none is nominated within ``nominate_grace_s`` are they treated like any other pending pod.
    :param takeover_grace_s: a new leader resumes another replica's intermediate state only this long after it
        became leader: longer than one actuator request (connect plus read timeout), so the old leader's last
        request has ended (it sends no other: it checks the Lease before each).
    :param own_node: the node this process runs on (the downward API's ``spec.nodeName`` in
        ``JOULESCHED_NODE_NAME``): never put to sleep, or nothing would be left to wake the others.
    :param wake_workers, sleep_workers: the bounded pools of wakes and of sleeps (drains and recoveries too).
    :param max_sleeps_per_hour: at most this many sleeps started over any sliding hour (0 = no limit): a bound
        on how many machines a misconfiguration or a bug can switch off, and on power cycles. Every sleep
        started counts; the controller's own idle sleeps and the autoscaler provider's wait for room, a resumed
        one and a node consolidation emptied go ahead. Counted by this replica: a new leader starts afresh.
    """

    policy: PowerPolicy = field(default_factory=PowerPolicy)
    dry_run: bool = False
    resync_s: float = 5.0
    wake_timeout_s: float = 600.0
    sleep_timeout_s: float = 300.0
    drain_timeout_s: float = 300.0
    retry_initial_s: float = 10.0
    retry_max_s: float = 600.0
    sleep_watts: float = DEFAULT_SLEEP_WATTS
    addresses: dict[str, str] = field(default_factory=dict)
    addresses_file: str | None = None
    access: AddressPolicy = field(default_factory=AddressPolicy)
    leader_elect: bool = True
    lease_namespace: str = "joulesched"
    lease_name: str = NODE_POWER_LEASE
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = field(default_factory=default_identity)
    request_timeout_s: float = 10.0
    takeover_grace_s: float = 25.0
    own_node: str = field(default_factory=lambda: os.environ.get("JOULESCHED_NODE_NAME", ""))
    wake_workers: int = 4
    sleep_workers: int = 4
    settle_s: float = 2.0
    poll_s: float = 0.5
    scheduler_name: str = "joulesched"
    nominate_grace_s: float = 10.0
    max_sleeps_per_hour: int = 60
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
        self.failures = Counter("joulesched_node_power_failures", "Failed sleeps, wakes and drains.", ["op"],
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
        self.recovered = Counter("joulesched_node_power_recovered", "Intermediate states left by another replica "
                                 "(or an aborted action) that were resumed or rolled back.", ["state"],
                                 registry=registry)


@dataclass
class _NodeRec:
    empty_since: float | None = None
    retry_at: float = 0.0
    failures: int = 0
    drain_started: float = 0.0
    #: when (our monotonic clock) the first sleep failed that the actuator could not confirm (the node stays
    #: cordoned): a kubelet renewing its Lease after ``sleep_timeout_s`` more shows the machine kept running.
    sleep_failed_at: float | None = None
    #: the node Lease's renewTime once that window had passed (a later, different one is a renewal after it)
    lease_after_window: str | None = None


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def eviction_blocker(p: PodInfo) -> str:
    """Why consolidation may not evict ``p`` ("" = it may)."""
    if p.deleting:  # already going (a finalizer may hold it for ever): its node would be planned at every round
        return "terminating"
    if p.safe_to_evict == "false":
        return "safe-to-evict: false"
    if p.local_storage and p.safe_to_evict != "true":
        return "local storage"
    if not p.meta.owner_kind:
        return "no controller"
    if p.daemon:  # here only when its DaemonSet is not confirmed (live/daemonsets.py): nothing would replace it
        return "names a DaemonSet that does not select it (or could not be read)"
    if p.meta.kind == "job" and p.safe_to_evict != "true":
        return "a Job's pod (not marked safe-to-evict: \"true\")"  # its progress would be lost
    if p.inter_pod:
        # Where it may go depends on the other pods, which the plan does not model: a replica evicted for a node its
        # anti-affinity excludes would stay Pending (a review), and its node sleep meanwhile.
        return "inter-pod (anti-)affinity or topology spread"
    return ""


#: A claim whose volume could not be read: no constraint known to a wake, a reason not to evict for consolidation.
UNREADABLE = object()


class LostLeadership(ActionAborted):
    """This replica no longer holds the Lease (or has held it again since the action began): stop at once."""


class NodePowerController:
    """The controller over a :class:`KubeCache` (see the module docstring).

    :param source: the process's cache (shared: not started or stopped here), or an API client (a cache of
        its own is made, started and stopped with the controller).
    :param actuator: anything with ``sleep``/``wake``/``state`` (:mod:`joulesched.live.actuators`).
    :param leader: an elector to use instead of making one (None = its own on ``cfg.lease_name`` when
        ``cfg.leader_elect``).

    :attr:`delegated` (``NodeInfo -> bool``, None = none) names the nodes whose sleep and wake someone else
    decides: the cluster-autoscaler provider's node groups (:mod:`joulesched.live.autoscaler`). The controller's
    own passes never sleep, wake or drain them (its recovery of a stranded state still applies);
    :meth:`request_wake` and :meth:`request_sleep` act on them with every rule of the controller's own actions.
    """

    def __init__(self, source: KubeCache | k8s.ApiClient, actuator: Any, cfg: NodePowerConfig | None = None, *,
                 curves: CurveResolver | None = None, registry: CollectorRegistry | None = None,
                 leader: LeaderElector | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg or NodePowerConfig()
        self._own_cache = not isinstance(source, KubeCache)
        self.cache = KubeCache(source, curves=curves) if self._own_cache else source
        self.api, self.actuator, self.clock = self.cache.api, actuator, clock
        self.core_api = k8s.CoreV1Api(self.api)
        self.policy_api = k8s.PolicyV1Api(self.api)
        self.coord_api = k8s.CoordinationV1Api(self.api)
        self.daemonsets = DaemonSetCheck(self.api, self.cfg.request_timeout_s)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = NodePowerMetrics(self.registry)
        self.core = NodePowerCore(self.cfg.policy)
        self.delegated: Callable[[NodeInfo], bool] | None = None
        self._delegated: set[str] = set()
        self._lock = threading.RLock()
        self._recs: dict[str, _NodeRec] = {}
        self._sleep_cap = SleepCap(self.cfg.max_sleeps_per_hour)  # on this replica's clock
        self._ratelog = RateLimitedLog(log, interval_s=300.0)
        self._busy: dict[str, str] = {}  # nodes with an action in flight -> the action
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_pool = ThreadPoolExecutor(max_workers=self.cfg.wake_workers, thread_name_prefix="node-wake")
        self._sleep_pool = ThreadPoolExecutor(max_workers=self.cfg.sleep_workers, thread_name_prefix="node-sleep")
        self._alive = clock()
        self._last_account = clock()
        self._next_consolidation = clock() + self.cfg.policy.consolidate_interval_s
        self._announced: set[tuple[str, str]] = set()
        self._first_seen: dict[str, float] = {}
        self._resolved: dict[str, Resolved] = {}
        self._resolve_inputs: tuple | None = None
        # per reconcile: claims -> their PV's node terms
        self._pv_cache: dict[tuple[str, str], list[NodeSelectorTerm] | None] = {}
        self._leading_since: float | None = None
        self._leading_term = -1
        self._seed_cap = False  # a new term: count the last hour's sleeps the nodes show (_seed_sleep_cap)
        self._placeable_pending = 0  # pending pods some node fits, at the last wake pass
        self._seeded: set[tuple[str, str]] = set()  # (node, power-state-since) counted so (once, over all terms)
        self._slept: dict[str, float] = {}  # node -> when (our clock) this replica last started its sleep
        self._keep_awake: frozenset[str] = frozenset()  # control planes by their static pods, our own node
        self._resolve_lock = threading.Lock()
        self._addresses_stamp = _files_stamp(self.cfg.addresses_file) if self.cfg.addresses_file else None
        self._addresses_pending: tuple[tuple, float] | None = None
        #: (monotonic time, action, node) of every action taken, or announced in dry-run (tests read it).
        self.actions: list[tuple[float, str, str]] = []
        self._own_leader = leader is None and self.cfg.leader_elect and not self.cfg.dry_run
        self.leader = leader
        if self._own_leader:
            self.leader = LeaderElector(self.api, self.cfg.lease_namespace, self.cfg.lease_name,
                                        identity=self.cfg.identity, lease_duration_s=self.cfg.lease_duration_s,
                                        renew_deadline_s=self.cfg.renew_deadline_s,
                                        retry_period_s=self.cfg.retry_period_s, clock=clock)
        self.cache.add_change_listener(self._kick.set)
        if not self._own_cache:  # a scheduler on the same cache sees which nodes this controller would sleep
            self.cache.sleeper = self.may_sleep

    # ---- lifecycle ----
    def start(self) -> "NodePowerController":
        if self._own_cache:
            self.cache.start()
        if self._own_leader:
            self.leader.start()
        self._thread = threading.Thread(target=self._loop, name="node-power", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop: actions in flight abort at their next checkpoint and leave their state (and owner) for the
        next leader; then the Lease is released so a standby takes over at once."""
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(10)
        self._wake_pool.shutdown(wait=True)
        self._sleep_pool.shutdown(wait=True)
        if self._own_leader:
            self.leader.stop(release=True)
        if self._own_cache:
            self.cache.stop()

    @property
    def synced(self) -> bool:
        return self.cache.synced

    def healthy(self) -> bool:
        return not self._stop.is_set() and self.clock() - self._alive < max(30.0, 3 * self.cfg.resync_s)

    def is_leader(self) -> bool:
        if self.cfg.dry_run and self.leader is None:
            return True
        return self.leader is None or self.leader.is_leader()

    def _term(self) -> int:
        return self.leader.transitions if self.leader is not None else 0

    def _may_write(self, stopping_ok: bool = False) -> bool:
        return not self.cfg.dry_run and self.is_leader() and (stopping_ok or not self._stop.is_set())

    def _guard(self, term: int) -> Callable[[], None]:
        """The check an action's every request is preceded by: still leader, in the term it began in, and not
        stopping."""
        def check() -> None:
            if self._stop.is_set():
                raise LostLeadership("the controller is stopping")
            if not self.is_leader() or self._term() != term:
                raise LostLeadership("this replica lost the Lease")
        return check

    # ---- the loop ----
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(self.cfg.resync_s)
            self._kick.clear()
            self._alive = self.clock()
            try:
                self._reload_addresses()
            except Exception:  # whatever the file holds, the loop goes on with the last good map
                log.exception("the address map changed but could not be read; the last good one stays in force")
            leading = self.is_leader()
            self.metrics.leader.set(1 if leading else 0)
            if not leading:
                self._leading_since = None
            elif self._leading_since is None or self._leading_term != self._term():
                # A new term, also one regained between two passes: the grace before resuming others' work
                # starts again, and what this replica remembers of failed sleeps is forgotten (another leader may
                # have asked for a power-off since): reconcile() marks each node left going down afresh.
                self._leading_since, self._leading_term = self.clock(), self._term()
                with self._lock:
                    for rec in self._recs.values():
                        rec.sleep_failed_at, rec.lease_after_window = None, None
                        # When a node emptied is this term's to see: a time kept from an earlier term would let a
                        # node that has run pods since (under another leader) sleep without its sleep_after_s.
                        rec.empty_since = None
                self._seed_cap = True
            if self._stop.is_set() or not self.synced:
                continue
            if not leading:
                # A standby acts on nothing, but a scheduler sharing its cache still asks which nodes would sleep
                # (may_sleep): keep the addresses resolved (reads only; a refusal is logged once, as a leader's).
                if not self._own_cache:
                    try:
                        nodes, pods = self._snapshot()
                        self._refresh_keep_awake(pods)
                        self._resolve(nodes)
                    except Exception:
                        log.exception("resolving power addresses failed")
                continue
            try:
                self.reconcile()
            except Exception:  # an unexpected error must not stop the controller
                log.exception("reconcile failed")
            time.sleep(0.01)  # coalesce bursts of events

    def _reload_addresses(self) -> None:
        """Re-read ``addresses_file`` when its files changed (size, time, inode: a mounted ConfigMap is swapped
        in whole by the kubelet); a map that does not load leaves the last good one in force."""
        path = self.cfg.addresses_file
        if not path:
            return
        stamp = _files_stamp(path)
        if stamp == self._addresses_stamp:
            self._addresses_pending = None
            return
        # An edit is read once it has stood still for _MAP_SETTLE_S: a file rewritten in place is empty, then
        # half-written, for a moment, and a map read then would take machines from their nodes (an empty map
        # is written as ``{}``, never as an empty file).
        now = time.monotonic()
        if self._addresses_pending is None or self._addresses_pending[0] != stamp:
            self._addresses_pending = (stamp, now)
            return
        if now - self._addresses_pending[1] < _MAP_SETTLE_S:
            return
        self._addresses_pending = None
        self._addresses_stamp = stamp
        from joulesched.live.daemon import DaemonInputError

        try:  # read again when it changes (its stamp does)
            new = load_addresses(path, self.cfg.access, allow_blank=False)
        except DaemonInputError as e:
            log.error("the address map changed but does not load, the last good one stays in force: %s", e)
            return
        if new == self.cfg.addresses:
            return
        changed = {n for n in set(new) | set(self.cfg.addresses) if new.get(n) != self.cfg.addresses.get(n)}
        log.info("address map reloaded from %s: %d entries, changed for %s", path, len(new),
                 ", ".join(sorted(changed)[:10]) + (" ..." if len(changed) > 10 else ""))
        self._announced -= {("adopt", n) for n in changed}  # show the new address on the node
        self.cfg.addresses = new  # one assignment: a pass sees the old map or the new one whole

    # ---- the view the core decides on ----
    def _snapshot(self) -> tuple[dict[str, NodeInfo], list[PodInfo]]:
        with self.cache.lock:
            return dict(self.cache.nodes), list(self.cache.pods.values())

    def _refresh_keep_awake(self, pods) -> None:
        keep = _keep_awake(pods, self.cfg.own_node)
        if keep != self._keep_awake:
            self._keep_awake = keep
            self.cache.sleepers_changed()

    def _resolve(self, nodes: dict[str, NodeInfo]) -> dict[str, Resolved]:
        """Each node's usable power address (the operator's map, or an annotation its policy allows); refusals
        are logged once per node and reason. (The loop and the autoscaler's requests both call it.)"""
        with self._resolve_lock:
            return self._resolve_locked(nodes)

    def _resolve_locked(self, nodes: dict[str, NodeInfo]) -> dict[str, Resolved]:
        inputs = {n: (i.power_address, i.provider_id) for n, i in nodes.items()}
        addresses = self.cfg.addresses  # one map for the whole resolution, whatever a reload does meanwhile
        key = (inputs, dict(addresses))
        if key != self._resolve_inputs:
            self._resolved = self.cfg.access.resolve_all(inputs, addresses)
            self._resolve_inputs = key
            self.cache.sleepers_changed()
            for n, r in self._resolved.items():
                if r.refused:
                    self._announce_once(f"refused:{r.refused}", n, f"node {n}: its power address from the "
                                        f"{r.source} is not used: {r.refused}")
        return self._resolved

    def may_sleep(self, info: NodeInfo) -> bool:
        """Whether this controller would put ``info``'s node to sleep once idle: not a control plane or never-sleep
        node, not delegated, and with a power address it may use (the cache's :attr:`KubeCache.sleeper` where a
        scheduler shares the cache: its states' ``may_sleep``). The addresses are resolved on every pass, by a
        leader or a standby; before the first, only the ``none`` actuator (cordon only) answers yes."""
        return not (self._never_slept(info, self._keep_awake)
                    or (self.delegated is not None and self.delegated(info)))

    def address_of(self, name: str) -> Resolved:
        if getattr(self.actuator, "name", "") == "none":
            return Resolved(parse_address("none"), "map")  # cordon only: nothing is ever contacted
        return self._resolved.get(name) or Resolved(None)

    def _announce_once(self, what: str, node: str, msg: str) -> None:
        if (what, node) not in self._announced:
            if len(self._announced) > 100_000:  # bounded: a churning cluster must not grow it for ever
                self._announced.clear()
            self._announced.add((what, node))
            log.warning("%s", msg)

    def _view(self):
        """(state, names, infos, workload pods per node, pending pods, pods by node index, counted)."""
        nodes, pods = self._snapshot()
        self._refresh_keep_awake(pods)
        self._resolve(nodes)
        names = sorted(nodes)
        infos = [nodes[n] for n in names]
        index = {n: k for k, n in enumerate(names)}
        st = ClusterState(names, [i.cpu_m for i in infos], [i.memory_mib for i in infos],
                          [i.max_pods for i in infos], [i.curve for i in infos],
                          sleep_watts=[self.cfg.sleep_watts] * len(names), can_sleep=True)
        protected = np.zeros(len(names), dtype=bool)
        counted = np.zeros(len(names), dtype=bool)  # Ready, schedulable workers: what min_awake counts
        delegated = {i.name for i in infos if self.delegated is not None and self.delegated(i)}
        if delegated != self._delegated:
            self._delegated = delegated
            self.cache.sleepers_changed()
        for k, info in enumerate(infos):
            s = info.power_state
            foreign_cordon = info.unschedulable and not info.cordoned_by_us
            if s in (SLEEPING, ASLEEP_STATE):
                st.power_state[k] = ASLEEP
            elif s in (WAKING_STATE, DRAINING) or not info.ready or foreign_cordon:
                st.power_state[k] = WAKING  # awake but not a place for pods (or for our decisions)
            if (info.control_plane or info.never_sleep or foreign_cordon or info.name in self._delegated
                    or info.name in self._keep_awake or self.address_of(info.name).address is None):
                protected[k] = True
            counted[k] = (s == AWAKE and info.ready and not info.unschedulable and not info.control_plane
                          and not any(t.key == ASLEEP_TAINT for t in info.taints))
        self.core.protected = protected
        self.core.counted = counted
        workload = np.zeros(len(names), dtype=np.int64)
        pending: list[PodInfo] = []
        by_node: dict[int, list[PodInfo]] = {}
        for p in pods:
            if p.node_name:
                k = index.get(p.node_name)
                if k is None:
                    continue
                st.bind(k, p.request)
                if not p.daemon or not self.daemonsets.keeps_no_node_awake(p):  # unreadable: on the safe side
                    workload[k] += 1
                    by_node.setdefault(k, []).append(p)
            elif not p.deleting and not p.gated:  # a gated pod is no scheduler's yet: it wakes nothing
                pending.append(p)
        pending.sort(key=lambda p: (p.rv, p.uid))
        return st, names, infos, workload, pending, by_node

    # ---- reconcile ----
    def reconcile(self) -> None:
        """One pass: account, recover, wake, sleep, consolidate (see the module docstring)."""
        now = self.clock()
        st, names, infos, workload, pending, by_node = self._view()
        states = [i.power_state for i in infos]
        self._account(st, infos, now)
        with self._lock:
            busy = dict(self._busy)
            for n in names:
                self._recs.setdefault(n, _NodeRec())
            present = set(names)
            for n in [n for n in self._recs if n not in present and n not in self._busy]:  # deleted: bounded
                del self._recs[n]
        # A node whose sleep is in flight is on its way down though the cache may still show it awake: it must not
        # count toward min_awake or spare_cpu_m, or consecutive passes could together sleep past min_awake.
        going = [k for k, n in enumerate(names) if busy.get(n) == "sleep"]
        if going:
            st.power_state[going] = ASLEEP
            if len(self.core.counted) == len(names):
                self.core.counted[going] = False
        if self._seed_cap:
            self._seed_cap = False
            self._seed_sleep_cap(infos, now)
        self._adopt_addresses(infos)
        self._forget_lifted_cordons(infos, busy)
        self._assume_going_down(names, infos, busy)
        self._recover(names, infos, busy, now, (WAKING_STATE, DRAINING))
        self._resume_failed_wakes(names, infos, busy, now)
        wanted = self._wake_pass(st, names, infos, pending, busy, now)
        # A sleep left half-done is resumed only after the wake pass: a pending pod that needs the node wakes it
        # instead (a sleep the actuator could not confirm leaves the node cordoned; retrying it must not win).
        with self._lock:
            after_wakes = dict(self._busy)
        self._recover(names, infos, after_wakes, now, (SLEEPING,))
        self._sleep_pass(st, names, states, workload, busy, now, wanted)
        if (self.cfg.policy.consolidate and now >= self._next_consolidation
                and not self._consolidation_held(infos, pending)):
            self._next_consolidation = now + self.cfg.policy.consolidate_interval_s
            self._consolidate(st, names, infos, by_node, busy, now)
        counts = {s: 0 for s in POWER_STATES}
        for s in states:
            counts[s] += 1
        for s, c in counts.items():
            self.metrics.nodes.labels(s).set(c)

    def _seed_sleep_cap(self, infos: list[NodeInfo], now: float) -> None:
        """At a new term, count toward ``max_sleeps_per_hour`` the sleeps of the last hour that the nodes show
        (sleeping or asleep since then) and this replica did not start itself: a restarted or failed-over controller
        started from an empty count, so a crash loop was bounded by nothing. Both times compared are wall-clock
        times a controller wrote (``power-state-since``) and ours."""
        if not self._sleep_cap.per_hour:
            return
        wall = time.time()
        seeds = []
        for info in infos:
            # Asleep only: a `sleeping` node is resumed, and counted then; and a failed wake rewrites the time.
            if info.power_state != ASLEEP_STATE or info.wake_failed or not info.power_since:
                continue
            mine = self._slept.get(info.name)
            if mine is not None and now - mine < 3600.0:
                continue  # counted when this replica started it
            if (info.name, info.power_since) in self._seeded:
                continue  # counted at an earlier term
            try:
                since = datetime.fromisoformat(info.power_since.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
            age = max(wall - since, 0.0)  # a writer's clock a little ahead of ours: just now
            if age < 3600.0 and wall - since > -60.0:
                seeds.append(now - age)
                self._seeded.add((info.name, info.power_since))
        self._seeded &= {(i.name, i.power_since) for i in infos}  # those the nodes still show: bounded
        if seeds:
            with self._lock:
                self._sleep_cap.started = collections.deque(sorted([*self._sleep_cap.started, *seeds]))
            log.info("%d sleeps of the last hour by an earlier leader count toward max_sleeps_per_hour", len(seeds))

    def _forget_lifted_cordons(self, infos: list[NodeInfo], busy) -> None:
        """A node marked as cordoned by us that is schedulable was uncordoned by someone else: the mark goes, or a
        cordon an administrator sets later would be taken for ours and lifted by our next wake or undrain (a
        review). Written with the node's resourceVersion: a cordon set meanwhile keeps the mark's removal out."""
        if not self._may_write():
            return
        for info in infos:
            if not info.cordoned_by_us or info.unschedulable or info.name in busy:
                continue
            try:
                obj = json.loads(self.core_api.read_node(info.name, _preload_content=False,
                                                         _request_timeout=self.cfg.request_timeout_s).data)
                meta = obj.get("metadata") or {}
                if (obj.get("spec") or {}).get("unschedulable") or CORDONED_ANNOTATION not in (
                        meta.get("annotations") or {}):
                    continue
                resp = self.core_api.patch_node(
                    info.name, {"metadata": {"resourceVersion": meta["resourceVersion"],
                                             "annotations": {CORDONED_ANNOTATION: None}}},
                    _content_type="application/merge-patch+json", _preload_content=False,
                    _request_timeout=self.cfg.request_timeout_s)
                self.cache.observe_node(json.loads(resp.data))
                log.info("node %s was uncordoned by someone else: our cordon mark is removed", info.name)
            except Exception as e:  # the next pass tries again
                log.info("could not remove the cordon mark of node %s: %s", info.name, type(e).__name__)

    def _resume_failed_wakes(self, names, infos, busy, now) -> None:
        """A wake that timed out leaves the node asleep with ``wake-failed``; if its machine came up after all
        (a slow boot, a BMC job run late) it is Ready yet cordoned and tainted, and no pass would ever wake or
        sleep it. Such a node is woken again once its backoff is over: the wake is idempotent and counts the node
        awake only on a fresh heartbeat."""
        if self._leading_since is None:
            return
        for name, info in zip(names, infos):
            if (info.power_state == ASLEEP_STATE and info.wake_failed and info.ready and name not in busy
                    and self._recs[name].retry_at <= now and name not in self._delegated
                    and self.address_of(name).address is not None and not self._in_grace(info, now)):
                log.info("node %s is Ready after its wake failed: waking it again", name)
                self._start(name, "wake", self._do_wake)

    def _adopt_addresses(self, infos: list[NodeInfo]) -> None:
        """Write the address map's entry onto a node that does not show it, so that ``kubectl get node``
        shows where its power is switched (once per node; the map stays what is used)."""
        if not self.cfg.addresses or not self._may_write():
            return
        for info in infos:
            addr = self.cfg.addresses.get(info.name)
            if not addr or info.power_address == addr or ("adopt", info.name) in self._announced:
                continue
            self._announced.add(("adopt", info.name))
            try:
                self.core_api.patch_node(info.name, {"metadata": {"annotations": {POWER_ADDRESS_ANNOTATION: addr}}},
                                         _content_type="application/merge-patch+json", _preload_content=False,
                                         _request_timeout=self.cfg.request_timeout_s)
            except Exception as e:
                log.info("could not annotate node %s with its power address: %s", info.name, type(e).__name__)

    def _account(self, st: ClusterState, infos: list[NodeInfo], now: float) -> None:
        dt = now - self._last_account
        self._last_account = now
        # A node whose wake failed may be on (a timed-out wake): it saves nothing we can claim.
        asleep = np.array([i.power_state == ASLEEP_STATE and not i.wake_failed for i in infos], dtype=bool)
        if dt > 0 and asleep.any():
            self.metrics.joules_saved.inc(float(np.maximum(st.idle_watts[asleep] - self.cfg.sleep_watts, 0).sum()) * dt)

    def _assume_going_down(self, names, infos, busy) -> None:
        """A node marked :data:`OFF_REQUESTED_ANNOTATION` that no action of this leader is on, and whose failed
        sleep it does not remember, may have a power-off on its way (a sleep whose answer was lost, before a restart
        or a failover): its OS may still be shutting down with its kubelet renewing. Treated as a sleep that failed
        unconfirmed from now on this replica's clock, so it is uncordoned, or counted awake after a wake, only once
        its kubelet outlives a whole sleep's deadline (a review: a new leader woke such a node at once, uncordoned
        it and marked it awake, and the machine then went off with its new pods)."""
        if self._leading_since is None:
            return
        now = self.clock()
        for name, info in zip(names, infos):
            rec = self._recs[name]
            if info.off_requested and name not in busy and rec.sleep_failed_at is None:
                rec.sleep_failed_at, rec.lease_after_window = now, None

    def _in_grace(self, info: NodeInfo, now: float) -> bool:
        """A replica's action on the node may still be on the wire: it names an owner and this replica has led
        for less than ``takeover_grace_s``. Nothing is resumed, rolled back or woken until it has ended."""
        return bool(info.power_owner) and (self._leading_since is None
                                           or now - self._leading_since < self.cfg.takeover_grace_s)

    def _recover(self, names, infos, busy, now, kinds=INTERMEDIATE) -> None:
        """Resume or roll back intermediate states (of ``kinds``) no action of ours is working on."""
        if self._leading_since is None:
            return
        for k, info in enumerate(infos):
            name = names[k]
            if info.power_state not in kinds or name in busy:
                continue
            if info.power_state == DRAINING and info.power_owner == self.cfg.identity:
                continue  # our own drain: the sleep pass follows it (sleep once empty, undrain on timeout)
            if self._in_grace(info, now):
                continue  # another replica's request may still be on the wire
            if self._recs[name].retry_at > now:
                continue
            self.metrics.recovered.labels(info.power_state).inc()
            log.info("node %s was left %s by %s: %s", name, info.power_state, info.power_owner or "a failed action",
                     "rolling back" if info.power_state == DRAINING else "resuming")
            if info.power_state == WAKING_STATE:
                self._start(name, "wake", self._do_wake)
            elif info.power_state == SLEEPING:
                self._start(name, "sleep", lambda n: self._do_sleep(n, resume=True))
            else:
                self._start(name, "undrain", self._do_undrain)

    def _fits(self, info: NodeInfo, pod: PodInfo) -> bool:
        """Would ``pod`` pass the filters on ``info`` (the cache's filter chain: resources aside, which the
        core counts), and its volumes' node affinity."""
        return not node_gate_reason(info, pod) and self._volumes_allow(info, pod)

    def _volumes_allow(self, info: NodeInfo, pod: PodInfo) -> bool:
        """PV node affinity (kube-scheduler's VolumeBinding filter for bound claims), which the cache's filters
        do not cover: every bound claim's volume must accept the node. Claims are read when asked (a pod with
        claims waiting for a sleeping node is rare) and cached per reconcile."""
        for claim in pod.claims:
            terms = self._pv_terms(pod.namespace, claim)
            if terms is None or terms is UNREADABLE:  # a wake trusts the scheduler; an eviction refuses (below)
                continue
            if terms and not any(t.matches(info.labels, {"metadata.name": info.name}) for t in terms):
                return False
        return True

    def _pv_terms(self, namespace: str, claim: str) -> list | None | object:
        """The node affinity of the claim's volume: None when it has none (or is not bound), :data:`UNREADABLE`
        when the claim or volume could not be read."""
        key = (namespace, claim)
        cache = self._pv_cache
        if key in cache:
            return cache[key]
        terms = None
        try:
            pvc = json.loads(self.core_api.read_namespaced_persistent_volume_claim(
                claim, namespace, _preload_content=False, _request_timeout=self.cfg.request_timeout_s).data)
            vol = (pvc.get("spec") or {}).get("volumeName")
            if vol:
                pv = json.loads(self.core_api.read_persistent_volume(
                    vol, _preload_content=False, _request_timeout=self.cfg.request_timeout_s).data)
                req = (((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {})
                terms = node_selector_terms(req.get("nodeSelectorTerms"))
        except Exception as e:  # unreadable: no constraint known (the scheduler still applies it)
            self._ratelog.warn("pv-read", "cannot read the volume of claim %s/%s (%s): a pod waiting for it may not "
                               "wake its node, and its pods are not moved", namespace, claim, type(e).__name__)
            terms = UNREADABLE
        cache[key] = terms
        return terms

    def _wake_pass(self, st, names, infos, pending, busy, now) -> np.ndarray:
        """Wake nodes for pending pods; returns the awake nodes some pending pod fits (they must not sleep)."""
        self._pv_cache: dict[tuple[str, str], list[NodeSelectorTerm] | None] = {}
        seen = self._first_seen
        live = {p.uid for p in pending}
        for uid in [u for u in seen if u not in live]:
            del seen[uid]
        grace = self.cfg.nominate_grace_s
        # Our scheduler's pods: the node it nominates, or, if it says nothing within the grace, the core's choice.
        # Within the grace such a pod wakes nothing, but the awake nodes it fits are still wanted: it is about to
        # be bound to one of them, which must not be put to sleep meanwhile.
        in_grace = [not p.nominated_node and p.scheduler_name == self.cfg.scheduler_name
                    and now - seen.setdefault(p.uid, now) < grace for p in pending]
        self._placeable_pending = 0
        if not pending:
            return np.zeros(len(names), dtype=bool)
        n = len(names)
        fits = np.zeros((len(pending), n), dtype=bool)
        for j, info in enumerate(infos):
            if busy.get(names[j]) == "wake" or (st.power_state[j] == WAKING and info.waking):
                st.power_state[j] = WAKING  # on its way: its room counts, nothing more to wake for it
                info, usable = info.awake_view(), True
            elif st.power_state[j] == ASLEEP:  # gate it as it will be once awake: without our taint and cordon
                # (Not a node another replica may still be putting to sleep: waking it now would find its kubelet
                # alive, uncordon it, and leave it marked awake once the machine is off.)
                usable = (self._recs[names[j]].retry_at <= now and names[j] not in busy
                          and names[j] not in self._delegated and self.address_of(names[j]).address is not None
                          and not (info.power_state == SLEEPING and self._in_grace(info, now)))
                info = info.awake_view()
            else:
                usable = st.power_state[j] == ON
            if not usable:
                continue
            for k, p in enumerate(pending):
                fits[k, j] = self._fits(info, p)
        index = {nm: k for k, nm in enumerate(names)}
        nominated: list[int] = []
        rest: list[int] = []  # pods whose wake is not already taken care of
        for k, p in enumerate(pending):
            if in_grace[k]:
                continue  # its wake is its scheduler's to nominate
            j = index.get(p.nominated_node, -1)
            if j >= 0 and st.power_state[j] == ASLEEP and fits[k, j]:
                nominated.append(j)  # the scheduler's choice
            elif j >= 0 and (st.power_state[j] != ASLEEP or names[j] in busy):
                pass  # its node is waking (or awake): nothing to do for it
            else:
                rest.append(k)
        for j in self.core.choose_wake(st, [pending[k].request for k in rest], nominated, fits[rest]):
            name = names[j]
            if name in busy or infos[j].power_state not in (SLEEPING, ASLEEP_STATE):
                continue
            self._start(name, "wake", self._do_wake)
        # Pods some node takes by its filters and its whole allocatable (a pod larger than every node, or that no
        # node's filters take, is pending for good and holds no consolidation back).
        cpu = np.array([p.request.filter_cpu for p in pending], dtype=np.int64)[:, None]
        mem = np.array([p.request.filter_mem for p in pending], dtype=np.int64)[:, None]
        whole = (cpu <= st.alloc_cpu[None, :]) & (mem <= st.alloc_mem[None, :])
        self._placeable_pending = int((fits & whole).any(axis=1).sum())
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
            if verdict or not self._sleep_room(name, now) or not self._start(name, "sleep", self._do_sleep,
                                                                              capped=True):
                continue
            st.power_state[i] = ASLEEP  # later verdicts in this pass count it as asleep
            self.core.counted[i] = False

    def _consolidation_held(self, infos, pending) -> bool:
        """One drain at a time, until its node has emptied and its pods are placed: the evictions are sent in
        seconds, but the pods take their grace to go and their replacements to be placed, and meanwhile the room
        they will take on other nodes would be counted as free again (a review). So no plan while a node drains or
        a pending pod fits some node (the wake pass's filters); a pod that fits none (an unsatisfiable selector)
        holds nothing. A pod pending for good that our filters think fits (inter-pod rules, which they do not
        model) would hold it off for good: said in the log."""
        if any(i.power_state == DRAINING for i in infos):
            return True
        if self._placeable_pending:
            self._ratelog.warn("consolidation-held", "consolidation waits: %d pending pod(s) fit some node (a drain's "
                               "pods are placed first; one that stays pending holds it off)", self._placeable_pending)
            return True
        return False

    def _consolidate(self, st, names, infos, by_node, busy, now) -> None:
        try:
            pdbs = json.loads(self.policy_api.list_pod_disruption_budget_for_all_namespaces(
                _preload_content=False, _request_timeout=self.cfg.request_timeout_s).data).get("items") or []
        except Exception as e:
            log.info("consolidation skipped: cannot list PodDisruptionBudgets (%s)", type(e).__name__)
            return
        if any(a == "drain" for a in busy.values()):
            # One drain at a time: its evictions are counted in the budget when it ends, and its pods, not yet
            # placed, would be counted as room on the other nodes (a review: two drains took 4 evictions of 3).
            return
        self._pv_cache = {}
        movable: dict[int, list[MovablePod]] = {}
        fits: dict[object, np.ndarray] = {}
        for i, pods in by_node.items():
            if (st.power_state[i] != ON or names[i] in busy or infos[i].power_state != AWAKE
                    or self._recs[names[i]].retry_at > now):  # a drain that was aborted backs off
                continue
            ms = []
            budget: dict[int, int] = {}  # id(PDB) -> its pods on this node to evict
            for p in pods:
                blocker = eviction_blocker(p)
                # A PDB with no selector selects nothing (policy/v1); one with an empty selector, every pod.
                covering = [b for b in pdbs if (b.get("metadata") or {}).get("namespace") == p.namespace
                            and (b.get("spec") or {}).get("selector") is not None
                            and selector_matches((b.get("spec") or {}).get("selector"), p.labels, empty_matches=True)]
                if not blocker and len(covering) > 1:
                    blocker = "several PDBs"  # the Eviction API refuses such a pod (500)
                if not blocker and any(int((b.get("status") or {}).get("disruptionsAllowed") or 0) <= 0
                                       for b in covering):
                    blocker = "pdb"
                if not blocker and p.namespace == "kube-system" and not covering:
                    blocker = "kube-system pod without a PDB"
                if not blocker and any(self._pv_terms(p.namespace, c) is UNREADABLE for c in p.claims):
                    blocker = "its volumes could not be read"  # a local volume would pin it to this node
                if not blocker and (p.request.named or p.request.host_ports):
                    # Where they could go is not known here: the plan counts CPU, memory, pods and GPUs, and a
                    # named resource only against a node's total (a review: a pod of a device plugin's resource
                    # was evicted, its node slept, and its replacement stayed Pending).
                    blocker = "named resources or host ports"
                if not blocker and covering:
                    budget[id(covering[0])] = budget.get(id(covering[0]), 0) + 1
                ms.append(MovablePod(p.uid, p.request, float(p.request.filter_cpu), 0.0, blocker))
                if not blocker:  # where it may go: by its own selectors, affinity, tolerations and volumes
                    # Only to nodes that hold workload or never sleep: an empty node is about to sleep (its own
                    # timer runs on, and nothing pending holds it while the pod is still terminating here), so
                    # moving pods there would swap which node sleeps, after a restart, and could leave them
                    # nowhere (a review).
                    fits[p.uid] = np.array([j != i and (j in by_node or bool(self.core.protected[j]))
                                            and self._fits(infos[j], p) for j in range(len(infos))])
            # A PDB allows disruptionsAllowed evictions in all: more of its pods on the node than that and the
            # drain would stop half done at a 429, one pod restarted for nothing (a review).
            if any(n > int((b.get("status") or {}).get("disruptionsAllowed") or 0)
                   for b in pdbs if (n := budget.get(id(b), 0))):
                ms = [m if m.blocker else dataclasses.replace(m, blocker="pdb: fewer disruptions allowed than its "
                                                                         "pods here") for m in ms]
            movable[i] = ms
        # (No node is draining here, see above: none is being disrupted for the budgets.)
        plan = self.core.plan(st, now, movable, fits, wall_s=time.time(), disrupting=0)
        if plan is None:
            return
        name = names[plan.node]
        pods = [(p.namespace, p.name, p.uid) for p in by_node[plan.node]]
        log.info("consolidating %s: %d pods to move, predicted saving %.0f J against %.0f J to restart them",
                 name, len(pods), plan.saving_j, plan.cost_j)
        self._start(name, "drain", lambda n: self._do_drain(n, pods))

    # ---- what an external decider calls (the autoscaler provider) ----
    def node_infos(self) -> dict[str, NodeInfo]:
        """The cache's nodes by name (immutable NodeInfo)."""
        return self._snapshot()[0]

    def action_of(self, name: str) -> str | None:
        """The action in flight on ``name`` (``wake``, ``sleep``, ``drain``...), or None."""
        with self._lock:
            return self._busy.get(name)

    def workload_pods_on(self, name: str) -> list[str] | None:
        """A fresh read of the workload pods on ``name`` (mirror pods and confirmed DaemonSet pods left out,
        live/daemonsets.py); None if the pods or a DaemonSet they name could not be read."""
        return self._workload_pods_on(name)

    def request_wake(self, name: str) -> bool:
        """Wake ``name`` as the controller's own wakes do. False when it is not asleep, has an action in flight
        or is backing off after a failure."""
        info = self.node_infos().get(name)
        with self._lock:
            rec = self._recs.setdefault(name, _NodeRec())
            busy = name in self._busy
        if info is None or info.power_state != ASLEEP_STATE or busy or rec.retry_at > self.clock():
            return False
        return self._start(name, "wake", self._do_wake)

    def _never_slept(self, info: NodeInfo, keep_awake: frozenset[str]) -> bool:
        """Whatever asks: a control plane, a never-sleep node, one in ``keep_awake`` (control-plane static pods,
        this controller's node), or one without a usable power address."""
        return (info.control_plane or info.never_sleep or info.name in keep_awake
                or self.address_of(info.name).address is None)

    def request_sleep(self, name: str) -> bool:
        """Put ``name`` to sleep as the controller's own sleeps do (cordon, taint, settle, a fresh check that no
        workload pod is left, the actuator with its deadline). False when it is not awake, is protected (control
        plane, never-sleep), has an action in flight, has no usable power address, or ``max_sleeps_per_hour``
        leaves no room."""
        nodes, pods = self._snapshot()  # one copy of the cache for the whole check
        self._resolve(nodes)  # the addresses as of now (a reconcile may not have run since the cache changed)
        info = nodes.get(name)
        with self._lock:
            busy = name in self._busy
        if (info is None or info.power_state != AWAKE or busy
                or self._never_slept(info, _keep_awake(pods, self.cfg.own_node))
                or not self._sleep_room(name, self.clock())):
            return False
        return self._start(name, "sleep", self._do_sleep, capped=True)

    # ---- actions (wakes and sleeps on their own bounded pools; at most one per node) ----
    def _sleep_room(self, name: str, now: float) -> bool:
        """Whether ``max_sleeps_per_hour`` leaves room for one more sleep now (logged, rate-limited, when not)."""
        wait = self._sleep_cap.wait(now)
        if not wait:
            return True
        self._ratelog.warn("sleep-cap", "node %s stays awake: %d sleeps were started in the last hour "
                           "(max_sleeps_per_hour); the next may start in %.0f s", name, len(self._sleep_cap.started),
                           wait)
        return False

    def _start(self, name: str, action: str, fn: Callable[[str], None], *, capped: bool = False) -> bool:
        """Run ``fn(name)`` on the action's pool, at most one action per node; False when not started. A
        ``capped`` sleep starts only while ``max_sleeps_per_hour`` leaves room, checked and counted under one lock
        (the loop and the autoscaler's requests could each pass a separate check and together exceed it)."""
        if self.cfg.dry_run:
            if (action, name) not in self._announced:
                if capped and self._sleep_cap.wait(self.clock()):
                    return False
                self._announced.add((action, name))
                if action == "sleep":
                    self._sleep_cap.record(self.clock())
                self.actions.append((self.clock(), action, name))
                self.metrics.actions.labels(action).inc()
                log.info("dry-run: would %s node %s", action, name)
            return True
        with self._lock:
            if name in self._busy or self._stop.is_set():
                return False
            if capped and self._sleep_cap.wait(self.clock()):
                return False
            self._busy[name] = action
            if action == "sleep":
                self._sleep_cap.record(self.clock())
                self._slept[name] = self.clock()
        self.actions.append((self.clock(), action, name))
        if len(self.actions) > 10_000:
            del self.actions[:5_000]
        self.metrics.actions.labels(action).inc()

        def run() -> None:
            try:
                fn(name)
            except LostLeadership as e:
                log.info("%s of node %s stopped: %s; its state is left for the next leader", action, name, e)
            except Exception:
                log.exception("%s of node %s failed", action, name)
            finally:
                with self._lock:
                    self._busy.pop(name, None)
                self._kick.set()

        pool = self._wake_pool if action == "wake" else self._sleep_pool
        try:
            pool.submit(run)
        except RuntimeError:  # the pool is shut down: stopping
            with self._lock:
                self._busy.pop(name, None)
            return False
        return True

    def _target(self, name: str, deadline_s: float, term: int) -> Target | None:
        r = self.address_of(name)
        if r.address is None:
            return None
        return Target(name, r.address, source=r.source, deadline=self.clock() + deadline_s, check=self._guard(term),
                      before_force=lambda: self._still_empty(name))

    def _still_empty(self, name: str) -> None:
        """Before a hard power-off: the node's workload pods read afresh; raises ActionAborted unless none."""
        left = self._workload_pods_on(name)
        if left is None or left:
            raise ActionAborted(f"{name}: " + ("its pods could not be read" if left is None else
                                               f"pod {left[0]} landed on it") + ": no hard power-off")

    def _backoff(self, name: str) -> float:
        with self._lock:
            rec = self._recs.setdefault(name, _NodeRec())
        rec.failures += 1
        delay = min(self.cfg.retry_initial_s * 2 ** (rec.failures - 1), self.cfg.retry_max_s)
        rec.retry_at = self.clock() + delay
        return delay

    def _power(self, target: Target) -> str:
        """The actuator's ``state()``, UNKNOWN when it cannot say (an error); a lost Lease propagates."""
        try:
            return self.actuator.state(target)
        except LostLeadership:
            raise
        except Exception as e:
            log.debug("state of %s: %s", target.node, e)
            return UNKNOWN

    def _node(self, name: str) -> NodeInfo | None:
        with self.cache.lock:
            return self.cache.nodes.get(name)

    def _do_sleep(self, name: str, resume: bool = False) -> None:
        term = self._term()
        target = self._target(name, self.cfg.sleep_timeout_s, term)
        if target is None or not self._may_write():
            return
        if not resume:
            if not self._patch_node(name, state=SLEEPING, owner=True, cordon=True, taint=True):
                return
            self._event(name, "Normal", "NodeSleeping", f"Node {name} is idle: cordoned and tainted, going to sleep")
            if self._stop.wait(self.cfg.settle_s):  # stopping before anything was switched: undo now
                self._patch_node(name, state=AWAKE, cordon=False, taint=False, stopping_ok=True)
                return
        else:  # another replica's (or an aborted) sleep: ours now, still cordoned and tainted
            if not self._patch_node(name, state=SLEEPING, owner=True, cordon=True, taint=True):
                return
            power, info = self._power(target), self._node(name)
            if power == OFF or (power == UNKNOWN and target.address.actuator == "wol" and info is not None
                                and not info.ready):
                self._recs[name].failures = 0  # it went down after all
                self._recs[name].sleep_failed_at = None
                self._patch_node(name, state=ASLEEP_STATE)
                self._event(name, "Normal", "NodeAsleep", f"Node {name} is asleep ({self.actuator.name})")
                return
            if self._roll_back_if_running(name, term):
                return
        target.check()
        left = self._workload_pods_on(name)
        info = self._node(name)
        # What request_sleep refuses too (a delegated node is slept on its delegate's request: not asked here).
        protected = "it is gone" if info is None else "" if not self._never_slept(info, self._keep_awake) else (
            "it is protected now (control plane, never-sleep, this controller's node, or no usable power address)")
        if left is None or left or protected:
            why = protected or ("its pods or their DaemonSets could not be read" if left is None
                                else "a pod landed on it")
            if left is None or protected:
                self._backoff(name)  # not tried again at once: a cordon and uncordon on every pass otherwise
            if self._recs[name].sleep_failed_at is not None:
                # A power-off may be on its way (an earlier sleep's, ours or a former leader's): uncordoning now
                # would let pods land on a machine going down. It stays cordoned; it is uncordoned only once its
                # kubelet outlives the sleep's deadline, the power-off withdrawn first (_roll_back_if_running).
                self._patch_node(name, state=SLEEPING, owner=False)
                self._event(name, "Warning", "NodeSleepAborted", f"Not sleeping node {name}: {why}; an earlier "
                            "power-off may still be under way, so it stays cordoned until its kubelet outlives "
                            "the sleep's deadline")
                return
            self._patch_node(name, state=AWAKE, cordon=False, taint=False)
            self._event(name, "Normal", "NodeSleepAborted", f"Not sleeping node {name}: {why}")
            return
        # Marked on the node before anything is asked of the machine: a replica that takes over (or this one after a
        # restart) then knows a power-off may be under way (_assume_going_down).
        if not self._patch_node(name, state=SLEEPING, owner=True, off_requested=True):
            return  # nothing was asked: left sleeping and cordoned, resumed or rolled back by the next pass
        try:
            target.checkpoint()
            self.actuator.sleep(target)
            if target.address.actuator == "wol":
                self._confirm_off(target)
        except LostLeadership:
            raise
        except Exception as e:
            self._sleep_failed(name, target, e)
            return
        self._recs[name].failures = 0
        self._recs[name].sleep_failed_at = None
        self._patch_node(name, state=ASLEEP_STATE)
        self._event(name, "Normal", "NodeAsleep", f"Node {name} is asleep ({self.actuator.name})")
        log.info("node %s asleep", name)

    def _confirm_off(self, target: Target) -> None:
        """Where the actuator cannot report power (WoL), a sleep counts once the node stops being Ready."""
        while True:
            info = self._node(target.node)
            if info is None or not info.ready:
                return
            target.pause(self.cfg.poll_s)

    def _sleep_failed(self, name: str, target: Target, e: Exception) -> None:
        """Uncordon only when the actuator confirms the machine is on; otherwise keep the cordon and taint
        (``sleeping``, no owner) for a later retry, since pods must not land on a machine going down."""
        delay = self._backoff(name)
        self.metrics.failures.labels("sleep").inc()
        log.warning("sleep of %s failed: %s (retry in %g s)", name, e, delay)
        log.debug("sleep of %s failed", name, exc_info=True)
        untouched = isinstance(e, AddressError)  # refused before anything was sent
        # After an accepted power-off, "on" may be an OS still shutting down: only the kubelet outliving the
        # sleep's deadline shows that it kept running (_roll_back_if_running).
        if untouched or (not off_requested(e) and self._power(
                Target(name, target.address, source=target.source, check=target.check,
                       deadline=self.clock() + self.cfg.request_timeout_s)) == POWER_ON
                and self._withdraw_power_off(name, Target(name, target.address, source=target.source,
                                                          check=target.check,
                                                          deadline=self.clock() + self.cfg.request_timeout_s))):
            self._patch_node(name, state=AWAKE, cordon=False, taint=False)
            self._event(name, "Warning", "NodeSleepFailed", f"{self.actuator.name} could not put node {name} to "
                        f"sleep; it reports the machine on: uncordoned, retrying in {delay:g} s")
        else:
            rec = self._recs[name]
            if rec.sleep_failed_at is None:
                rec.sleep_failed_at, rec.lease_after_window = self.clock(), None
            self._patch_node(name, state=SLEEPING, owner=False)
            self._event(name, "Warning", "NodeSleepFailed", f"{self.actuator.name} could not put node {name} to "
                        f"sleep and cannot confirm it is on: kept cordoned and tainted, retrying in {delay:g} s")

    def _withdraw_power_off(self, name: str, target: Target) -> bool:
        """Before a node whose sleep failed is uncordoned: a power-off left standing with the machine's owner
        (metal3's spec.online: false, a Rufio Job not yet run) would be carried out once it gets to it, pods and
        all, so it is withdrawn first. False (the node stays cordoned) when that fails."""
        cancel = getattr(self.actuator, "cancel_sleep", None)
        if cancel is None:
            return True
        try:
            cancel(target)
            return True
        except LostLeadership:
            raise
        except Exception as e:
            log.warning("node %s: the power-off asked for could not be withdrawn (%s): it stays cordoned", name, e)
            return False

    def _roll_back_if_running(self, name: str, term: int) -> bool:
        """After a sleep that failed unconfirmed: if the kubelet outlived a whole sleep's deadline, the machine
        kept running (a BMC that cannot be reached, an SSH suspend that never ran). Uncordon it rather than keep
        it cordoned for as long as the actuator stays broken; the next sleep waits out the backoff."""
        info = self._node(name)
        if info is None or not info.ready or not self._alive_after_failed_sleep(name):
            return False
        target = self._target(name, self.cfg.request_timeout_s, term)
        if target is not None and not self._withdraw_power_off(name, target):
            return False
        self._recs[name].sleep_failed_at = None
        delay = self._backoff(name)
        self._patch_node(name, state=AWAKE, cordon=False, taint=False, wake_failed=False)
        self._event(name, "Warning", "NodeSleepFailed", f"Node {name} kept running after a failed sleep (its "
                    f"kubelet still renews its Lease {self.cfg.sleep_timeout_s:g} s later): uncordoned, next sleep "
                    f"in {delay:g} s at the earliest")
        return True

    def _alive_after_failed_sleep(self, name: str) -> bool:
        """The node's kubelet renewed its Lease after ``sleep_timeout_s`` had passed since its failed sleep: the
        machine kept running. Two reads on our own clock (the Lease as it was once the window had passed, then a
        different one), so a node's clock ahead of ours cannot make it look alive early."""
        rec = self._recs[name]
        if rec.sleep_failed_at is None or self.clock() - rec.sleep_failed_at < self.cfg.sleep_timeout_s:
            return False
        renew = self._heartbeat(name)[1]
        if not renew:  # unread: kept as the reference, the next good read of a stale Lease would look like a renewal
            return False
        if rec.lease_after_window is None:
            rec.lease_after_window = renew
            return False
        return bool(renew) and renew != rec.lease_after_window

    def _heartbeat(self, name: str) -> tuple[str, str]:
        """What changes when the node's kubelet is alive: its Ready condition's times, and its node Lease's
        renew time (read directly: kubelets renew it every 10 s, while the Node status may stay unchanged)."""
        info = self._node(name)
        renew = ""
        try:
            lease = json.loads(self.coord_api.read_namespaced_lease(
                name, NODE_LEASE_NAMESPACE, _preload_content=False,
                _request_timeout=self.cfg.request_timeout_s).data)
            renew = str((lease.get("spec") or {}).get("renewTime") or "")
        except Exception:
            renew = ""
        return (info.heartbeat if info is not None else ""), renew

    def _do_wake(self, name: str) -> None:
        term = self._term()
        target = self._target(name, self.cfg.wake_timeout_s, term)
        if target is None:
            self._announce_once("no-address-wake", name, f"node {name} is asleep and pods wait for it, but it has "
                                f"no usable power address ({self.address_of(name).refused or 'none given'})")
            self._backoff(name)  # not asked again at every pass
            return
        if not self._may_write():
            return
        t0 = self.clock()
        before = self._heartbeat(name)
        if not self._patch_node(name, state=WAKING_STATE, owner=True):
            return
        self._event(name, "Normal", "NodeWaking", f"Pods are waiting: waking node {name}")
        try:
            target.checkpoint()
            self.actuator.wake(target)
            self._wait_awake(name, target, before)
        except LostLeadership:
            raise  # the state stays waking, with its owner: the next leader resumes it
        except Exception as e:
            delay = self._backoff(name)
            self.metrics.failures.labels("wake").inc()
            # Schedulers stop waiting for it. A node whose sleep failed unconfirmed stays `sleeping` (its machine
            # may be on): resumed, it is uncordoned once its kubelet outlives the sleep's deadline.
            failed_sleep = self._recs[name].sleep_failed_at is not None
            if failed_sleep and self._roll_back_if_running(name, term):
                return
            self._patch_node(name, state=SLEEPING if failed_sleep else ASLEEP_STATE, wake_failed=True,
                             **({"owner": False} if failed_sleep else {}))
            self._event(name, "Warning", "NodeWakeFailed", f"{self.actuator.name} could not wake node {name}; "
                        f"trying another node, retrying this one in {delay:g} s")
            log.warning("wake of %s failed: %s", name, e)
            log.debug("wake of %s failed", name, exc_info=True)
            return
        if not self._patch_node(name, state=AWAKE, cordon=False, taint=False, wake_failed=False):
            return
        self._recs[name].failures = 0
        self._recs[name].empty_since = None
        self._recs[name].sleep_failed_at = None
        self.metrics.wake_latency.observe(self.clock() - t0)
        self._event(name, "Normal", "NodeAwake", f"Node {name} is Ready: untainted and uncordoned")
        log.info("node %s awake after %.1f s", name, self.clock() - t0)

    def _wait_awake(self, name: str, target: Target, before: tuple[str, str]) -> None:
        """Until the node is Ready with a heartbeat newer than the wake (not the stale Ready of a node that has
        just gone down) and the actuator, where it can say, reports it on. (``none`` switched nothing off: its
        Ready is never stale.)"""
        fresh = target.address.scheme == "none"
        while True:
            target.checkpoint()
            info = self._node(name)
            if info is not None and info.ready:
                if not fresh:
                    now = self._heartbeat(name)
                    fresh = (now[0] != before[0]) or (bool(now[1]) and now[1] != before[1])
                # After a sleep that failed unconfirmed, the machine may still be going down with its kubelet alive:
                # it counts as awake only once it renews its Lease after that sleep's deadline has passed.
                settled = self._recs[name].sleep_failed_at is None or self._alive_after_failed_sleep(name)
                if fresh and settled and self._power(target) in (POWER_ON, UNKNOWN):
                    return
            if self.clock() >= target.deadline:
                raise TimeoutError(f"no fresh heartbeat within {self.cfg.wake_timeout_s:g} s")
            target.pause(self.cfg.poll_s)

    def _do_drain(self, name: str, pods: list[tuple[str, str, str]]) -> None:
        term = self._term()
        check = self._guard(term)
        if not self._may_write():
            return
        self._recs[name].drain_started = self.clock()
        if not self._patch_node(name, state=DRAINING, owner=True, cordon=True):
            return
        self._event(name, "Normal", "NodeConsolidating", f"Evicting {len(pods)} pods: they fit on other nodes "
                    f"and node {name} can then sleep")
        evicted = 0
        for ns, pod, uid in pods:
            check()
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
        self._backoff(name)  # not planned again at once: its pods came back, or would be evicted again
        if self._may_write() and self._patch_node(name, state=AWAKE, cordon=False):
            self.metrics.failures.labels("drain").inc()
            self._event(name, "Warning", "NodeConsolidationAborted",
                        f"Node {name} did not empty (or its drain was abandoned); uncordoned")

    # ---- API writes ----
    def _workload_pods_on(self, name: str) -> list[str] | None:
        """A fresh (not cached) list of the workload pods on ``name``, each claimed DaemonSet read afresh too;
        None when a read fails."""
        from joulesched.cluster.kube.objects import parse_pod

        try:
            resp = self.core_api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name},{ACTIVE_PODS_SELECTOR}", _preload_content=False,
                _request_timeout=self.cfg.request_timeout_s)
            items = json.loads(resp.data).get("items") or []
        except Exception:
            return None
        left = []
        for p in map(parse_pod, items):
            if p.daemon:  # as the pod claims: the DaemonSet it names is read afresh (live/daemonsets.py)
                ok = self.daemonsets.keeps_no_node_awake(p, fresh=True)
                if ok is None:
                    return None
                if ok:
                    continue
            left.append(p.key)
        return left

    def _patch_node(self, name: str, *, state: str, owner: bool | None = None, cordon: bool | None = None,
                    taint: bool | None = None, wake_failed: bool | None = None, off_requested: bool | None = None,
                    stopping_ok: bool = False) -> bool:
        """Set the power-state annotation (its time, its owner on an intermediate state; and the cordon and our
        taint) with the node's resourceVersion as a precondition; re-read and retry on a conflict. Our cordon is
        marked (``joulesched.io/cordoned``) and only a marked cordon is ever lifted. ``off_requested``: set or
        clear :data:`OFF_REQUESTED_ANNOTATION` (cleared with every ``awake`` or ``asleep``: the machine's state is
        then known). False when it could not be written."""
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
            meta = obj.get("metadata") or {}
            ann_now = meta.get("annotations") or {}
            node_spec = obj.get("spec") or {}
            ann: dict[str, Any] = {POWER_STATE_ANNOTATION: state, POWER_SINCE_ANNOTATION: _now_rfc3339()}
            if owner is not None or state in (AWAKE, ASLEEP_STATE):
                ann[POWER_OWNER_ANNOTATION] = self.cfg.identity if owner else None
            patch: dict[str, Any] = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": ann}}
            if wake_failed is not None:
                ann[WAKE_FAILED_ANNOTATION] = _now_rfc3339() if wake_failed else None
            if off_requested is not None or state in (AWAKE, ASLEEP_STATE):
                ann[OFF_REQUESTED_ANNOTATION] = _now_rfc3339() if off_requested else None
            spec: dict[str, Any] = {}
            ours = CORDONED_ANNOTATION in ann_now
            if cordon is True and (ours or not node_spec.get("unschedulable")):
                spec["unschedulable"] = True
                ann[CORDONED_ANNOTATION] = "true"
            elif cordon is False and ours:  # never lift a cordon someone else set
                spec["unschedulable"] = None
                ann[CORDONED_ANNOTATION] = None
            if taint is not None:
                taints = [t for t in node_spec.get("taints") or [] if t.get("key") != ASLEEP_TAINT]
                if taint:
                    taints.append({"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule",
                                   "timeAdded": _now_rfc3339()})
                spec["taints"] = taints or None
            if spec:
                patch["spec"] = spec
            try:
                resp = self.core_api.patch_node(name, patch, _content_type="application/merge-patch+json",
                                                _preload_content=False, _request_timeout=self.cfg.request_timeout_s)
                self.cache.observe_node(json.loads(resp.data))
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
        """An Event on the node. Messages are ours alone (no remote error text: details go to the log)."""
        if not self._may_write():
            return
        now = _now_rfc3339()
        ns = self.cfg.event_namespace
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{node}.{time.time_ns():x}", "namespace": ns},
                # A Node's Events carry its name as uid, as the kubelet's do.
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
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


#: The static pods of a control plane (kubeadm's, k3s's and most distributions' names and labels).
CONTROL_PLANE_COMPONENTS = frozenset({"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"})


def _keep_awake(pods, own_node: str) -> frozenset[str]:
    """Nodes never put to sleep whatever their labels say: those running a control plane's static pods (a
    control plane without its role label looks empty, its pods being mirror pods) and ``own_node``."""
    keep = {p.node_name for p in pods if p.mirror and p.node_name and p.namespace == "kube-system"
            and (p.labels.get("tier") == "control-plane" or p.labels.get("component") in CONTROL_PLANE_COMPONENTS)}
    if own_node:
        keep.add(own_node)
    return frozenset(keep)


# ---- the daemon: options checked, then started and stopped together -----------------------------------------
_MAP_SETTLE_S = 0.5  # how long an edited address map must stand still before it is read


def _files_stamp(path: str) -> tuple:
    """What changes when the map file, or any file of the map directory, changes (stat follows the kubelet's
    ``..data`` links, whose targets are new files on each update)."""

    def one(p: str) -> tuple:
        try:
            st = os.stat(p)
        except OSError:
            return (p, None)
        return (p, st.st_ino, st.st_size, st.st_mtime_ns)

    if os.path.isdir(path):
        try:
            names = sorted(os.listdir(path))
        except OSError:
            return (path, None)
        return tuple(one(os.path.join(path, n)) for n in names if not n.startswith(".."))
    return (one(path),)


def load_addresses(path: str | None, access: AddressPolicy | None = None, *,
                   allow_blank: bool = True) -> dict[str, str]:
    """The operator's node -> power address map: a YAML/JSON mapping file, or a directory (a ConfigMap mounted
    with one key per node, as the kube_node role writes it: file name = node, content = address; a ``.yaml``
    file in it is read as a mapping). Every address is parsed (and checked against what no map entry may do,
    e.g. redfish+http without its flag), so a bad one is named before anything starts. A map file without a
    document (empty, blank, comments only) is an empty map only with ``allow_blank``: a map read again while
    it is rewritten in place must not become one (``{}`` is an empty map either way)."""
    if not path:
        return {}

    import yaml

    from joulesched.core import yamlio
    from joulesched.live.daemon import DaemonInputError

    # A node named twice (in one file, or in two files of a directory) is an error, never "the last one wins":
    # which machine a node's entry switches off must not hang on the order of keys or of file names.
    where: dict[str, str] = {}

    def claim(node: object, source: str) -> None:
        if not isinstance(node, str):  # YAML reads 010 as 8, on as True, ~ as None: another node's name
            raise DaemonInputError(f"--addresses {path}: {source}: a key YAML reads as {type(node).__name__} "
                                   f"{node!r} is not a node name; quote it")
        first = where.setdefault(str(node), source)
        if first != source:
            raise DaemonInputError(f"--addresses {path}: node {node} is given twice ({first} and {source})")

    try:
        if os.path.isdir(path):
            data = {}
            for entry in sorted(os.listdir(path)):
                full = os.path.join(path, entry)
                if entry.startswith("..") or not os.path.isfile(full):
                    continue  # the kubelet's ..data links of a mounted ConfigMap
                with open(full, encoding="utf-8") as f:
                    if entry.endswith((".yaml", ".yml")):
                        part = yamlio.load(f) or {}
                        for node in dict(part):  # a file that is no mapping: the TypeError/ValueError below
                            claim(node, entry)
                        data.update(part)
                    else:
                        claim(entry, entry)
                        data[entry] = f.read().strip()
        else:
            with open(path, encoding="utf-8") as f:
                data = yamlio.load(f)
            if data is None and not allow_blank:
                raise DaemonInputError(f"--addresses {path}: holds no mapping (being written?); an empty map is "
                                       "written {}")
            data = {} if data is None else data
    except DaemonInputError:
        raise  # a UsageError is a ValueError: not the "no mapping" of the last clause
    except OSError as e:
        raise DaemonInputError(f"--addresses {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise DaemonInputError(f"--addresses {path}: not YAML: {e}".replace("\n", " ")) from None
    except UnicodeDecodeError:
        raise DaemonInputError(f"--addresses {path}: not UTF-8 text") from None
    except (TypeError, ValueError):  # a .yaml key of the directory that is no mapping
        raise DaemonInputError(f"--addresses {path}: every .yaml file in it must be a mapping of node name to "
                               "power address") from None
    if not isinstance(data, dict):
        raise DaemonInputError(f"--addresses {path}: expected a mapping of node name to power address")
    out = {}
    machines: dict[tuple[str, str], str] = {}
    for node, text in data.items():
        if not os.path.isdir(path):
            claim(node, os.path.basename(path))
        if not isinstance(text, str):
            raise DaemonInputError(f"--addresses {path}: node {node}: the power address must be a string, not "
                                   f"{type(text).__name__} {text!r}")
        try:
            addr = parse_address(str(text))
            if access is not None:
                access.check_map_entry(str(node), addr)
        except (AddressError, AccessError) as e:
            raise DaemonInputError(f"--addresses {path}: node {node}: {e}") from None
        for key in machine_keys(addr, str(node)):  # a copy-paste slip: an idle node would switch off the other
            other = machines.setdefault(key, str(node))
            if other != str(node):
                raise DaemonInputError(f"--addresses {path}: nodes {other} and {node} name the same machine "
                                       f"({key[0]} {key[1]})")
        out[str(node)] = str(text)
    return out


class NodePowerDaemon:
    """``joulesched node-power`` (and ``serve --node-power``): the controller plus /metrics, /healthz, /readyz.

    Every option is checked in the constructor; ``with`` starts it and stops it. ``cache`` is the process's
    informer cache (the scheduler's, inside ``serve``: then nodes and pods are listed and watched once, and it is
    started and stopped by its owner); ``identity`` the process's one Lease identity. The Lease is
    :data:`NODE_POWER_LEASE` either way, so ``serve --node-power`` and a ``node-power`` Deployment never both
    act. ``allow_annotated`` (``SCHEME=PATTERN``) and ``allow_redfish_http`` are the operator's address policy.
    """

    def __init__(self, *, actuator: str = "none", policy: PowerPolicy | None = None, dry_run: bool = False,
                 listen: str = "127.0.0.1:10262", leader_elect: bool = True, lease_namespace: str | None = None,
                 kubeconfig: str | None = None, context: str | None = None, credentials: str | None = None,
                 addresses: str | None = None, power_profiles: str | None = None,
                 sleep_watts: float = DEFAULT_SLEEP_WATTS,
                 resync_s: float = 5.0, wake_timeout_s: float = 600.0, scheduler_name: str = "joulesched",
                 actuator_options: dict | None = None, cache: KubeCache | None = None,
                 identity: str | None = None, allow_annotated: list[str] | tuple[str, ...] = (),
                 allow_redfish_http: bool = False, status: bool = True, max_sleeps_per_hour: int = 60) -> None:
        from joulesched.cluster.kube.client import load_api_client
        from joulesched.cluster.kube.objects import load_profiles
        from joulesched.core.net import parse_listen
        from joulesched.live.actuators import NAMES, ActuatorOptions, make_actuator
        from joulesched.live.actuators.credentials import Credentials
        from joulesched.live.daemon import DaemonInputError, _listen, check_names, default_namespace

        check_names(scheduler_name, lease_namespace)
        if actuator not in NAMES:
            raise DaemonInputError(f"--actuator {actuator!r}: known: {', '.join(NAMES)}")
        if status:
            parse_listen(listen)
        try:
            access = AddressPolicy.from_options(allow_annotated, allow_redfish_http)
        except AccessError as e:
            raise DaemonInputError(str(e)) from None
        opts = ActuatorOptions(credentials=Credentials.load(credentials), allow_redfish_http=allow_redfish_http,
                               **(actuator_options or {}))
        self.actuator = make_actuator(actuator, opts)
        self.cfg = NodePowerConfig(policy=policy or PowerPolicy(), dry_run=dry_run, resync_s=resync_s,
                                   wake_timeout_s=wake_timeout_s, sleep_watts=sleep_watts,
                                   addresses=load_addresses(addresses, access), addresses_file=addresses,
                                   access=access,
                                   leader_elect=leader_elect, lease_namespace=lease_namespace or default_namespace(),
                                   scheduler_name=scheduler_name, max_sleeps_per_hour=max_sleeps_per_hour,
                                   **({"identity": identity} if identity else {}))
        if cache is None:
            curves = CurveResolver(load_profiles(power_profiles) if power_profiles else None)
            source: KubeCache | k8s.ApiClient = load_api_client(kubeconfig, context)
        else:
            curves, source = None, cache
        self.controller = NodePowerController(source, self.actuator, self.cfg, curves=curves)
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
