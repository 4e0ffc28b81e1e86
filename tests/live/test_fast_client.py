"""FastClient, the scheduler's pooled keep-alive HTTP client: the same answers as the generated client, over
plain HTTP and verified TLS, with Content-Length and chunked bodies, connection reuse, and a clear error when
the server drops the connection. Local servers on 127.0.0.1 only."""

from __future__ import annotations

import datetime
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s

from joulesched.cluster.kube.client import FastClient, api_client_for


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, dict, bytes]]

    def log_message(self, *a) -> None:
        pass

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        self.seen.append((self.command, self.path, dict(self.headers), body))
        if self.path.endswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b'{"a":', b'"b"}'):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.endswith("/close"):
            data = b'{"closing":true}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
        elif self.path.endswith("/drop"):
            self.close_connection = True  # no answer at all
        elif self.path.endswith("/half"):  # the status line, then nothing
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self.wfile.flush()
            self.close_connection = True
        elif self.path.endswith("/drip"):  # an answer that keeps coming, a part every 0.3 s for 2.4 s
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(8):
                time.sleep(0.3)
                try:
                    self.wfile.write(b"1\r\nx\r\n")
                    self.wfile.flush()
                except OSError:
                    return
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.endswith("/slow"):
            time.sleep(0.4)
            data = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            data = json.dumps({"path": self.path, "len": len(body)}).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    do_GET = do_POST = do_PATCH = _answer


def _serve(ctx: ssl.SSLContext | None = None, idle_s: float | None = None) -> tuple[ThreadingHTTPServer, list]:
    """``idle_s``: keep-alive connections idle this long are closed (kube-apiserver's IdleTimeout)."""
    seen: list = []
    handler = type("H", (_Handler,), {"seen": seen, "timeout": idle_s})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if ctx is not None:
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv, seen


@pytest.fixture
def plain() -> Iterator[tuple[str, list]]:
    srv, seen = _serve()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()
    srv.server_close()


def test_requests_bodies_and_keep_alive(plain):
    url, seen = plain
    fc = FastClient(api_client_for(url))
    r = fc.request("POST", "/api/v1/namespaces/default/pods/p/binding", b'{"x":1}')
    assert (r.status, json.loads(r.data)) == (201, {"path": "/api/v1/namespaces/default/pods/p/binding", "len": 7})
    method, path, headers, body = seen[-1]
    assert (method, body, headers["Content-Type"], headers["Accept"]) == ("POST", b'{"x":1}', "application/json",
                                                                           "application/json")
    assert headers["Host"] == url.removeprefix("http://")
    for _ in range(20):
        assert fc.request("GET", "/api/v1/x").status == 201
    assert fc.opened == 1  # one keep-alive connection for all of them
    r = fc.request("GET", "/api/v1/chunked")
    assert (r.status, r.data) == (200, b'{"a":"b"}')
    r = fc.request("PATCH", "/api/v1/close", b"{}", content_type="application/merge-patch+json")
    assert (r.status, r.data) == (404, b'{"closing":true}')
    assert seen[-1][2]["Content-Type"] == "application/merge-patch+json"
    assert fc.request("GET", "/api/v1/x").status == 201
    assert fc.opened == 2  # the server closed that one: a new connection
    fc.close()


def test_a_dropped_connection_raises(plain):
    url, _ = plain
    fc = FastClient(api_client_for(url))
    with pytest.raises(OSError):  # RemoteDisconnected: the caller must find out whether the write happened
        fc.request("POST", "/api/v1/drop", b"{}")
    assert fc.request("GET", "/api/v1/x").status == 201


def test_a_request_on_a_connection_the_server_closed_while_idle_goes_out_again_once():
    """kube-apiserver closes keep-alive connections idle for 90 s (0.2 s here): the next request on such a
    pooled connection gets no answer at all, so it is sent once more on a new connection, and arrives once."""
    srv, seen = _serve(idle_s=0.2)
    try:
        fc = FastClient(api_client_for(f"http://127.0.0.1:{srv.server_address[1]}"))
        assert fc.request("GET", "/api/v1/x").status == 201
        time.sleep(0.5)
        r = fc.request("POST", "/api/v1/namespaces/default/pods/p/binding", b'{"x":1}', timeout=5.0, whole=True)
        assert r.status == 201 and (fc.opened, fc.retried) == (2, 1)
        assert [p for m, p, _, _ in seen if m == "POST"] == ["/api/v1/namespaces/default/pods/p/binding"]
        fc.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_only_a_reused_connection_with_no_answer_begun_is_retried(plain):
    url, seen = plain
    fc = FastClient(api_client_for(url))
    assert fc.request("GET", "/api/v1/x").status == 201
    with pytest.raises(OSError):  # an answer had begun: whether the write happened is the caller's to find out
        fc.request("POST", "/api/v1/half", b"{}")
    assert fc.retried == 0 and [p for _, p, _, _ in seen].count("/api/v1/half") == 1
    assert fc.request("GET", "/api/v1/x").status == 201
    with pytest.raises(OSError):  # dropped again on the new connection: raised, sent twice at most
        fc.request("POST", "/api/v1/drop", b"{}")
    assert fc.retried == 1 and [p for _, p, _, _ in seen].count("/api/v1/drop") == 2
    fc.close()


