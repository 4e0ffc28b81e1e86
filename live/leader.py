"""Leader election on a coordination.k8s.io/v1 Lease, following client-go's leaderelection package.

- A candidate may take the lease when nobody holds it, or when the lease record (holder, renew time, duration,
  resourceVersion) has not changed for ``lease_duration_s`` of its *own* clock since it first saw that
  record, so clocks of different machines are never compared.
- Writes carry the resourceVersion read, so two candidates racing get one success and one 409.
- The leader counts as leader only until ``renew_deadline_s`` after the start of its last successful renew;
  a rival needs ``lease_duration_s`` (> renew_deadline_s) of an unchanged record to take over, so the two
  never both believe they lead. The apiserver's 409 on a second binding backs this up: even then no pod
  could be bound twice.
- On stop the leader releases the lease (empty holder, 1 s duration) so a standby takes over at once.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from joulesched.live.ratelog import RateLimitedLog

log = logging.getLogger("joulesched.leader")


def _micro_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"HTTP {e.status} {e.reason or ''}".strip()
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElector:
    """:param namespace: namespace of the Lease. :param name: its name (the scheduler name by default).
    :param lease_duration_s: 15 s as in kube-scheduler. :param renew_deadline_s: 10 s. :param retry_period_s: 2 s.
    :param on_change: called with True when leadership starts and False when it ends.
    """

    def __init__(self, api_client: k8s.ApiClient, namespace: str, name: str, *, identity: str | None = None,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 on_change: Callable[[bool], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need 0 < retry period < renew deadline < lease duration")
        self.coord = k8s.CoordinationV1Api(api_client)
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.lease_duration_s, self.renew_deadline_s, self.retry_period_s = (lease_duration_s, renew_deadline_s,
                                                                              retry_period_s)
        self.on_change = on_change
        self.clock = clock
        self._renewed_at = -1e18
        self._leading = False
        self._observed: tuple | None = None
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: terms begun on this replica; a new term's number is set before is_leader() turns True
        self.transitions = 0
        #: monotonic time of the last round the apiserver answered (a 409 is an answer), and the last error:
        #: a replica whose Lease calls keep failing (a wrong RBAC name, say) is standby for ever, and says so.
        self.last_answer = clock()
        self.last_error = ""
        self._warn = RateLimitedLog(log)
        #: [start, end] of each term as leader on this replica's clock (end: when is_leader() turns False).
        self.terms: deque[list[float]] = deque(maxlen=1024)  # bounded: a flapping lease must not grow memory

    def is_leader(self) -> bool:
        return self.clock() < self.leading_until()

    def leading_until(self) -> float:
        """Until when (``clock``) this replica counts as leader unless it renews; -inf while it does not lead."""
        return self._renewed_at + self.renew_deadline_s if self._leading else -math.inf

    def start(self) -> "LeaderElector":
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.terms and self.terms[-1][1] > self.clock():
            self.terms[-1][1] = self.clock()  # no binding is sent after this point
        if release and self.is_leader():
            self._release()
        self._set_leading(False)

    def _set_leading(self, v: bool) -> None:
        if v != self._leading:
            if v:  # first: is_leader() never turns True under the old term's number (what callers key work to)
                self.transitions += 1
            self._leading = v
            log.info("%s %s leadership of lease %s/%s", self.identity, "acquired" if v else "lost",
                     self.namespace, self.name)
            if self.on_change is not None:
                self.on_change(v)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ok = self.try_acquire_or_renew()
                self.last_answer, self.last_error = self.clock(), ""
            except Exception as e:  # apiserver down, timeouts, 403: retry; the deadline ends leadership
                self.last_error = _describe(e)
                self._warn.warn(f"lease:{self.last_error}", "lease %s/%s: %s (this replica cannot lead until "
                                "it can read and write its Lease)", self.namespace, self.name, self.last_error)
                ok = False
            if not ok and self._leading and not self.is_leader():
                self._set_leading(False)
            self._stop.wait(self.retry_period_s)

    @property
    def holder(self) -> str:
        """The holder named by the Lease when it was last read ("" when nobody holds it or it was never read)."""
        return (self._observed or ("",))[0] or ""

    def answering(self, within_s: float) -> bool:
        """The apiserver answered a Lease round within ``within_s`` seconds (leading or standby)."""
        return self.clock() - self.last_answer <= within_s

    def _body(self, lease: dict | None, now: str) -> dict:
        spec = dict((lease or {}).get("spec") or {})
        mine = spec.get("holderIdentity") == self.identity
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration_s)),
                         "acquireTime": spec.get("acquireTime") if mine and spec.get("acquireTime") else now,
                         "renewTime": now,
                         "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)}}
        if lease is not None:
            body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return body

    def try_acquire_or_renew(self) -> bool:
        """One round: read the lease, take or renew it if allowed. True when we lead afterwards."""
        t0 = self.clock()
        try:
            resp = self.coord.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                    _request_timeout=self.retry_period_s * 2)
            lease = json.loads(resp.data)
        except ApiException as e:
            if e.status != 404:
                raise
            lease = None
        if lease is None:
            try:
                self.coord.create_namespaced_lease(self.namespace, self._body(None, _micro_now()),
                                                   _preload_content=False, _request_timeout=self.retry_period_s * 2)
            except ApiException as e:
                if e.status == 409:  # a rival created it first
                    return False
                raise
            return self._won(t0)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"),
                  lease["metadata"].get("resourceVersion"))
        # A rival's lease is timed from when its record was read, not from when the read began (as client-go's
        # observedTime): a slow read of a lease renewed meanwhile would otherwise be counted as old, and its
        # holder's term overlapped (a review: a read answered 6 s late let a rival take over 0.5 s early).
        t_read = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, t_read
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        if holder and holder != self.identity and t_read < self._observed_at + duration:
            if self._leading:
                self._set_leading(False)
            return False
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, self._body(lease, _micro_now()),
                                                _preload_content=False, _request_timeout=self.retry_period_s * 2)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return self._won(t0)

    def _won(self, t0: float) -> bool:
        if self._leading and not self.is_leader():
            # Renewed after the renew deadline had passed: another replica may have led in between, so this is
            # a new term (transitions moves on), and an action begun in the old one must not go on.
            self._set_leading(False)
        if not self.is_leader():
            self.terms.append([self.clock(), t0 + self.renew_deadline_s])
        self._renewed_at = t0
        self.terms[-1][1] = t0 + self.renew_deadline_s
        self._set_leading(True)
        return True

    def _release(self) -> None:
        try:
            resp = self.coord.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                    _request_timeout=2)
            lease = json.loads(resp.data)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = self._body(lease, _micro_now())
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            self.coord.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False,
                                                _request_timeout=2)
        except Exception as e:
            log.info("lease %s: release failed (%s); a standby takes over after the lease expires", self.name, e)
