"""HTTP fuzzing kit: Hypothesis strategies for whole requests and a raw-socket client that sends them as bytes.

A raw socket rather than an HTTP library, so a request can carry what libraries refuse to send: a negative or
non-numeric Content-Length, odd methods, paths with stray percent escapes. Every request opens its own
connection with ``Connection: close``; the client reads the status line and the headers within a deadline
and returns the status code (a closed connection without a status line is a failure of the server).
"""

from __future__ import annotations

import socket
import string
import time
from dataclasses import dataclass

from hypothesis import strategies as st

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT", "PROPFIND", "BREW")
# Request-target characters: unreserved, sub-delims, ':' '@' '/' '?' and '%' (stray escapes included).
_PATH_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/%?"
_TOKEN = string.ascii_letters + string.digits + "-_"
_VALUE = "".join(chr(c) for c in range(0x20, 0x7F))
# Framing headers are chosen on purpose below, never at random.
_RESERVED = {"content-length", "transfer-encoding", "expect", "connection", "host"}
BAD_LENGTHS = ("-1", "-100", "abc", "1e3", "0x10", "12abc", "+5", "", "٣")  # "٣" is an Arabic-Indic three


@dataclass(frozen=True)
class Req:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    length: str | None  # the Content-Length header to send; None: none

    def to_bytes(self) -> bytes:
        head = [f"{self.method} {self.path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
        head += [f"{k}: {v}" for k, v in self.headers]
        if self.length is not None:
            head.append(f"Content-Length: {self.length}")
        return ("\r\n".join(head) + "\r\n\r\n").encode("utf-8") + self.body

    @property
    def bad_length(self) -> bool:
        return self.length is not None and not (self.length.isascii() and self.length.isdigit())


@st.composite
def requests(draw, paths: tuple[str, ...], json_bodies: bool = True) -> Req:
    """A random request aimed mostly at ``paths`` (the server's own endpoints), sometimes anywhere."""
    method = draw(st.sampled_from(METHODS) | st.text(_TOKEN, min_size=1, max_size=12))
    base = draw(st.sampled_from(paths) | st.text(_PATH_CHARS, max_size=40).map(lambda p: "/" + p))
    query = draw(st.none() | st.text(_PATH_CHARS.replace("?", ""), max_size=40))
    path = base + (f"?{query}" if query is not None else "")
    names = st.text(_TOKEN, min_size=1, max_size=20).filter(lambda n: n.lower() not in _RESERVED)
    headers = tuple(draw(st.lists(st.tuples(names, st.text(_VALUE, max_size=60)), max_size=6)))
    if draw(st.booleans()):
        headers += (("Content-Type", draw(st.sampled_from(["application/json", "text/plain",
                                                            "application/octet-stream", "x/y"]))),)
    json_like = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                             | st.text(max_size=20),
                             lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids,
                                                                                        max_size=4),
                             max_leaves=12)
    body_st = st.binary(max_size=2048)
    if json_bodies:
        import json

        body_st = body_st | json_like.map(lambda v: json.dumps(v).encode())
    body = draw(body_st)
    length_kind = draw(st.sampled_from(["exact", "exact", "exact", "none", "bad"]))
    if length_kind == "exact":
        length: str | None = str(len(body))
    elif length_kind == "none":
        length, body = None, b""
    else:
        length = draw(st.sampled_from(BAD_LENGTHS))
    return Req(method, path, headers, body, length)


class NoAnswer(AssertionError):
    pass


def send(port: int, data: bytes, deadline_s: float = 5.0, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """Send raw bytes on a new connection; return (status, head) once the response head has arrived.

    Raises NoAnswer when the server closes without a status line or takes longer than ``deadline_s``."""
    end = time.monotonic() + deadline_s
    with socket.create_connection((host, port), timeout=deadline_s) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413) and close before reading everything: read what it said
        buf = b""
        while b"\r\n\r\n" not in buf:
            left = end - time.monotonic()
            if left <= 0:
                raise NoAnswer(f"no response head within {deadline_s} s; got {buf[:200]!r}")
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                raise NoAnswer(f"no response head within {deadline_s} s; got {buf[:200]!r}") from None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
    line = buf.split(b"\r\n", 1)[0].split()
    if len(line) < 2 or not line[0].startswith(b"HTTP/1.") or not line[1].isdigit():
        raise NoAnswer(f"connection closed without a status line: {buf[:200]!r}")
    return int(line[1]), buf.split(b"\r\n\r\n", 1)[0]


def open_idle(port: int, n: int, host: str = "127.0.0.1") -> list[socket.socket]:
    """``n`` connections that send nothing (a slowloris client): the caller closes them."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=5)
        socks.append(s)
    return socks
