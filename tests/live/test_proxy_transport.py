"""FastClient behind an HTTP proxy (``http_proxy``, which the kubernetes client picks up) goes through urllib3,
whose errors are no ``OSError``: the client turns them into :class:`TransportError` (``OSError``;
:class:`TransportTimeout` is a ``TimeoutError``) as its docstring promises, so the Event recorder and the
scheduler's bindings and re-reads handle a proxy that is down, drops a request or stalls like any lost connection.
Also: an Event recorder worker survives a write raising something nobody expected. Local sockets only."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
import urllib3
from prometheus_client import CollectorRegistry

from joulesched.cluster.kube.client import FastClient, Response, TransportError, TransportTimeout, api_client_for
from joulesched.live.events import EventRecorder
from joulesched.live.scheduler import SchedulerMetrics
from tests.live.conftest import wait_until


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy for plain HTTP: each request (an absolute URI) is dropped, stalled or passed on, as
    ``server.plan(method, path)`` says."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def _any(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        u = urlsplit(self.path)
        self.server.seen.append((self.command, u.path))
        act = self.server.plan(self.command, u.path)
        if act in ("drop", "stall"):
            if act == "stall":
                time.sleep(1.0)
            self.close_connection = True  # no answer at all
            return
        up = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")}
        up.request(self.command, u.path + (f"?{u.query}" if u.query else ""), body=body, headers=headers)
        r = up.getresponse()
        data = r.read()
        up.close()
        self.send_response(r.status)
        self.send_header("Content-Type", r.getheader("Content-Type") or "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")  # no idle keep-alive thread left behind
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any


@pytest.fixture
def proxy(monkeypatch):
    """Start a proxy; ``use(url)`` points ``http_proxy`` at a URL (the kubernetes client reads it when a
    Configuration's host is set)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    srv.daemon_threads = True
    srv.seen, srv.plan = [], lambda method, path: "forward"
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    for var in ("no_proxy", "NO_PROXY", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)

    def use(url: str) -> None:
        monkeypatch.setenv("http_proxy", url)

    use(f"http://127.0.0.1:{srv.server_address[1]}")
    yield srv, use
    srv.shutdown()
    srv.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_proxy_failures_are_os_errors(emu, proxy):
    srv, use = proxy
    fc = FastClient(api_client_for(emu.url))
    assert fc._pool_manager is not None  # the proxy path
    assert fc.request("GET", "/api/v1/namespaces/default/pods").status == 200
    assert srv.seen == [("GET", "/api/v1/namespaces/default/pods")]
    srv.plan = lambda method, path: "drop"
    with pytest.raises(TransportError) as e:  # urllib3's ProtocolError
        fc.request("POST", "/api/v1/namespaces/default/events", b"{}")
    assert isinstance(e.value, OSError) and not isinstance(e.value, TimeoutError)
    assert isinstance(e.value.__cause__, urllib3.exceptions.HTTPError)
    srv.plan = lambda method, path: "stall"
    with pytest.raises(TransportTimeout) as e:  # ReadTimeoutError: a timeout, as the scheduler counts it
        fc.request("GET", "/api/v1/namespaces/default/pods", timeout=0.3)
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, socket.timeout)
    use(f"http://127.0.0.1:{_closed_port()}")  # the proxy is down: a refused connection, no timeout
    fc = FastClient(api_client_for(emu.url))
    with pytest.raises(TransportError, match="ProxyError") as e:
        fc.request("GET", "/api/v1/namespaces/default/pods", timeout=2.0)
    assert not isinstance(e.value, TimeoutError)
    assert isinstance(e.value.__cause__, urllib3.exceptions.ProxyError)


def test_the_event_recorder_counts_writes_through_a_proxy_that_is_down(emu, proxy):
    _, use = proxy
    use(f"http://127.0.0.1:{_closed_port()}")
    metrics = SchedulerMetrics(reg := CollectorRegistry())
    rec = EventRecorder(FastClient(api_client_for(emu.url)), "joulesched", "test", metrics, workers=1)
    try:
        rec.scheduled("default", "p1", "uid-1", "n1")
        rec.failed("default", "p2", "uid-2", "no node", True)  # an Event and a condition
        wait_until(lambda: reg.get_sample_value("joulesched_events_dropped_total") == 3, 10, "3 writes dropped")
        assert reg.get_sample_value("joulesched_api_errors_total", {"op": "event", "code": "connection"}) == 6
        assert reg.get_sample_value("joulesched_api_errors_total", {"op": "condition", "code": "connection"}) == 3
        assert [t.name for t in threading.enumerate() if t.name == "event-recorder-0"]  # the worker lives on
    finally:
        rec.stop(2.0)


