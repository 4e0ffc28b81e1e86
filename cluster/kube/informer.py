"""List-then-watch of one resource, with resourceVersion, through the real ``kubernetes`` client.

A watch resumes from the last resourceVersion it saw; a ``410 Gone`` (an ERROR event or an HTTP status)
triggers a fresh list; a dropped stream, a half-written event or a 5xx resumes the watch after a short
backoff. Objects stay plain JSON dicts (``_preload_content=False`` / ``deserialize=False``): the client's
model deserialisation costs about a millisecond per pod, which a scheduler cannot afford.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError, ReadTimeoutError

#: A watch that has sent nothing for this long, not even a BOOKMARK (the apiserver sends one about every minute
#: to a watch that allows them), is given up and opened again; until then, at most this long counts as fresh. A
#: connection that died without a FIN or RST (the apiserver's host gone, a NAT dropping it) otherwise looked
#: healthy for the whole server-side timeout plus 30 s (a review: 330 s of decisions on a frozen view).
WATCH_QUIET_S = 90.0

log = logging.getLogger("joulesched.kube")


def _line_batches(resp: Any) -> Any:
    """The complete, non-empty lines of each chunk the stream delivers, as one list per chunk (a half line
    waits for the next chunk). ``kubernetes.watch``'s splitter copies the rest of the buffer at every line."""
    buf = b""
    for seg in resp.stream(amt=None, decode_content=False):
        buf += seg.encode("utf-8") if isinstance(seg, str) else seg
        *lines, buf = buf.split(b"\n")
        lines = [ln for ln in lines if ln.strip()]
        if lines:
            yield lines


class Informer:
    """Keeps calling ``on_replace(items)`` after each list and ``on_event(type, obj)`` for each watch event.

    :param list_fn: an API list method, e.g. ``CoreV1Api.list_node``.
    :param kwargs: passed to every list and watch call (``field_selector``...).
    :param watch_timeout_s: server-side watch timeout; the watch is re-opened after it, from the last version.
    :param retry_s: pause after an error before retrying (doubles up to 5 s).
    """

    def __init__(self, name: str, list_fn: Callable[..., Any], on_replace: Callable[[list[dict]], None],
                 on_event: Callable[[str, dict], None], *, watch_timeout_s: int = 300, retry_s: float = 0.05,
                 on_events: Callable[[list[tuple[str, dict]]], None] | None = None, **kwargs: Any) -> None:
        self.name = name
        self.list_fn, self.kwargs = list_fn, kwargs
        self.on_replace, self.on_event = on_replace, on_event
        #: optional: every event of one chunk of the stream in one call (the cache then takes its lock once)
        self.on_events = on_events
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s
        self.synced = threading.Event()
        self.relists = 0
        self.resumes = 0
        #: monotonic time of the last answer from the apiserver (a list, a watch opened, an event, a clean end);
        #: with ``streaming`` it tells a quiet watch (healthy) from one that cannot reconnect (stale).
        self.last_contact = time.monotonic()
        self.streaming = False
        self._reopening = False  # a watch that went quiet is being opened again
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)
        self.resource_version = ""

    def start(self) -> "Informer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:  # unblock the read, as kubernetes.watch.Watch.stop does
            sock = getattr(getattr(resp, "connection", None), "sock", None)
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(10)

    def stale_for(self) -> float:
        """Seconds since the apiserver last answered; an open watch, and one being opened again after it went
        quiet, are fresh for :data:`WATCH_QUIET_S` after its last chunk (a quiet watch is not stale, one silent
        for longer may be a dead connection: it is opened again, and counts as stale if that fails)."""
        quiet = time.monotonic() - self.last_contact
        return max(0.0, quiet - WATCH_QUIET_S) if self.streaming or self._reopening else max(0.0, quiet)

    def _list(self) -> None:
        resp = self.list_fn(_preload_content=False, _request_timeout=30, **self.kwargs)
        data = json.loads(resp.data)
        self.last_contact = time.monotonic()
        self.resource_version = data["metadata"]["resourceVersion"]
        self.on_replace(data.get("items") or [])
        self.synced.set()

    def _run(self) -> None:
        delay = self.retry_s
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    self.relists += 1
                    need_list = False
                self._watch_once()
                delay = self.retry_s
            except ApiException as e:
                self._reopening = False
                if self._stop.is_set():
                    break
                if e.status == 410:
                    log.info("%s: watch expired (410 Gone), re-listing", self.name)
                    need_list = True
                    continue
                log.warning("%s: API error %s, retrying in %.2f s", self.name, e.status, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
            except Exception as e:  # dropped stream, connection refused, half an event
                if self._stop.is_set():
                    break
                self._reopening = False
                log.info("%s: watch interrupted (%s), resuming from %s", self.name, type(e).__name__,
                         self.resource_version)
                self.resumes += 1
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def _watch_once(self) -> None:
        # The client's Watch helper with deserialize=False fails on ERROR events (it reads a 'raw_object' key
        # it never set), so the stream is read here, a chunk of lines at a time.
        if self._stop.is_set():
            return
        resp = self.list_fn(watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
                            timeout_seconds=self.watch_timeout_s, _preload_content=False,
                            _request_timeout=(10, min(self.watch_timeout_s + 30, WATCH_QUIET_S)), **self.kwargs)
        self._resp = resp
        self.last_contact, self.streaming, self._reopening = time.monotonic(), True, False
        try:
            if self._stop.is_set():
                return
            try:
                for lines in _line_batches(resp):
                    self._apply(lines)
                    if self._stop.is_set():
                        break
            except (ReadTimeoutError, ProtocolError) as e:
                if self._stop.is_set() or not (isinstance(e, ReadTimeoutError)
                                               or isinstance(e.__context__, ReadTimeoutError)
                                               or any(isinstance(a, ReadTimeoutError) for a in e.args)):
                    raise
                # nothing for WATCH_QUIET_S, not even a bookmark: opened again at once, from where it was
                log.debug("%s: watch silent for %.0f s, opening it again", self.name, WATCH_QUIET_S)
                self._reopening = True
        finally:
            self.streaming = False
            self._resp = None
            resp.close()
            resp.release_conn()

    def _apply(self, lines: list[bytes]) -> None:
        """One chunk's events, in order; an ERROR event raises (after what came before it is applied)."""
        self.last_contact = time.monotonic()
        batch: list[tuple[str, dict]] = []
        rv = ""
        error = None
        for line in lines:
            ev = json.loads(line)
            etype, obj = ev.get("type"), ev.get("object") or {}
            if etype == "ERROR":
                error = ApiException(status=int(obj.get("code") or 500), reason=obj.get("message", "watch error"))
                break
            if etype in ("ADDED", "MODIFIED", "DELETED"):
                batch.append((etype, obj))
            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
        if batch:
            if self.on_events is not None:
                self.on_events(batch)
            else:
                for etype, obj in batch:
                    self.on_event(etype, obj)
        if rv:
            self.resource_version = rv  # applied: a resumed watch starts after it
        if error is not None:
            raise error
