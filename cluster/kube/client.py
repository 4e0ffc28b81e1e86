"""Building a ``kubernetes.client.ApiClient``: from a kubeconfig file, in-cluster, or the default kubeconfig; and
:class:`FastClient`, the pooled keep-alive HTTP client of the scheduler's hot path (bindings, Events, re-reads).

TLS verification is whatever the kubeconfig says; joulesched never turns it off.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import should_bypass_proxies

from joulesched.core.errors import UsageError


class KubeConfigError(UsageError):
    """No usable cluster configuration."""


class TransportError(OSError):
    """A request that failed on the way to or from the apiserver where the failure is not already an ``OSError``
    (urllib3's, behind an HTTP proxy): callers catch ``OSError`` and need not know which path the request took."""


class TransportTimeout(TransportError, TimeoutError):
    """A :class:`TransportError` that is a timeout (a caller that tells timeouts apart sees a ``TimeoutError``)."""


def check_tls(cfg: k8s.Configuration) -> None:
    """Refuse a configuration that switches certificate verification off for an HTTPS apiserver (a kubeconfig's
    ``insecure-skip-tls-verify: true``): joulesched binds pods with these credentials and never talks TLS
    unverified. Plain HTTP (the loopback API emulator) has nothing to verify."""
    if cfg.host.startswith("https://") and not cfg.verify_ssl:
        raise KubeConfigError(f"the kubeconfig turns TLS verification off for {cfg.host} (insecure-skip-tls-verify); "
                              "joulesched refuses unverified TLS: give the cluster's CA (certificate-authority or "
                              "certificate-authority-data) instead")


def _tune(cfg: k8s.Configuration) -> None:
    # Watches hold connections; binds, events and the lease share the rest. The default pool (5 per CPU) is
    # too small on a 2-CPU pod and urllib3 would then discard keep-alive connections.
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 32)


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """``kubeconfig`` given: that file. Otherwise in-cluster (service account), else ``$KUBECONFIG`` or
    ``~/.kube/config``. Raises :class:`KubeConfigError` with one line saying what is missing."""
    cfg = k8s.Configuration()
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
        try:
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        except Exception as e:  # the loader raises ConfigException, ValueError, yaml errors...
            raise KubeConfigError(f"kubeconfig {kubeconfig}: {e}") from None
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except k8s_config.ConfigException:
            try:
                k8s_config.load_kube_config(context=context, client_configuration=cfg)
            except Exception as e:
                raise KubeConfigError(f"not running in a cluster and no usable kubeconfig ({e}); "
                                      "pass --kubeconfig") from None
    check_tls(cfg)
    _tune(cfg)
    return _sourced(k8s.ApiClient(cfg), {"kubeconfig": kubeconfig, "context": context})


def api_client_for(url: str) -> k8s.ApiClient:
    """A client for a plain-HTTP loopback server such as the emulator (tests, benches)."""
    cfg = k8s.Configuration()
    cfg.host = url
    check_tls(cfg)
    _tune(cfg)
    return _sourced(k8s.ApiClient(cfg), {"url": url})


_SOURCE_ATTR = "_joulesched_source"


def _sourced(api: k8s.ApiClient, source: dict) -> k8s.ApiClient:
    setattr(api, _SOURCE_ATTR, source)
    return api


def client_source(api: k8s.ApiClient) -> dict | None:
    """How ``api`` was built (by :func:`load_api_client` or :func:`api_client_for`), so that another process
    can build its own the same way (live/events.py) without a credential crossing over; None for a client
    built elsewhere."""
    src = getattr(api, _SOURCE_ATTR, None)
    return dict(src) if isinstance(src, dict) else None


def api_client_from_source(source: dict) -> k8s.ApiClient:
    """The client :func:`client_source` describes."""
    if "url" in source:
        return api_client_for(source["url"])
    return load_api_client(source.get("kubeconfig"), source.get("context"))


# ---- the hot path: pooled keep-alive connections -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Response:
    """An apiserver answer: the HTTP status and the raw body (JSON bytes; nothing is deserialised)."""

    status: int
    data: bytes


