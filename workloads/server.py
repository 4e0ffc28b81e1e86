"""Run a Flask app on werkzeug's threaded server in this process, and clean up on every way out."""

from __future__ import annotations

import atexit
import logging
import signal
import sys
from typing import Callable

from flask import Flask
from werkzeug.serving import make_server


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
