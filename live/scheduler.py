"""`joulesched serve`: any joulesched policy as a secondary Kubernetes scheduler.

One pass of the loop, for a pod with ``spec.schedulerName`` = ours and no ``spec.nodeName``:

1. **decide** (under the cache lock): the cached pod is still pending → filter (kube-scheduler's filters) →
   ``policy.choose`` → *assume* the pod on the node, so the next decision already sees it there;
2. **bind** (in a small worker pool, as kube-scheduler's binding cycle runs in a goroutine):
   ``POST pods/{name}/binding`` with the pod's uid as a precondition;
3. **record**: Events (``Scheduled`` / ``FailedScheduling``) and the PodScheduled=False condition go through an
   asynchronous recorder, best effort, off the scheduling path.

What happens to a pod, whatever fails:

- no feasible node: ``FailedScheduling`` event with kube's "0/N nodes are available: ..." message, condition
  PodScheduled=False/Unschedulable, retry after a backoff of 1 s doubling to 10 s;
- bind answers 201: done; the watch confirms it;
- bind answers 409: the pod is already bound (by us, when an earlier answer was lost, or by anyone else) or
  its uid changed. Re-read it; bound → done, never bound again; still pending → back off and retry;
- bind answers 404: the pod was deleted; forget it;
- anything else (5xx, timeouts, dropped connections): re-read; bound → done; otherwise back off and retry.
  A retried binding of a pod that did get bound answers 409, so no pod is ever bound twice, and no pod leaves
  the queue until the cache or a read shows it bound or deleted.

With leader election on, only the replica holding the Lease decides and binds (checked again right before
each binding request).

The scheduler is the cluster's :class:`~joulesched.cluster.backend.Backend`: its loop thread is
``run_policy(scheduler, policy, seed)``, the same loop that drives the twin. :meth:`Scheduler.next_decision`
pops the next pod whose backoff is over and returns it with the cache lock held; :meth:`Scheduler.bind`
assumes it and hands the binding to a worker; :meth:`Scheduler.abandon` requeues it when the policy failed.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from joulesched.agent.policy import Policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.backend import Decision
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.objects import PodInfo
from joulesched.live.httpd import BackgroundHTTPServer, reply
from joulesched.live.leader import LeaderElector, default_identity

log = logging.getLogger("joulesched.serve")

#: kube-scheduler's scheduling_attempt_duration_seconds buckets: 1 ms * 2^k, k = 0..14.
ATTEMPT_BUCKETS = tuple(0.001 * 2**k for k in range(15))


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


@dataclass
class _Attempt:
    """A decision in progress: its queue entry, when filtering began, and whether it still holds the lock."""

    entry: "_Entry"
    t0: float
    locked: bool = True

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


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter("joulesched_schedule_attempts", "Scheduling attempts by result "
                                "(scheduled, unschedulable, error).", ["result"], registry=registry)
        for r in ("scheduled", "unschedulable", "error"):
            self.attempts.labels(r)
        self.duration = Histogram("joulesched_scheduling_attempt_duration_seconds",
                                  "Decision plus binding request, per attempt.", ["result"],
                                  buckets=ATTEMPT_BUCKETS, registry=registry)
        self.bind_conflicts = Counter("joulesched_bind_conflicts", "Bindings answered 409 (already bound).",
                                      registry=registry)
        self.pending = Gauge("joulesched_pending_pods", "Pods of this scheduler waiting for a node.",
                             registry=registry)
        self.leader = Gauge("joulesched_leader", "1 while this replica holds the leader lease.", registry=registry)
        self.events_dropped = Counter("joulesched_events_dropped", "Events or status patches given up on.",
                                      registry=registry)


class EventRecorder:
    """Posts core/v1 Events and PodScheduled conditions from one thread, retrying each a few times."""

    def __init__(self, core: k8s.CoreV1Api, component: str, instance: str, metrics: SchedulerMetrics,
                 may_write: Callable[[], bool] = lambda: True,
                 condition_dropped: Callable[[str], None] = lambda uid: None) -> None:
        self.core, self.component, self.instance, self.metrics = core, component, instance, metrics
        self.condition_dropped = condition_dropped  # told when a condition could not be written, to retry it
        self.may_write = may_write  # a deposed leader must not overwrite its successor's conditions
        self._q: queue.Queue[tuple[str, tuple] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="event-recorder", daemon=True)
        self._thread.start()

    def scheduled(self, ns: str, name: str, uid: str, node: str) -> None:
        self._q.put(("event", (ns, name, uid, "Normal", "Scheduled", f"Successfully assigned {ns}/{name} to {node}")))

    def failed(self, ns: str, name: str, uid: str, message: str, condition: bool) -> None:
        self._q.put(("event", (ns, name, uid, "Warning", "FailedScheduling", message)))
        if condition:
            self._q.put(("condition", (ns, name, uid, message)))

    def stop(self, timeout: float = 5.0) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            kind, args = item
            if not self.may_write():
                continue
            for attempt in range(3):
                try:
                    (self._event if kind == "event" else self._condition)(*args)
                    break
                except ApiException as e:
                    if e.status == 404:
                        break  # the pod is gone; nothing to record
                    time.sleep(0.05 * (attempt + 1))
                except Exception:
                    time.sleep(0.05 * (attempt + 1))
            else:
                self.metrics.events_dropped.inc()
                if kind == "condition":
                    self.condition_dropped(args[2])

    def _event(self, ns: str, name: str, uid: str, etype: str, reason: str, message: str) -> None:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name, "uid": uid},
                "reason": reason, "message": message, "type": etype,
                "source": {"component": self.component}, "reportingComponent": self.component,
                "reportingInstance": self.instance, "action": "Scheduling" if etype == "Warning" else "Binding",
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        self.core.create_namespaced_event(ns, body, _preload_content=False, _request_timeout=5)

    def _condition(self, ns: str, name: str, uid: str, message: str) -> None:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": message, "lastProbeTime": None,
                                            "lastTransitionTime": now}]}}
        self.core.patch_namespaced_pod_status(name, ns, patch, _preload_content=False, _request_timeout=5,
                                              _content_type="application/strategic-merge-patch+json")


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
        self.core = k8s.CoreV1Api(cache.api)
        self._cv = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.cfg.bind_workers, thread_name_prefix="bind")
        # At most bind_workers bindings in flight: the loop decides the next pod only when a worker is free, so
        # decisions see fresh state and no pod waits in a hidden executor queue.
        self._slots = threading.BoundedSemaphore(self.cfg.bind_workers)
        self.recorder = EventRecorder(self.core, self.cfg.scheduler_name, self.cfg.identity, self.metrics,
                                      may_write=self.is_leader, condition_dropped=self._condition_dropped)
        self.leader: LeaderElector | None = None
        if self.cfg.leader_elect:
            self.leader = LeaderElector(cache.api, self.cfg.lease_namespace,
                                        self.cfg.lease_name or self.cfg.scheduler_name, identity=self.cfg.identity,
                                        lease_duration_s=self.cfg.lease_duration_s,
                                        renew_deadline_s=self.cfg.renew_deadline_s,
                                        retry_period_s=self.cfg.retry_period_s, on_change=self._leader_changed)
        self.bound: dict[str, str] = {}  # uid -> node, bindings this replica made (for tests and the bench)
        self.bind_sent: list[tuple[float, str]] = []  # (monotonic time, uid) of every binding request sent
        self.latencies: list[float] = []  # seconds, decision + binding request, successful attempts
        self._alive = time.monotonic()
        self._resync_needed = False
        #: Set while this replica decides and binds (caches synced, leader or no election); cleared on losing it.
        self.ready = threading.Event()
        cache.add_pod_listener(self._on_pod)

    # ---- lifecycle ----
    def start(self) -> "Scheduler":
        self.cache.start()
        if self.leader is not None:
            self.leader.start()
        self._loop_thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._loop_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._loop_thread is not None:
            self._loop_thread.join(10)
        self._pool.shutdown(wait=True)
        self.recorder.stop()  # drained while still leader, before the lease is released
        if self.leader is not None:
            self.leader.stop(release=True)
        self.cache.stop()

    def healthy(self) -> bool:
        """Caches synced and the loop turned within the last 30 s."""
        return self.cache.synced and time.monotonic() - self._alive < 30 and not self._stop.is_set()

    def is_leader(self) -> bool:
        return self.leader is None or self.leader.is_leader()

    def _leader_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if not leading:
            self.ready.clear()
        if leading:
            self._resync_needed = True  # see KubeCache.resync_pods
        with self._cv:
            if leading:  # pods may have waited in backoff while we were standby: look at all of them now
                now = time.monotonic()
                for e in self._entries.values():
                    e.ready_at = min(e.ready_at, now)
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
        return (p is not None and p.scheduler_name == self.cfg.scheduler_name and not p.node_name
                and not p.deleting and p.active)

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

    def _requeue(self, e: _Entry, backoff: bool, message: str = "") -> None:
        with self._cv:
            e.in_flight = False
            if e.uid not in self._entries:
                return
            if backoff:
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

    def _next(self) -> _Entry | None:
        """The next pod whose backoff is over, or None after a short wait."""
        with self._cv:
            while not self._stop.is_set():
                self._alive = time.monotonic()
                if not self.is_leader():
                    self._cv.wait(0.2)
                    continue
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
                timeout = (self._heap[0][0] - now) if self._heap else 0.5
                self._cv.wait(min(max(timeout, 0.0), 0.5))
        return None

    # ---- the Backend: the loop thread is run_policy(self, policy, seed) ----
    def _loop(self) -> None:
        run_policy(self, self.policy, self.cfg.seed)

    def begin(self) -> None:
        """Nothing to reset: decisions wait for the caches (:meth:`next_decision`)."""

    def next_decision(self) -> Decision | None:
        """The next pod to place, with the cache lock held until :meth:`bind` or :meth:`abandon`; None once
        the scheduler stops. Pods with no feasible node are answered here (Event, condition, backoff)."""
        while not self._stop.is_set():
            if not self.cache.synced:  # like kube-scheduler: no decision before the caches are in
                self._alive = time.monotonic()
                self._stop.wait(0.05)
                continue
            if self._resync_needed and self.is_leader():
                try:
                    self.cache.resync_pods()
                    self._resync_needed = False
                except Exception as ex:
                    log.info("resync after becoming leader failed (%s); retrying", type(ex).__name__)
                    self._stop.wait(0.2)
                continue
            if self.is_leader():
                self.ready.set()
            if not self._slots.acquire(timeout=0.5):
                continue
            e = self._next()
            if e is None:
                self._slots.release()
                continue
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
        return None

    def bind(self, decision: Decision, node: int) -> None:
        """Assume the pod on ``node`` and hand the binding request to a worker (which frees the slot)."""
        p: _Attempt = decision.key
        try:
            if not (0 <= node < len(decision.mask) and decision.mask[node]):
                raise RuntimeError(f"policy {self.policy.name!r} chose infeasible node {node}")
            name = decision.state.names[node]
            self.cache.assume(p.entry.uid, name)
        finally:
            p.unlock(self.cache.lock)
        self._pool.submit(self._bind, p.entry, name, p.t0)

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
        return {"bound": len(self.bound), "pending": self.pending()}

    def _resolve_uncertain(self, e: _Entry) -> bool:
        """A previous binding's outcome is unknown: find out before deciding again. True = go on deciding."""
        node = e.uncertain_node
        outcome = self._reread(e, node)
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
            if self._resync_needed:  # just became leader: decide only once the cache is known to be fresh
                self._requeue(e, backoff=False)
                return None
            if pod is None or not self._ours(pod) or self.cache.is_assumed(e.uid):
                # Bound or deleted meanwhile, or bound by us with the watch still behind (a late event of the
                # pending pod must not lead to a second binding request).
                self._done(e)
                return None
            st = self.cache.state()
            mask = self.cache.feasible(pod)
            if st is not None and mask.any():
                attempt = _Attempt(e, t0)
                lock = None  # handed over: bind() or abandon() releases it
                return Decision(st, pod.request, mask, attempt)
            message = self.cache.unschedulable_message(pod)
        finally:
            if lock is not None:
                lock.release()
        dt = time.perf_counter() - t0
        self.metrics.attempts.labels("unschedulable").inc()
        self.metrics.duration.labels("unschedulable").observe(dt)
        self.recorder.failed(e.namespace, e.name, e.uid, message, condition=message != e.last_failure)
        e.last_failure = message
        self._requeue(e, backoff=True)
        return None

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
            self.metrics.attempts.labels("scheduled").inc()
            self.metrics.duration.labels("scheduled").observe(dt)
            self.latencies.append(dt)
            self.bound[e.uid] = node
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
        else:
            self.metrics.attempts.labels("error").inc()
            self.metrics.duration.labels("error").observe(dt)
            self._requeue(e, backoff=True)

    def _bind_once(self, e: _Entry, node: str) -> str:
        """POST the binding; returns bound / gone (deleted or bound elsewhere) / retry (certainly not bound) /
        unknown (no answer and no successful re-read) / standby (not the leader any more)."""
        if not self.is_leader():
            return "standby"
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": e.name, "namespace": e.namespace, "uid": e.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self.bind_sent.append((time.monotonic(), e.uid))
        try:
            # _preload_content=False: the client cannot deserialise the Status the apiserver answers
            # ("Invalid value for `target`", kubernetes-client/python#825); we only need the status code.
            self.core.create_namespaced_pod_binding(e.name, e.namespace, body, _preload_content=False,
                                                    _request_timeout=self.cfg.request_timeout_s)
            return "bound"
        except ApiException as ex:
            status = ex.status
            if status == 409:
                self.metrics.bind_conflicts.inc()
            if status == 404:
                return "gone"
        except Exception as ex:  # connection dropped, timeout: the binding may or may not have happened
            log.info("binding %s/%s: %s", e.namespace, e.name, type(ex).__name__)
        return self._reread(e, node)

    def _reread(self, e: _Entry, node: str) -> str:
        """After an unclear answer: read the pod. Bound → never bind again; pending → retry; no answer →
        unknown."""
        try:
            resp = self.core.read_namespaced_pod(e.name, e.namespace, _preload_content=False,
                                                 _request_timeout=self.cfg.request_timeout_s)
            pod = json.loads(resp.data)
        except ApiException as ex:
            return "gone" if ex.status == 404 else "unknown"
        except Exception:
            return "unknown"
        if (pod.get("metadata") or {}).get("uid") != e.uid:
            return "gone"  # deleted and re-created under the same name: the new pod is a new entry
        bound_to = (pod.get("spec") or {}).get("nodeName") or ""
        if not bound_to:
            return "retry"
        if bound_to == node:
            return "bound"  # our earlier request went through; its answer was lost
        return "gone"  # someone else bound it


# ---- /metrics and /healthz --------------------------------------------------------------------------------
class StatusServer(BackgroundHTTPServer):
    """``GET /metrics`` (Prometheus text) and ``GET /healthz`` on ``host:port`` (loopback by default)."""

    def __init__(self, registry: CollectorRegistry, healthy: Any, host: str = "127.0.0.1", port: int = 10259) -> None:
        reg, ok = registry, healthy

        class H(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    data, ctype, code = generate_latest(reg), CONTENT_TYPE_LATEST, 200
                elif self.path.split("?")[0] in ("/healthz", "/livez", "/readyz"):
                    good = ok()
                    data, ctype, code = (b"ok" if good else b"not ready"), "text/plain", 200 if good else 503
                else:
                    data, ctype, code = b"not found", "text/plain", 404
                reply(self, code, data, ctype)

        super().__init__(H, host, port, "status-server")
