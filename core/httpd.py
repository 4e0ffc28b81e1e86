"""The one hardened HTTP server base under every joulesched endpoint: the extender, the scheduler's status
endpoint, the power exporter and the workload apps (werkzeug's server, with the same two mixins).

What it enforces, whatever the handler does (:class:`Limits`):

- a time limit on every request (:class:`_RequestClock`): the wait for its first byte is at most ``timeout_s``,
  and from that byte its request line, headers and body must arrive within ``timeout_s``, however the client
  paces them (one byte every half second no longer holds a thread). Past it the connection is closed, after a
  ``408`` when the request was cut off in its head or in :meth:`HardenedHandlerMixin.read_body` (a WSGI app
  answers a cut-off body itself). On a keep-alive connection each request has its own limit. An endpoint that
  swallows a stream by design lifts it for its request (:func:`lift_deadline`), each read still bounded by
  ``timeout_s``. Writes are bounded by the socket timeout, ``timeout_s``;
- at most ``max_connections`` connections served at once (one thread each); one more is answered
  ``503`` with ``Retry-After`` and closed at once, so the thread count stays bounded whatever clients do;
- ``Content-Length`` checked before the handler runs: not a non-negative decimal integer (``-1``, ``1e3``,
  two different values) is ``400``; over ``max_body`` is ``413``; a ``Transfer-Encoding`` body is ``411``
  unless the server decodes it (``allow_chunked``, the WSGI server), and both headers at once are ``400``
  (request smuggling);
- a method the handler does not implement is ``405`` with ``Allow`` (the standard library says ``501``);
- HTTP/0.9 requests are refused with ``400`` at once, and so is a head line that is no ``name: value``
  (``Content-Length : 4``) or a header name that is no token, before any ``100 Continue``; every refusal of a
  request line has a status line.

A handler reads its body with :meth:`HardenedHandlerMixin.read_body`, which never reads more than the checked
length. :class:`BackgroundHTTPServer` wraps any ``BaseHTTPRequestHandler`` subclass in the mixin, so a handler
written without it (``live/scheduler.py``'s StatusServer) gets all of the above unchanged.
"""

from __future__ import annotations

import email.errors
import io
import logging
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIB = 1 << 20
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header field name (RFC 9110 5.1)
#: What the email parser records for a head line that is no header: a line without a colon, or a first line that
#: continues nothing.
_HEAD_DEFECTS = (email.errors.MissingHeaderBodySeparatorDefect, email.errors.FirstHeaderLineIsContinuationDefect)
log = logging.getLogger("joulesched.http")


@dataclass(frozen=True)
class Limits:
    """:param timeout_s: socket timeout of each connection (reads and writes), the longest wait for a request's first
        byte and the time from that byte by which the whole request (line, headers, body) must have arrived.
    :param max_connections: connections served at once; each has one thread.
    :param max_body: largest request body in bytes; ``None`` leaves the cap to the application (Flask's
        ``MAX_CONTENT_LENGTH``), the header is still checked for syntax.
    :param allow_chunked: accept ``Transfer-Encoding`` bodies (only where the server decodes them)."""

    timeout_s: float = 10.0
    max_connections: int = 32
    max_body: int | None = 1 * MIB
    allow_chunked: bool = False

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or self.max_connections < 1 or (self.max_body is not None and self.max_body < 0):
            raise ValueError("Limits need timeout_s > 0, max_connections >= 1 and max_body >= 0")


DEFAULT_LIMITS = Limits()
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n\r\nbusy\n")
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain\r\nContent-Length: 16\r\n"
              b"Connection: close\r\n\r\nrequest timeout\n")
#: WSGI environ key of the callable that lifts the current request's deadline (see :func:`lift_deadline`).
LIFT_DEADLINE_KEY = "joulesched.lift_deadline"


class _RequestClock(io.RawIOBase):
    """The connection's socket as the raw stream under ``rfile``, with a deadline per request: every ``recv``
    waits at most the time left (``timeout_s`` while no byte of the request has come), then the socket timeout
    goes back to ``timeout_s`` for the writes. Once a read has timed out, every later one fails at once."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        super().__init__()
        self._sock, self._timeout = sock, timeout_s
        self.deadline: float | None = None  # by when this request must have arrived; None until its first byte
        self.got = False  # a byte of this request came from the socket
        self.lifted = False
        self.timed_out = False

    def next_request(self) -> None:
        self.deadline, self.got, self.lifted = None, False, False

    def lift(self) -> None:
        self.lifted = True

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.timed_out:
            raise TimeoutError("request timed out")
        left = self._timeout
        if self.deadline is not None and not self.lifted:
            left = min(left, self.deadline - time.monotonic())
            if left <= 0:
                self.timed_out = True
                raise TimeoutError("request deadline passed")
        self._sock.settimeout(left)
        try:
            n = self._sock.recv_into(b)
        except TimeoutError:
            self.timed_out = True
            raise
        finally:
            self._sock.settimeout(self._timeout)
        if n and not self.got:
            self.got, self.deadline = True, time.monotonic() + self._timeout
        return n


def lift_deadline(environ: dict) -> None:
    """Lift the current request's deadline (each read stays bounded by ``timeout_s``): for a WSGI endpoint that
    reads a stream for as long as it lasts, such as the blockers' ``/sink``. A no-op outside these servers."""
    lift = environ.get(LIFT_DEADLINE_KEY)
    if lift is not None:
        lift()


