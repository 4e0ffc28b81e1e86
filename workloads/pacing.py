"""Token-bucket pacing shared by the disk and network blockers."""

from __future__ import annotations

import threading
import time
from typing import Callable

#: (smallest, largest) transfer of the disk blocker, and of the network blocker and ``GET /stream``.
DISK_CHUNK = (4096, 1 << 20)
NET_CHUNK = (1024, 64 << 10)
#: A load that ran at least SHORTFALL_MIN_S and moved less than SHORTFALL of the rate asked failed (the pacing's
#: start-up, a reconnect's pause and the last partial chunk stay well inside the margin).
SHORTFALL, SHORTFALL_MIN_S = 0.8, 2.0


def shortfall(done_bytes: int, active_s: float, rate: float) -> float | None:
    """The rate reached (bytes/s) where it fell short of SHORTFALL x ``rate`` over at least SHORTFALL_MIN_S of
    pacing, else None (too short a run to judge, or the rate was kept)."""
    if active_s < SHORTFALL_MIN_S:
        return None
    got = done_bytes / active_s
    return got if got < SHORTFALL * rate else None


class TokenBucket:
    """Paces byte transfers to `rate` bytes/s.

    Debt-style: `reserve(n)` takes n tokens at once (the balance may go negative) and returns how long to
    wait before the next transfer. The balance never exceeds `burst`, so a worker that fell behind (slow
    disk) does not catch up later with a burst above the asked rate.

    :param rate: bytes per second, > 0.
    :param burst: largest credit that may accumulate, in bytes; defaults to 100 ms worth.
    :param clock: monotonic seconds; injected by tests.
    """

    rate: float
    burst: float

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic):
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = rate
        self.burst = burst if burst is not None else rate * 0.1
        self._clock = clock
        self._tokens = 0.0
        self._last = clock()

    def reserve(self, n: int) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= n
        return max(0.0, -self._tokens / self.rate)

    def take(self, n: int, stop: threading.Event, until: float | None = None) -> bool:
        """Reserve n tokens and wait for them; False when `stop` was set meanwhile, or when the tokens would come
        only at or after `until` (on `clock`): then it waits until `until`, so a slow rate cannot hold a load or a
        stream past its end (nor ask threading for a wait longer than it can time)."""
        wait = self.reserve(n)
        if until is not None and wait >= until - self._clock():
            stop.wait(max(0.0, until - self._clock()))
            return False
        if wait > 0:
            return not stop.wait(wait)
        return not stop.is_set()


def chunk_size(rate: float, lo: int = DISK_CHUNK[0], hi: int = DISK_CHUNK[1]) -> int:
    """Transfer size for a byte rate: about 20 transfers a second, page-aligned, within [lo, hi]."""
    size = int(rate / 20) // 4096 * 4096
    return max(lo, min(hi, size))
