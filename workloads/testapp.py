"""The test app: bounded CPU work per request, the service whose latency the load drivers measure.

    GET /work?ms=N   burn N ms of CPU (0..MAX_WORK_MS) in the request thread, then answer
    GET /test        the same with the default work (the seed's JMeter plan hit /test)
    GET /healthz
"""

from __future__ import annotations

import time

from flask import Flask, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_WORK_MS = 1000
DEFAULT_WORK_MS = 10
#: The test app takes no body; anything larger is refused with 413.
MAX_CONTENT_LENGTH = 64 << 10


class WorkQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ms: float = Field(DEFAULT_WORK_MS, ge=0, le=MAX_WORK_MS, description="CPU milliseconds to burn")


def burn(ms: float) -> int:
    """Spin for `ms` of this thread's CPU time; returns the iteration count (so the loop is not optimised away)."""
    end = time.thread_time() + ms / 1000
    n = 0
    while time.thread_time() < end:
        n += 1
    return n


def create_app(default_ms: float = DEFAULT_WORK_MS) -> Flask:
    app = Flask("joulesched-testapp")
    app.config["MAX_CONTENT_LENGTH"] = MAX_CONTENT_LENGTH

    @app.get("/healthz")
    def healthz():
        return jsonify(status="ok", kind="testapp")

    def _work(args: dict[str, str]):
        try:
            q = WorkQuery.model_validate(args)
        except ValidationError as exc:
            msg = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            return jsonify(error=msg), 400
        t0 = time.perf_counter()
        n = burn(q.ms)
        return jsonify(ms=q.ms, iterations=n, wall_ms=round((time.perf_counter() - t0) * 1000, 3))

    @app.get("/work")
    def work():
        return _work(request.args.to_dict())

    @app.get("/test")
    def test():
        return _work({"ms": str(default_ms)} | request.args.to_dict())

    return app
