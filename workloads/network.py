"""Network blocker: move bytes at a given Mbit/s.

Two directions, both paced by a token bucket:
- `NetworkLoad` POSTs one chunked stream to a target URL (another blocker's `/sink`), so a started load
  produces traffic with no client in the loop;
- `paced_stream` backs `GET /stream`, for a client that pulls the bytes.
A send blocks at most SEND_TIMEOUT_S, so `stop()` returns promptly even against a stalled receiver, and no wait
for tokens outlasts the stream's end.
Every (re)connect resolves the target through the allow-list (`workloads/egress.py`) and connects to the
address it checked, so DNS cannot re-point a running stream at a refused address.
"""

from __future__ import annotations

import http.client
import math
import os
import socket
import threading
import time
from typing import Any, Iterator
from urllib.parse import urlsplit

from joulesched.workloads.egress import NetAllow
from joulesched.workloads.pacing import NET_CHUNK, TokenBucket, chunk_size, shortfall

SEND_TIMEOUT_S = 5.0
RETRY_S = 1.0


def paced_stream(mbps: float, seconds: float, stop: threading.Event, counter: list[int]) -> Iterator[bytes]:
    """Yield random bytes at `mbps` for `seconds` or until `stop`; adds each chunk's size to counter[0]."""
    rate = mbps * 1e6 / 8
    n = chunk_size(rate, *NET_CHUNK)
    block = os.urandom(n)
    bucket = TokenBucket(rate, burst=n)
    end = time.monotonic() + seconds
    while time.monotonic() < end and bucket.take(n, stop, until=end):
        yield block
        counter[0] += n  # counted once the consumer took it


class NetworkLoad:
    """Stream `mbps` to `target` (chunked POST) for `duration_s`, reconnecting if the target drops."""

    def __init__(self, mbps: float, target: str, duration_s: float, allow: NetAllow | None = None):
        self.mbps = mbps
        self.target = target
        self.allow = allow if allow is not None else NetAllow()
        self.duration_s = duration_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sent = [0]
        self.connections = 0
        self.last_error: str | None = None  # a connection that failed and was retried
        self.error: str | None = None  # what ended the load early, or a rate far short of the one asked
        self._began: float | None = None
        self._end = math.inf

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="network-blocker", daemon=True)
        self._thread.start()

    def _connect(self) -> http.client.HTTPConnection:
        u = urlsplit(self.target)
        address = self.allow.resolve(self.target)  # EgressError (a ValueError) when refused
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.hostname, u.port, timeout=SEND_TIMEOUT_S)
        # Connect to the checked address; Host and (for https) SNI and certificate checks keep the name.
        conn._create_connection = lambda addr, timeout, source=None: socket.create_connection(  # type: ignore
            (address, addr[1]), timeout, source)
        conn.putrequest("POST", (u.path or "/") + (f"?{u.query}" if u.query else ""))
        conn.putheader("Content-Type", "application/octet-stream")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        return conn

    def _run(self) -> None:
        try:
            self._stream()
        except Exception as exc:  # anything not retried ends this load, visibly in its stats, not silently
            self.error = f"{type(exc).__name__}: {exc}"

    def _stream(self) -> None:
        self._began = time.monotonic()
        end = self._end = self._began + self.duration_s
        while not self._stop.is_set() and time.monotonic() < end:
            before = self._sent[0]
            try:
                conn = self._connect()
                self.connections += 1
                try:
                    left = end - time.monotonic()
                    try:
                        for block in paced_stream(self.mbps, left, self._stop, self._sent):
                            conn.send(b"%x\r\n%s\r\n" % (len(block), block))
                        conn.send(b"0\r\n\r\n")
                    except OSError as exc:  # the target may have answered and closed: its status says why
                        raise http.client.HTTPException(f"{type(exc).__name__}: {exc}{self._early_status(conn)}")
                    resp = conn.getresponse()
                    resp.read()
                    if not 200 <= resp.status < 300:  # a 404, 413 or 429: nothing it got counts as load
                        raise http.client.HTTPException(f"HTTP {resp.status} {resp.reason} from {self.target}")
                finally:
                    conn.close()
            except (OSError, ValueError, http.client.HTTPException) as exc:
                # Bytes the target did not accept are no load (a review: a 404 answered at once was counted
                # as sent on every reconnect, and the run "completed").
                self._sent[0] = before
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(RETRY_S)

    @staticmethod
    def _early_status(conn: http.client.HTTPConnection) -> str:
        """The status of a reply the target sent before it closed the connection (", HTTP 404 ..."), or ""."""
        try:
            resp = conn.getresponse()
            return f", HTTP {resp.status} {resp.reason}"
        except Exception:  # noqa: BLE001 - nothing to read: the error says enough
            return ""

    def stop(self) -> None:
        stopped = time.monotonic()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SEND_TIMEOUT_S + 2)
        if self.error is None and self._sent[0] == 0 and self.last_error:  # retried all along: no load was made
            self.error = f"nothing sent to {self.target}: {self.last_error}"
        active = min(stopped, self._end) - self._began if self._began is not None else 0.0
        got = shortfall(self._sent[0], active, self.mbps * 1e6 / 8)
        if self.error is None and got is not None:  # the link, the target or this host could not carry it
            self.error = (f"sent {got * 8 / 1e6:.1f} Mbit/s of the {self.mbps:g} asked to {self.target}"
                          + (f" (last error: {self.last_error})" if self.last_error else ""))

    def stats(self) -> dict[str, Any]:
        return {
            "mbps": self.mbps,
            "target": self.target,
            "bytes_sent": self._sent[0],
            "connections": self.connections,
            "last_error": self.last_error,
            "error": self.error,
        }
