"""What a load run reports, the same for every driver: request count, errors, throughput, latency percentiles."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
from pydantic import BaseModel

from joulesched.core.errors import JouleschedError


class DriverError(JouleschedError, RuntimeError):
    """A load driver could not run or produced no results; the message says what to fix."""


def remove_stale(*paths: Path) -> None:
    """Remove a previous run's outputs before a run, so that a reused --workdir cannot mix them into this one's
    (JMeter appends to an existing results file; a tool that fails early would leave the old file to be read).
    DriverError when one cannot be removed."""
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError as exc:  # a directory of that name, a read-only folder
            raise DriverError(f"cannot remove the previous run's {p}: {exc.strerror or exc}") from None


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
    """Samples from a CSV with a header row, naming the start, elapsed and success columns.

    Every row must be whole in those columns: start and elapsed in milliseconds (finite and not negative; start
    since the epoch, as JMeter's timestamp_format=ms writes it) and success ``true`` or ``false``. Anything else (a
    row cut short by a killed tool, a date for a timestamp, a quote left open, bytes that are not UTF-8) is a
    DriverError naming the file, the line and the field, never a traceback or a silently wrong number: a file cut
    off mid-row is a run to repeat, not one to summarise. Blank lines are skipped.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DriverError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DriverError(f"{path} line {line}: not UTF-8 text (byte {data[exc.start]:#04x})") from None
    # strict: a quote left open is an error at the end of the file, not the rest of the file read as one field.
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    samples = []
    try:
        header = next(reader, None) or []
        missing = {start, elapsed, ok} - set(header)
        if missing:
            raise DriverError(f"{path} lacks column(s) {', '.join(sorted(missing))}; header: {header or '(none)'}")
        col = {name: header.index(name) for name in (start, elapsed, ok)}
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            cells = {}
            for name, i in col.items():
                if i >= len(row):
                    raise DriverError(f"{path} line {line}: no {name} field (the row has {len(row)} of the header's "
                                      f"{len(header)}; cut short?)")
                cells[name] = row[i]
            samples.append(Sample(_millis(path, line, start, cells[start], " since the epoch"),
                                  _millis(path, line, elapsed, cells[elapsed]), _success(path, line, ok, cells[ok])))
    except csv.Error as exc:
        raise DriverError(f"{path} line {reader.line_num}: not readable as CSV ({exc})") from None
    return samples


#: No timestamp or latency in milliseconds comes near it (it is some 30,000 years); numbers past it are no sample,
#: and their sums would overflow the mean to a silent null.
MAX_MILLIS = 1e15
_DECIMAL = re.compile(r"\s*[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?\s*\Z")  # float() would also take "1_0" and "١٢"


def _millis(path: Path, line: int, field: str, text: str, since: str = "") -> float:
    if not _DECIMAL.match(text):
        raise DriverError(f"{path} line {line}: {field} {text!r} is not a number of milliseconds{since}")
    v = float(text)
    if not 0 <= v <= MAX_MILLIS:
        raise DriverError(f"{path} line {line}: {field} {text!r} is not a number of milliseconds in 0..1e15")
    return v


def _success(path: Path, line: int, field: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise DriverError(f"{path} line {line}: {field} {text!r} is neither true nor false")
    return value == "true"


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
