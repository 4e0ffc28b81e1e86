"""What a load run reports, the same for every driver: request count, errors, throughput, latency percentiles."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable
from urllib.parse import urlsplit

import numpy as np
from pydantic import BaseModel

from joulesched.core.errors import JouleschedError


class DriverError(JouleschedError, RuntimeError):
    """A load driver could not run or produced no results; the message says what to fix."""


def check_url(url: str, option: str = "--target") -> str:
    """`url` if it is http(s) with a host, else ValueError with a one-line reason naming `option`."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{option} {url!r}: expected http(s)://HOST[:PORT][/PATH]")
    try:
        port = u.port  # urllib raises on a port out of range, or one that is no number, only when asked
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{option} {url!r}: the port must be a number in 1..65535")
    return url


@dataclass(frozen=True)
class Sample:
    """One request as the load tool saw it."""

    start_ms: float  # epoch milliseconds
    elapsed_ms: float
    ok: bool


class Latency(BaseModel):
    """Milliseconds over all requests (failed ones too: a timeout is latency the user felt)."""

    min: float
    mean: float
    p50: float
    p95: float
    p99: float
    max: float


class LoadResult(BaseModel):
    tool: str
    target: str
    requests: int
    errors: int
    error_rate: float
    """errors / requests, 0..1"""
    duration_s: float
    """first request start to last request end"""
    throughput_rps: float
    latency_ms: Latency
    wall_s: float = 0.0
    """the tool's whole run, start-up included"""


def summarise(samples: Iterable[Sample], tool: str, target: str, wall_s: float = 0.0) -> LoadResult:
    s = list(samples)
    if not s:
        raise DriverError(f"{tool} recorded no requests against {target}; is the target up and the path right?")
    elapsed = np.array([x.elapsed_ms for x in s], dtype=float)
    first = min(x.start_ms for x in s)
    last = max(x.start_ms + x.elapsed_ms for x in s)
    duration = max((last - first) / 1000, 1e-3)
    errors = sum(not x.ok for x in s)
    p50, p95, p99 = np.percentile(elapsed, [50, 95, 99])  # linear interpolation between ranks
    return LoadResult(
        tool=tool,
        target=target,
        requests=len(s),
        errors=errors,
        error_rate=errors / len(s),
        duration_s=round(duration, 3),
        throughput_rps=round(len(s) / duration, 3),
        latency_ms=Latency(
            min=float(elapsed.min()),
            mean=round(float(elapsed.mean()), 3),
            p50=float(p50),
            p95=float(p95),
            p99=float(p99),
            max=float(elapsed.max()),
        ),
        wall_s=round(wall_s, 3),
    )


def read_csv_samples(path: Path, start: str, elapsed: str, ok: str) -> list[Sample]:
    """Samples from a CSV with a header row, naming the start, elapsed and success columns."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {start, elapsed, ok} - set(reader.fieldnames or [])
        if missing:
            raise DriverError(f"{path} lacks column(s) {', '.join(sorted(missing))}; header: {reader.fieldnames}")
        return [
            Sample(float(r[start]), float(r[elapsed]), r[ok].strip().lower() == "true")
            for r in reader
            if r.get(start)
        ]


def format_table(r: LoadResult) -> str:
    lat = r.latency_ms
    rows = [
        ("tool", r.tool),
        ("target", r.target),
        ("requests", str(r.requests)),
        ("errors", f"{r.errors} ({r.error_rate:.2%})"),
        ("throughput", f"{r.throughput_rps:.1f} req/s over {r.duration_s:.1f} s"),
        ("latency ms", f"p50 {lat.p50:.1f}  p95 {lat.p95:.1f}  p99 {lat.p99:.1f}  mean {lat.mean:.1f}  max {lat.max:.1f}"),
    ]
    return "\n".join(f"{k:<11} {v}" for k, v in rows)
