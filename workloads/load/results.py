"""What a load run reports, the same for every driver: request count, errors, throughput, latency percentiles."""

from __future__ import annotations

import csv
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from pydantic import BaseModel

from joulesched.core.errors import JouleschedError


class DriverError(JouleschedError, RuntimeError):
    """A load driver could not run or produced no results; the message says what to fix."""


def check_target(url: str, option: str = "--target") -> str:
    """``url`` if it is an http(s) URL (core/net.py's rules) without user-info; else DriverError. Credentials in a
    target would be printed, kept in the results and shown in ``ps``, and the drivers would not agree on them
    (JMeter drops them, Locust sends them as Basic auth)."""
    from urllib.parse import urlsplit

    from joulesched.core.net import check_http_url

    try:
        check_http_url(url, option)
    except ValueError as e:
        raise DriverError(str(e)) from None
    u = urlsplit(url)
    if u.username is not None or u.password is not None:
        raise DriverError(f"{option}: a URL with user-info (USER:PASSWORD@) is refused: it would be printed and kept "
                          "in the results; put the target behind no login or a proxy that adds it")
    return url


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


@dataclass(frozen=True)
class Samples:
    """Many requests, column-wise: a day's run at 1,000 req/s is 86 million rows, 17 bytes each here (a
    :class:`Sample` object per row would need tens of GB)."""

    start_ms: np.ndarray
    elapsed_ms: np.ndarray
    ok: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ms)

    def __iter__(self) -> Iterator[Sample]:
        for s, e, k in zip(self.start_ms.tolist(), self.elapsed_ms.tolist(), self.ok.tolist()):
            yield Sample(s, e, bool(k))


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


def summarise(samples: Samples | Iterable[Sample], tool: str, target: str, wall_s: float = 0.0) -> LoadResult:
    if not isinstance(samples, Samples):
        rows = list(samples)
        samples = Samples(np.array([x.start_ms for x in rows], dtype=float),
                          np.array([x.elapsed_ms for x in rows], dtype=float),
                          np.array([x.ok for x in rows], dtype=bool))
    n = len(samples)
    if not n:
        raise DriverError(f"{tool} recorded no requests against {target}; is the target up and the path right?")
    elapsed = samples.elapsed_ms
    first = float(samples.start_ms.min())
    last = float((samples.start_ms + elapsed).max())
    duration = max((last - first) / 1000, 1e-3)
    errors = int(n - np.count_nonzero(samples.ok))
    p50, p95, p99 = np.percentile(elapsed, [50, 95, 99])  # linear interpolation between ranks
    return LoadResult(
        tool=tool,
        target=target,
        requests=n,
        errors=errors,
        error_rate=errors / n,
        duration_s=round(duration, 3),
        throughput_rps=round(n / duration, 3),
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


def read_csv_samples(path: Path, start: str, elapsed: str, ok: str) -> Samples:
    """Samples from a CSV with a header row, naming the start, elapsed and success columns, read as a stream.

    Every row must be whole in those columns: start and elapsed in milliseconds (finite and not negative; start
    since the epoch, as JMeter's timestamp_format=ms writes it) and success ``true`` or ``false``. Anything else (a
    row cut short by a killed tool, a date for a timestamp, a quote left open, bytes that are not UTF-8) is a
    DriverError naming the file, the line and the field, never a traceback or a silently wrong number: a file cut
    off mid-row is a run to repeat, not one to summarise. Blank lines are skipped.
    """
    starts, lasts, oks = array("d"), array("d"), array("b")
    try:
        with open(path, "rb") as f:
            # strict: a quote left open is an error at the end of the file, not the rest read as one field.
            reader = csv.reader(_text_lines(f, path), strict=True)
            try:
                header = next(reader, None) or []
                missing = {start, elapsed, ok} - set(header)
                if missing:
                    raise DriverError(f"{path} lacks column(s) {', '.join(sorted(missing))}; "
                                      f"header: {header or '(none)'}")
                cols = [(name, header.index(name)) for name in (start, elapsed, ok)]
                for row in reader:
                    if not row:
                        continue
                    line = reader.line_num
                    cells = []
                    for name, i in cols:
                        if i >= len(row):
                            raise DriverError(f"{path} line {line}: no {name} field (the row has {len(row)} of the "
                                              f"header's {len(header)}; cut short?)")
                        cells.append(row[i])
                    starts.append(_millis(path, line, start, cells[0], " since the epoch"))
                    lasts.append(_millis(path, line, elapsed, cells[1]))
                    oks.append(_success(path, line, ok, cells[2]))
            except csv.Error as exc:
                raise DriverError(f"{path} line {reader.line_num}: not readable as CSV ({exc})") from None
    except OSError as exc:
        raise DriverError(f"cannot read {path}: {exc.strerror or exc}") from None
    return Samples(np.frombuffer(starts, dtype=np.float64), np.frombuffer(lasts, dtype=np.float64),
                   np.frombuffer(oks, dtype=np.int8).astype(bool))


def _text_lines(f, path: Path) -> Iterator[str]:
    """The file's lines as text, each decoded alone so that a byte that is not UTF-8 names its line."""
    for n, raw in enumerate(f, 1):
        try:
            yield raw.decode("utf-8-sig" if n == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise DriverError(f"{path} line {n}: not UTF-8 text (byte {raw[exc.start]:#04x})") from None


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
