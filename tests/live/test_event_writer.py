"""The Event recorder in a process of its own (live/events.py, issue 28): what the cluster sees is what the
in-process recorder writes; a replica that does not lead writes nothing; failures come back to the scheduler's
metrics; a helper that falls behind costs drops, never a blocked scheduler; a helper that dies is replaced by
threads of the scheduler's own process."""

from __future__ import annotations

import math
import os
import signal
import threading

import pytest
from prometheus_client import CollectorRegistry

from joulesched.cluster.kube.client import FastClient, api_client_for, api_client_from_source, client_source
from joulesched.live.events import EventRecorder, EventWriterProcess
from joulesched.live.scheduler import SchedulerMetrics
from tests.live.conftest import wait_until

MSG = "0/1 nodes are available: 1 Insufficient cpu."


def _writer(emu, lead: list[float], dropped: list[str] | None = None, **kw) -> tuple[EventWriterProcess,
                                                                                    SchedulerMetrics]:
    metrics = SchedulerMetrics(CollectorRegistry())
    api = api_client_for(emu.url)

    def local() -> EventRecorder:
        return EventRecorder(FastClient(api), "joulesched", "test", metrics, may_write=lambda: lead[0] > 0)

    w = EventWriterProcess(client_source(api), "joulesched", "test", metrics, lambda: lead[0],
                           (dropped if dropped is not None else []).append, local, update_interval_s=0.0,
                           lead_interval_s=0.05, **kw)
    wait_until(w.ready.is_set, what="the writer process")
    return w, metrics


def _conditions(emu, pod: str) -> list[dict]:
    return [c for c in emu.get("pods", pod, "default")["status"].get("conditions", [])
            if c["type"] == "PodScheduled"]


def test_the_scheduler_writes_its_events_from_another_process(emu, make_scheduler):
    emu.add_node("a", cpu="4")
    for i in range(5):
        emu.add_pod(f"p{i}", cpu="100m")
    emu.add_pod("huge", cpu="8")
    s = make_scheduler(event_update_interval_s=0.0)
    assert isinstance(s.recorder, EventWriterProcess) and s.recorder.proc.pid != os.getpid()
    wait_until(lambda: len([e for e in emu.list("events") if e["reason"] == "Scheduled"]) == 5, what="5 Events")
    wait_until(lambda: _conditions(emu, "huge"), what="the condition")
    scheduled = {e["involvedObject"]["name"]: e for e in emu.list("events") if e["reason"] == "Scheduled"}
    assert scheduled["p3"]["message"] == "Successfully assigned default/p3 to a"
    assert scheduled["p3"]["involvedObject"]["uid"] == emu.get("pods", "p3", "default")["metadata"]["uid"]
    assert _conditions(emu, "huge")[0]["reason"] == "Unschedulable"
    proc = s.recorder.proc
    s.stop()
    assert proc.returncode == 0  # drained and exited, not killed


def test_thread_mode_and_unknown_clients_write_in_process(emu, make_scheduler):
    assert isinstance(make_scheduler(event_writer="thread").recorder, EventRecorder)
    with pytest.raises(ValueError, match="event_writer"):
        make_scheduler(event_writer="fork", start=False)


def test_a_replica_that_does_not_lead_writes_nothing(emu):
    emu.add_pod("p")
    lead, dropped = [-math.inf], []
    w, _ = _writer(emu, lead, dropped)
    try:
        w.failed("default", "p", "uid-p", MSG, condition=True)
        wait_until(lambda: dropped == ["uid-p"], what="the condition handed back")  # to be written again later
        assert not _conditions(emu, "p") and not emu.list("events")
        lead[0] = math.inf  # it leads now
        w.leadership_changed()
        w.failed("default", "p", "uid-p", MSG, condition=True)
        wait_until(lambda: _conditions(emu, "p"), what="the condition")
        lead[0] = -math.inf  # deposed: the next heartbeat (or this call) fences the helper at once
        w.leadership_changed()
        w.scheduled("default", "p", "uid-p", "n")
        w.stop(timeout=5)  # drains what it holds: still nothing Scheduled, since it does not lead
        assert not [e for e in emu.list("events") if e["reason"] == "Scheduled"]
    finally:
        w.stop(timeout=5)


def test_the_helpers_failures_are_counted_by_the_scheduler(emu):
    emu.faults.add("500", "create:events", times=-1)
    w, metrics = _writer(emu, [math.inf])
    try:
        w.scheduled("default", "p", "uid-p", "n")
        errors = metrics.api_errors.labels("event", "500")
        wait_until(lambda: errors._value.get() == 3 and metrics.events_dropped._value.get() == 1,
                   what="three failed tries, then a drop")
    finally:
        emu.faults.clear()
        w.stop(timeout=5)


def test_a_helper_that_falls_behind_costs_drops_not_a_blocked_scheduler(emu):
    w, metrics = _writer(emu, [math.inf])
    os.kill(w.proc.pid, signal.SIGSTOP)  # it reads nothing: the pipe fills
    try:
        done = threading.Event()

        def flood() -> None:
            for i in range(3000):  # ~0.3 MB of frames, several pipes' worth
                w.scheduled("default", f"p{i}", f"uid-{i}", "n")
            done.set()

        threading.Thread(target=flood, daemon=True).start()
        assert done.wait(10), "a full pipe blocked the sender"
        assert metrics.events_dropped._value.get() > 0
    finally:
        os.kill(w.proc.pid, signal.SIGCONT)
        w.stop(timeout=10)
    n = len([e for e in emu.list("events") if e["reason"] == "Scheduled"])
    assert 0 < n == 3000 - metrics.events_dropped._value.get()  # what was not dropped was written


