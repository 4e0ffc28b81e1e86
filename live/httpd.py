"""A small threaded HTTP server on a daemon thread, shared by the scheduler's status endpoint and the extender."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reply(handler: BaseHTTPRequestHandler, code: int, data: bytes, ctype: str) -> None:
    """Send a complete response with a Content-Length (keep-alive clients need it)."""
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class BackgroundHTTPServer:
    """``handler`` served on ``host:port`` (port 0 picks a free one) from a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str, port: int, name: str) -> None:
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
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
