"""Failures are visible (issue 17, item 4): a refused binding is logged and counted by code; re-read, Event and
Lease errors are logged at WARNING, rate-limited; /readyz reports leadership and informer sync, /healthz fails
on a stale informer; Events are aggregated as kube-scheduler does, and the recorder's queue is bounded.
Against the API emulator (no kube-apiserver can run here)."""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from joulesched.cluster.kube.client import FastClient, api_client_for
from joulesched.live.ratelog import RateLimitedLog
from joulesched.live.events import EventRecorder
from joulesched.live.scheduler import LatencyReservoir, SchedulerMetrics, StatusServer
from tests.live.conftest import wait_until


MSG_CPU = "0/1 nodes are available: 1 Insufficient cpu."


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _metrics(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_forbidden_binding_is_logged_at_warning_and_counted_by_code(emu, make_scheduler, caplog):
    emu.add_node("a")
    emu.faults.add("403", "bind", times=2)  # RBAC refuses the first two bindings
    emu.add_pod("p", cpu="100m")
    with caplog.at_level(logging.WARNING, logger="joulesched.serve"):
        s = make_scheduler()
        wait_until(lambda: emu.bindings, what="the binding after the 403s")
    text = _metrics(s.registry)
    assert 'joulesched_bind_errors_total{code="403"} 2.0' in text
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "answered HTTP 403" in r.getMessage()]
    assert warnings, [r.getMessage() for r in caplog.records]
    assert "forbidden" in warnings[0].getMessage()  # the apiserver's own message is in the line
    assert len(warnings) == 1  # rate-limited: the second 403 within 30 s is held back
    assert [b[1] for b in emu.bindings] == ["p"]


def test_bind_conflict_is_counted_but_not_warned(emu, make_scheduler, caplog):
    emu.add_node("a")
    emu.faults.add("409", "bind", times=1)
    emu.add_pod("p", cpu="100m")
    with caplog.at_level(logging.WARNING, logger="joulesched.serve"):
        s = make_scheduler()
        wait_until(lambda: emu.bindings, what="the binding after the 409")
    assert 'joulesched_bind_errors_total{code="409"} 1.0' in _metrics(s.registry)
    assert not [r for r in caplog.records if "binding default/p" in r.getMessage()]


def test_failed_reread_is_logged_at_warning(emu, make_scheduler, caplog):
    emu.add_node("a")
    emu.faults.add("500", "bind", times=1)
    emu.faults.add("500", "get:pods", times=1)  # the re-read after it fails too: outcome unknown, then resolved
    emu.add_pod("p", cpu="100m")
    with caplog.at_level(logging.WARNING, logger="joulesched.serve"):
        s = make_scheduler()
        wait_until(lambda: emu.bindings and s.pending() == 0, what="the pod bound in the end")
    assert any("re-reading default/p answered HTTP 500" in r.getMessage() for r in caplog.records)
    assert 'joulesched_api_errors_total{code="500",op="reread"} 1.0' in _metrics(s.registry)


def test_failed_scheduling_events_are_aggregated_with_a_count(emu, make_scheduler):
    emu.add_node("a", cpu="1")
    emu.add_pod("huge", cpu="2")
    emu.add_pod("big", cpu="3")
    s = make_scheduler(backoff_initial_s=0.02, backoff_max_s=0.05, event_update_interval_s=0.0)

    def counts() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for e in emu.list("events"):
            if e["reason"] == "FailedScheduling":
                out.setdefault(e["involvedObject"]["name"], []).append(e["count"])
        return out

    def patched() -> bool:  # an update (not only the creation, which may already carry a count > 1) was written
        return any("series" in e for e in emu.list("events") if e["involvedObject"]["name"] == "huge")

    wait_until(lambda: all(c and c[0] >= 5 for c in (counts().get("huge"), counts().get("big"))) and patched(),
               what="counts of 5, updated")
    s.stop()  # the recorder writes the last count before it stops
    attempts = s.metrics.attempts.labels("unschedulable")._value.get()  # read once no attempt can follow
    c = counts()
    assert len(c["huge"]) == 1 and len(c["big"]) == 1  # one Event per pod and reason
    assert c["huge"][0] + c["big"][0] == attempts  # every attempt counted, none lost
    ev = next(e for e in emu.list("events") if e["involvedObject"]["name"] == "huge")
    assert ev["series"]["count"] == ev["count"] and ev["lastTimestamp"] >= ev["firstTimestamp"]
    assert ev["message"] == "0/1 nodes are available: 1 Insufficient cpu."