def _methods(handler: BaseHTTPRequestHandler) -> str:
    return ", ".join(sorted(m[3:] for m in dir(type(handler)) if m.startswith("do_")))


class HardenedHandlerMixin:
    """Put before a ``BaseHTTPRequestHandler`` subclass: checks the request head against the server's
    :class:`Limits` before any ``do_*`` method runs (see the module docstring).

    A handler that did not read a body it was sent (a GET with one) gets its connection closed after the
    answer, so the body is never parsed as the next request. ``app_reads_body = True`` (the WSGI server, whose
    application reads ``wsgi.input``) leaves that to the server."""

    body_length: int = 0
    app_reads_body = False
    # What the standard library answers a request line it refuses with (a bad version, one word): left at its
    # HTTP/0.9, that answer had no status line.
    default_request_version = "HTTP/1.0"
    _framing: bool | None = None
    _body_read = False
    _clock: _RequestClock | None = None

    def setup(self) -> None:
        super().setup()  # type: ignore[misc]
        limits: Limits = getattr(self.server, "limits", DEFAULT_LIMITS)  # type: ignore[attr-defined]
        self.rfile.close()  # type: ignore[has-type]
        self._clock = _RequestClock(self.connection, limits.timeout_s)  # type: ignore[attr-defined]
        self.rfile = io.BufferedReader(self._clock)

    def lift_deadline(self) -> None:
        """Lift this request's deadline (see :func:`lift_deadline`)."""
        if self._clock is not None:
            self._clock.lift()

    def make_environ(self) -> dict:
        # The WSGI server's (werkzeug) environ, with the request's lift_deadline.
        environ = super().make_environ()  # type: ignore[misc]
        environ[LIFT_DEADLINE_KEY] = self.lift_deadline
        return environ

    def _refuse(self, code: int, message: str, extra: dict[str, str] | None = None) -> bool:
        data = (message + "\n").encode()
        self.close_connection = True
        self.send_response(code)  # type: ignore[attr-defined]
        for k, v in (extra or {}).items():
            self.send_header(k, v)  # type: ignore[attr-defined]
        self.send_header("Content-Type", "text/plain; charset=utf-8")  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(data)))  # type: ignore[attr-defined]
        self.send_header("Connection", "close")  # type: ignore[attr-defined]
        self.end_headers()  # type: ignore[attr-defined]
        if self.command != "HEAD":  # type: ignore[attr-defined]
            self.wfile.write(data)  # type: ignore[attr-defined]
        return False

    def handle_one_request(self) -> None:
        self.body_length, self._body_read, self._framing = 0, False, None
        clock = self._clock
        if clock is not None:
            clock.next_request()
        try:
            super().handle_one_request()  # type: ignore[misc]
        except TimeoutError:  # the standard library catches it itself; werkzeug lets it out
            self.close_connection = True
        if clock is not None and clock.timed_out:
            self.close_connection = True
            if clock.got and self._framing is None:  # cut off in its head: nothing was answered yet
                try:
                    self.connection.sendall(_TIMED_OUT)  # type: ignore[attr-defined]
                except OSError:
                    pass
        if self.body_length and not self._body_read and not self.app_reads_body:
            self.close_connection = True

    def handle_expect_100(self) -> bool:
        # Refuse a bad or oversized body before inviting the client to send it.
        if not self._check_framing():
            return False
        return super().handle_expect_100()  # type: ignore[misc]

    def parse_request(self) -> bool:
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")  # type: ignore[attr-defined]
        words = line.split()
        if len(words) == 2:  # HTTP/0.9 (no version): refused at once, not after waiting for headers it has none of
            self.requestline, self.command, self.request_version = line, words[0], "HTTP/1.0"
            return self._refuse(400, "HTTP/0.9 requests are not supported")
        if not super().parse_request():  # type: ignore[misc]
            return False
        return self._check_framing()

    def _check_head(self) -> bool:
        """The header lines (from :meth:`_check_framing`, so before any ``100 Continue``)."""
        headers = self.headers  # type: ignore[attr-defined]
        # The email parser ends the headers at a line that is no "name:" ("Content-Length : 4", RFC 9112 5.1: a
        # 400) and keeps the rest as its payload: read as having no Content-Length, the body would be parsed as
        # the next request. Only those defects: a multipart Content-Type adds others to any well-formed head.
        if any(isinstance(d, _HEAD_DEFECTS) for d in headers.defects):
            return self._refuse(400, "malformed header line (no 'name: value')")
        bad = next((k for k in headers.keys() if not _TOKEN.fullmatch(k)), None)
        if bad is not None:
            return self._refuse(400, f"bad header name {bad[:40]!r}")
        return True

    def _check_framing(self) -> bool:
        """The checks of the module docstring, once per request (from Expect handling or after parsing)."""
        if self._framing is not None:
            return self._framing
        self._framing = False
        if not self._check_head():
            return False
        limits: Limits = getattr(self.server, "limits", DEFAULT_LIMITS)  # type: ignore[attr-defined]
        headers = self.headers  # type: ignore[attr-defined]
        lengths = {v.strip() for v in headers.get_all("Content-Length") or []}
        chunked = headers.get("Transfer-Encoding") is not None
        if len(lengths) > 1:
            return self._refuse(400, "more than one Content-Length")
        n = 0
        if lengths:
            raw = lengths.pop()
            if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
                return self._refuse(400, f"Content-Length must be a non-negative integer, got {raw[:40]!r}")
            n = int(raw)
            if chunked:
                return self._refuse(400, "Content-Length and Transfer-Encoding together")
        if chunked and not limits.allow_chunked:
            return self._refuse(411, "send the body with a Content-Length (Transfer-Encoding is not accepted)")
        if limits.max_body is not None and n > limits.max_body:
            return self._refuse(413, f"body of {n} bytes is over the {limits.max_body}-byte limit")
        if not hasattr(self, "do_" + self.command):  # type: ignore[attr-defined]
            return self._refuse(405, f"method {self.command} not allowed",  # type: ignore[attr-defined]
                                {"Allow": _methods(self)})  # type: ignore[arg-type]
        self.body_length = n
        self._framing = True
        return True

    def read_body(self) -> bytes:
        """The request body: exactly the checked Content-Length. A body that does not arrive within the request's
        time limit is answered ``408`` and the ``TimeoutError`` goes on (the connection is closed)."""
        n = self.body_length
        self._body_read = True
        try:
            return self.rfile.read(n) if n else b""  # type: ignore[attr-defined]
        except TimeoutError:
            try:
                self._refuse(408, "request body not received in time")
            except OSError:
                pass
            raise


