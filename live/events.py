"""Events, PodScheduled conditions and nominations: the scheduler's writes that are not bindings.

:class:`EventRecorder` writes them from worker threads, aggregated as kube-scheduler's recorder does.
:class:`EventWriterProcess` runs that recorder in a process of its own (``python -m joulesched.live.events``),
which is what ``serve`` does by default (``--event-writer process``): a thousand pods a second is a thousand
Event POSTs a second, and in the scheduler's process each one took the interpreter lock from the decisions
three times (its queue, its request, its answer). Issue 28's measurement: with the Events written in-process
the shipped model bound 769 pods/s at 5,000 nodes, with none written 1,018 (docs/PERFORMANCE.md, sixth
pass). What the scheduler pays per Event is now one ``os.write`` of a small frame on a pipe.

The process boundary changes nothing the cluster sees:

- the helper builds its own API client the way the scheduler built its own (the same kubeconfig and context,
  in-cluster service account, or URL: :func:`~joulesched.cluster.kube.client.client_source`); no credential
  crosses the pipe, and a refreshed token (in-cluster, exec plugins) is refreshed there too;
- a deposed leader must not overwrite its successor's conditions: the scheduler sends the time until which
  it counts as leader (monotonic, which every process of the machine shares) on every change of leadership
  and twice a second, and the helper writes nothing after it; a stale time is an earlier one, so it only
  errs on the side of writing less;
- its failures come back over its stdout and are counted in the scheduler's own metrics
  (``joulesched_events_dropped_total``, ``joulesched_api_errors_total``), and a condition it could not write
  is written again on the pod's next failed attempt, as before;
- the pipe is non-blocking and each frame is one atomic write (under ``PIPE_BUF``): when the helper falls
  behind by a pipe's worth of frames, new ones are dropped and counted, as a full queue drops them;
- if the helper dies, the scheduler logs it and goes on with an in-process recorder.
"""

from __future__ import annotations

import functools
import heapq
import http.client
import json
import logging
import math
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from joulesched.cluster.kube.client import FastClient
from joulesched.live.ratelog import RateLimitedLog

log = logging.getLogger("joulesched.serve")


#: Where a scheduler's Events are written from (``serve --event-writer``): a helper process, or its own threads.
EVENT_WRITERS = ("process", "thread")
#: Event series (pod and reason) a recorder keeps, the most recent.
MAX_SERIES = 4096


class RecorderMetrics(Protocol):
    """What a recorder counts: ``events_dropped`` (``.inc()``) and ``api_errors`` (``.labels(op, code).inc()``)."""

    events_dropped: Any
    api_errors: Any


def _count_drop(metrics: RecorderMetrics, condition_dropped: Callable[[str], None], warn: RateLimitedLog,
                kind: str, uid: str, why: str) -> None:
    """A write given up on: counted, a condition handed back (written again on the pod's next failed attempt),
    a rate-limited WARNING."""
    metrics.events_dropped.inc()
    if kind == "condition":
        condition_dropped(uid)
    warn.warn(f"drop:{kind}", "recorder: %s for pod %s given up: %s", kind, uid, why)


@dataclass(slots=True)
class _Series:
    """One Event object: every occurrence of one reason for one pod, as kube's recorder aggregates them."""

    namespace: str
    pod: str
    uid: str
    etype: str
    reason: str
    message: str
    count: int = 1
    name: str = ""  # the Event's name once created
    # The name a POST was sent with, kept until it is known to exist: a POST whose answer was lost (or that the
    # client resent on a connection the apiserver had closed) is sent again under the same name, so that the
    # apiserver answers 409 instead of creating a second Event.
    posted: str = ""
    written: int = 0  # the count the API has
    written_at: float = -1e18  # monotonic time of the last write
    first_seen: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)


@dataclass
class _Shard:
    """One recorder worker: its queue of keys and its deferred series updates ``(due, key)``."""

    q: queue.Queue
    deferred: list = field(default_factory=list)
    thread: threading.Thread | None = None


def _rfc3339(t: float, micro: bool = False) -> str:
    """RFC 3339 UTC (``metav1.Time``; ``metav1.MicroTime`` with ``micro``)."""
    base = _second(int(t))
    return f"{base}.{int(t % 1 * 1e6):06d}Z" if micro else base + "Z"


