"""The secondary scheduler against the emulator: bind, events, conditions, 409s, lost answers, backoff, metrics."""

from __future__ import annotations

import urllib.request
from datetime import datetime, timezone

from joulesched.live.scheduler import ATTEMPT_BUCKETS, StatusServer
from tests.live.conftest import wait_until
from tests.support.kube_emulator import KubeEmulator


def _bound(emu: KubeEmulator) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in emu.list("pods")}


def test_binds_pending_pods_and_records_scheduled_events(emu, make_scheduler):
    for i in range(3):
        emu.add_node(f"n{i}", cpu="2", memory="4Gi")
    for i in range(6):
        emu.add_pod(f"p{i}", cpu="500m", memory="256Mi")
    emu.add_pod("other", cpu="100m", scheduler_name="default-scheduler")
    s = make_scheduler()
    wait_until(lambda: len(emu.bindings) == 6, what="6 bindings")
    pods = _bound(emu)
    assert pods["other"] == ""  # not ours
    assert all(pods[f"p{i}"] for i in range(6))
    # default-k8s spreads: 2 pods on each node
    assert sorted(list(pods.values()).count(f"n{i}") for i in range(3)) == [2, 2, 2]
    wait_until(lambda: sum(e["reason"] == "Scheduled" for e in emu.list("events")) == 6, what="events")
    ev = next(e for e in emu.list("events") if e["involvedObject"]["name"] == "p0")
    assert ev["message"] == f"Successfully assigned default/p0 to {pods['p0']}"
    assert ev["type"] == "Normal" and ev["source"]["component"] == "joulesched"
    wait_until(lambda: s.pending() == 0, what="empty queue")


def test_unschedulable_pod_gets_kube_message_condition_and_backoff(emu, make_scheduler):
    emu.add_node("a", cpu="1", memory="1Gi")
    emu.add_node("b", cpu="4", memory="1Gi")
    emu.add_pod("huge", cpu="2", memory="2Gi")
    s = make_scheduler(backoff_initial_s=0.05, backoff_max_s=0.1, event_update_interval_s=0.0)
    wait_until(lambda: (emu.get("pods", "huge", "default")["status"].get("conditions")), what="condition")
    cond = emu.get("pods", "huge", "default")["status"]["conditions"][0]
    msg = "0/2 nodes are available: 1 Insufficient cpu, 2 Insufficient memory."
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == ("PodScheduled", "False",
                                                                              "Unschedulable", msg)
    # Retries are aggregated as kube-scheduler does: one Event whose count goes up.
    wait_until(lambda: sum(e.get("count", 0) for e in emu.list("events") if e["reason"] == "FailedScheduling") >= 3,
               what="retries")
    evs = [e for e in emu.list("events") if e["reason"] == "FailedScheduling"]
    assert len(evs) == 1
    ev = evs[0]
    assert ev["type"] == "Warning" and ev["message"] == msg
    # Capacity appears: the pod is bound on the next retry.
    emu.add_node("c", cpu="4", memory="4Gi")
    wait_until(lambda: _bound(emu)["huge"] == "c", what="binding to the new node")
    wait_until(lambda: s.pending() == 0, what="empty queue")


def _observed_times(emu: KubeEmulator) -> list[float]:
    """When each FailedScheduling occurrence was recorded: the Event's creation, then each update's
    ``series.lastObservedTime`` (microseconds), from the emulator's watch history."""
    out = []
    for etype, ev in emu.changes("events"):
        if ev.get("reason") != "FailedScheduling":
            continue
        if etype == "ADDED":
            out.append(int(ev["metadata"]["name"].rsplit(".", 1)[1], 16) / 1e9)
        elif ev.get("series"):
            out.append(datetime.strptime(ev["series"]["lastObservedTime"], "%Y-%m-%dT%H:%M:%S.%fZ")
                       .replace(tzinfo=timezone.utc).timestamp())
    return out


