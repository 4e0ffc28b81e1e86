"""Log lines that cannot flood a log (WARNING by default): the first of each kind is written at once, then at
most one every ``interval_s`` per kind, saying how many were held back in between."""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """``warn(key, msg, *args)``: log ``msg`` at WARNING unless ``key`` was logged within ``interval_s``; a
    held-back line is counted, and the next one written says ``(N similar suppressed)``. Keys are few (an
    operation and a status code), so the table stays small; it is cleared when it passes ``max_keys``."""

    def __init__(self, logger: logging.Logger, interval_s: float = 30.0, max_keys: int = 256,
                 level: int = logging.WARNING) -> None:
        self.logger, self.interval_s, self.max_keys, self.level = logger, interval_s, max_keys, level
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def warn(self, key: str, msg: str, *args: object) -> bool:
        """True when the line was written."""
        now = time.monotonic()
        with self._lock:
            last, held = self._last.get(key, (-1e18, 0))
            if now - last < self.interval_s:
                self._last[key] = (last, held + 1)
                return False
            if len(self._last) >= self.max_keys:
                self._last.clear()
            self._last[key] = (now, 0)
        if held:
            msg += " (%d similar suppressed in the last %.0f s)"
            args = (*args, held, self.interval_s)
        self.logger.log(self.level, msg, *args)
        return True
