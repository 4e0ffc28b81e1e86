"""Every blocker knob in one place: defaults, limits and the pydantic models that enforce them.

Units: millicores (1000 = one core busy), MiB (2**20 bytes) of memory, MB/s (10**6 bytes/s, as dd and
iostat count) of disk, Mbit/s (10**6 bits/s) of network, seconds of duration.
"""

from __future__ import annotations

import math
import os
from typing import Annotated, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from joulesched.core.net import check_http_url as check_url
from joulesched.workloads import cgroup
from joulesched.workloads.pacing import DISK_CHUNK, NET_CHUNK, chunk_size

KINDS = ("cpu", "memory", "disk", "network", "combined")
Kind = Literal["cpu", "memory", "disk", "network", "combined"]

MAX_DURATION_S = 3600.0
"""Hard cap on any load: a forgotten blocker stops within the hour."""
MAX_DISK_MBPS = 4000.0
MAX_NET_MBPS = 100_000.0
MAX_DISK_FILE_MIB = 4096
MEMORY_HEADROOM = 0.9
"""A memory request may take at most this share of what is available, so the blocker is not the one OOM-killed."""
MB = 10**6


def cpu_capacity_m() -> int:
    """Millicores this process may run on: its CPU affinity, or its cgroup's CPU quota where that is lower."""
    quota = cgroup.cpu_quota_m()
    cores = len(os.sched_getaffinity(0)) * 1000
    return cores if quota is None else min(cores, quota)


def memory_capacity_mib() -> int:
    """MiB a memory load may take: MEMORY_HEADROOM of the host's MemAvailable or of what the cgroup's limit
    leaves, whichever is less (a container sees the host's MemAvailable but is OOM-killed at its limit)."""
    available = psutil.virtual_memory().available
    left = cgroup.memory_available()
    if left is not None:
        available = min(available, left)
    return int(available * MEMORY_HEADROOM) // 2**20


def _ceil3(x: float) -> float:
    """x rounded up to three significant digits: a least value that, quoted back, still passes."""
    step = 10 ** (math.floor(math.log10(x)) - 2)
    return math.ceil(x / step) * step


def check_moves_a_chunk(field: str, value: float, unit_bytes: float, unit: str, seconds: float,
                        chunk: tuple[int, int]) -> None:
    """ValueError when ``value`` (bytes/s = value x unit_bytes) cannot move one transfer of its size within
    ``seconds``: the token bucket would wait past the end, or longer than any wait the platform can time."""
    rate = value * unit_bytes
    n = chunk_size(rate, *chunk)
    if value <= 0 or rate * seconds >= n:
        return
    if n == chunk[0]:
        raise ValueError(f"{field}={value:g} {unit} is too slow to move one {n}-byte transfer in {seconds:g} s; ask "
                         f"for at least {_ceil3(n / seconds / unit_bytes):g} {unit} or a longer duration")
    raise ValueError(f"{field}={value:g} {unit} moves {n}-byte transfers, one every {n / rate:.3g} s: more than the "
                     f"{seconds:g} s it would last")


Duration = Annotated[float, Field(gt=0, le=MAX_DURATION_S, description="seconds the load runs before it stops itself")]


class _Strict(BaseModel):
    # strict: "500" is not 500 and true is not 1; extra="forbid": a misspelt knob is an error, not a no-op.
    model_config = ConfigDict(extra="forbid", strict=True)


class LoadParams(_Strict):
    """One start request. Fields left at 0 / None are loads not started."""

    duration_s: Duration
    cpu_m: int = Field(0, ge=0, description="millicores to hold busy, spread over ceil(cpu_m/1000) processes")
    memory_mib: int = Field(0, ge=0, description="MiB to allocate, touch and hold")
    disk_read_mbps: float = Field(0.0, ge=0, le=MAX_DISK_MBPS, description="MB/s read from a scratch file")
    disk_write_mbps: float = Field(0.0, ge=0, le=MAX_DISK_MBPS, description="MB/s written (and synced)")
    disk_file_mib: int = Field(64, ge=1, le=MAX_DISK_FILE_MIB, description="scratch file size; I/O wraps around")
    net_mbps: float = Field(0.0, ge=0, le=MAX_NET_MBPS, description="Mbit/s sent to net_target")
    net_target: str | None = Field(None, description="http(s) URL that accepts a streamed POST, e.g. another blocker's /sink")

    @field_validator("cpu_m")
    @classmethod
    def _cpu_fits(cls, v: int) -> int:
        cap = cpu_capacity_m()
        if v > cap:
            raise ValueError(f"cpu_m={v} exceeds the {cap}m this process can run on")
        return v

    @field_validator("memory_mib")
    @classmethod
    def _memory_fits(cls, v: int) -> int:
        cap = memory_capacity_mib()
        if v > cap:
            raise ValueError(f"memory_mib={v} exceeds {cap} MiB ({MEMORY_HEADROOM:.0%} of the memory available to "
                             "this process, its cgroup's limit included)")
        return v

    @field_validator("net_target")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        return check_url(v, "net_target")  # a port out of 1..65535 too, which urlsplit leaves for connect to find

    @model_validator(mode="after")
    def _consistent(self) -> "LoadParams":
        if self.net_mbps > 0 and self.net_target is None:
            raise ValueError("net_mbps needs net_target (the URL the stream is POSTed to)")
        if not any((self.cpu_m, self.memory_mib, self.disk_read_mbps, self.disk_write_mbps, self.net_mbps)):
            raise ValueError("nothing to do: set at least one of cpu_m, memory_mib, disk_*_mbps, net_mbps")
        for name in ("disk_read_mbps", "disk_write_mbps"):
            check_moves_a_chunk(name, getattr(self, name), MB, "MB/s", self.duration_s, DISK_CHUNK)
        check_moves_a_chunk("net_mbps", self.net_mbps, MB / 8, "Mbit/s", self.duration_s, NET_CHUNK)
        return self


# Which fields each single-kind app accepts; the combined app accepts them all.
KIND_FIELDS: dict[str, frozenset[str]] = {
    "cpu": frozenset({"duration_s", "cpu_m"}),
    "memory": frozenset({"duration_s", "memory_mib"}),
    "disk": frozenset({"duration_s", "disk_read_mbps", "disk_write_mbps", "disk_file_mib"}),
    "network": frozenset({"duration_s", "net_mbps", "net_target"}),
    "combined": frozenset(LoadParams.model_fields),
}


class StreamParams(BaseModel):
    """Query of GET /stream; lax because query strings are text."""

    model_config = ConfigDict(extra="forbid")
    mbps: float = Field(gt=0, le=MAX_NET_MBPS)
    seconds: float = Field(gt=0, le=MAX_DURATION_S)

    @model_validator(mode="after")
    def _moves_a_chunk(self) -> "StreamParams":
        check_moves_a_chunk("mbps", self.mbps, MB / 8, "Mbit/s", self.seconds, NET_CHUNK)
        return self
