"""The per-request time limit of core/httpd.py, over real sockets: a client that drips its request line, its
headers or its body one byte every half second is cut off about ``timeout_s`` after its first byte (it used to
hold its connection slot for as long as it kept dripping, the socket timeout bounding only each read), on the
standard library's server and on werkzeug's (the workload apps); a normal client is served afterwards, a
keep-alive connection gets a fresh limit per request, and an endpoint that lifts its deadline reads a slow
stream to the end."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from flask import Flask, request

from joulesched.core.httpd import BackgroundHTTPServer, Limits, lift_deadline, reply
from joulesched.workloads.server import make_server

LIMITS = Limits(timeout_s=1.0, max_connections=2, max_body=64 << 10)
APP_LIMITS = Limits(timeout_s=1.0, max_connections=2, max_body=None, allow_chunked=True)  # the apps', but 1 s
DRIP_S = 10.0  # how long a dripping client would keep going if nobody stopped it
CUT_BY_S = 5.0  # it must be cut off well before that (the limit is 1 s; the margin is for busy CI cores)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        reply(self, 200, b"ok\n", "text/plain")

    def do_POST(self):
        reply(self, 200, b"got %d\n" % len(self.read_body()), "text/plain")

    def log_message(self, *args):
        pass


@pytest.fixture
def stdlib_server():
    srv = BackgroundHTTPServer(_Handler, "127.0.0.1", 0, "test-httpd", LIMITS).start()
    try:
        yield srv.port
    finally:
        srv.stop()


@pytest.fixture
def wsgi_server():
    app = Flask("deadline-test")

    @app.get("/")
    def index():
        return "ok\n"

    @app.post("/sink")
    def sink():
        lift_deadline(request.environ)
        return f"got {len(request.get_data())}\n"

    @app.post("/echo")
    def echo():
        return f"got {len(request.get_data())}\n"

    srv = make_server("127.0.0.1", 0, app, APP_LIMITS)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        yield srv.port
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def _drip(port: int, head: bytes, drip: bytes = b"a", every_s: float = 0.5) -> tuple[float, bytes]:
    """Send ``head``, then ``drip`` every ``every_s`` for up to DRIP_S: the seconds until the server closed the
    connection (DRIP_S if it never did) and what it answered."""
    got = b""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head)
        while time.monotonic() - t0 < DRIP_S:
            s.settimeout(every_s)
            try:
                data = s.recv(4096)
            except TimeoutError:
                try:
                    s.sendall(drip)
                except OSError:  # reset: closed
                    break
                continue
            except OSError:
                break
            if not data:
                break
            got += data
    return time.monotonic() - t0, got


def _response(s: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a keep-alive connection."""
    out = b""
    while b"\r\n\r\n" not in out:
        out += s.recv(4096)
    head, body = out.split(b"\r\n\r\n", 1)
    length = int(next(v for k, v in (h.split(b":", 1) for h in head.split(b"\r\n")[1:])
                      if k.lower() == b"content-length"))
    while len(body) < length:
        body += s.recv(4096)
    return head + b"\r\n\r\n" + body


def _get(port: int, path: str = "/") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while data := s.recv(4096):
            out += data
    return out


HEADS = {
    "request line": b"GET /",
    "headers": b"GET / HTTP/1.1\r\nHost: x\r\nX-Drip: ",
}


@pytest.mark.parametrize("where", sorted(HEADS))
def test_a_dripped_head_is_cut_off_with_408_and_both_slots_come_back(stdlib_server, where):
    """Two drippers hold both slots, as in the audit; both are cut off about a second in, with a 408, and a
    normal client is served."""
    results: list[tuple[float, bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(_drip(stdlib_server, HEADS[where])))
               for _ in range(LIMITS.max_connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DRIP_S + 5)
    assert len(results) == LIMITS.max_connections
    for elapsed, answer in results:
        assert elapsed < CUT_BY_S, f"a client dripping its {where} held its slot for {elapsed:.1f} s"
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert _get(stdlib_server).startswith(b"HTTP/1.1 200")


def test_a_dripped_body_is_cut_off_with_408(stdlib_server):
    elapsed, answer = _drip(stdlib_server, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n")
    assert elapsed < CUT_BY_S and answer.startswith(b"HTTP/1.1 408"), (elapsed, answer[:80])
    assert _get(stdlib_server).startswith(b"HTTP/1.1 200")


def test_keep_alive_requests_each_get_their_own_limit_and_a_dripped_one_is_cut_off(stdlib_server):
    """Requests 0.3 s apart on one connection, past one timeout_s in all, are all served; then one dripped
    request on the same connection is cut off."""
    with socket.create_connection(("127.0.0.1", stdlib_server), timeout=5) as s:
        for _ in range(5):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _response(s).startswith(b"HTTP/1.1 200")
            time.sleep(0.3)
        t0 = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\nX-Drip: ")
        answer = None
        while answer is None and time.monotonic() - t0 < DRIP_S:
            s.settimeout(0.5)
            try:
                answer = s.recv(4096)
            except TimeoutError:
                s.sendall(b"a")
        assert time.monotonic() - t0 < CUT_BY_S and answer is not None and answer.startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("head", [b"GET /", b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n",
                                  b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"],
                         ids=["request line", "body", "chunked body"])
def test_the_workload_apps_server_cuts_off_a_dripping_client(wsgi_server, head):
    drip = b"1\r\na\r\n" if b"chunked" in head else b"a"
    elapsed, answer = _drip(wsgi_server, head, drip)
    assert elapsed > 0.5 and not answer.startswith(b"HTTP/1.1 411"), answer[:80]  # cut off, not refused at once
    assert elapsed < CUT_BY_S, f"held for {elapsed:.1f} s"
    assert _get(wsgi_server).startswith(b"HTTP/1.1 200")


def test_an_endpoint_that_lifts_its_deadline_reads_a_slow_stream_to_the_end(wsgi_server):
    """/sink lifts the limit: a body sent over three seconds (three timeouts) arrives whole; each read is still
    bounded by timeout_s."""
    with socket.create_connection(("127.0.0.1", wsgi_server), timeout=5) as s:
        s.sendall(b"POST /sink HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10\r\n\r\n")
        for _ in range(10):
            time.sleep(0.3)
            s.sendall(b"a")
        out = b""
        while data := s.recv(4096):
            out += data
    assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"got 10\n"), out
