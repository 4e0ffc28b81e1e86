"""`joulesched serve`: any joulesched policy as a secondary Kubernetes scheduler.

One pass of the loop, for a pod with ``spec.schedulerName`` = ours, no ``spec.nodeName`` and no
``spec.schedulingGates`` (a gated pod waits for the event that lifts its last gate, as in kube-scheduler):

1. **decide** (under the cache lock): the cached pod is still pending → filter (kube-scheduler's filters) →
   ``policy.choose`` → *assume* the pod on the node, so the next decision already sees it there;
2. **bind** (``bind_workers`` threads, as kube-scheduler's binding cycle runs in a goroutine; at most that many
   requests in flight): ``POST pods/{name}/binding`` with the pod's uid as a precondition, through
   :class:`~joulesched.cluster.kube.client.FastClient` (pooled keep-alive connections, raw JSON);
3. **record**: Events (``Scheduled`` / ``FailedScheduling``, aggregated per pod and reason with a count, as
   kube-scheduler's recorder does) and the PodScheduled=False condition go through an asynchronous recorder
   with a bounded queue, best effort, off the scheduling path: by default in a helper process
   (live/events.py), so that the decisions keep the interpreter lock.

What happens to a pod, whatever fails:

- no feasible node: ``FailedScheduling`` event with kube's "0/N nodes are available: ..." message, condition
  PodScheduled=False/Unschedulable, retry after a backoff of 1 s doubling to 10 s;
- the policy chose a node that is asleep or waking (the node power controller's taint): the pod is not bound;
  its ``status.nominatedNodeName`` names the node (which tells the controller to wake it), and it waits in
  the queue, without backoff, until the node is Ready and untainted, then is bound there (the nominated node
  is tried first, as kube-scheduler does). No binding ever goes to a node that is not Ready, and a node that is
  NotReady without being asleep (down, booting, a failed wake) is no candidate at all, even for a pod that
  tolerates every taint: nothing would wake it, so waiting for it could last for ever. That is the filter
  chain's NodeReady (FailedScheduling counts such nodes as ``node(s) were not ready``); a pod pinned to a
  booting node by ``matchFields`` (a DaemonSet's) is unschedulable, with that event, until its node is Ready.
  The extender, where kube-scheduler binds, judges readiness as kube does (the not-ready taint alone). A pod
  decided away from its nominated node (bound elsewhere, waiting for another node, or unschedulable) has the
  nomination cleared (``nominatedNodeName: null``), so the controller stops waking that node for it;
- bind answers 201: done; the watch confirms it;
- bind answers 409: the pod is already bound (by us, when an earlier answer was lost, or by anyone else) or
  its uid changed. Re-read it; bound → done, never bound again; still pending → back off and retry;
- bind answers 404: the pod was deleted; forget it;
- anything else (403, 5xx, timeouts, dropped connections): logged at WARNING (rate-limited) and counted in
  ``joulesched_bind_errors_total{code}``; re-read; bound → done; otherwise back off and retry (after a timeout
  or a dropped connection, with the pod still assumed on the node and the same binding sent again: the
  apiserver may apply the first one late).
  A retried binding of a pod that did get bound answers 409, so no pod is ever bound twice, and no pod leaves
  the queue until the cache or a read shows it bound or deleted.

With leader election on, only the replica holding the Lease decides and binds (checked again right before
each binding request, whose timeout is capped so that it ends before this replica's leadership would, so that
our side of a binding is over before a successor takes over and reads the pods; with too little of the term
left the pod is requeued without backoff). The apiserver may still apply a binding whose answer we gave up on
(a slow etcd): such a pod found pending stays assumed on its node, its outcome unknown, until a re-read after
the backoff.

The scheduler is the cluster's :class:`~joulesched.cluster.backend.Backend`: its loop thread is
``run_policy(scheduler, policy, seed)``, the same loop that drives the twin. :meth:`Scheduler.next_decision`
pops the next pod whose backoff is over and returns it with the cache lock held; :meth:`Scheduler.bind`
assumes it and hands the binding to a worker; :meth:`Scheduler.abandon` requeues it when the policy failed.

**Batches** (``ServeConfig.batch``, ``serve --batch``): while another pod is ready now and a binding slot is
free, the loop keeps the cache lock from one decision to the next, up to ``batch`` decisions or
:data:`HOLD_MAX_S`, and releases it before it would wait for anything (a pod, a slot, an HTTP answer). Every
pod still gets its own filter and decision on a state that holds every earlier pod's assumption, so the
choices are those of one pod at a time; what changes is that the informer applies its watch events between
batches rather than between pods. Each hand-over of the lock cost the loop a wait for the informer thread
and for the GIL (issue 28's profile: about a third of a millisecond per pod at a thousand pods a second).
The bindings do not take the lock, so they go out while the batch goes on.

Memory is bounded however long it runs: counters, a fixed-size latency reservoir, the last ``bind_log``
binding requests, an LRU of Event series (bench/soak.py).
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import json
import logging
import math
import queue
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import quote

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from joulesched.agent.kube_scoring import num_nodes_to_score
from joulesched.agent.policy import Policy, PolicyError
from joulesched.agent.runner import run_policy
from joulesched.cluster.backend import Decision
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import FastClient, client_source
from joulesched.cluster.kube.objects import PodInfo
from joulesched.live.events import EVENT_WRITERS, EventRecorder, EventWriterProcess, compact_json
from joulesched.live.httpd import BackgroundHTTPServer, reply
from joulesched.live.leader import LeaderElector, default_identity
from joulesched.live.ratelog import RateLimitedLog

log = logging.getLogger("joulesched.serve")

#: kube-scheduler's scheduling_attempt_duration_seconds buckets: 1 ms * 2^k, k = 0..14.
ATTEMPT_BUCKETS = tuple(0.001 * 2**k for k in range(15))
#: A batch (``ServeConfig.batch``) ends once the loop has held the cache lock this long, so that a slow policy
#: keeps the informer waiting no longer than about one decision plus this.
HOLD_MAX_S = 0.01
#: A binding request must be over this fraction of the renew deadline (0.5 s of kube's 10 s) before the leader's
#: term would end, and is not sent with less than that left (:meth:`Scheduler._bind_timeout`).
FENCE_MARGIN = 0.05


@dataclass
class ServeConfig:
    """Settings of one scheduler replica.

    :param scheduler_name: pods with this ``spec.schedulerName`` are ours.
    :param seed: seeds the policy's generator (tie breaks).
    :param backoff_initial_s: first retry delay of a pod that failed (kube-scheduler: 1 s).
    :param backoff_max_s: the cap of the doubling delay (kube-scheduler: 10 s).
    :param bind_workers: binding requests in flight at once.
    :param leader_elect: take part in leader election (required with more than one replica).
    :param lease_namespace: namespace of the leader Lease.
    :param lease_name: its name; default: the scheduler name.
    :param lease_duration_s, renew_deadline_s, retry_period_s: leader election timing (kube defaults 15/10/2 s).
    :param identity: this replica's name in the Lease; default: hostname plus a random suffix.
    :param request_timeout_s: timeout of each binding/read request.
    """

    scheduler_name: str = "joulesched"
    seed: int = 0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 10.0
    bind_workers: int = 4
    leader_elect: bool = True
    lease_namespace: str = "joulesched"
    lease_name: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = field(default_factory=default_identity)
    request_timeout_s: float = 10.0
    node_wait_poll_s: float = 1.0  # a pod waiting for a sleeping node looks at it again this often
    node_wait_max_s: float = 900.0  # ... and is decided afresh after this long (without it, for as long again)
    informer_stale_s: float = 60.0  # /healthz fails once an informer has had no answer for this long
    loop_stale_s: float = 30.0  # ... or the scheduling loop has not turned for this long
    event_update_interval_s: float = 10.0  # an aggregated Event's count is written at most this often
    event_queue: int = 4096  # Events, conditions and nominations waiting to be written, at most
    latency_reservoir: int = 8192  # attempt latencies kept as a uniform sample (for benches and tests)
    bind_log: int = 4096  # the most recent binding requests kept in ``bind_sent``
    #: percentageOfNodesToScore for policies that do not sample themselves (the DQN, the sleep-aware ones):
    #: None = they see every feasible node; 0 = kube-scheduler's adaptive percentage (10 % at 5,000 nodes,
    #: at least 100 nodes); 1..100 = that percentage. The kube-scoring baselines always sample as kube does
    #: (their ``pct`` option).
    sample_pct: int | None = None
    #: Consecutive decisions made under one hold of the cache lock while pods are ready and binding slots free
    #: (1: take and release the lock once per pod).
    batch: int = 8
    #: Where Events, conditions and nominations are written from: ``process``, a helper process (the
    #: decisions keep the interpreter lock: live/events.py), or ``thread``, threads of this process. A client
    #: that :func:`~joulesched.cluster.kube.client.client_source` cannot describe always uses threads.
    event_writer: str = "process"


@dataclass
class _Attempt:
    """A decision in progress: its queue entry, when filtering began, and whether it still holds the lock."""

    entry: "_Entry"
    t0: float
    locked: bool = True
    nominated: str = ""  # the pod's nominatedNodeName when it was decided

    def unlock(self, lock: Any) -> None:
        if self.locked:
            self.locked = False
            lock.release()


@dataclass
class _Entry:
    uid: str
    namespace: str
    name: str
    attempts: int = 0
    ready_at: float = 0.0
    in_flight: bool = False
    enqueued_at: float = field(default_factory=time.monotonic)
    last_failure: str = ""
    uncertain_node: str = ""  # a binding to this node may have happened: capacity stays reserved until we know
    waiting_for: str = ""  # the sleeping node the policy chose: the pod waits until it is awake
    waiting_since: float = 0.0
    #: a sleeping node this pod waited for in vain (node_wait_max_s): no candidate for it until ``avoid_until``
    #: unless it is awake, or the only one left; otherwise the same choice would make it wait again, for ever
    avoid: str = ""
    avoid_until: float = 0.0
    #: the pod's nominatedNodeName as this replica last wrote it; None: not written since it became leader (the
    #: cache's copy of the pod says)
    nominated: str | None = None


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter("joulesched_schedule_attempts", "Scheduling attempts by result "
                                "(scheduled, unschedulable, error).", ["result"], registry=registry)
        for r in ("scheduled", "unschedulable", "error"):
            self.attempts.labels(r)
        self.duration = Histogram("joulesched_scheduling_attempt_duration_seconds",
                                  "Decision plus binding request, per attempt.", ["result"],
                                  buckets=ATTEMPT_BUCKETS, registry=registry)
        # every binding's two series, looked up once (a labels() lookup takes a lock and a dict per call)
        self.scheduled = self.attempts.labels("scheduled")
        self.scheduled_duration = self.duration.labels("scheduled")
        self.bind_conflicts = Counter("joulesched_bind_conflicts", "Bindings answered 409 (already bound).",
                                      registry=registry)
        self.pending = Gauge("joulesched_pending_pods", "Pods of this scheduler waiting for a node.",
                             registry=registry)
        self.leader = Gauge("joulesched_leader", "1 while this replica holds the leader lease.", registry=registry)
        self.events_dropped = Counter("joulesched_events_dropped", "Events or status patches given up on.",
                                      registry=registry)
        self.waiting = Counter("joulesched_pods_waited_for_node", "Pods that waited for a sleeping node to wake.",
                               registry=registry)
        self.bind_errors = Counter("joulesched_bind_errors", "Binding requests not answered 2xx, by HTTP code "
                                   "(or timeout / connection when there was no answer).", ["code"],
                                   registry=registry)
        self.api_errors = Counter("joulesched_api_errors", "Failed re-reads, Event, condition and nomination "
                                  "writes, by operation and HTTP code (or connection).", ["op", "code"],
                                  registry=registry)
        self.batch = Histogram("joulesched_scheduling_batch_size", "Attempts made in a row under one hold of the "
                               "cache lock (--batch).", buckets=(1, 2, 4, 8, 16, 32, 64), registry=registry)


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _status_message(data: bytes) -> str:
    """The ``message`` of a Status answer (or the start of whatever came back)."""
    try:
        return str(json.loads(data).get("message") or "")[:300]
    except (ValueError, AttributeError):
        return data[:200].decode("utf-8", "replace")


class LatencyReservoir:
    """A fixed-size uniform sample of attempt latencies (Vitter's algorithm R): ``size`` floats whatever the
    run's length, for the percentiles benches and tests read; ``count`` is how many were offered."""

    def __init__(self, size: int = 8192, seed: int = 0) -> None:
        self.size = max(1, int(size))
        self._buf = np.zeros(self.size)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.count = 0

    def add(self, x: float) -> None:
        with self._lock:
            if self.count < self.size:
                self._buf[self.count] = x
            else:
                j = int(self._rng.integers(self.count + 1))
                if j < self.size:
                    self._buf[j] = x
            self.count += 1

    def values(self) -> np.ndarray:
        with self._lock:
            return self._buf[: min(self.count, self.size)].copy()

    def percentile(self, q: float) -> float:
        v = self.values()
        return float(np.percentile(v, q)) if v.size else float("nan")

    def clear(self) -> None:
        with self._lock:
            self.count = 0


class Scheduler:
    """A secondary scheduler over a :class:`KubeCache` (see the module docstring for the pod lifecycle).

    :param cache: the cluster cache; the scheduler registers a pod listener on it and starts/stops it.
    :param policy: any :class:`joulesched.agent.policy.Policy`.
    :param registry: where the scheduler's metrics go (one registry per replica).
    """

    def __init__(self, cache: KubeCache, policy: Policy, cfg: ServeConfig | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.cfg = cfg or ServeConfig()
        self.cache, self.policy = cache, policy
        self.registry = registry if registry is not None else cache.registry
        self.metrics = SchedulerMetrics(self.registry)
        self.http = FastClient(cache.api)  # bindings, re-reads, Events: the hot path, pooled keep-alive
        self._warn = RateLimitedLog(log)
        # One INFO line per binding, at most one every 10 s (then saying how many were bound in between): the
        # operator sees the scheduler working without a line per pod at a thousand pods a second.
        self._bound_log = RateLimitedLog(log, interval_s=10.0, level=logging.INFO)
        self._cv = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        # The binding workers: bind_workers threads on one queue (a plain queue: an executor's futures cost the
        # loop thread more than the decision's bookkeeping).
        self._bind_q: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._binders = [threading.Thread(target=self._bind_worker, name=f"bind-{k}", daemon=True)
                         for k in range(self.cfg.bind_workers)]
        # At most bind_workers bindings in flight: the loop decides the next pod only when a worker is free, so
        # decisions see fresh state and no pod waits in a hidden executor queue.
        self._slots = threading.BoundedSemaphore(self.cfg.bind_workers)
        self.leader: LeaderElector | None = None
        if self.cfg.leader_elect:
            self.leader = LeaderElector(cache.api, self.cfg.lease_namespace,
                                        self.cfg.lease_name or self.cfg.scheduler_name, identity=self.cfg.identity,
                                        lease_duration_s=self.cfg.lease_duration_s,
                                        renew_deadline_s=self.cfg.renew_deadline_s,
                                        retry_period_s=self.cfg.retry_period_s, on_change=self._leader_changed)
        self.recorder = self._recorder()
        # Bounded, however long serve runs: counts, a latency sample, and the most recent binding requests.
        self.bound_count = 0  # bindings this replica made
        #: (monotonic time, uid) of the last ``bind_log`` binding requests sent (the property tests check each
        #: was sent inside a leader term).
        self.bind_sent: deque[tuple[float, str]] = deque(maxlen=self.cfg.bind_log)
        #: seconds, decision + binding request, of successful attempts (a uniform sample)
        self.latency = LatencyReservoir(self.cfg.latency_reservoir, seed=self.cfg.seed)
        self._alive = time.monotonic()
        self.loop_error = ""  # why the scheduling loop ended by itself (it never should)
        self._sample_start = 0
        torch = sys.modules.get("torch")
        self._torch_threads = torch.get_num_threads() if torch is not None else 0
        #: the leader term (LeaderElector.transitions) whose pod resync is done: no decision in a later term before
        #: its own (keyed to the term, not set by on_change, which runs after is_leader() has turned True)
        self._resynced_term = 0
        self._held = 0  # decisions made under the loop's current hold of the cache lock (0: not held)
        self._held_since = 0.0
        cache.sleep_aware = True  # sleeping nodes are candidates: choosing one makes the pod wait for it
        #: Set while this replica decides and binds (caches synced, leader or no election); cleared on losing it.
        self.ready = threading.Event()
        cache.add_pod_listener(self._on_pod)

    def _recorder(self) -> EventRecorder | EventWriterProcess:
        cfg = self.cfg
        if cfg.event_writer not in EVENT_WRITERS:
            raise ValueError(f"event_writer {cfg.event_writer!r}: one of {', '.join(EVENT_WRITERS)}")

        def local() -> EventRecorder:
            return EventRecorder(self.http, cfg.scheduler_name, cfg.identity, self.metrics, may_write=self.is_leader,
                                 condition_dropped=self._condition_dropped,
                                 update_interval_s=cfg.event_update_interval_s, max_queue=cfg.event_queue,
                                 timeout_s=min(5.0, cfg.request_timeout_s))

        source = client_source(self.cache.api) if cfg.event_writer == "process" else None
        if source is None:
            return local()
        return EventWriterProcess(source, cfg.scheduler_name, cfg.identity, self.metrics, self._leading_until,
                                  self._condition_dropped, local, update_interval_s=cfg.event_update_interval_s,
                                  max_queue=cfg.event_queue, timeout_s=min(5.0, cfg.request_timeout_s),
                                  lead_interval_s=cfg.retry_period_s)

    def _leading_until(self) -> float:
        """Until when (``time.monotonic``) this replica may write: the Event writer process's fence."""
        le = self.leader
        if le is None:
            return math.inf
        return time.monotonic() + (le.leading_until() - le.clock())

    # ---- lifecycle ----
    def start(self) -> "Scheduler":
        self.cache.start()
        if self.leader is not None:
            self.leader.start()
        for t in self._binders:
            t.start()
        self._loop_thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._loop_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._loop_thread is not None:
            self._loop_thread.join(10)
        for _ in self._binders:
            self._bind_q.put(None)
        for t in self._binders:
            if t.is_alive():
                t.join()
        self.recorder.stop()  # drained while still leader, before the lease is released
        if self.leader is not None:
            self.leader.stop(release=True)
        self.cache.stop()

    def health_checks(self) -> list[tuple[str, bool, str]]:
        """``/healthz``: (check, passed, detail). Fails when an informer has had no answer from the apiserver
        for ``informer_stale_s`` (its cache is no longer the cluster) or the loop is stuck."""
        stale = self.cache.stale_for()
        loop = time.monotonic() - self._alive
        return [("informers", stale <= self.cfg.informer_stale_s,
                 f"no answer from the apiserver for {stale:.0f} s" if stale else "watching"),
                ("scheduling-loop", loop < self.cfg.loop_stale_s and not self._stop.is_set() and not self.loop_error,
                 f"ended: {self.loop_error}" if self.loop_error else "stopped" if self._stop.is_set()
                 else f"last turn {loop:.1f} s ago")]

    def readiness_checks(self) -> list[tuple[str, bool, str]]:
        """``/readyz``: informer sync, and leadership. A standby whose Lease calls are answered is ready (it
        takes over when the leader goes); one whose Lease calls fail (a wrong RBAC name, say) is not, and says
        why, so two such replicas cannot both sit in standby unseen."""
        checks = [("informer-sync", self.cache.synced, "synced" if self.cache.synced else "listing")]
        le = self.leader
        if le is None:
            checks.append(("leader-election", True, "disabled"))
        elif le.is_leader():
            checks.append(("leader-election", True, f"leading as {le.identity}"))
        elif le.answering(max(le.lease_duration_s, 3 * le.retry_period_s)):
            holder = le.holder or "nobody"
            checks.append(("leader-election", True, f"standby; lease {le.namespace}/{le.name} held by {holder}"))
        else:
            checks.append(("leader-election", False, f"lease {le.namespace}/{le.name}: "
                           f"{le.last_error or 'no answer'}"))
        return checks

    def healthy(self) -> bool:
        """Every :meth:`health_checks` passes."""
        return all(ok for _, ok, _ in self.health_checks())

    def is_leader(self) -> bool:
        return self.leader is None or self.leader.is_leader()

    def _resync_due(self) -> bool:
        """This term's pod resync (KubeCache.resync_pods) is not done: a new leader decides nothing before it."""
        return self.leader is not None and self._resynced_term != self.leader.transitions

    def _leader_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        recorder = getattr(self, "recorder", None)  # None only while __init__ builds the elector
        if recorder is not None:
            recorder.leadership_changed()
        if not leading:
            self.ready.clear()
            with self.cache.lock:  # (before the queue's lock: the cache's listeners take that one under this)
                self.cache.unreserve()  # the next leader decides those pods; nothing of ours holds room
        with self._cv:
            if leading:  # pods may have waited in backoff while we were standby: look at all of them now
                now = time.monotonic()
                for e in self._entries.values():
                    e.ready_at = min(e.ready_at, now)
                    e.nominated = None  # another leader may have nominated it meanwhile: the cache says
                    heapq.heappush(self._heap, (e.ready_at, next(self._seq), e.uid))
            self._cv.notify_all()

    def _condition_dropped(self, uid: str) -> None:
        with self._cv:
            e = self._entries.get(uid)
            if e is not None:
                e.last_failure = ""  # write the condition again on the next failed attempt

    def pending(self) -> int:
        with self._cv:
            return len(self._entries)

    # ---- queue (listener runs with the backend lock held: only touch the queue) ----
    def _ours(self, p: PodInfo | None) -> bool:
        """Pending for this scheduler. A gated pod (``spec.schedulingGates``) is not, as kube-scheduler keeps it
        SchedulingGated and the apiserver refuses its binding; the event that lifts the last gate queues it."""
        return (p is not None and p.scheduler_name == self.cfg.scheduler_name and not p.node_name
                and not p.deleting and p.active and not p.gated)

    def _on_pod(self, old: PodInfo | None, new: PodInfo | None) -> None:
        with self._cv:
            if self._ours(new):
                assert new is not None
                if new.uid not in self._entries:
                    e = _Entry(new.uid, new.namespace, new.name, ready_at=time.monotonic())
                    self._entries[new.uid] = e
                    heapq.heappush(self._heap, (e.ready_at, next(self._seq), e.uid))
                    self._cv.notify()
            elif old is not None and old.uid in self._entries and not self._entries[old.uid].in_flight:
                del self._entries[old.uid]  # bound (by anyone) or deleted
            self.metrics.pending.set(len(self._entries))

    def _requeue(self, e: _Entry, backoff: bool, message: str = "", delay: float | None = None) -> None:
        with self._cv:
            e.in_flight = False
            if e.uid not in self._entries:
                return
            if delay is not None:
                pass
            elif backoff:
                e.attempts += 1
                delay = min(self.cfg.backoff_initial_s * 2 ** (e.attempts - 1), self.cfg.backoff_max_s)
            else:
                delay = 0.0
            e.ready_at = time.monotonic() + delay
            heapq.heappush(self._heap, (e.ready_at, next(self._seq), e.uid))
            self._cv.notify()

    def _done(self, e: _Entry) -> None:
        with self._cv:
            self._entries.pop(e.uid, None)
            self.metrics.pending.set(len(self._entries))
        self.recorder.forget(e.uid)

    def _next(self, wait: bool = True) -> _Entry | None:
        """The next pod whose backoff is over, or None after a short wait (at once without ``wait``)."""
        with self._cv:
            while not self._stop.is_set():
                self._alive = time.monotonic()
                if not self.is_leader():
                    if not wait:
                        return None
                    self._cv.wait(0.2)
                    continue
                if self._resync_due():
                    return None  # a new term: next_decision resyncs the pods before anything is decided
                now = time.monotonic()
                while self._heap:
                    ready_at, _, uid = self._heap[0]
                    e = self._entries.get(uid)
                    if e is None or e.in_flight or e.ready_at != ready_at:
                        heapq.heappop(self._heap)  # stale heap entry
                        continue
                    if ready_at > now:
                        break
                    heapq.heappop(self._heap)
                    e.in_flight = True
                    return e
                if not wait:
                    return None
                timeout = (self._heap[0][0] - now) if self._heap else 0.5
                self._cv.wait(min(max(timeout, 0.0), 0.5))
        return None

    # ---- the Backend: the loop thread is run_policy(self, policy, seed) ----
    def _loop(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and self._torch_threads:
            # OpenMP's thread count is per thread: what was set on the thread that built the scheduler holds here
            # too (the DQN sets its own when the run starts, DQNPolicy.reset, which runs on this thread).
            torch.set_num_threads(self._torch_threads)
        # run_policy warms the policy first (compiled code built on this thread before begin(), not under the
        # cache lock in the first decision's reset).
        try:
            run_policy(self, self.policy, self.cfg.seed)
        except Exception as e:  # the policy refused this backend (attach), or a bug: said now, not 30 s later
            self.loop_error = f"{type(e).__name__}: {e}"
            log.error("the scheduling loop ended: %s", self.loop_error, exc_info=not isinstance(e, PolicyError))

    def begin(self) -> None:
        """Nothing to reset: decisions wait for the caches (:meth:`next_decision`)."""

    def next_decision(self) -> Decision | None:
        """The next pod to place, with the cache lock held until :meth:`bind` or :meth:`abandon`; None once
        the scheduler stops. Pods with no feasible node are answered here (Event, condition, backoff)."""
        while not self._stop.is_set():
            e = self._next_in_batch() if self._held else None
            if e is None:
                self._release_hold()
                if not self.cache.synced:  # like kube-scheduler: no decision before the caches are in
                    self._alive = time.monotonic()
                    self._stop.wait(0.05)
                    continue
                if self.is_leader() and self._resync_due():
                    # The term is read before the list: a term begun during it needs a list of its own.
                    term = self.leader.transitions if self.leader is not None else 0
                    # The loop is alive while it resyncs: a slow or failing list (a large cluster, an apiserver
                    # under load) must not read as a hung loop in /healthz and get the new leader restarted.
                    self._alive = time.monotonic()
                    try:
                        self.cache.resync_pods()
                        self._resynced_term = term
                    except Exception as ex:
                        log.info("resync after becoming leader failed (%s: %s); retrying", type(ex).__name__, ex)
                        self._stop.wait(0.2)
                    self._alive = time.monotonic()
                    continue
                if self.is_leader():
                    self.ready.set()
                if not self._slots.acquire(timeout=0.5):
                    continue
                e = self._next()
                if e is None:
                    self._slots.release()
                    continue
            if e.uncertain_node:  # its last binding's outcome is read over HTTP first: never under the hold
                self._release_hold()
            elif self.cfg.batch > 1 and not self._held:
                self.cache.lock.acquire()
                self._held, self._held_since = 1, time.monotonic()
            try:
                d = self._decision(e)
            except Exception:  # an unexpected cache or API error must not kill the scheduler or lose the pod
                log.exception("scheduling %s/%s failed", e.namespace, e.name)
                self.metrics.attempts.labels("error").inc()
                self._requeue(e, backoff=True)
                d = None
            if d is not None:
                return d
            self._slots.release()
        self._release_hold()
        return None

    def _next_in_batch(self) -> _Entry | None:
        """While the loop holds the cache lock: the next pod, if one is ready now and a binding slot is free and
        the batch has room; None otherwise (never waits)."""
        if (self._held >= self.cfg.batch or time.monotonic() - self._held_since > HOLD_MAX_S or not self.is_leader()
                or not self._slots.acquire(blocking=False)):
            return None
        e = self._next(wait=False)
        if e is None:
            self._slots.release()
            return None
        self._held += 1
        return e

    def _release_hold(self) -> None:
        if self._held:
            self.metrics.batch.observe(self._held)
            self._held = 0
            self.cache.lock.release()

    def bind(self, decision: Decision, node: int) -> None:
        """Assume the pod on ``node`` and hand the binding request to a worker (which frees the slot)."""
        p: _Attempt = decision.key
        try:
            if not (0 <= node < len(decision.mask) and decision.mask[node]):
                raise RuntimeError(f"policy {self.policy.name!r} chose infeasible node {node}")
            name = decision.state.names[node]
            info = self.cache.nodes.get(name)
            awake = info is not None and info.ready and not info.asleep  # KubeCache.node_awake
            asleep = info is not None and info.asleep
            if awake:
                self.cache.assume(p.entry.uid, name)
            elif asleep and self.is_leader():  # its room on the node it waits for is taken, as kube-scheduler
                # counts a nominated pod (not once leadership is lost: the release of every reservation is done)
                self.cache.reserve(p.entry.uid, name)
        finally:
            p.unlock(self.cache.lock)
        e = p.entry
        if not awake:
            if asleep:  # asleep or waking: nominate it, wait for it, lose nothing
                self._wait_for_node(e, name)
            else:  # the lock was held since the decision, so the filter chain let a NotReady node through: a bug
                log.error("scheduling %s/%s: node %s is not ready; retrying", e.namespace, e.name, name)
                self.metrics.attempts.labels("error").inc()
                self._requeue(e, backoff=True)
            self._slots.release()
            return
        if p.nominated and p.nominated != name:  # decided away from the node it was nominated for
            self._unnominate(e)
        self._bind_q.put((e, name, p.t0))

    def _wait_for_node(self, e: _Entry, node: str) -> None:
        if e.waiting_for != node:
            e.waiting_for, e.waiting_since = node, time.monotonic()
            self.metrics.waiting.inc()
        if e.nominated != node:
            e.nominated = node
            self.recorder.nominated(e.namespace, e.name, e.uid, node)
        self._requeue(e, backoff=False, delay=self.cfg.node_wait_poll_s)

    def _unnominate(self, e: _Entry) -> None:
        """Clear the pod's ``status.nominatedNodeName`` (as kube-scheduler does when a nomination no longer holds),
        so that the node power controller stops waking that node for it."""
        e.nominated = ""
        self.recorder.unnominated(e.namespace, e.name, e.uid)

    def abandon(self, decision: Decision, error: BaseException) -> None:
        """The policy (or the hand-off) failed: a policy bug must not kill the scheduler or lose the pod."""
        p: _Attempt = decision.key
        p.unlock(self.cache.lock)
        e = p.entry
        log.error("scheduling %s/%s failed: %s", e.namespace, e.name, error, exc_info=error)
        with self.cache.lock:
            self.cache.forget(e.uid)
        self.metrics.attempts.labels("error").inc()
        self._requeue(e, backoff=True)
        self._slots.release()

    def result(self) -> dict[str, int]:
        """What this replica did while it ran."""
        return {"bound": self.bound_count, "pending": self.pending()}

    def _resolve_uncertain(self, e: _Entry) -> bool:
        """A previous binding's outcome is unknown: find out before deciding again. True = go on deciding."""
        node = e.uncertain_node
        outcome = self._reread(e, node)
        if outcome == "retry":
            # Pending proves nothing: the apiserver may still apply the binding we gave up on (until its own
            # request timeout). So the same binding is sent again, the room still counted: whichever of the two
            # lands, the other is a 409, and the pod ends where its room was (a review: re-deciding freed the room
            # and another pod took it). Bound or still unknown, it is settled here.
            outcome = self._bind_once(e, node)
            if outcome in ("bound", "unknown"):
                self._finish(e, node, outcome, 0.0)
                return False
            if outcome in ("standby", "fenced"):  # not ours to send now: still uncertain, asked again later
                self._requeue(e, backoff=False, delay=self.cfg.retry_period_s)
                return False
        if outcome == "unknown":
            self._requeue(e, backoff=True)
            return False
        e.uncertain_node = ""
        if outcome == "bound":
            self._finish(e, node, outcome, 0.0)
            return False
        with self.cache.lock:
            self.cache.forget(e.uid)
        if outcome == "gone":
            self._done(e)
            return False
        return True

    def _decision(self, e: _Entry) -> Decision | None:
        """One scheduling attempt up to the policy's choice: a Decision (cache lock held), or None when the pod
        was bound, deleted, unschedulable (answered here) or must wait."""
        if e.uncertain_node and not self._resolve_uncertain(e):
            return None
        t0 = time.perf_counter()
        lock = self.cache.lock
        lock.acquire()
        try:
            pod = self.cache.pods.get(e.uid)
            if self._resync_due():  # just became leader: decide only once the cache is known to be fresh
                self._requeue(e, backoff=False)
                return None
            if pod is None or not self._ours(pod) or self.cache.is_assumed(e.uid):
                # Bound or deleted meanwhile, or bound by us with the watch still behind (a late event of the
                # pending pod must not lead to a second binding request).
                self._done(e)
                return None
            self.cache.unreserve(e.uid)  # decided again: its own reservation must not crowd it out
            st = self.cache.state()
            mask = self.cache.feasible(pod, st)  # NotReady nodes that are not asleep are out (NodeReady)
            nominated = pod.nominated_node if e.nominated is None else e.nominated
            if e.waiting_for and st is not None:
                w = e.waiting_for
                k = st.names.index(w) if w in self.cache.nodes else -1
                now = time.monotonic()
                if k < 0 or not mask[k] or now - e.waiting_since > self.cfg.node_wait_max_s:
                    e.waiting_for = ""  # gone, full, or never woke: decide afresh
                    if k >= 0 and mask[k]:  # never woke: afresh means without it for a while
                        e.avoid, e.avoid_until = w, now + self.cfg.node_wait_max_s
                elif not self.cache.node_awake(w):
                    self.cache.reserve(e.uid, w)  # still asleep: keep waiting, its room kept
                    self._requeue(e, backoff=False, delay=self.cfg.node_wait_poll_s)
                    return None
                else:  # awake now: the node it waited for first, as kube-scheduler tries a nominated node first
                    only = np.zeros_like(mask)
                    only[k] = True
                    mask = only
            if e.avoid and st is not None and not e.waiting_for:
                k = st.names.index(e.avoid) if e.avoid in self.cache.nodes else -1
                if k < 0 or time.monotonic() > e.avoid_until or self.cache.node_awake(e.avoid):
                    e.avoid = ""
                elif mask[k] and mask.sum() > 1:  # the only candidate left: wait for it again rather than fail
                    mask = mask.copy()
                    mask[k] = False
            if st is not None and self.cfg.sample_pct is not None and not getattr(self.policy, "kube_sampling", False):
                mask = self._sample(mask)
            if st is not None and mask.any():
                attempt = _Attempt(e, t0, nominated=nominated)
                lock = None  # handed over: bind() or abandon() releases it
                return Decision(st, pod.request, mask, attempt, pod.meta)  # meta: as the twin's (pod_meta)
            message = self.cache.unschedulable_message(pod, st)
        finally:
            if lock is not None:
                lock.release()
        if nominated:  # it waits for no node now
            self._unnominate(e)
        dt = time.perf_counter() - t0
        self.metrics.attempts.labels("unschedulable").inc()
        self.metrics.duration.labels("unschedulable").observe(dt)
        write = message != e.last_failure
        e.last_failure = message  # first: a condition the recorder drops at once resets it (_condition_dropped)
        self.recorder.failed(e.namespace, e.name, e.uid, message, condition=write,
                             rv=str(pod.rv) if pod is not None and pod.rv else "")
        self._requeue(e, backoff=True)
        return None

    def _sample(self, mask: np.ndarray) -> np.ndarray:
        """kube-scheduler's feasible-node search with percentageOfNodesToScore: from a start index that rotates
        from one attempt to the next, the first k feasible nodes (k = numFeasibleNodesToFind)."""
        n = len(mask)
        k = num_nodes_to_score(n, self.cfg.sample_pct or 0)
        idx = np.flatnonzero(mask)
        if idx.size <= k:
            self._sample_start = 0
            return mask
        pos = int(np.searchsorted(idx, self._sample_start))
        take = np.concatenate((idx[pos:], idx[:pos]))[:k]
        self._sample_start = (int(take[-1]) + 1) % n
        out = np.zeros(n, dtype=bool)
        out[take] = True
        return out

    def _bind_worker(self) -> None:
        while (job := self._bind_q.get()) is not None:
            self._bind(*job)

    def _bind(self, e: _Entry, node: str, t0: float) -> None:
        try:
            try:
                outcome = self._bind_once(e, node)
            except Exception:
                log.exception("binding %s/%s to %s", e.namespace, e.name, node)
                outcome = "unknown"
            self._finish(e, node, outcome, time.perf_counter() - t0)
        finally:
            self._slots.release()

    def _finish(self, e: _Entry, node: str, outcome: str, dt: float) -> None:
        if outcome == "bound":
            self.metrics.scheduled.inc()
            self.metrics.scheduled_duration.observe(dt)
            self.latency.add(dt)
            with self._cv:
                self.bound_count += 1
            self._bound_log.warn("bound", "bound %s/%s to %s", e.namespace, e.name, node)
            self.recorder.scheduled(e.namespace, e.name, e.uid, node)
            self._done(e)
            return
        if outcome == "unknown":
            # Keep the pod assumed on the node: if the binding did land, no other pod may take that room.
            e.uncertain_node = node
            self.metrics.attempts.labels("error").inc()
            self.metrics.duration.labels("error").observe(dt)
            self._requeue(e, backoff=True)
            return
        with self.cache.lock:
            self.cache.forget(e.uid)
        if outcome == "gone":
            self._done(e)
        elif outcome == "standby":
            self._requeue(e, backoff=False)
        elif outcome == "fenced":  # too little of the term left: by then leadership is renewed or lost
            self._requeue(e, backoff=False, delay=self.cfg.retry_period_s)
        else:
            self.metrics.attempts.labels("error").inc()
            self.metrics.duration.labels("error").observe(dt)
            self._requeue(e, backoff=True)

    def _bind_timeout(self) -> float:
        """The binding request's timeout: ``request_timeout_s``, capped so that the request is over (answered or
        given up) a margin (:data:`FENCE_MARGIN` of the renew deadline) before this replica's leadership ends; 0
        when not leading, or when that would leave the request less than the margin itself.

        A successor takes over no earlier than ``lease_duration_s - renew_deadline_s`` after that end (5 s by
        default) and then reads the pods afresh; a binding sent with the full 10 s timeout just before the
        deadline could still be answered after that read, and the successor would decide the pod on a cache
        without it (its own binding would get a 409, but the room it counted on may be gone)."""
        le = self.leader
        if le is None:
            return self.cfg.request_timeout_s
        margin = FENCE_MARGIN * le.renew_deadline_s
        left = le.leading_until() - le.clock() - margin
        return min(self.cfg.request_timeout_s, left) if left >= margin else 0.0

    def _bind_once(self, e: _Entry, node: str) -> str:
        """POST the binding; returns bound / gone (deleted or bound elsewhere) / retry (certainly not bound) /
        unknown (no answer and no successful re-read) / standby (not the leader any more) / fenced (too little
        of this replica's term left to send it)."""
        if not self.is_leader():
            return "standby"
        timeout = self._bind_timeout()
        if timeout <= 0.0:
            return "fenced" if self.is_leader() else "standby"
        if not self.cache.node_awake(node):  # it went to sleep (or NotReady) since the decision
            return "retry"
        body = compact_json({"apiVersion": "v1", "kind": "Binding",
                       "metadata": {"name": e.name, "namespace": e.namespace, "uid": e.uid},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        self.bind_sent.append((time.monotonic(), e.uid))
        try:
            # whole: the timeout bounds the request from connect to answer, not each socket operation, so that a
            # binding is over before the leader's term ends (see _bind_timeout).
            r = self.http.request("POST", f"/api/v1/namespaces/{_q(e.namespace)}/pods/{_q(e.name)}/binding", body,
                                  timeout=timeout, whole=self.leader is not None)
        except (OSError, http.client.HTTPException) as ex:  # dropped, timed out: it may or may not have happened
            code = "timeout" if isinstance(ex, (socket.timeout, TimeoutError)) else "connection"
            self.metrics.bind_errors.labels(code).inc()
            self._warn.warn(f"bind:{code}", "binding %s/%s to %s: no answer (%s); re-reading the pod", e.namespace,
                            e.name, node, type(ex).__name__)
            # Pending now proves nothing: the apiserver may still write the binding after our deadline (a slow
            # etcd). The pod stays assumed on the node, uncertain, until a re-read after the backoff settles it;
            # freeing its room at once let another pod take it and the kubelet refuse one of the two (a review).
            outcome = self._reread(e, node)
            return "unknown" if outcome == "retry" else outcome
        if r.status < 300:
            return "bound"
        self.metrics.bind_errors.labels(str(r.status)).inc()
        if r.status == 409:  # already bound (by us after a lost answer, or by someone else) or a new uid
            self.metrics.bind_conflicts.inc()
        else:  # 403 (RBAC), 404 (deleted), 5xx...: never silent
            self._warn.warn(f"bind:{r.status}", "binding %s/%s to %s answered HTTP %d: %s", e.namespace, e.name, node,
                            r.status, _status_message(r.data))
            if r.status == 404:
                return "gone"
        return self._reread(e, node)

    def _reread(self, e: _Entry, node: str) -> str:
        """After an unclear answer: read the pod. Bound → never bind again; pending → retry; no answer →
        unknown."""
        try:
            r = self.http.request("GET", f"/api/v1/namespaces/{_q(e.namespace)}/pods/{_q(e.name)}",
                                  timeout=self.cfg.request_timeout_s)
        except (OSError, http.client.HTTPException) as ex:
            self.metrics.api_errors.labels("reread", "connection").inc()
            self._warn.warn("reread:connection", "re-reading %s/%s failed (%s); its binding's outcome stays unknown",
                            e.namespace, e.name, type(ex).__name__)
            return "unknown"
        if r.status == 404:
            return "gone"
        if r.status >= 300:
            self.metrics.api_errors.labels("reread", str(r.status)).inc()
            self._warn.warn(f"reread:{r.status}", "re-reading %s/%s answered HTTP %d: %s", e.namespace, e.name,
                            r.status, _status_message(r.data))
            return "unknown"
        try:
            pod = json.loads(r.data)
        except ValueError:
            return "unknown"
        if (pod.get("metadata") or {}).get("uid") != e.uid:
            return "gone"  # deleted and re-created under the same name: the new pod is a new entry
        bound_to = (pod.get("spec") or {}).get("nodeName") or ""
        if not bound_to:
            return "retry"
        if bound_to == node:
            return "bound"  # our earlier request went through; its answer was lost
        return "gone"  # someone else bound it


# ---- /metrics, /healthz, /readyz --------------------------------------------------------------------------
Checks = Callable[[], "bool | list[tuple[str, bool, str]]"]


def _check_body(checks: bool | list[tuple[str, bool, str]], name: str, verbose: bool) -> tuple[int, bytes]:
    """kube-apiserver's health answer: ``ok`` (200), or one ``[+]``/``[-]`` line per check and 503."""
    if isinstance(checks, bool):
        return (200, b"ok") if checks else (503, b"not ready")
    good = all(ok for _, ok, _ in checks)
    if good and not verbose:
        return 200, b"ok"
    lines = [f"[{'+' if ok else '-'}]{c} {'ok' if ok else 'failed'}: {detail}" for c, ok, detail in checks]
    lines.append(f"{name} check {'passed' if good else 'failed'}")
    return (200 if good else 503), ("\n".join(lines) + "\n").encode()


class StatusServer(BackgroundHTTPServer):
    """``GET /metrics`` (Prometheus text), ``/healthz`` (= ``/livez``: ``healthy``) and ``/readyz``
    (``ready``, default ``healthy``) on ``host:port`` (loopback by default). A check callable returns a bool or
    a list of (check, passed, detail); ``?verbose`` lists them even when all pass."""

    def __init__(self, registry: CollectorRegistry, healthy: Checks, host: str = "127.0.0.1", port: int = 10259,
                 ready: Checks | None = None) -> None:
        reg, live, rdy = registry, healthy, ready or healthy

        class H(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path == "/metrics":
                    data, ctype, code = generate_latest(reg), CONTENT_TYPE_LATEST, 200
                elif path in ("/healthz", "/livez", "/readyz"):
                    fn = rdy if path == "/readyz" else live
                    code, data = _check_body(fn(), path[1:], "verbose" in query)
                    ctype = "text/plain; charset=utf-8"
                else:
                    data, ctype, code = b"not found", "text/plain", 404
                reply(self, code, data, ctype)

        super().__init__(H, host, port, "status-server")