def test_a_connection_idle_past_idle_max_s_is_not_reused(plain):
    url, _ = plain
    fc = FastClient(api_client_for(url), idle_max_s=0.1)
    assert fc.request("GET", "/api/v1/x").status == 201
    assert fc.request("GET", "/api/v1/x").status == 201 and fc.opened == 1
    time.sleep(0.2)
    assert fc.request("GET", "/api/v1/x").status == 201
    assert (fc.opened, fc.retried) == (2, 0)  # closed and replaced before use: nothing failed
    fc.close()


def test_each_requests_timeout_holds_on_a_reused_connection(plain):
    """The socket's timeout is set only when it changes (the call costs a GIL hand-off): on one kept-alive
    connection a longer timeout after a shorter one still waits, and a shorter one still times out."""
    url, _ = plain
    fc = FastClient(api_client_for(url))
    assert fc.request("GET", "/api/v1/slow", timeout=5.0).status == 200
    assert fc.request("GET", "/api/v1/x", timeout=0.2).status == 201
    assert fc.request("GET", "/api/v1/slow", timeout=5.0).status == 200  # back up to 5 s on the same connection
    assert fc.opened == 1
    with pytest.raises(OSError):  # TimeoutError: down to 0.1 s
        fc.request("GET", "/api/v1/slow", timeout=0.1)
    fc.close()


def test_a_whole_request_timeout_bounds_an_answer_that_keeps_coming(plain):
    """Per socket operation, an answer that arrives a part every 0.3 s never times out at 1 s; with ``whole``
    the 1 s bounds the request (the scheduler's bindings must be over before its leadership ends)."""
    url, _ = plain
    fc = FastClient(api_client_for(url))
    assert fc.request("GET", "/api/v1/drip", timeout=1.0).data == b"x" * 8
    t0 = time.monotonic()
    with pytest.raises(OSError):  # TimeoutError
        fc.request("GET", "/api/v1/drip", timeout=1.0, whole=True)
    assert time.monotonic() - t0 < 2.0
    assert fc.request("GET", "/api/v1/slow", timeout=5.0).status == 200  # per operation again afterwards
    fc.close()


def test_bearer_token_and_its_refresh_hook(plain):
    url, seen = plain
    cfg = k8s.Configuration()
    cfg.host = url
    cfg.api_key = {"authorization": "t0"}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    calls = []

    def refresh(c: k8s.Configuration) -> None:  # as load_incluster_config installs for rotated tokens
        calls.append(1)
        c.api_key["authorization"] = f"t{len(calls)}"

    cfg.refresh_api_key_hook = refresh
    fc = FastClient(k8s.ApiClient(cfg))
    fc.request("GET", "/a")
    fc.request("GET", "/b")
    assert [s[2]["Authorization"] for s in seen] == ["Bearer t1", "Bearer t2"]


def _cert(tmp: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    crt, pem = tmp / f"{name}.crt", tmp / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    pem.chmod(0o600)
    return crt, pem


def test_tls_is_verified_as_the_kubeconfig_says(tmp_path):
    crt, key = _cert(tmp_path, "apiserver.test")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    srv, seen = _serve(ctx)
    url = f"https://127.0.0.1:{srv.server_address[1]}"
    try:
        cfg = k8s.Configuration()
        cfg.host = url
        cfg.ssl_ca_cert = str(crt)
        cfg.tls_server_name = "apiserver.test"  # the certificate names the apiserver, not 127.0.0.1
        assert FastClient(k8s.ApiClient(cfg)).request("GET", "/api/v1/x").status == 201
        wrong = k8s.Configuration()
        wrong.host = url
        wrong.ssl_ca_cert = str(crt)  # right CA, but the name checked is 127.0.0.1: refused
        with pytest.raises(ssl.SSLCertVerificationError):
            FastClient(k8s.ApiClient(wrong)).request("GET", "/api/v1/x")
        unknown = k8s.Configuration()
        unknown.host = url  # no CA: the system store does not know this one
        with pytest.raises(ssl.SSLCertVerificationError):
            FastClient(k8s.ApiClient(unknown)).request("GET", "/api/v1/x")
    finally:
        srv.shutdown()
        srv.server_close()
    assert len(seen) == 1


def test_a_kubeconfig_that_skips_tls_verification_is_refused(tmp_path):
    """``insecure-skip-tls-verify: true`` is refused where the kubeconfig is loaded (exit 2 with the fix) and by
    the fast client itself; plain HTTP (the emulator) is unaffected."""
    from joulesched.cluster.kube.client import KubeConfigError, load_api_client

    kc = tmp_path / "kubeconfig"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    with pytest.raises(KubeConfigError, match="insecure-skip-tls-verify"):
        load_api_client(str(kc))
    cfg = k8s.Configuration()
    cfg.host = "https://127.0.0.1:6443"
    cfg.verify_ssl = False
    with pytest.raises(KubeConfigError):
        FastClient(k8s.ApiClient(cfg))
    plain = k8s.Configuration()
    plain.host = "http://127.0.0.1:1"
    plain.verify_ssl = False
    FastClient(k8s.ApiClient(plain)).close()
