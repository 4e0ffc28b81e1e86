"""Disk blocker: read and write a scratch file at given MB/s.

Writes are paced by a token bucket and each chunk is `fdatasync`ed, so the bytes reach the device at the
asked rate instead of piling up as dirty page cache that the kernel flushes later in bursts. After each
chunk the pages are dropped with posix_fadvise(DONTNEED); reads drop their range before reading, so they
come from the device, not the cache. O_DIRECT would do the same more strictly but needs aligned buffers and
is refused by tmpfs and some overlay setups; fadvise works everywhere and degrades to cached I/O at worst.
The scratch directory is created at start and removed at stop. No wait for tokens outlasts the load's end, and an
error that ends a worker is kept in the stats, as is a device that could not keep up (under 80 % of the rate
asked over the paced time: the blocker did not make the load it was asked for).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from joulesched.workloads.pacing import TokenBucket, chunk_size, shortfall

MB = 10**6


class DiskLoad:
    """Pace reads and writes against a scratch file under `scratch_dir` for `duration_s`."""

    def __init__(self, read_mbps: float, write_mbps: float, file_mib: int, duration_s: float, scratch_dir: Path):
        self.read_mbps = read_mbps
        self.write_mbps = write_mbps
        self.file_bytes = file_mib * 2**20
        self.duration_s = duration_s
        self.scratch_dir = Path(scratch_dir)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._dir: Path | None = None
        self.bytes_written = 0
        self.bytes_read = 0
        self.prefill_bytes = 0
        self.error: str | None = None
        self._end = 0.0
        self._began: dict[str, float] = {}  # when each direction's pacing started (reads: after the prefill)

    def start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="joulesched-disk-", dir=self.scratch_dir))
        end = self._end = time.monotonic() + self.duration_s
        if self.write_mbps > 0:
            self._spawn(self._write_loop, self._dir / "write.bin", end)
        if self.read_mbps > 0:
            self._spawn(self._read_loop, self._dir / "read.bin", end)

    def _spawn(self, fn, path: Path, end: float) -> None:
        t = threading.Thread(target=self._guard, args=(fn, path, end), name=fn.__name__, daemon=True)
        t.start()
        self._threads.append(t)

    def _guard(self, fn, path: Path, end: float) -> None:
        try:
            fn(path, end)
        except Exception as exc:  # a full or read-only disk (or anything else) ends this load, visibly, not silently
            self.error = f"{type(exc).__name__}: {exc}"

    def _write_loop(self, path: Path, end: float) -> None:
        rate = self.write_mbps * MB
        n = min(chunk_size(rate), self.file_bytes)
        buf = os.urandom(n)  # incompressible, so thin-provisioned or compressing storage sees every byte
        size = self.file_bytes - self.file_bytes % n
        bucket = TokenBucket(rate, burst=n)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            off = 0
            self._began["write"] = time.monotonic()
            while time.monotonic() < end and bucket.take(n, self._stop, until=end):
                written = os.pwrite(fd, buf, off)
                os.fdatasync(fd)
                os.posix_fadvise(fd, off, written, os.POSIX_FADV_DONTNEED)
                self.bytes_written += written
                off = (off + written) % size
        finally:
            os.close(fd)

    def _read_loop(self, path: Path, end: float) -> None:
        rate = self.read_mbps * MB
        n = min(chunk_size(rate), self.file_bytes)
        size = self.file_bytes - self.file_bytes % n
        # The file to read is filled once, unpaced, before pacing starts (counted apart in stats).
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            block = os.urandom(n)
            for off in range(0, size, n):
                if self._stop.is_set():
                    return
                os.pwrite(fd, block, off)
            os.fdatasync(fd)
            self.prefill_bytes = size
            bucket = TokenBucket(rate, burst=n)
            off = 0
            self._began["read"] = time.monotonic()
            while time.monotonic() < end and bucket.take(n, self._stop, until=end):
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
                got = len(os.pread(fd, n, off))
                self.bytes_read += got
                off = (off + n) % size
        finally:
            os.close(fd)

    def stop(self) -> None:
        stopped = time.monotonic()
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        for way, done, mbps in (("wrote", self.bytes_written, self.write_mbps), ("read", self.bytes_read,
                                                                                  self.read_mbps)):
            began = self._began.get("write" if way == "wrote" else "read")
            got = shortfall(done, min(stopped, self._end) - began, mbps * MB) if began is not None else None
            if self.error is None and got is not None:  # the device (or a neighbour's I/O) could not carry it
                self.error = f"{way} {got / MB:.1f} MB/s of the {mbps:g} asked in {self.scratch_dir}"
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def stats(self) -> dict[str, Any]:
        return {
            "read_mbps": self.read_mbps,
            "write_mbps": self.write_mbps,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "prefill_bytes": self.prefill_bytes,
            "scratch_dir": str(self._dir) if self._dir else None,
            "error": self.error,
        }