class _Conn:
    """One keep-alive HTTP/1.1 connection: a request is written in one ``sendall``; the answer's status line and
    headers are read with plain line reads (``http.client`` parses headers with the ``email`` package, which
    costs more than the whole rest of a binding), then the body by Content-Length or chunks."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("rb", buffering=65536)
        self._timeout = sock.gettimeout()
        self._deadline: float | None = None
        self.idle_since = 0.0  # monotonic time it went back to the pool
        self.answered = False  # a byte of the current exchange's answer has arrived

    def close(self) -> None:
        for c in (self.rfile, self.sock):
            try:
                c.close()
            except OSError:
                pass

    def _arm(self) -> None:
        """Under a whole-request deadline: the time left as the next socket operation's timeout."""
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the request's deadline passed")
            self.sock.settimeout(left)
            self._timeout = left

    def _line(self) -> bytes:
        self._arm()
        line = self.rfile.readline(65537)
        if not line:
            raise http.client.RemoteDisconnected("the apiserver closed the connection without an answer")
        self.answered = True
        if len(line) > 65536:
            raise http.client.LineTooLong("header line")
        return line

    def exchange(self, request: bytes, timeout: float, deadline: float | None = None) -> tuple[int, bytes, bool]:
        """Send ``request`` (head and body); returns (status, body, keep-alive). ``timeout`` bounds each socket
        operation; ``deadline`` (monotonic), where given, the whole exchange."""
        self._deadline, self.answered = deadline, False
        try:
            return self._exchange(request, timeout)
        finally:
            self._deadline = None

    def _exchange(self, request: bytes, timeout: float) -> tuple[int, bytes, bool]:
        if self._deadline is not None:
            self._arm()
        elif timeout != self._timeout:  # set only when it changes: the call releases the GIL (an ioctl)
            self.sock.settimeout(timeout)
            self._timeout = timeout
        self.sock.sendall(request)
        while True:
            parts = self._line().split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise http.client.BadStatusLine(repr(parts))
            status, close = int(parts[1]), parts[0] == b"HTTP/1.0"
            length, chunked = -1, False
            while (h := self._line()) not in (b"\r\n", b"\n"):
                k, _, v = h.partition(b":")
                k = k.strip().lower()
                if k == b"content-length":
                    length = int(v)
                elif k == b"transfer-encoding":
                    chunked = b"chunked" in v.lower()
                elif k == b"connection":
                    close = b"close" in v.lower() or (close and b"keep-alive" not in v.lower())
            if status >= 200:
                break  # a 1xx (100 Continue) is followed by the real answer
        if status in (204, 304) or (length == 0 and not chunked):
            return status, b"", not close
        if chunked:
            out = []
            while (size := int(self._line().split(b";", 1)[0], 16)) > 0:
                out.append(self._read(size))
                self._line()
            while self._line() not in (b"\r\n", b"\n"):  # trailers
                pass
            return status, b"".join(out), not close
        if length >= 0:
            return status, self._read(length), not close
        self._arm()
        return status, self.rfile.read(), False  # no length: the body ends with the connection

    def _read(self, n: int) -> bytes:
        self._arm()
        data = self.rfile.read(n)
        if len(data) < n:
            raise http.client.IncompleteRead(data, n - len(data))
        return data


#: An idle pooled connection older than this is closed, not reused: kube-apiserver closes keep-alive connections
#: idle for 90 s (its IdleTimeout), and one it closed would cost the next request a retry.
IDLE_MAX_S = 60.0