def harden(handler: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """``handler`` with :class:`HardenedHandlerMixin` in front (itself when it already has it)."""
    if issubclass(handler, HardenedHandlerMixin):
        return handler
    return type(handler.__name__, (HardenedHandlerMixin, handler), {})  # type: ignore[return-value]


class HardenedServerMixin:
    """Put before ``socketserver.ThreadingMixIn`` (or a server class using it): socket timeouts and a bounded
    number of connection threads, from ``self.limits``."""

    limits: Limits = DEFAULT_LIMITS
    daemon_threads = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 stalls bursts of connects for a second)

    def _slots_sem(self) -> threading.BoundedSemaphore:
        sem = self.__dict__.get("_js_slots")
        if sem is None:
            sem = self.__dict__["_js_slots"] = threading.BoundedSemaphore(self.limits.max_connections)
        return sem

    def get_request(self):
        conn, addr = super().get_request()  # type: ignore[misc]
        conn.settimeout(self.limits.timeout_s)
        return conn, addr

    def process_request(self, request, client_address) -> None:
        slots = self._slots_sem()
        if not slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            slots.release()
            raise

    def handle_error(self, request, client_address) -> None:
        # A client that hung up or went silent is routine, not a traceback on stderr; anything else is logged.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        log.warning("request from %s failed", client_address[0] if client_address else "?", exc_info=exc)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slots_sem().release()


class HardenedHTTPServer(HardenedServerMixin, ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with :class:`HardenedServerMixin`; IPv6 when the host is an IPv6 address."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, harden(handler))


def reply(handler: BaseHTTPRequestHandler, code: int, data: bytes, ctype: str,
          headers: dict[str, str] | None = None) -> None:
    """Send a complete response with a Content-Length (keep-alive clients need it)."""
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)


class BackgroundHTTPServer:
    """``handler`` served on ``host:port`` (port 0 picks a free one) from a daemon thread, under ``limits``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str, port: int, name: str,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.httpd = HardenedHTTPServer((host, port), handler, limits)
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=name, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)
