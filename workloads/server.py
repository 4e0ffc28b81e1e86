"""Run a Flask app on werkzeug's threaded server in this process, and clean up on every way out."""

from __future__ import annotations

import atexit
import logging
import signal
import sys
from typing import Callable

from flask import Flask
from werkzeug.serving import make_server


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT' (or '[v6]:PORT') -> (host, port); port 0 picks a free one. ValueError if malformed."""
    host, sep, port_s = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"--listen {value!r}: port must be a number from 0 to 65535")
    return host, int(port_s)


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
    server = make_server(host, port, app, threaded=True)
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