def _left(deadline: float) -> float:
    """The time left before a whole-request deadline, as the next connect's timeout."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("the request's deadline passed")
    return left


def ssl_context(cfg: k8s.Configuration) -> ssl.SSLContext:
    """The TLS settings urllib3 would apply for this configuration: CA file or data and client certificate,
    the certificate always verified (:func:`check_tls` refuses configurations that would not)."""
    check_tls(cfg)
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None, cadata=cfg.ca_cert_data or None)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return ctx


class FastClient:
    """Keep-alive HTTP/1.1 connections to the apiserver of ``api`` (same host, TLS settings and credentials),
    for the scheduler's hot path: one request costs about a quarter of the CPU of the generated client's method
    (which validates its arguments with pydantic and goes through urllib3), because a body is sent as the JSON
    bytes it already is and the answer comes back unparsed.

    Thread-safe: each request takes an idle connection (or opens one) and puts it back afterwards, so N threads
    keep at most N connections open, and no more than ``max_idle`` idle ones. Behind an HTTP proxy the
    ApiClient's own urllib3 pool is used instead (same calls, same answers).

    A request that fails on the connection (reset, timeout, half an answer) raises ``OSError`` or
    ``http.client.HTTPException``; urllib3's errors on the proxy path become :class:`TransportError` (an
    ``OSError``; :class:`TransportTimeout` for its timeouts). Whether a write happened is then unknown, and the
    caller must find out (the scheduler re-reads the pod). One case only is retried here, as Go's transport
    does: a request on a *reused* connection that was closed or reset before any byte of an answer came back
    (the apiserver closes keep-alive connections idle for 90 s) goes out once more on a new connection. Idle
    connections older than ``idle_max_s`` are not reused at all.
    """

    def __init__(self, api: k8s.ApiClient, max_idle: int = 64, idle_max_s: float = IDLE_MAX_S) -> None:
        cfg = api.configuration
        self.cfg = cfg
        u = urlsplit(cfg.host)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise KubeConfigError(f"apiserver URL {cfg.host!r} is not http(s)://host[:port]")
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port or (443 if self._https else 80)
        self._base = u.path.rstrip("/")
        self._ctx = ssl_context(cfg) if self._https else None
        self._server_hostname = cfg.tls_server_name or (cfg.assert_hostname if isinstance(cfg.assert_hostname, str)
                                                        else None)
        proxied = bool(cfg.proxy) and not should_bypass_proxies(cfg.host, cfg.no_proxy or "")
        self._pool_manager = api.rest_client.pool_manager if proxied else None
        self._headers = {"Accept": "application/json", "User-Agent": api.user_agent or "joulesched"}
        host = f"[{self._host}]" if ":" in self._host else self._host  # an IPv6 literal
        self._host_header = host if self._port == (443 if self._https else 80) else f"{host}:{self._port}"
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self.max_idle = max_idle
        self.idle_max_s = idle_max_s
        self.opened = 0  # connections opened so far (a pool that works opens few)
        self.retried = 0  # requests sent again after a reused connection turned out closed

    def _auth(self) -> dict[str, str]:
        token = self.cfg.get_api_key_with_prefix("BearerToken", alias="authorization")  # runs the refresh hook
        return {"Authorization": token} if token else {}

    def _connect(self, timeout: float) -> _Conn:
        self.opened += 1
        sock = socket.create_connection((self._host, self._port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ctx is not None:
            try:
                sock = self._ctx.wrap_socket(sock, server_hostname=self._server_hostname or self._host)
            except BaseException:
                sock.close()
                raise
        return _Conn(sock)

    def request(self, method: str, path: str, body: bytes | None = None, *,
                content_type: str = "application/json", timeout: float = 10.0,
                whole: bool = False) -> Response:
        """``method path`` with ``body`` (JSON bytes); returns the status and raw body, whatever the status.
        ``timeout`` bounds each socket operation, or with ``whole`` the request from connect to the last byte
        (what a caller that must be answered by a given time needs: the scheduler's fenced bindings)."""
        deadline = time.monotonic() + timeout if whole else None
        headers = {**self._headers, **self._auth()}
        if body is not None:
            headers["Content-Type"] = content_type
        if self._pool_manager is not None:
            return self._proxied(method, path, body, headers, timeout, whole)
        head = [f"{method} {self._base}{path} HTTP/1.1", f"Host: {self._host_header}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append(f"Content-Length: {len(body or b'')}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        conn = self._pooled()
        reused = conn is not None
        while True:
            if conn is None:
                conn = self._connect(timeout if deadline is None else _left(deadline))
            try:
                status, data, keep = conn.exchange(request, timeout, deadline)
                break
            except (ConnectionResetError, BrokenPipeError):  # RemoteDisconnected is a ConnectionResetError
                conn.close()
                if not reused or conn.answered:  # a new connection, or an answer begun: the request was read
                    raise
                # Closed by the apiserver while idle, before it read the request: send it again, once.
                reused, conn = False, None
                self.retried += 1
            except BaseException:
                conn.close()
                raise
        if keep:
            with self._lock:
                if len(self._idle) < self.max_idle:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                    conn = None
        if conn is not None:
            conn.close()
        return Response(status, data)

    def _pooled(self) -> _Conn | None:
        """The most recently used idle connection, if it has been idle less than ``idle_max_s``; older ones are
        closed (the apiserver may have closed them already; the ones below it in the pool are older still)."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
            if conn is None or time.monotonic() - conn.idle_since <= self.idle_max_s:
                return conn
            stale, self._idle = [conn, *self._idle], []
        for c in stale:
            c.close()
        return None

    def _proxied(self, method: str, path: str, body: bytes | None, headers: dict, timeout: float,
                 whole: bool) -> Response:
        try:
            r = self._pool_manager.request(method, f"{self.cfg.host}{path}", body=body, headers=headers,
                                           timeout=urllib3.Timeout(total=timeout) if whole else timeout,
                                           retries=False, preload_content=True)
        except urllib3.exceptions.HTTPError as e:  # ProxyError, ProtocolError, ReadTimeoutError...: no OSError
            x = urllib3.exceptions
            cause = e.original_error if isinstance(e, x.ProxyError) else e
            # NewConnectionError derives from ConnectTimeoutError in urllib3 2.x: a refused connection is no timeout.
            timed_out = (isinstance(cause, (x.TimeoutError, TimeoutError))
                         and not isinstance(cause, x.NewConnectionError))
            raise (TransportTimeout if timed_out else TransportError)(f"{type(e).__name__}: {e}") from e
        return Response(r.status, r.data)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()