def test_a_helper_that_dies_is_replaced_in_process(emu, caplog):
    w, _ = _writer(emu, [math.inf])
    try:
        w.proc.kill()
        w.proc.wait()
        wait_until(lambda: w._local is not None, what="the fall-back")  # noticed by its reader (end of output)
        assert "event writer process stopped" in caplog.text
        w.scheduled("default", "p", "uid-p", "n")
        wait_until(lambda: [e for e in emu.list("events") if e["reason"] == "Scheduled"], what="the Event")
    finally:
        w.stop(timeout=5)


def test_a_client_is_described_by_how_it_was_built(emu, tmp_path):
    api = api_client_for(emu.url)
    assert client_source(api) == {"url": emu.url}
    assert api_client_from_source(client_source(api)).configuration.host == emu.url
    from kubernetes import client as k8s
    assert client_source(k8s.ApiClient(k8s.Configuration())) is None  # built elsewhere: no helper process


def test_a_helper_that_cannot_start_leaves_the_events_to_threads(emu, caplog):
    metrics = SchedulerMetrics(CollectorRegistry())
    api = api_client_for(emu.url)

    def local() -> EventRecorder:
        return EventRecorder(FastClient(api), "joulesched", "test", metrics)

    # The helper cannot build its client (the kubeconfig is gone): it exits, and the scheduler writes in-process.
    w = EventWriterProcess({"kubeconfig": "/does/not/exist"}, "joulesched", "test", metrics, lambda: math.inf,
                           lambda uid: None, local)
    try:
        wait_until(lambda: w._local is not None, what="the fall-back")
        assert w.ready.is_set() and w.proc.wait(5) != 0
        w.scheduled("default", "p", "uid-p", "n")
        wait_until(lambda: [e for e in emu.list("events") if e["reason"] == "Scheduled"], what="the Event")
    finally:
        w.stop(timeout=5)


def test_a_signal_to_the_process_group_leaves_the_helper_to_drain(emu):
    """Ctrl-C in a terminal (or systemd's SIGTERM to the unit) reaches the helper too: it keeps writing until
    the scheduler stops it."""
    w, _ = _writer(emu, [math.inf])
    try:
        os.kill(w.proc.pid, signal.SIGINT)
        os.kill(w.proc.pid, signal.SIGTERM)
        w.scheduled("default", "p", "uid-p", "n")
        wait_until(lambda: [e for e in emu.list("events") if e["reason"] == "Scheduled"], what="the Event")
        assert w.proc.poll() is None and w._local is None  # still the helper writing
    finally:
        w.stop(timeout=5)
    assert w.proc.returncode == 0


def test_the_pods_with_series_are_bounded(emu, monkeypatch):
    """Pods deleted while pending are never forgotten one by one: the scheduler's list of them stays bounded."""
    from joulesched.live import events

    monkeypatch.setattr(events, "MAX_SERIES", 8)
    w, _ = _writer(emu, [-math.inf])  # not leading: nothing is written, only the bookkeeping is exercised
    try:
        for i in range(50):
            w.failed("default", f"p{i}", f"uid-{i}", MSG, condition=False)
        assert len(w._with_series) == 8 and "uid-49" in w._with_series
    finally:
        w.stop(timeout=5)


def test_a_nomination_names_its_pod_by_uid_and_skips_one_made_again_under_its_name(emu):
    """web-0 waits for a sleeping node and its nomination is queued; web-0 is deleted and made again (another uid):
    the patch by name landed on the new pod, which then woke a node it never chose."""
    from joulesched.live.scheduler import SchedulerMetrics

    new = emu.add_pod("web-0", cpu="100m")
    metrics = SchedulerMetrics(reg := CollectorRegistry())
    rec = EventRecorder(FastClient(api_client_for(emu.url)), "joulesched", "test", metrics, workers=1)
    try:
        rec.nominated("default", "web-0", "uid-of-the-deleted-one", "sleepy")
        rec.nominated("default", "web-0", new["metadata"]["uid"], "awake")  # after it: the queue is in order
        wait_until(lambda: emu.get("pods", "web-0", "default")["status"].get("nominatedNodeName") == "awake", 10,
                   "the live pod nominated")
        assert reg.get_sample_value("joulesched_events_dropped_total") in (None, 0.0)
    finally:
        rec.stop(2.0)
    assert not [p for _, p in emu.changes("pods") if p and (p.get("status") or {}).get("nominatedNodeName") == "sleepy"]


def test_nothing_is_written_to_the_pipe_once_the_writer_has_stopped(emu, monkeypatch):
    """A leader stepping down after the recorder stopped wrote its frame to the closed pipe's descriptor number,
    which may name another file or socket by then."""
    w, _metrics = _writer(emu, [math.inf])
    w.stop(2.0)
    writes: list[int] = []
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(fd) or len(data))
    w.leadership_changed()
    w.scheduled("default", "p", "uid-p", "n")
    assert writes == []