@functools.lru_cache(maxsize=4)
def _second(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


class EventRecorder:
    """Writes core/v1 Events, PodScheduled conditions and nominations from one thread, off the scheduling path.

    **Aggregated as kube-scheduler does**: one Event per pod and reason (client-go's recorder keys a series by
    the involved object, reason, action and reporting controller). The first occurrence creates it; later
    ones raise its ``count``, ``lastTimestamp``, ``series`` and message with a merge patch, at most once every
    ``update_interval_s`` per Event (the last count is always written, at the latest on stop), so a pod that
    stays unschedulable for an hour costs a handful of writes, not one per attempt.

    **Bounded**: the queue holds keys, not requests; a key already queued is not queued again (its latest
    state is what gets written), and at most ``max_queue`` keys wait: past that new ones are dropped and
    counted in ``joulesched_events_dropped_total`` (a dropped condition is written again on the pod's next
    failed attempt). The series table keeps the ``max_series`` most recent pods and reasons.

    Failures are retried three times, then logged at WARNING (rate-limited) and counted.
    """

    def __init__(self, http: FastClient, component: str, instance: str, metrics: RecorderMetrics,
                 may_write: Callable[[], bool] = lambda: True,
                 condition_dropped: Callable[[str], None] = lambda uid: None, *, update_interval_s: float = 10.0,
                 max_queue: int = 4096, max_series: int = MAX_SERIES, timeout_s: float = 5.0, workers: int = 2) -> None:
        self.http, self.component, self.instance, self.metrics = http, component, instance, metrics
        self.condition_dropped = condition_dropped  # told when a condition could not be written, to retry it
        self.may_write = may_write  # a deposed leader must not overwrite its successor's conditions
        self.update_interval_s, self.max_series, self.timeout_s = update_interval_s, max_series, timeout_s
        self._lock = threading.Lock()
        self._series: OrderedDict[tuple[str, str], _Series] = OrderedDict()
        self._queued: set[tuple] = set()
        self._latest: dict[tuple, tuple] = {}  # condition / nomination keys -> their latest arguments
        self._warn = RateLimitedLog(log)
        self._crashed = False  # a write has raised something unexpected (logged with its traceback once)
        self.ready = threading.Event()  # writing (set at once here; when the helper is up in EventWriterProcess)
        self.ready.set()
        # Workers, each with its own queue and deferred updates; a pod's writes always go to the same one, in
        # order. One worker cannot keep up with a scheduler binding 1,000 pods/s (one Event each).
        self._shards = [_Shard(queue.Queue(maxsize=max(1, max_queue // workers))) for _ in range(max(1, workers))]
        for k, sh in enumerate(self._shards):
            sh.thread = threading.Thread(target=self._loop, args=(sh,), name=f"event-recorder-{k}", daemon=True)
            sh.thread.start()

    # ---- what the scheduler calls (never blocks) ----
    def scheduled(self, ns: str, name: str, uid: str, node: str) -> None:
        self._record(ns, name, uid, "Normal", "Scheduled", f"Successfully assigned {ns}/{name} to {node}")

    def nominated(self, ns: str, name: str, uid: str, node: str) -> None:
        """The pod waits for ``node`` to wake: ``status.nominatedNodeName`` (which the node power controller
        reads) and an Event."""
        self._put(("nominate", uid), (ns, name, uid, node))
        self._record(ns, name, uid, "Normal", "WaitingForNode", f"Node {node} is asleep; waiting for it to wake up")

    def unnominated(self, ns: str, name: str, uid: str) -> None:
        """The pod no longer waits for the node it was nominated for: ``status.nominatedNodeName`` cleared (a
        nomination still queued is replaced, never written after this), so the node power controller stops
        waking that node for it."""
        self._put(("nominate", uid), (ns, name, uid, ""))

    def failed(self, ns: str, name: str, uid: str, message: str, condition: bool, rv: str = "") -> None:
        """A failed attempt: its FailedScheduling Event, and with ``condition`` the ``PodScheduled=False``
        condition, written only if the pod is still at ``rv`` (its resourceVersion as the decision saw it): a
        write that lands after the pod was bound would otherwise overwrite its ``PodScheduled=True``."""
        self._record(ns, name, uid, "Warning", "FailedScheduling", message)
        if condition:
            self._put(("condition", uid), (ns, name, uid, message, rv))

    def forget(self, uid: str) -> None:
        """The pod is bound or gone: its FailedScheduling series ends (a later failure starts a new Event), and a
        condition still queued for it is not written."""
        with self._lock:
            self._latest.pop(("condition", uid), None)
            for reason in ("FailedScheduling", "WaitingForNode"):
                s = self._series.get((uid, reason))
                if s is not None and s.written == s.count and ("event", uid, reason) not in self._queued:
                    del self._series[(uid, reason)]

    def series_count(self) -> int:
        with self._lock:
            return len(self._series)

    def stop(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        for sh in self._shards:
            try:
                sh.q.put(None, timeout=timeout)  # waits only while the queue is full and the worker drains it
            except queue.Full:
                pass
        for sh in self._shards:
            sh.thread.join(max(0.0, deadline - time.monotonic()))

    def _shard(self, key: tuple) -> _Shard:
        return self._shards[hash(key[1]) % len(self._shards)]

    # ---- queueing ----
    def _record(self, ns: str, name: str, uid: str, etype: str, reason: str, message: str) -> None:
        key = (uid, reason)
        with self._lock:
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series(ns, name, uid, etype, reason, message)
                while len(self._series) > self.max_series:
                    self._series.popitem(last=False)
            else:
                s.count += 1
                s.message, s.last_seen = message, time.time()
                self._series.move_to_end(key)
        self._put(("event", uid, reason), None)

    def _put(self, key: tuple, args: tuple | None) -> None:
        with self._lock:
            if args is not None:
                self._latest[key] = args
            if key in self._queued:
                return  # already waiting: the worker writes the latest state
            self._queued.add(key)
        try:
            self._shard(key).q.put_nowait(key)
        except queue.Full:
            with self._lock:
                self._queued.discard(key)
                self._latest.pop(key, None)
            self._dropped(key, "the recorder's queue is full")

    def _dropped(self, key: tuple, why: str) -> None:
        _count_drop(self.metrics, self.condition_dropped, self._warn, key[0], key[1], why)

    def leadership_changed(self) -> None:
        """Nothing to do: :attr:`may_write` is asked at every write."""

    # ---- the worker ----
    def _loop(self, sh: _Shard) -> None:
        stopping = False
        while True:
            timeout = max(0.0, sh.deferred[0][0] - time.monotonic()) if sh.deferred else None
            try:
                key = sh.q.get(timeout=timeout)
            except queue.Empty:
                key = ()
            if key is None:
                stopping = True
            elif key:
                with self._lock:
                    self._queued.discard(key)
                self._handle_safely(key)
            now = time.monotonic()
            while sh.deferred and (stopping or sh.deferred[0][0] <= now):
                _, k = heapq.heappop(sh.deferred)
                self._handle_safely(k, force=True)
            if stopping:
                while True:  # what is still queued (stop() waits at most its timeout for this)
                    try:
                        k = sh.q.get_nowait()
                    except queue.Empty:
                        return
                    if k:
                        self._handle_safely(k, force=True)

    def _handle_safely(self, key: tuple, force: bool = False) -> None:
        """:meth:`_handle`; an error nobody expected (a bug, a client raising something new) drops that write,
        counted, instead of ending the worker and leaving its queue to fill for good."""
        try:
            self._handle(key, force)
        except Exception as e:
            if not self._crashed:  # the traceback once; the drops are counted and rate-limited after that
                self._crashed = True
                log.exception("recorder: unexpected error writing %s for pod %s", key[0], key[1])
            self._dropped(key, f"unexpected {type(e).__name__}")

    def _handle(self, key: tuple, force: bool = False) -> None:
        if not self.may_write():
            if key[0] == "condition":  # written again on the pod's next failed attempt (by whoever leads then)
                with self._lock:
                    self._latest.pop(key, None)
                self.condition_dropped(key[1])
            return
        kind = key[0]
        if kind == "event":
            with self._lock:
                if force:
                    self._queued.discard(("deferred",) + key)
                s = self._series.get((key[1], key[2]))
                if s is None or s.written == s.count:
                    return
                if s.name and not force and time.monotonic() - s.written_at < self.update_interval_s:
                    if ("deferred",) + key not in self._queued:
                        self._queued.add(("deferred",) + key)
                        heapq.heappush(self._shard(key).deferred, (s.written_at + self.update_interval_s, key))
                    return
                self._queued.discard(("deferred",) + key)
                snap = (s.name, s.count, s.message, s.last_seen)
            self._attempt(key, lambda: self._write_event(s, *snap))
            return
        with self._lock:
            args = self._latest.pop(key, None)
        if args is not None:
            self._attempt(key, lambda: (self._condition if kind == "condition" else self._nominate)(*args))

    def _attempt(self, key: tuple, write: Callable[[], int]) -> None:
        why = ""
        for attempt in range(3):
            try:
                code = write()
            except (OSError, http.client.HTTPException) as e:
                code, why = 0, type(e).__name__
            else:
                if code < 300:
                    return
                if code == 404 or (key[0] == "nominate" and code in (409, 422)):
                    return  # the pod (or the Event) is gone, or made again under its name; nothing to record
                if code == 409 and key[0] == "condition":
                    # The pod changed since the decision (bound, or another write): not written now, and written
                    # again on its next failed attempt if it is still pending then.
                    self.condition_dropped(key[1])
                    return
                why = f"HTTP {code}"
            self.metrics.api_errors.labels(key[0], str(code) if code else "connection").inc()
            time.sleep(0.05 * (attempt + 1))
        self._dropped(key, why)

    def _write_event(self, s: _Series, name: str, count: int, message: str, last_seen: float) -> int:
        last = _rfc3339(last_seen)
        if not name:
            with self._lock:
                name = s.posted = s.posted or f"{s.pod}.{time.time_ns():x}"
            body = {"apiVersion": "v1", "kind": "Event",
                    "metadata": {"name": name, "namespace": s.namespace},
                    "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": s.namespace, "name": s.pod,
                                       "uid": s.uid},
                    "reason": s.reason, "message": message, "type": s.etype,
                    "source": {"component": self.component}, "reportingComponent": self.component,
                    "reportingInstance": self.instance,
                    "action": "Scheduling" if s.etype == "Warning" else "Binding",
                    "firstTimestamp": _rfc3339(s.first_seen), "lastTimestamp": last, "count": count}
            r = self.http.request("POST", f"/api/v1/namespaces/{s.namespace}/events", compact_json(body),
                                  timeout=self.timeout_s)
            if r.status == 409:  # created by an earlier try of ours whose answer was lost: update it instead
                with self._lock:
                    s.name, s.posted = name, ""
                return self._write_event(s, name, count, message, last_seen)
            if r.status < 300:
                with self._lock:
                    s.name, s.posted = name, ""
        else:
            patch = {"count": count, "lastTimestamp": last, "message": message,
                     "series": {"count": count, "lastObservedTime": _rfc3339(last_seen, micro=True)}}
            r = self.http.request("PATCH", f"/api/v1/namespaces/{s.namespace}/events/{name}", compact_json(patch),
                                  content_type="application/merge-patch+json", timeout=self.timeout_s)
            if r.status == 404:  # the Event expired (the apiserver's event TTL is 1 h): start a new one
                with self._lock:
                    s.name = ""
                return self._write_event(s, "", count, message, last_seen)
        if r.status < 300:
            with self._lock:
                s.written, s.written_at = max(s.written, count), time.monotonic()
        return r.status

    def _nominate(self, ns: str, name: str, uid: str, node: str) -> int:
        """``nominatedNodeName: node``, or ``null`` (removed, as kube-scheduler clears it) when ``node`` is "". The
        pod's uid goes with it: a pod deleted and made again under its name is another pod, which the apiserver
        refuses to write so (a uid may not change: 409 or 422), rather than have it wake a node it never chose."""
        return self.http.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                                 compact_json({"metadata": {"uid": uid},
                                               "status": {"nominatedNodeName": node or None}}),
                                 content_type="application/merge-patch+json", timeout=self.timeout_s).status

    def _condition(self, ns: str, name: str, uid: str, message: str, rv: str = "") -> int:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch: dict = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                  "message": message, "lastProbeTime": None,
                                                  "lastTransitionTime": now}]}}
        if rv:  # a precondition: 409 if the pod changed since the decision (bound meanwhile, above all)
            patch["metadata"] = {"resourceVersion": rv}
        return self.http.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", compact_json(patch),
                                 content_type="application/strategic-merge-patch+json",
                                 timeout=self.timeout_s).status