def test_event_updates_are_throttled_but_the_last_count_is_written(emu, make_scheduler):
    emu.add_node("a", cpu="1")
    emu.add_pod("huge", cpu="2")
    s = make_scheduler(backoff_initial_s=0.01, backoff_max_s=0.02, event_update_interval_s=30.0)
    wait_until(lambda: s.metrics.attempts.labels("unschedulable")._value.get() >= 20, what="20 attempts")
    writes = [t for t, e in emu.changes("events") if e["reason"] == "FailedScheduling"]
    assert len(writes) <= 2  # created, then at most one update within the interval, not one per attempt
    s.stop()
    ev = next(e for e in emu.list("events") if e["reason"] == "FailedScheduling")
    assert ev["count"] == s.metrics.attempts.labels("unschedulable")._value.get()


def test_recorder_queue_is_bounded_and_drops_are_counted(emu):
    emu.faults.add("slow", "create:events", times=-1, delay_s=0.2)  # the apiserver is slow to take Events
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    rec = EventRecorder(FastClient(api_client_for(emu.url)), "joulesched", "test", metrics, max_queue=4,
                        workers=1)
    try:
        for i in range(50):
            emu.add_pod(f"p{i}")
            rec.scheduled("default", f"p{i}", f"uid-{i}", "n")
        assert rec._shards[0].q.qsize() <= 4
        assert metrics.events_dropped._value.get() >= 40
    finally:
        emu.faults.clear()
        rec.stop(timeout=10)
    assert 1 <= len(emu.list("events")) <= 10


def test_repeated_occurrences_do_not_grow_the_queue(emu):
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    emu.faults.add("slow", "create:events", times=1, delay_s=0.3)
    rec = EventRecorder(FastClient(api_client_for(emu.url)), "joulesched", "test", metrics, max_queue=2,
                        workers=1, update_interval_s=0.0)
    emu.add_pod("p")
    try:
        for _ in range(200):  # one pod failing again and again: one queued key, whatever the rate
            rec.failed("default", "p", "uid-p", "0/1 nodes are available: 1 Insufficient cpu.", condition=False)
        assert metrics.events_dropped._value.get() == 0
    finally:
        rec.stop(timeout=10)
    (ev,) = emu.list("events")
    assert ev["count"] == 200


def test_an_event_whose_answer_was_lost_is_not_created_twice(emu):
    """The apiserver creates the Event and the answer is lost (a 500 here; a cut connection the same): the next
    try posts the same name, gets 409 AlreadyExists, and brings that Event up to date instead of adding one."""
    metrics = SchedulerMetrics(CollectorRegistry())
    emu.faults.add("lost-response", "create:events", times=1)
    rec = EventRecorder(FastClient(api_client_for(emu.url)), "joulesched", "test", metrics, workers=1,
                        update_interval_s=0.0)
    emu.add_pod("p")
    try:
        rec.failed("default", "p", "uid-p", MSG_CPU, condition=False)
        wait_until(lambda: emu.faults.log and any(e["count"] == 1 for e in emu.list("events")), what="the Event")
        rec.failed("default", "p", "uid-p", MSG_CPU, condition=False)
        wait_until(lambda: [e["count"] for e in emu.list("events")] == [2], what="its count updated to 2")
    finally:
        rec.stop(timeout=10)
    (ev,) = emu.list("events")
    assert ev["count"] == 2 and emu.faults.log == [("lost-response", "create:events")]
    assert metrics.events_dropped._value.get() == 0


def test_lease_errors_are_warned_and_readyz_reports_them(emu, make_scheduler, caplog):
    emu.add_node("a")
    emu.faults.add("403", "get:leases", times=-1)  # a wrong RBAC name: the Lease can never be read
    with caplog.at_level(logging.WARNING, logger="joulesched.leader"):
        s = make_scheduler(leader_elect=True, identity="r1")
        srv = StatusServer(s.registry, s.health_checks, "127.0.0.1", 0, ready=s.readiness_checks).start()
        try:
            wait_until(lambda: s.cache.synced)
            time.sleep(1.0)  # about 20 failed rounds at retry_period 0.05 s, past lease_duration 0.6 s
            # (a loaded machine may have run fewer: the first failed round past lease_duration is awaited)
            code, body = wait_until(lambda: (r := _get(f"http://127.0.0.1:{srv.port}/readyz"))[0] == 503 and r,
                                    10, "/readyz failing")
            assert "[-]leader-election failed" in body and "HTTP 403" in body and "[+]informer-sync ok" in body
            assert _get(f"http://127.0.0.1:{srv.port}/healthz") == (200, "ok")  # alive: restarting would not help
            emu.faults.clear()
            wait_until(s.is_leader, timeout=10, what="leadership once the Lease is readable")
            code, body = _get(f"http://127.0.0.1:{srv.port}/readyz?verbose")
            assert code == 200 and "[+]leader-election ok: leading as r1" in body
        finally:
            srv.stop()
    lines = [r for r in caplog.records if r.levelno == logging.WARNING and "HTTP 403" in r.getMessage()]
    assert len(lines) == 1  # rate-limited: one line for ~20 failures