def test_backoff_doubles_to_the_cap(emu, make_scheduler):
    emu.add_node("a", cpu="1")
    s = make_scheduler(backoff_initial_s=0.1, backoff_max_s=0.4, event_update_interval_s=0.0)
    # The Event writer process takes a moment to start: occurrences before it are written as one creation
    # with a count, which would hide the first gaps.
    wait_until(s.recorder.ready.is_set, what="the Event writer")
    emu.add_pod("huge", cpu="2")
    wait_until(lambda: len(_observed_times(emu)) >= 5, timeout=5)
    ts = _observed_times(emu)[:5]
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert 0.08 < gaps[0] < 0.3 and 0.18 < gaps[1] < 0.45 and 0.35 < gaps[2] < 0.65 and 0.35 < gaps[3] < 0.65, gaps


def test_409_already_bound_is_never_bound_again(emu, make_scheduler):
    emu.add_node("a")
    emu.add_node("b")
    emu.faults.add("lost-response", "bind", times=2)  # bound in the store, the client sees a 500
    emu.faults.add("409", "bind", times=1)  # a spurious conflict: pod still pending, must be retried
    for i in range(4):
        emu.add_pod(f"p{i}", cpu="100m")
    s = make_scheduler()
    wait_until(lambda: all(_bound(emu).values()), what="all bound")
    wait_until(lambda: s.pending() == 0, what="queue empty")
    names = [b[1] for b in emu.bindings]
    assert sorted(names) == ["p0", "p1", "p2", "p3"]  # each exactly once
    assert s.bound_count == len(emu.list("pods")) == 4  # the lost answers were resolved as ours by re-reading


def test_pod_bound_by_someone_else_or_deleted_is_dropped(emu, make_scheduler):
    emu.add_node("a")
    emu.faults.add("slow", "bind", times=-1, delay_s=0.3)  # both bindings are in flight for 0.3 s
    emu.add_pod("p", cpu="100m")
    emu.add_pod("q", cpu="100m")
    s = make_scheduler(bind_workers=2)
    wait_until(lambda: s.metrics.attempts.labels("scheduled")._value.get() == 0 and s.cache.synced)
    wait_until(lambda: all(e.in_flight for e in s._entries.values()) and len(s._entries) == 2, what="in flight")
    emu.bind("default", "p", {"target": {"name": "elsewhere"}}, None)  # another scheduler wins the race
    emu.delete_pod("default", "q")
    wait_until(lambda: s.pending() == 0, what="queue drained")
    assert [b[1] for b in emu.bindings] == ["p"]
    assert emu.get("pods", "p", "default")["spec"]["nodeName"] == "elsewhere"
    assert s.bound_count == 0 and s.metrics.bind_conflicts._value.get() == 1


def test_node_deleted_between_decision_and_binding(emu, make_scheduler):
    emu.add_node("a")
    emu.add_node("b")
    emu.faults.add("delete-node", "bind", times=1)
    emu.add_pod("p", cpu="100m")
    emu.add_pod("q", cpu="100m")
    make_scheduler()
    wait_until(lambda: len(emu.bindings) == 2, what="2 bindings")
    # Like the real apiserver, the binding to the vanished node is accepted (PodGC's business afterwards);
    # the scheduler's cache drops the node, and later pods go to the node that is left.
    gone = next(iter(emu.deleted_nodes))
    emu.add_pod("r", cpu="100m")
    wait_until(lambda: len(emu.bindings) == 3, what="3rd binding")
    assert emu.bindings[-1][3] != gone


def test_server_errors_and_slow_answers_only_delay(emu, make_scheduler):
    for i in range(3):
        emu.add_node(f"n{i}")
    emu.faults.add("500", "bind", times=5)
    emu.faults.add("500", "get:pods", times=2)
    emu.faults.add("slow", "bind", times=3, delay_s=0.1)
    emu.faults.add("500", "create:events", times=2)
    for i in range(10):
        emu.add_pod(f"p{i}", cpu="100m")
    s = make_scheduler()
    wait_until(lambda: len(emu.bindings) == 10 and s.pending() == 0, what="all bound")
    assert len({b[1] for b in emu.bindings}) == 10