def compact_json(body: dict) -> bytes:
    """A request body: JSON without spaces, as bytes."""
    return json.dumps(body, separators=(",", ":")).encode()


# ---- the recorder in a process of its own ------------------------------------------------------------------
_LEN = struct.Struct("<I")
#: A frame's most bytes: one write of at most PIPE_BUF bytes to a pipe is atomic (never interleaved with
#: another thread's, never half-written when the pipe is full).
MAX_FRAME = select.PIPE_BUF
#: How often the scheduler tells the helper until when it leads, at the least (and at every retry period).
LEAD_INTERVAL_S = 0.5
_MAX_MESSAGE = 1024  # an Event's message, at most (client-go truncates to 1 KiB as well)


def _frame(msg: tuple) -> bytes:
    data = json.dumps(msg, separators=(",", ":")).encode()  # JSON, not pickle: nothing on a pipe runs code
    return _LEN.pack(len(data)) + data


class _Frames:
    """Splits a byte stream into frames (length-prefixed JSON arrays written by the other end of our pipe)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        self._buf += data
        out, b = [], self._buf
        while len(b) >= _LEN.size:
            (n,) = _LEN.unpack_from(b)
            if len(b) < _LEN.size + n:
                break
            out.append(json.loads(bytes(b[_LEN.size:_LEN.size + n])))
            del b[:_LEN.size + n]
        return out


class EventWriterProcess:
    """An :class:`EventRecorder` run by a child process (module docstring), with the recorder's interface.

    :param source: how the child builds its API client (:func:`~joulesched.cluster.kube.client.client_source`).
    :param leading_until: until when (``time.monotonic``) this replica may write; ``inf`` without leader election.
    :param local: builds the in-process recorder used once the child has died.
    :param lead_interval_s: how often to send ``leading_until`` (at most :data:`LEAD_INTERVAL_S`): the leader's
        retry period, so that the child's deadline is never more than one renewal behind.
    """

    def __init__(self, source: dict, component: str, instance: str, metrics: RecorderMetrics,
                 leading_until: Callable[[], float], condition_dropped: Callable[[str], None],
                 local: Callable[[], EventRecorder], *, update_interval_s: float = 10.0, max_queue: int = 4096,
                 timeout_s: float = 5.0, lead_interval_s: float = LEAD_INTERVAL_S) -> None:
        self.metrics, self.leading_until, self.condition_dropped = metrics, leading_until, condition_dropped
        self.lead_interval_s = min(LEAD_INTERVAL_S, lead_interval_s)
        self._make_local = local
        self._local: EventRecorder | None = None
        self._warn = RateLimitedLog(log)
        self.ready = threading.Event()  # set once the child has built its client and recorder
        # Pods with a FailedScheduling / WaitingForNode series in the child, as many as the child keeps series
        # (a pod deleted while pending is never forgotten here; past the bound the child's LRU forgets it).
        self._with_series: dict[str, None] = {}  # insertion-ordered: the oldest goes first
        self._series_lock = threading.Lock()
        self._stopping = threading.Event()
        self._closed = False  # stdin closed by stop(): its descriptor number is no longer ours
        self._pipe_lock = threading.Lock()
        self._lock = threading.Lock()  # the switch to the local recorder
        # The same interpreter and environment: the child imports this package from where we did.
        self.proc = subprocess.Popen([sys.executable, "-m", "joulesched.live.events"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, close_fds=True)
        self._out = self.proc.stdin.fileno()
        self._in = self.proc.stdout.fileno()
        # The config frame goes first, while the pipe is empty and still blocking; then nothing ever waits.
        try:
            self._write(_frame(("config", {"source": source, "component": component, "instance": instance,
                                           "update_interval_s": update_interval_s, "max_queue": max_queue,
                                           "timeout_s": timeout_s, "lead_until": self._until(),
                                           "log_level": logging.getLogger("joulesched").getEffectiveLevel()})))
        except OSError:  # it died at once (its error is on stderr): its end of output says so below
            pass
        os.set_blocking(self._out, False)
        self._io = threading.Thread(target=self._io_loop, name="event-writer-io", daemon=True)
        self._io.start()

    # ---- the recorder's interface (never blocks) ----
    def scheduled(self, ns: str, name: str, uid: str, node: str) -> None:
        if self._local is not None:
            return self._local.scheduled(ns, name, uid, node)
        self._send(("scheduled", ns, name, uid, node), "event", uid)

    def nominated(self, ns: str, name: str, uid: str, node: str) -> None:
        if self._local is not None:
            return self._local.nominated(ns, name, uid, node)
        self._series_of(uid)
        self._send(("nominated", ns, name, uid, node), "nominate", uid)

    def unnominated(self, ns: str, name: str, uid: str) -> None:
        if self._local is not None:
            return self._local.unnominated(ns, name, uid)
        self._send(("unnominated", ns, name, uid), "nominate", uid)

    def failed(self, ns: str, name: str, uid: str, message: str, condition: bool, rv: str = "") -> None:
        if self._local is not None:
            return self._local.failed(ns, name, uid, message, condition, rv)
        self._series_of(uid)
        self._send(("failed", ns, name, uid, message[:_MAX_MESSAGE], condition, rv),
                   "condition" if condition else "event", uid)

    def forget(self, uid: str) -> None:
        if self._local is not None:
            return self._local.forget(uid)
        if uid in self._with_series:  # most pods never failed: nothing to forget, no frame
            with self._series_lock:
                self._with_series.pop(uid, None)
            self._send(("forget", uid), "forget", uid)

    def _series_of(self, uid: str) -> None:
        with self._series_lock:
            w = self._with_series
            w[uid] = None
            if len(w) > MAX_SERIES:
                del w[next(iter(w))]

    def leadership_changed(self) -> None:
        """Tell the child at once (a replica that steps down must stop writing before a successor starts)."""
        if self._local is None:
            self._send(("lead", self._until()), "lead", "")

    def stop(self, timeout: float = 5.0) -> None:
        """Drain: the child writes what it holds (while we still lead) and exits; at most ``timeout`` seconds."""
        self._stopping.set()
        if self._local is not None:
            self._local.stop(timeout)
        if self.proc.poll() is None:
            try:
                self._write(_frame(("stop", timeout)))
            except OSError:  # its pipe is full (a stuck helper): the end of input below stops it as well
                pass
            with self._pipe_lock:
                self._closed = True
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass
            try:
                self.proc.wait(timeout + 2.0)
            except subprocess.TimeoutExpired:
                log.warning("the event writer did not stop in %.0f s; killed", timeout + 2.0)
                self.proc.kill()
                self.proc.wait()
        self._io.join(2.0)
        self.proc.stdout.close()

    # ---- the pipe ----
    def _until(self) -> float:
        u = self.leading_until()
        return u if math.isfinite(u) else (1e300 if u > 0 else -1e300)

    def _write(self, frame: bytes) -> None:
        # The check and the write under the lock stop() closes the pipe under: once closed, the descriptor's
        # number may belong to another file or socket (a leader stepping down after the stop wrote a frame there).
        with self._pipe_lock:
            if self._closed:
                raise BrokenPipeError("the event writer has stopped")
            n = os.write(self._out, frame)
        if n != len(frame):  # cannot happen below PIPE_BUF; never leave half a frame unnoticed
            raise BrokenPipeError("partial frame")

    def _send(self, msg: tuple, kind: str, uid: str) -> None:
        if self._closed:  # stopped: nothing more to tell the child (and no fall-back to start)
            return
        frame = _frame(msg)
        try:
            if len(frame) > MAX_FRAME:
                raise ValueError(f"{len(frame)} bytes")
            self._write(frame)
            return
        except BlockingIOError:
            why = "the event writer is behind (its pipe is full)"
        except ValueError as e:
            why = f"frame too large ({e})"
        except OSError:  # the child is gone: go on in this process
            self._fall_back("its pipe is closed")
            local = self._local
            if local is not None and msg[0] in ("scheduled", "nominated", "unnominated", "failed", "forget"):
                getattr(local, msg[0])(*msg[1:])
            return
        if kind != "lead":  # a lost heartbeat: the next one says it again
            _count_drop(self.metrics, self.condition_dropped, self._warn, kind, uid, why)

    def _fall_back(self, why: str) -> None:
        with self._lock:
            if self._local is not None or self._stopping.is_set():
                return
            log.error("the event writer process stopped (%s; exit code %s); Events are written in-process from now",
                      why, self.proc.poll())
            self._local = self._make_local()
            self.ready.set()

    def _io_loop(self) -> None:
        """Reads the child's reports (drops, API errors, conditions to write again) and sends the heartbeat."""
        frames, last_beat = _Frames(), time.monotonic()
        while True:
            ready, _, _ = select.select([self._in], [], [], self.lead_interval_s)
            if ready:
                try:
                    data = os.read(self._in, 65536)
                except OSError:
                    data = b""
                if not data:  # the child exited
                    if not self._stopping.is_set():
                        self._fall_back("end of its output")
                    return
                for msg in frames.feed(data):
                    self._report(msg)
            if not self._stopping.is_set() and time.monotonic() - last_beat >= self.lead_interval_s:
                last_beat = time.monotonic()
                self.leadership_changed()

    def _report(self, msg: tuple) -> None:
        op = msg[0]
        if op == "ready":
            self.ready.set()
        elif op == "dropped":
            self.metrics.events_dropped.inc()
        elif op == "api_error":
            self.metrics.api_errors.labels(msg[1], msg[2]).inc()
        elif op == "condition_dropped":
            self.condition_dropped(msg[1])


