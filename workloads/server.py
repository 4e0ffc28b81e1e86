"""Run a Flask app on werkzeug's threaded server in this process, and clean up on every way out.

The server is werkzeug's with joulesched's hardened base in front (:mod:`joulesched.core.httpd`): a socket
timeout, a bounded number of connection threads, ``Content-Length`` checked before the app sees the request.
Body sizes are the app's to cap (``MAX_CONTENT_LENGTH``, :data:`MAX_CONTENT_LENGTH` by default), so a
streaming endpoint such as the blockers' ``/sink`` can opt out on purpose.
"""

from __future__ import annotations

import atexit
import logging
import signal
import sys
from typing import Callable

from flask import Flask, request
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from joulesched.core.httpd import HardenedHandlerMixin, HardenedServerMixin, Limits

#: Default request body cap of every workload app (Flask's MAX_CONTENT_LENGTH): their bodies are small JSON.
MAX_CONTENT_LENGTH = 1 << 20
#: Timeout and connection bound; bodies are capped by the apps (max_body=None), chunked bodies are decoded.
APP_LIMITS = Limits(timeout_s=30.0, max_connections=64, max_body=None, allow_chunked=True)


class _Handler(HardenedHandlerMixin, WSGIRequestHandler):
    app_reads_body = True  # the application reads wsgi.input; werkzeug deals with what it leaves


class HardenedWSGIServer(HardenedServerMixin, ThreadedWSGIServer):
    """werkzeug's threaded WSGI server under :class:`~joulesched.core.httpd.Limits`."""

    def __init__(self, host: str, port: int, app, limits: Limits = APP_LIMITS) -> None:
        self.limits = limits
        super().__init__(host, port, app, handler=_Handler)


def request_body() -> bytes:
    """The current request's body, at most its ``max_content_length`` bytes (the app's MAX_CONTENT_LENGTH), else
    RequestEntityTooLarge (413). werkzeug refuses a Content-Length over the cap itself, but cuts a chunked body
    at the cap without a word, so the cut JSON read as malformed (400)."""
    cap = request.max_content_length
    # Only a chunked body (the server decoded it and marked the input terminated) is read raw: a request with
    # neither length nor chunks has no body, and reading the socket would wait out the timeout for one.
    if request.content_length is not None or cap is None or not request.environ.get("wsgi.input_terminated"):
        return request.get_data(cache=False)
    raw = request.environ["wsgi.input"].read(cap + 1)
    if len(raw) > cap:
        raise RequestEntityTooLarge()
    return raw


def make_server(host: str, port: int, app: Flask, limits: Limits = APP_LIMITS) -> HardenedWSGIServer:
    """The hardened server for ``app``; an app without MAX_CONTENT_LENGTH gets :data:`MAX_CONTENT_LENGTH`."""
    if app.config.get("MAX_CONTENT_LENGTH") is None:
        app.config["MAX_CONTENT_LENGTH"] = MAX_CONTENT_LENGTH
    return HardenedWSGIServer(host, port, app, limits)


def serve(app: Flask, host: str, port: int, on_exit: Callable[[], None] = lambda: None, access_log: bool = False) -> None:
    """Serve until SIGINT/SIGTERM; `on_exit` runs exactly once whichever way the process leaves.

    Prints 'listening on http://HOST:PORT' (the real port when 0 was asked) as the first stdout line.
    """
    if not access_log:
        # One log line per request costs more than a small /work request under JMeter load.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    done = []

    def cleanup() -> None:
        if not done:
            done.append(True)
            on_exit()

    atexit.register(cleanup)

    def _term(signum, frame):  # SIGTERM (docker stop, kubelet) leaves through the same finally as Ctrl-C
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    server = make_server(host, port, app)
    shown = f"[{host}]" if ":" in host else host
    print(f"listening on http://{shown}:{server.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        cleanup()
        sys.stdout.flush()