def test_metrics_and_healthz(emu, make_scheduler):
    emu.add_node("a", cpu="1")
    emu.add_pod("ok", cpu="100m")
    emu.add_pod("no", cpu="4")
    s = make_scheduler()
    srv = StatusServer(s.registry, s.healthy, "127.0.0.1", 0).start()
    try:
        wait_until(lambda: s.metrics.attempts.labels("scheduled")._value.get() == 1)  # the answer is in, not
        wait_until(lambda: s.metrics.attempts.labels("unschedulable")._value.get() >= 1)  # only the request
        base = f"http://127.0.0.1:{srv.port}"
        assert urllib.request.urlopen(base + "/healthz").read() == b"ok"
        text = urllib.request.urlopen(base + "/metrics").read().decode()
        assert 'joulesched_schedule_attempts_total{result="scheduled"} 1.0' in text
        assert 'joulesched_schedule_attempts_total{result="unschedulable"}' in text
        assert 'joulesched_scheduling_attempt_duration_seconds_bucket{le="0.001",result="scheduled"}' in text
        assert 'le="16.384"' in text and len(ATTEMPT_BUCKETS) == 15
        assert 'joulesched_metrics_fallback{feed="cpu"} 1.0' in text
    finally:
        srv.stop()


def test_watch_faults_do_not_lose_pods(emu, make_scheduler):
    emu.add_node("a", cpu="64", memory="64Gi")
    s = make_scheduler()
    wait_until(lambda: s.cache.synced)
    emu.faults.add("cut", "watch:pods", times=2)  # the next two watches break half-way through an event
    emu.faults.add("gone", "watch:pods", times=1)  # the third answers 410 Gone: re-list
    assert emu.drop_watches() >= 1
    for i in range(5):
        emu.add_pod(f"p{i}", cpu="100m")
    wait_until(lambda: s.cache.pod_informer.relists >= 2, what="a re-list")
    emu.compact()  # history gone: a watch resuming from an old version gets 410 and re-lists
    emu.drop_watches()
    for i in range(5, 10):
        emu.add_pod(f"p{i}", cpu="100m")
    wait_until(lambda: len(emu.bindings) == 10 and s.pending() == 0, what="all bound")
    assert s.cache.pod_informer.relists >= 2 and s.cache.pod_informer.resumes >= 2
    assert [k for k, _ in emu.faults.log] == ["cut", "cut", "gone"]


def test_bindings_are_logged_at_info_rate_limited(emu, make_scheduler, caplog):
    """Issue 33: serve says what it binds, one INFO line at once and then at most one per 10 s with the count
    held back, so a thousand pods a second do not become a thousand lines."""
    import logging

    caplog.set_level(logging.INFO, logger="joulesched.serve")
    for i in range(2):
        emu.add_node(f"n{i}", cpu="8", memory="16Gi")
    for i in range(20):
        emu.add_pod(f"p{i}", cpu="100m", memory="64Mi")
    make_scheduler()
    wait_until(lambda: len(emu.bindings) == 20, what="20 bindings")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("bound ")]
    assert lines and all(r.levelno == logging.INFO for r in caplog.records if r.getMessage().startswith("bound "))
    assert len(lines) == 1, lines  # the other 19 fell within 10 s of the first
    name, node = lines[0].split()[1], lines[0].split()[3]
    assert name.startswith("default/p") and _bound(emu)[name.split("/")[1]] == node


def test_the_held_back_bindings_are_counted_in_the_next_line(caplog, monkeypatch):
    import logging
    from types import SimpleNamespace

    from joulesched.live import ratelog
    from joulesched.live.ratelog import RateLimitedLog

    now = [100.0]  # the log's clock, moved by hand: a stalled test thread cannot let an interval pass
    monkeypatch.setattr(ratelog, "time", SimpleNamespace(monotonic=lambda: now[0]))
    caplog.set_level(logging.INFO, logger="test.bound")
    rl = RateLimitedLog(logging.getLogger("test.bound"), interval_s=0.2, level=logging.INFO)
    written = [rl.warn("bound", "bound %s to %s", f"p{i}", "n0") for i in range(5)]
    now[0] += 0.25
    assert rl.warn("bound", "bound %s to %s", "p5", "n0") and written == [True, False, False, False, False]
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert msgs == [(logging.INFO, "bound p0 to n0"),
                    (logging.INFO, "bound p5 to n0 (4 similar suppressed in the last 0 s)")]
