"""CPU blocker: hold an exact number of millicores with duty-cycled worker processes.

Processes, not threads: under the GIL a Python thread pool tops out at one core (the seed's bug).
The load is spread evenly, ceil(m/1000) workers each at m/(1000*n) duty, so 1500m is two workers at 75%.
Each worker steers by its own CPU time (CLOCK_PROCESS_CPUTIME_ID), not wall time, so preemption by
other tasks is made up within the next period instead of silently lowering the load.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from typing import Any

PERIOD_S = 0.1
"""Duty-cycle period: short enough that a 1 s sample sees a steady rate, long enough that sleeps are accurate."""

# fork: the worker needs nothing but the time module, and a spawned child would re-import the CLI.
_CTX = mp.get_context("fork")


def split_millicores(millicores: int) -> list[float]:
    """Duty fractions of the workers that together hold `millicores` (even spread)."""
    if millicores <= 0:
        return []
    n = math.ceil(millicores / 1000)
    return [millicores / (1000 * n)] * n


def _spin(duty: float, duration_s: float, stop: Any, parent: int) -> None:
    """Worker body: busy until CPU time catches up with duty x elapsed, sleep the rest of each period."""
    t0 = time.monotonic()
    c0 = time.process_time()
    end = t0 + duration_s
    while not stop.is_set() and os.getppid() == parent:  # a dead parent means nobody will stop us
        now = time.monotonic()
        if now >= end:
            break
        target = c0 + duty * (now - t0 + PERIOD_S)
        cap = now + PERIOD_S
        while time.process_time() < target and time.monotonic() < cap:
            pass
        rest = now + PERIOD_S - time.monotonic()
        if rest > 0:
            stop.wait(rest)


class CpuLoad:
    """`millicores` of busy CPU for `duration_s`, in child processes that `stop()` ends."""

    def __init__(self, millicores: int, duration_s: float):
        self.millicores = millicores
        self.duration_s = duration_s
        self._stop = _CTX.Event()
        self._procs: list[mp.process.BaseProcess] = []
        self.error: str | None = None  # a worker that ended early

    def start(self) -> None:
        parent = os.getpid()
        for duty in split_millicores(self.millicores):
            p = _CTX.Process(target=_spin, args=(duty, self.duration_s, self._stop, parent), daemon=True)
            p.start()
            self._procs.append(p)

    def stop(self) -> None:
        self._stop.set()
        # A worker that ended by itself before the stop (killed, OOM) delivered less than asked: the run failed.
        died = [p for p in self._procs if not p.is_alive() and p.exitcode not in (None, 0)]
        for p in self._procs:
            p.join(timeout=2 * PERIOD_S + 1)
            if p.is_alive():
                p.kill()
                p.join(timeout=1)
        if died and self.error is None:
            self.error = (f"{len(died)} of {len(self._procs)} CPU workers ended early (exit codes "
                          f"{', '.join(str(p.exitcode) for p in died)}): less CPU than asked")

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def stats(self) -> dict[str, Any]:
        return {
            "millicores": self.millicores,
            "workers": [{"pid": p.pid, "alive": p.is_alive(), "exitcode": p.exitcode} for p in self._procs],
            "error": self.error,
        }