def test_an_unexpected_error_in_a_write_drops_it_and_the_worker_goes_on(caplog):
    calls: list[str] = []

    class Http:  # raises what no client should, twice; then works
        def request(self, method, path, body=None, **kw):
            calls.append(path)
            if len(calls) <= 2:
                raise RuntimeError("surprise")
            return Response(201, b"{}")

    metrics = SchedulerMetrics(reg := CollectorRegistry())
    rec = EventRecorder(Http(), "joulesched", "test", metrics, workers=1)
    try:
        with caplog.at_level(logging.WARNING, logger="joulesched.serve"):
            rec.scheduled("default", "p1", "uid-1", "n1")
            rec.scheduled("default", "p2", "uid-2", "n1")
            wait_until(lambda: reg.get_sample_value("joulesched_events_dropped_total") == 2, 5, "2 writes dropped")
            rec.scheduled("default", "p3", "uid-3", "n1")
            wait_until(lambda: len(calls) == 3, 5, "the third Event written")
    finally:
        rec.stop(2.0)
    assert reg.get_sample_value("joulesched_events_dropped_total") == 2
    tracebacks = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert len(tracebacks) == 1 and "unexpected error" in tracebacks[0].getMessage()


def _drop_first(suffix: str, dropped: list[str]):
    """A proxy plan dropping the first request whose path ends with ``suffix`` (recorded in ``dropped``)."""
    def plan(method: str, path: str) -> str:
        if path.endswith(suffix) and not dropped:
            dropped.append(path)
            return "drop"
        return "forward"
    return plan


def _bindings_through(emu, proxy, plan, make_scheduler):
    """A started scheduler whose bindings and re-reads go through the proxy (deciding ``plan(method, path)``);
    its cache and Events go direct (a watch through this proxy would never end)."""
    srv, use = proxy
    srv.plan = plan
    use("")
    s = make_scheduler(start=False, event_writer="thread")
    use(f"http://127.0.0.1:{srv.server_address[1]}")
    s.http = FastClient(api_client_for(emu.url))
    return s.start()


def test_a_binding_the_proxy_drops_is_counted_and_the_pod_re_read(emu, proxy, make_scheduler):
    srv, use = proxy
    emu.add_node("n", cpu="4", memory="8Gi")
    dropped: list[str] = []
    s = _bindings_through(emu, proxy, _drop_first("/binding", dropped), make_scheduler)
    assert s.http._pool_manager is not None
    emu.add_pod("p", cpu="100m")
    wait_until(lambda: emu.get("pods", "p", "default")["spec"].get("nodeName") == "n", 10, "p bound")
    assert dropped and s.registry.get_sample_value("joulesched_bind_errors_total", {"code": "connection"}) == 1
    assert ("GET", "/api/v1/namespaces/default/pods/p") in srv.seen  # the re-read after the lost answer


def test_a_binding_without_an_answer_keeps_its_room_until_a_later_re_read(emu, proxy, make_scheduler):
    """The binding's answer is lost and the re-read right after shows the pod pending: the apiserver may still
    write the binding (a slow etcd), so the room stays the pod's until the re-read after its backoff. Released at
    once, another pod took it and the kubelet refused one of the two."""
    emu.add_node("n", cpu="1", memory="8Gi")
    dropped: list[str] = []
    _bindings_through(emu, proxy, _drop_first("/pods/p/binding", dropped), make_scheduler)
    emu.add_pod("p", cpu="800m")
    wait_until(lambda: dropped, 10, "p's binding dropped")
    emu.add_pod("q", cpu="800m")
    time.sleep(0.5)  # within p's backoff: its outcome is unknown, its room is still counted
    assert not emu.get("pods", "q", "default")["spec"].get("nodeName")
    wait_until(lambda: any(emu.get("pods", k, "default")["spec"].get("nodeName") for k in "pq"), 15, "one bound")
    time.sleep(0.5)
    assert sum(bool(emu.get("pods", k, "default")["spec"].get("nodeName")) for k in "pq") == 1  # room for one



def test_a_pending_re_read_sends_the_same_binding_again_and_keeps_the_room(emu, make_scheduler, monkeypatch):
    """After a binding whose answer was lost, pending proves nothing: the apiserver may still apply it. Deciding
    the pod again freed its room (another pod could take it, then the late binding landed beside it); the same
    binding is sent again instead, the pod still assumed on its node."""
    from joulesched.live.scheduler import _Entry

    s = make_scheduler()  # (no pod: its loop has nothing to decide)
    e = _Entry("uid-p", "default", "p", uncertain_node="n")
    sent: list[str] = []
    forgotten: list[str] = []
    monkeypatch.setattr(s, "_reread", lambda entry, node: "retry")
    monkeypatch.setattr(s, "_bind_once", lambda entry, node: sent.append(node) or "bound")
    monkeypatch.setattr(s, "_finish", lambda entry, node, outcome, dt: forgotten.append(f"finish {outcome}"))
    monkeypatch.setattr(s.cache, "forget", lambda uid: forgotten.append(uid))
    assert s._resolve_uncertain(e) is False  # settled here: not decided again
    assert sent == ["n"] and forgotten == ["finish bound"]
