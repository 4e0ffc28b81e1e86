"""Memory blocker: allocate, touch and hold a number of MiB, then give it back to the OS.

Memory comes from anonymous mmap chunks rather than bytearray: `munmap` on release returns it to the
kernel at once, whereas malloc'd memory may stay in the allocator's arenas. Every page is written once
(numpy strided write, one byte per 4 KiB page) so the kernel really backs it: RSS rises by the request.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from joulesched.workloads.params import memory_capacity_mib

CHUNK_MIB = 64
PAGE = mmap.PAGESIZE


class MemoryLoad:
    """Hold `mib` MiB resident for `duration_s`; `stop()` releases it.

    What is still to allocate is checked against ``capacity_mib()`` (the headroom the request was validated
    against) before each chunk, so that memory another process took since the request was accepted (a second
    blocker started at the same time) stops the allocation with an error instead of exhausting the host. A load
    that ends holding less than it was asked for reports why in ``error``."""

    def __init__(self, mib: int, duration_s: float, capacity_mib: Callable[[], int] = memory_capacity_mib):
        self.mib = mib
        self.duration_s = duration_s
        self._capacity = capacity_mib
        self._stop = threading.Event()
        self._chunks: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.allocated_mib = 0
        self.released = False
        self.error: str | None = None

    def start(self) -> None:
        # Allocating gigabytes takes seconds; do it off the request thread.
        self._thread = threading.Thread(target=self._run, name="memory-blocker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        end = time.monotonic() + self.duration_s
        try:
            self._allocate()
        except Exception as exc:  # hold what we got and say why the rest is missing
            self.error = f"{type(exc).__name__}: {exc}"
        self._stop.wait(max(0.0, end - time.monotonic()))
        self._release()

    def _allocate(self) -> None:
        left = self.mib
        while left > 0 and not self._stop.is_set():
            size = min(CHUNK_MIB, left)
            cap = self._capacity()
            if left > cap + CHUNK_MIB:  # a chunk of slack: MemAvailable moves by itself (page cache, other work)
                raise MemoryError(f"stopped at {self.allocated_mib} of {self.mib} MiB: only {cap} MiB can still be "
                                  "taken (something else took memory since the load was accepted)")
            chunk = mmap.mmap(-1, size * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            view = np.frombuffer(chunk, dtype=np.uint8)
            view[::PAGE] = 1
            del view  # an exported buffer would make chunk.close() fail
            with self._lock:
                self._chunks.append(chunk)
                self.allocated_mib += size
            left -= size

    def _release(self) -> None:
        with self._lock:
            for chunk in self._chunks:
                chunk.close()
            self._chunks.clear()
            self.released = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._release()
        if self.error is None and self.allocated_mib < self.mib:
            self.error = (f"held {self.allocated_mib} of {self.mib} MiB: the allocation had not finished when the "
                          "load ended")

    def stats(self) -> dict[str, Any]:
        return {"requested_mib": self.mib, "allocated_mib": self.allocated_mib, "released": self.released, "error": self.error}
