"""The hardened HTTP base (core/httpd.py) under the extender and the scheduler's status endpoint, over real
sockets: Content-Length checks (negative, non-numeric, oversized), socket timeouts, a bounded thread count,
405 for unknown methods, and Hypothesis fuzzing of every endpoint (random methods, paths, headers, bodies):
every answer is 2xx or 4xx within a deadline, the server stays up and its threads stay bounded."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry, Counter

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.core.httpd import Limits
from joulesched.live.extender import EXTENDER_LIMITS, Extender, ExtenderServer
from joulesched.live.scheduler import StatusServer
from tests.live.conftest import wait_until
from tests.support.httpfuzz import NoAnswer, Req, open_idle, requests, send
from tests.support.kube_emulator import KubeEmulator, make_pod

ROOT = Path(__file__).resolve().parents[2]

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def cluster():
    emu = KubeEmulator().start()
    emu.add_node("n1", cpu="4", memory="8Gi")
    emu.add_node("n2", cpu="8", memory="16Gi")
    cache = KubeCache(api_client_for(emu.url))
    cache.start()
    assert cache.wait_synced(10)
    try:
        yield emu, cache
    finally:
        cache.stop()
        emu.stop()


@pytest.fixture(autouse=True)
def no_thread_leaks():  # the module-scoped servers outlive single tests; see tests/live/conftest.py
    yield


@pytest.fixture(scope="module")
def extender(cluster):
    _, cache = cluster
    srv = ExtenderServer(Extender(cache, make_policy("most-allocated")), "127.0.0.1", 0,
                         limits=Limits(timeout_s=1.0, max_connections=8, max_body=EXTENDER_LIMITS.max_body)).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def status():
    reg = CollectorRegistry()
    Counter("joulesched_test", "a counter", registry=reg).inc()
    # StatusServer is not changed by the hardening: the base wraps its plain handler.
    srv = StatusServer(reg, lambda: True, "127.0.0.1", 0)
    srv.httpd.limits = Limits(timeout_s=1.0, max_connections=8, max_body=64 << 10)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


#: Threads of this process that come and go on their own (the API emulator serving the cache's watches).
SLACK = 3


def in_use(srv) -> int:
    """Connections the server is serving now (each holds one thread): its slots taken."""
    return srv.httpd.limits.max_connections - srv.httpd._slots_sem()._value


def settle(srv, timeout: float = 3.0) -> int:
    """Wait for connections of earlier requests to finish; the number still being served."""
    deadline = time.monotonic() + timeout
    while in_use(srv) and time.monotonic() < deadline:
        time.sleep(0.02)
    return in_use(srv)


def _post(port: int, path: str, body: bytes, length: str | None = None, **extra: str) -> tuple[int, bytes]:
    length = str(len(body)) if length is None else length
    return send(port, Req("POST", path, tuple(extra.items()), body, length).to_bytes())


@pytest.mark.parametrize("length", ["-1", "-4096", "abc", "1e3", "0x10", "+12", "", "1 2"])
def test_negative_or_non_numeric_content_length_is_400(extender, length):
    """Before the hardening a negative Content-Length blocked the extender's handler (rfile.read(-1) reads to
    EOF, which a keep-alive client never sends) and a non-numeric one killed it with a traceback."""
    t0 = time.monotonic()
    code, head = _post(extender.port, "/filter", b'{"Pod": {}}', length=length)
    assert code == 400 and time.monotonic() - t0 < 2, head
    assert b"Content-Length" in head or code == 400


def test_oversized_content_length_is_413_without_reading_the_body(extender):
    cap = extender.httpd.limits.max_body
    t0 = time.monotonic()
    # The header promises cap+1 bytes and none follow: the answer must not wait for them.
    code, _ = send(extender.port, Req("POST", "/filter", (), b"", str(cap + 1)).to_bytes())
    assert code == 413 and time.monotonic() - t0 < 2
    assert _post(extender.port, "/filter", b'{"Pod": {}, "NodeNames": []}')[0] == 200  # still serving


def test_content_length_with_transfer_encoding_or_twice_is_refused(extender):
    assert send(extender.port, b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                               b"Content-Length: 4\r\n\r\n{}\r\n")[0] == 400
    assert send(extender.port, b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                               b"2\r\n{}\r\n0\r\n\r\n")[0] == 411
    assert send(extender.port, b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                               b"Content-Length: 3\r\n\r\n{}")[0] == 400


def test_an_oversized_body_is_refused_before_100_continue(extender):
    cap = extender.httpd.limits.max_body
    code, head = send(extender.port, f"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                     f"Content-Length: {cap + 1}\r\n\r\n".encode())
    assert code == 413, head  # not "100 Continue" first: the client is never invited to send it


def test_an_unread_body_is_never_parsed_as_the_next_request(extender):
    """GET /healthz with a body the handler ignores: the server closes the connection after answering rather
    than read `GET /metrics ...` smuggled in the body as a second request."""
    import socket

    smuggled = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", extender.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 ") == 1 and b"joulesched_extender" not in data


def test_unknown_methods_are_405_not_501(extender, status):
    for port in (extender.port, status.port):
        code, head = send(port, b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert code == 405 and b"Allow:" in head


def test_a_short_body_times_out_and_frees_its_thread(extender):
    """Content-Length 100, 10 bytes sent, then silence: the socket timeout (1 s here) ends the read."""
    import socket

    assert settle(extender) == 0
    base = threading.active_count()
    with socket.create_connection(("127.0.0.1", extender.port), timeout=5) as s:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        wait_until(lambda: in_use(extender) == 1, 5, "the connection served")  # for the timeout (1 s)
        assert threading.active_count() <= base + 1 + SLACK
        t0 = time.monotonic()
        s.settimeout(5)
        try:
            s.recv(100)  # the server gives up on the read and closes (or answers 400 for the truncated JSON)
        except ConnectionResetError:
            pass
        assert time.monotonic() - t0 < 3
    assert settle(extender) == 0 and threading.active_count() <= base + SLACK


def test_idle_connections_cannot_exhaust_threads(extender):
    """Three times max_connections idle sockets: at most max_connections threads, the rest answered 503 and
    closed; after the socket timeout the server serves again."""
    limit = extender.httpd.limits.max_connections
    assert settle(extender) == 0
    base = threading.active_count()
    socks = open_idle(extender.port, 3 * limit)
    try:
        # Taken one by one, each slot held for the socket timeout (1 s).
        wait_until(lambda: in_use(extender) == limit, 5, "every slot taken")
        assert threading.active_count() <= base + limit + SLACK
        busy = 0
        for s in socks:
            s.settimeout(0.2)
            try:
                if s.recv(64).startswith(b"HTTP/1.1 503"):
                    busy += 1
            except (TimeoutError, ConnectionResetError):
                pass
        assert busy >= 2 * limit - 1
    finally:
        for s in socks:
            s.close()
    assert settle(extender, extender.httpd.limits.timeout_s + 2) == 0
    assert send(extender.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200


def _fuzz(srv, req: Req) -> None:
    try:
        code, head = send(srv.port, req.to_bytes(), deadline_s=5)
    except NoAnswer as e:
        raise AssertionError(f"{req}: {e}") from None
    assert 200 <= code < 300 or 400 <= code < 500, (code, req, head)
    if req.bad_length:
        assert code == 400, (code, req)
    assert in_use(srv) <= srv.httpd.limits.max_connections


@FUZZ
@given(req=requests(("/filter", "/prioritize", "/healthz", "/readyz", "/metrics", "/")))
def test_fuzz_extender(extender, req):
    _fuzz(extender, req)


@FUZZ
@given(req=requests(("/metrics", "/healthz", "/livez", "/readyz", "/")))
def test_fuzz_status_endpoint(status, req):
    _fuzz(status, req)


def test_servers_still_answer_after_the_fuzzing(extender, status, cluster):
    emu, _ = cluster
    assert send(status.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200
    import json

    code, _ = _post(extender.port, "/prioritize", json.dumps({"Pod": make_pod("p", cpu="1"),
                                                               "NodeNames": ["n1", "n2"]}).encode())
    assert code == 200


def test_a_declared_32_mib_body_is_413_at_once_and_the_cap_fits_node_names():
    """Served nodeCacheCapable, the extender receives node names: its cap is sized to that (4 MiB holds the
    names of 50,000 nodes), so a declared 32 MiB body is refused from its header alone."""
    names = [f"node-{k:05d}.cluster.example.internal" for k in range(50_000)]
    assert len(json.dumps({"Pod": {"metadata": {"name": "p" * 200}}, "NodeNames": names})) < EXTENDER_LIMITS.max_body
    assert EXTENDER_LIMITS.max_body * EXTENDER_LIMITS.max_connections <= 256 << 20
    cfg = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "scheduler-config.yaml").read_text())
    assert cfg["extenders"][0]["nodeCacheCapable"] is True


def test_the_verb_is_checked_before_the_body_is_read(extender):
    import socket

    with socket.create_connection(("127.0.0.1", extender.port), timeout=5) as s:
        # A 1 MiB body is announced and never sent: an unknown path is answered at once, without waiting for it.
        t0 = time.monotonic()
        s.sendall(b"POST /not-a-verb HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 404") and time.monotonic() - t0 < 0.9, head[:80]


@pytest.mark.parametrize("line", [b"GET / HTTP/1.1 extra", b"GET / HTTP/2.0", b"GET / HTTP/x", b"BROKEN"])
def test_a_refused_request_line_is_answered_with_a_status_line(extender, status, line):
    for srv in (extender, status):
        code, head = send(srv.port, line + b"\r\nHost: x\r\n\r\n", deadline_s=2)
        assert head.startswith(b"HTTP/1.") and 400 <= code < 506, head[:80]


def test_an_http_0_9_request_is_refused_at_once(extender, status):
    for srv in (extender, status):
        t0 = time.monotonic()
        code, head = send(srv.port, b"GET /healthz\r\n", deadline_s=2)  # no blank line: it has no headers
        assert code == 400 and head.startswith(b"HTTP/1.") and time.monotonic() - t0 < 0.9, head[:80]


@pytest.mark.parametrize("name", [b"Content-Length ", b"Transfer-Encoding ", b"X Y", b"X\x01", b"X{}"])
def test_a_header_name_that_is_no_token_is_400(status, name):
    # Read as no Content-Length, "Content-Length : 4" left the body to be parsed as the next request.
    code, _ = send(status.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + name + b": 4\r\n\r\nABCD")
    assert code == 400
    code, _ = send(status.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Ok_1: y\r\n\r\n")
    assert code == 200


def test_a_multipart_or_message_content_type_is_no_malformed_head(status):
    """The email parser records multipart defects for any head with such a Content-Type (no body parsed)."""
    for ctype in (b"multipart/form-data; boundary=abc", b"message/rfc822"):
        code, _ = send(status.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype + b"\r\n\r\n")
        assert code == 200, ctype


def test_a_malformed_head_is_refused_before_100_continue(extender):
    import socket

    with socket.create_connection(("127.0.0.1", extender.port), timeout=5) as s:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\nX{}: 1\r\n\r\n")
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 400") and b"100 Continue" not in head, head[:120]
