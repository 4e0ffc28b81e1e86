"""The blocker service: one run at a time, bounded in time, all state in this one process.

`BlockerService` owns the running loads and a watchdog thread that stops them at the deadline; each load
also checks the deadline itself, so a stuck watchdog still cannot make a load run away. `create_app`
puts the HTTP API on top:

    POST /start   JSON LoadParams (only the fields of this app's kind)   -> 202 status | 400 | 409
    POST /stop                                                           -> 200 status
    GET  /status                                                         -> 200 status
    GET  /healthz                                                        -> 200 {"status": "ok"}
    GET  /stream?mbps=&seconds=   (network, combined) paced random bytes          -> 200 | 400 | 429
    POST /sink                    (network, combined) reads and discards a (chunked) body -> 200 | 429

Bodies are capped at MAX_CONTENT_LENGTH (413) except ``/sink``, which exists to swallow a stream; at most
``max_streams`` ``/stream`` and ``/sink`` run at once (429 with Retry-After beyond), so they cannot take every
server thread. ``net_target`` must pass the allow-list (`workloads/egress.py`) and not be this app itself; a disk
load must fit in the scratch directory's free space. A run whose load reported an error (a thread that died) ends
as ``a load failed``, not ``duration elapsed``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from flask import Flask, Response, jsonify, request
from pydantic import ValidationError
from werkzeug.exceptions import RequestEntityTooLarge

from joulesched.core.errors import UsageError, validation_summary
from joulesched.core.httpd import lift_deadline
from joulesched.workloads.cpu import CpuLoad
from joulesched.workloads.disk import DiskLoad
from joulesched.workloads.egress import EgressError, NetAllow
from joulesched.workloads.memory import MemoryLoad
from joulesched.workloads.network import NetworkLoad, paced_stream
from joulesched.workloads.params import KIND_FIELDS, KINDS, MAX_DURATION_S, MAX_NET_MBPS, LoadParams, StreamParams
from joulesched.workloads.server import request_body

#: Request bodies of /start and /stop are a few hundred bytes of JSON.
MAX_CONTENT_LENGTH = 64 << 10
#: /stream and /sink responses running at once; each holds a server thread for up to an hour.
MAX_STREAMS = 4
#: What one network load can send at most (its rate cap for the longest duration).
SINK_MAX_BYTES = int(MAX_NET_MBPS * 1e6 / 8 * MAX_DURATION_S)
#: Share of the scratch filesystem a disk load leaves free (ext4 reserves as much for root), so the node and its
#: other pods can still write.
DISK_FREE_MARGIN = 0.05
#: end_reason of a run that lasted its duration, and of one whose load reported an error meanwhile.
COMPLETED = "duration elapsed"
FAILED = "a load failed"


class Load(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...


class BadRequest(UsageError):
    """A request the service refuses; `status` is the HTTP code."""

    def __init__(self, message: str, status: int = 400, details: Any = None):
        super().__init__(message)
        self.status = status
        self.details = details


def validation_message(exc: ValidationError) -> str:
    return validation_summary(exc, root="body")


class _Run:
    def __init__(self, params: LoadParams, loads: dict[str, Load]):
        self.params = params
        self.loads = loads
        self.started = time.monotonic()
        self.started_at = time.time()
        self.deadline = self.started + params.duration_s
        self.stopped = threading.Event()
        self.end_reason: str | None = None
        self.ended_at: float | None = None


class BlockerService:
    """Starts, bounds and stops the loads of one kind (or all, for `combined`).

    :param kind: one of params.KINDS; limits which LoadParams fields /start accepts.
    :param scratch_dir: where the disk blocker creates (and removes) its scratch directory.
    :param net_allow: where network loads may stream (default: loopback and in-cluster service names).
    :param max_streams: concurrent /stream and /sink requests.
    """

    def __init__(self, kind: str, scratch_dir: Path | None = None, net_allow: NetAllow | None = None,
                 max_streams: int = MAX_STREAMS):
        if kind not in KINDS:
            raise ValueError(f"unknown blocker kind {kind!r}; expected one of {', '.join(KINDS)}")
        if max_streams < 1:
            raise ValueError("max_streams must be >= 1")
        self.kind = kind
        self.scratch_dir = Path(scratch_dir or tempfile.gettempdir())
        self.net_allow = net_allow if net_allow is not None else NetAllow()
        self.stream_slots = threading.BoundedSemaphore(max_streams)
        self._lock = threading.Lock()
        self._run: _Run | None = None
        self._last: dict[str, Any] | None = None
        self.streams = threading.Event()  # set at shutdown to end /stream responses
        self.stream_bytes = [0]
        self.sink_bytes = 0

    def parse(self, body: Any, own: tuple[str, int] | None = None) -> LoadParams:
        """``body`` as LoadParams of this app's kind; BadRequest naming what is wrong. ``own``: the address this
        app listens on (an IP and a port), which net_target must not name."""
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        extra = sorted(set(body) - KIND_FIELDS[self.kind])
        if extra:
            allowed = ", ".join(sorted(KIND_FIELDS[self.kind]))
            raise BadRequest(f"the {self.kind} blocker does not take {', '.join(extra)}; it takes {allowed}")
        try:
            params = LoadParams.model_validate(body)
        except ValidationError as exc:
            # Without the input: it is the client's own (a NaN in it made the answer JSON strict parsers refuse).
            details = exc.errors(include_url=False, include_context=False, include_input=False)
            raise BadRequest(validation_message(exc), details=details) from None
        if params.net_target is not None:
            try:
                self.net_allow.check_url(params.net_target)
            except EgressError as exc:
                raise BadRequest(str(exc)) from None
            if own is not None and self.net_allow.is_self(params.net_target, *own):
                raise BadRequest(f"net_target {params.net_target} is this blocker itself (listening on {own[0]} port "
                                 f"{own[1]}); stream to another blocker's /sink")
        if params.disk_read_mbps or params.disk_write_mbps:
            self._check_free(params)
        return params

    def _check_free(self, p: LoadParams) -> None:
        """BadRequest when the scratch files would not fit beside DISK_FREE_MARGIN of free space: the read file is
        written unpaced, and a full disk fails every writer on the node, not only this load."""
        files = bool(p.disk_read_mbps) + bool(p.disk_write_mbps)
        try:
            usage = shutil.disk_usage(self.scratch_dir)
        except OSError:
            return  # no such directory: start() says so
        margin = int(usage.total * DISK_FREE_MARGIN)
        if files * p.disk_file_mib * 2**20 > usage.free - margin:
            raise BadRequest(f"disk_file_mib={p.disk_file_mib} needs {files * p.disk_file_mib} MiB for {files} scratch "
                             f"file(s) in {self.scratch_dir}, which has {usage.free // 2**20} MiB free of which "
                             f"{margin // 2**20} MiB ({DISK_FREE_MARGIN:.0%} of the filesystem) stay free; ask for a "
                             "smaller disk_file_mib")

    def _build(self, p: LoadParams) -> dict[str, Load]:
        loads: dict[str, Load] = {}
        if p.cpu_m:
            loads["cpu"] = CpuLoad(p.cpu_m, p.duration_s)
        if p.memory_mib:
            loads["memory"] = MemoryLoad(p.memory_mib, p.duration_s)
        if p.disk_read_mbps or p.disk_write_mbps:
            loads["disk"] = DiskLoad(p.disk_read_mbps, p.disk_write_mbps, p.disk_file_mib, p.duration_s, self.scratch_dir)
        if p.net_mbps:
            assert p.net_target is not None
            loads["network"] = NetworkLoad(p.net_mbps, p.net_target, p.duration_s, self.net_allow)
        return loads

    def start(self, body: Any, own: tuple[str, int] | None = None) -> dict[str, Any]:
        params = self.parse(body, own)
        with self._lock:
            if self._run is not None:
                raise BadRequest("a load is already running; POST /stop first", status=409)
            run = _Run(params, self._build(params))
            started: list[Load] = []
            try:
                for load in run.loads.values():
                    started.append(load)  # before start(): one that fails half started (a worker forked, the
                    load.start()  # next refused) is stopped too (a review: its workers spun on, unreachable)
            except Exception as exc:
                for load in started:
                    load.stop()
                if isinstance(exc, OSError):  # e.g. an unwritable --scratch-dir: say so instead of a bare 500
                    raise BadRequest(f"could not start the load: {exc}", status=500) from exc
                raise
            self._run = run
        threading.Thread(target=self._watch, args=(run,), name="blocker-watchdog", daemon=True).start()
        return self.status()

    def _watch(self, run: _Run) -> None:
        if not run.stopped.wait(max(0.0, run.deadline - time.monotonic())):
            self._finish(run, COMPLETED)

    def _finish(self, run: _Run, reason: str) -> None:
        with self._lock:
            if self._run is not run:
                return
            run.stopped.set()
            for load in run.loads.values():
                load.stop()
            if reason == COMPLETED and any(load.stats().get("error") for load in run.loads.values()):
                reason = FAILED  # a thread that died must not read as a load that ran its course
            run.end_reason = reason
            run.ended_at = time.time()
            self._last = self._describe(run)
            self._run = None

    def stop(self, reason: str = "stopped by request") -> dict[str, Any]:
        run = self._run
        if run is not None:
            self._finish(run, reason)
        return self.status()

    def shutdown(self) -> None:
        """Stop everything: the run and any /stream responses. Called at server exit."""
        self.streams.set()
        self.stop("server shutting down")

    def _describe(self, run: _Run) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "params": run.params.model_dump(exclude_defaults=True),
            "started_at": run.started_at,
            "elapsed_s": round(now - run.started, 3),
            "remaining_s": round(max(0.0, run.deadline - now), 3) if run.end_reason is None else 0.0,
            "end_reason": run.end_reason,
            "loads": {k: v.stats() for k, v in run.loads.items()},
        }

    def status(self) -> dict[str, Any]:
        run = self._run
        out: dict[str, Any] = {"kind": self.kind, "state": "running" if run else "idle"}
        if run is not None:
            out["run"] = self._describe(run)
        if self._last is not None:
            out["last_run"] = self._last
        if self.kind in ("network", "combined"):
            out["stream_bytes"] = self.stream_bytes[0]
            out["sink_bytes"] = self.sink_bytes
        return out


def error_response(message: str, status: int = 400, details: Any = None) -> tuple[Response, int]:
    body: dict[str, Any] = {"error": message}
    if details is not None:
        body["details"] = details
    return jsonify(body), status


def _busy() -> tuple[Response, int]:
    resp, code = error_response("too many /stream and /sink requests at once; retry later", 429)
    resp.headers["Retry-After"] = "1"
    return resp, code


def _own_address() -> tuple[str, int] | None:
    """The address the serving socket is bound to (werkzeug's server puts it in the environ), None if unknown."""
    try:
        return str(request.environ["SERVER_NAME"]), int(request.environ["SERVER_PORT"])
    except (KeyError, ValueError):
        return None


def create_app(service: BlockerService) -> Flask:
    app = Flask(f"joulesched-{service.kind}-blocker")
    app.config["MAX_CONTENT_LENGTH"] = MAX_CONTENT_LENGTH

    @app.errorhandler(BadRequest)
    def _bad(exc: BadRequest):
        return error_response(str(exc), exc.status, exc.details)

    @app.get("/healthz")
    def healthz():
        return jsonify(status="ok", kind=service.kind)

    @app.get("/status")
    def status():
        return jsonify(service.status())

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc: RequestEntityTooLarge):
        return error_response(f"body is over the {request.max_content_length}-byte limit", 413)

    @app.post("/start")
    def start():
        if not request.is_json:
            raise BadRequest("body must be JSON (Content-Type: application/json)")
        try:
            body = json.loads(request_body())
        except RecursionError:  # '[' * 60000 fits in the body cap
            raise BadRequest("body must be a JSON object (this one nests too deeply to read)") from None
        except ValueError:
            raise BadRequest("body must be JSON (Content-Type: application/json)") from None
        return jsonify(service.start(body, _own_address())), 202

    @app.post("/stop")
    def stop():
        return jsonify(service.stop())

    if service.kind in ("network", "combined"):

        @app.get("/stream")
        def stream():
            try:
                q = StreamParams.model_validate(request.args.to_dict())
            except ValidationError as exc:
                raise BadRequest(validation_summary(exc, root="query")) from None
            if not service.stream_slots.acquire(blocking=False):
                return _busy()
            released = []

            def release() -> None:  # once, whether the stream ended, failed or was never started
                if not released:
                    released.append(True)
                    service.stream_slots.release()

            gen = paced_stream(q.mbps, q.seconds, service.streams, service.stream_bytes)
            resp = Response(gen, mimetype="application/octet-stream")
            resp.call_on_close(release)
            return resp

        @app.post("/sink")
        def sink():
            if not service.stream_slots.acquire(blocking=False):
                return _busy()
            try:
                # A sink swallows streams by design: the most one load can send, bounded in count by max_streams,
                # for as long as the load lasts (each read is still bounded by the server's timeout).
                request.max_content_length = SINK_MAX_BYTES
                lift_deadline(request.environ)
                got = 0
                while True:
                    block = request.stream.read(1 << 16)
                    if not block:
                        break
                    got += len(block)
                    service.sink_bytes += len(block)
                return jsonify(received=got)
            finally:
                service.stream_slots.release()

    return app