class _Relay:
    """The child's side of the metrics and callbacks: each report is a frame on its stdout."""

    def __init__(self, fd: int) -> None:
        self._fd, self._lock = fd, threading.Lock()
        self.events_dropped = self._Counter(self, ("dropped",))
        self.api_errors = self

    class _Counter:
        def __init__(self, relay: _Relay, msg: tuple) -> None:
            self._relay, self._msg = relay, msg

        def inc(self, amount: float = 1.0) -> None:
            self._relay.send(self._msg)

    def labels(self, op: str, code: str) -> _Relay._Counter:
        return self._Counter(self, ("api_error", op, code))

    def send(self, msg: tuple) -> None:
        frame = _frame(msg)
        with self._lock:
            try:
                os.write(self._fd, frame)  # blocking: the scheduler always reads
            except OSError:
                pass  # the scheduler is gone; stdin's end stops us


def _child_main() -> int:
    """``python -m joulesched.live.events``: the helper process (started by :class:`EventWriterProcess`).

    It ends when the scheduler says ``stop`` or its input closes (the scheduler exited, however), never on a
    signal: Ctrl-C in a terminal, or systemd's SIGTERM to the whole unit, reaches it too, and it must still
    write what it holds while the scheduler drains."""
    from joulesched.cluster.kube.client import api_client_from_source

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to stderr: stdout carries frames only
    logging.basicConfig(format="%(asctime)s event-writer %(levelname)s %(name)s: %(message)s")
    relay = _Relay(out)
    stdin = sys.stdin.buffer.raw
    frames, rec, lead_until = _Frames(), None, [-1e300]
    while True:
        data = stdin.read(65536)
        if not data:  # the scheduler is gone (or closed the pipe after "stop"): write what is held, then exit
            if rec is not None:
                rec.stop(5.0)
            return 0
        for msg in frames.feed(data):
            op = msg[0]
            if op == "config":
                c = msg[1]
                logging.getLogger("joulesched").setLevel(c["log_level"])  # the scheduler's --log-level
                lead_until[0] = c["lead_until"]
                rec = EventRecorder(FastClient(api_client_from_source(c["source"])), c["component"], c["instance"],
                                    relay, may_write=lambda: time.monotonic() < lead_until[0],
                                    condition_dropped=lambda uid: relay.send(("condition_dropped", uid)),
                                    update_interval_s=c["update_interval_s"], max_queue=c["max_queue"],
                                    timeout_s=c["timeout_s"])
                relay.send(("ready",))
            elif op == "lead":
                lead_until[0] = msg[1]
            elif rec is None:
                continue
            elif op == "stop":
                rec.stop(msg[1])
                return 0
            else:
                getattr(rec, op)(*msg[1:])


if __name__ == "__main__":
    sys.exit(_child_main())