def test_readyz_reports_the_standby(emu, make_scheduler):
    emu.add_node("a")
    a = make_scheduler(leader_elect=True, identity="a")
    wait_until(a.is_leader, what="a leading")
    b = make_scheduler(leader_elect=True, identity="b")
    srv = StatusServer(b.registry, b.health_checks, "127.0.0.1", 0, ready=b.readiness_checks).start()
    try:
        wait_until(lambda: b.cache.synced and b.leader.last_answer > 0)
        time.sleep(0.2)
        code, body = _get(f"http://127.0.0.1:{srv.port}/readyz?verbose")
        assert code == 200 and "standby; lease default/joulesched held by a" in body
    finally:
        srv.stop()


def test_healthz_fails_when_the_informer_is_stale(emu, make_scheduler):
    emu.add_node("a")
    s = make_scheduler(informer_stale_s=0.5)
    srv = StatusServer(s.registry, s.health_checks, "127.0.0.1", 0, ready=s.readiness_checks).start()
    try:
        wait_until(lambda: s.cache.synced)
        base = f"http://127.0.0.1:{srv.port}"
        assert _get(base + "/healthz") == (200, "ok")
        for op in ("watch:pods", "list:pods"):
            emu.faults.add("500", op, times=-1)  # the apiserver stops serving pods
        emu.drop_watches()
        wait_until(lambda: _get(base + "/healthz")[0] == 503, timeout=10, what="/healthz failing")
        code, body = _get(base + "/healthz")
        assert "[-]informers failed: no answer from the apiserver for" in body
        emu.faults.clear()
        wait_until(lambda: _get(base + "/healthz") == (200, "ok"), timeout=10, what="/healthz recovering")
    finally:
        srv.stop()


def test_rate_limited_log_holds_back_and_then_says_how_many(caplog, monkeypatch):
    from types import SimpleNamespace

    from joulesched.live import ratelog

    now = [100.0]  # the log's clock, moved by hand: a stalled test thread cannot let an interval pass
    monkeypatch.setattr(ratelog, "time", SimpleNamespace(monotonic=lambda: now[0]))
    log = logging.getLogger("joulesched.test.ratelog")
    rl = RateLimitedLog(log, interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger="joulesched.test.ratelog"):
        assert rl.warn("k", "lease %s: failed", "x") is True
        now[0] += 0.19
        assert not any(rl.warn("k", "lease %s: failed", "x") for _ in range(9))
        assert rl.warn("other", "another kind") is True  # kinds are limited separately
        now[0] += 0.06
        assert rl.warn("k", "lease %s: failed", "x") is True
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["lease x: failed", "another kind", "lease x: failed (9 similar suppressed in the last 0 s)"]


def test_latency_reservoir_is_fixed_size_and_uniform():
    r = LatencyReservoir(size=1000, seed=1)
    threads = [threading.Thread(target=lambda k=k: [r.add((k * 25_000 + i) / 100_000) for i in range(25_000)])
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    v = r.values()
    assert r.count == 100_000 and v.size == 1000  # bounded, whatever the run's length
    assert abs(r.percentile(50) - 0.5) < 0.05 and abs(r.percentile(99) - 0.99) < 0.02  # uniform over [0, 1)


def test_serve_keeps_bounded_structures(emu, make_scheduler):
    emu.add_node("a", cpu="64", memory="64Gi")
    s = make_scheduler(bind_log=8, latency_reservoir=16)
    for i in range(40):
        emu.add_pod(f"p{i}", cpu="10m")
    wait_until(lambda: len(emu.bindings) == 40 and s.pending() == 0, what="40 bindings")
    assert s.bound_count == 40 and s.result()["bound"] == 40
    assert len(s.bind_sent) == 8 and s.latency.values().size == 16 and s.latency.count == 40
    assert not hasattr(s, "bound") and not hasattr(s, "latencies")


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_late_unschedulable_condition_does_not_overwrite_a_bound_pods(emu, make_scheduler, writer):
    """The condition is written asynchronously: an apiserver slow to take it let the pod be bound first, and
    the late PodScheduled=False then stood on a running pod (a review). It is now written only if the pod is
    still the version the decision saw."""
    emu.add_node("a", cpu="1", memory="1Gi")
    emu.faults.add("slow", "patch-status:pods", times=1, delay_s=1.0)  # the first status write answers late
    emu.add_pod("p", cpu="2", memory="256Mi")
    s = make_scheduler(event_writer=writer, backoff_initial_s=0.05, backoff_max_s=0.1)
    wait_until(lambda: s.metrics.attempts.labels("unschedulable")._value.get() >= 1, 10, "a first failure")
    emu.add_node("b", cpu="4", memory="4Gi")  # room appears while that write is still on its way
    wait_until(lambda: emu.get("pods", "p", "default")["spec"].get("nodeName"), 10, "the binding")
    time.sleep(1.5)
    (cond,) = [c for c in emu.get("pods", "p", "default")["status"].get("conditions", [])
               if c["type"] == "PodScheduled"]
    assert cond["status"] == "True", cond
