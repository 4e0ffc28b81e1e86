"""What every trace importer shares: streaming readers with line numbers and progress, typed cells whose
errors name the file, line and column, the usage aggregator, the window, and the node groups.

An importer streams its files line by line (``.gz`` read on the fly): its memory grows with the pods it keeps
and their usage steps, never with the size of the input. Everything it knows goes through :class:`PodSink`,
which works in *trace* seconds and converts to the twin's pod model (docs/twin.md, "Trace formats").
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from joulesched.cluster.scenario import NodeGroup, ScenarioError
from joulesched.cluster.workload import (
    DEFAULT_NAMESPACE,
    JOB,
    MAX_QUANTITY,
    NO_LIMIT,
    NO_REQUEST,
    SERVICE,
    PodBuilder,
    Workload,
)
from joulesched.core.errors import validation_summary

#: Progress callback: units done since the last call (bytes of input, or rows of a database).
Progress = Callable[[int], None]

DEFAULT_POWER_PROFILE = "ibm-x3550-m3-x5675"
#: The largest magnitude a cell may hold: beyond it a float no longer holds every integer, and a request
#: overflows the twin's 64-bit columns once converted (a corrupt cell, not a machine of 10^15 cores).
MAX_CELL = float(MAX_QUANTITY)


class TraceFormatError(ScenarioError):
    """A trace file is malformed, truncated or of another format; the message names the file, the line (or
    row) and the column."""


@dataclass(frozen=True)
class ImportOptions:
    """How to convert. ``None`` units mean the format's documented default (each module's ``DEFAULTS``)."""

    window: tuple[float, float] | None = None  # trace seconds [start, end); start becomes the twin's 0
    usage_step_s: float = 300.0
    cpu_unit_m: float | None = None  # millicores of a normalised CPU of 1.0 (Google, Alibaba 2023, Azure)
    memory_unit_mib: float | None = None  # MiB of a normalised memory of 1.0 (Alibaba 2018: of 100)
    usage_fraction: float = 0.5  # demand of a pod whose trace records no usage, as a fraction of its request
    power_profile: str = DEFAULT_POWER_PROFILE
    max_pods_per_node: int = 110
    machine_id: str | None = None  # Azure: the machine type the fractions are read against


@dataclass
class ImportResult:
    workload: Workload
    node_groups: list[dict]
    summary: dict = field(default_factory=dict)
    span: dict | None = None  # PodSink.span(): when the trace's pods come and go, and a suggested window


# ---- reading ----------------------------------------------------------------------------------------------
def where(path: Path, line: int, column: str | int | None = None) -> str:
    col = "" if column is None else f", column {column}"
    return f"{path}: line {line}{col}"


def fail(path: Path, line: int, column: str | int | None, problem: str) -> TraceFormatError:
    return TraceFormatError(f"{where(path, line, column)}: {problem}")


def text_lines(path: Path, progress: Progress | None) -> Iterator[str]:
    """The file's lines, decoded as UTF-8 (``.gz`` decompressed on the fly), reporting bytes read.

    A file that ends mid-stream, is not the gzip it claims to be, or is not UTF-8 raises
    :class:`TraceFormatError` naming the line where that was found.
    """
    try:
        raw = path.open("rb")
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read: {e.strerror or e}") from None
    with raw:
        gz = path.suffix == ".gz"
        fh = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        done = last = 0
        lineno = 0
        try:
            for lineno, b in enumerate(fh, start=1):
                try:
                    line = b.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a BOM (Excel's UTF-8) is no data
                except UnicodeDecodeError as e:
                    raise fail(path, lineno, e.start + 1, "not UTF-8 text (is this the right file?)") from None
                if progress is not None:
                    done = raw.tell() if gz else done + len(b)
                    if done - last >= 1 << 20:
                        progress(done - last)
                        last = done
                yield line
        except EOFError:
            raise fail(path, lineno + 1, None, "the file is truncated (the compressed stream ends early)") from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise fail(path, lineno + 1, None, f"not a valid gzip file ({e})") from None
        if progress is not None:
            progress((raw.tell() if gz else done) - last)


def csv_rows(path: Path, progress: Progress | None, columns: Sequence[str], *,
             header: bool | None = False) -> Iterator[tuple[int, list[str]]]:
    """``(line, cells)`` of a CSV whose columns are ``columns`` in this order.

    ``header``: False for the published headerless files (a header line is then an error at line 1, since it
    is not data), True to require a header naming exactly ``columns``, None to accept either. Every row must
    have exactly ``len(columns)`` cells: a short last line is how a truncated file shows itself.
    """
    reader = csv.reader(text_lines(path, progress))
    n = len(columns)
    first = True
    try:
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if first:
                first = False
                names = [c.strip() for c in row]
                if header is True or (header is None and names == list(columns)):
                    if names != list(columns):
                        raise fail(path, line, None, f"the header is {','.join(names)!s}; this table's columns are "
                                   f"{','.join(columns)} (is this the right file for the format?)")
                    continue
            if len(row) != n:
                raise fail(path, line, None, f"{len(row)} columns; this table has {n} ({','.join(columns)})"
                           + (" -- the file may be truncated" if len(row) < n else "")
                           + ("" if line > 1 else " (is this the right file for the format?)"))
            yield line, row
    except csv.Error as e:
        raise fail(path, reader.line_num, None, f"unreadable CSV: {e}") from None
    if first:
        raise TraceFormatError(f"{path}: empty file; expected rows of {','.join(columns)}")


def csv_dicts(path: Path, progress: Progress | None, required: Sequence[str],
              optional: Sequence[str] = ()) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, {column: cell})`` of a CSV with a header that names at least ``required``."""
    reader = csv.reader(text_lines(path, progress))
    header: list[str] | None = None
    try:
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if header is None:
                header = [c.strip() for c in row]
                missing = [c for c in required if c not in header]
                if missing:
                    raise fail(path, line, None, f"the header lacks column(s) {', '.join(missing)}; this table needs "
                               f"{', '.join(required)} (is this the right file for the format?)")
                keep = [(c, header.index(c)) for c in (*required, *optional) if c in header]
                continue
            if len(row) != len(header):
                raise fail(path, line, None, f"{len(row)} cells, the header has {len(header)}"
                           + (" -- the file may be truncated" if len(row) < len(header) else ""))
            yield line, {c: row[k].strip() for c, k in keep}
    except csv.Error as e:
        raise fail(path, reader.line_num, None, f"unreadable CSV: {e}") from None
    if header is None:
        raise TraceFormatError(f"{path}: empty file; expected a header with {','.join(required)}")


def json_lines(path: Path, progress: Progress | None) -> Iterator[tuple[int, dict]]:
    """``(line, object)`` of a JSON-lines file (one object per line, as BigQuery exports a table)."""
    seen = False
    for line, text in enumerate(text_lines(path, progress), start=1):
        if not text.strip():
            continue
        seen = True
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise fail(path, line, e.colno, f"not JSON ({e.msg})" + (" -- the file may be truncated"
                                                                  if e.msg.startswith(("Expecting", "Unterminated"))
                                                                  else "")) from None
        if not isinstance(obj, dict):
            raise fail(path, line, 1, f"expected one JSON object per line, got {type(obj).__name__}")
        yield line, obj
    if not seen:
        raise TraceFormatError(f"{path}: empty file; expected one JSON object per line")


def number(path: Path, line: int, column: str, cell: str, *, empty: float | None = None,
           minimum: float | None = None) -> float:
    """A numeric cell. ``empty``: the value of an empty cell (None: an empty cell is an error)."""
    if cell == "" or cell is None:
        if empty is not None:
            return empty
        raise fail(path, line, column, "is empty")
    try:
        v = float(cell)
    except (TypeError, ValueError):
        raise fail(path, line, column, f"{cell!r} is not a number") from None
    if not math.isfinite(v):
        raise fail(path, line, column, f"{cell!r} is not finite")
    if abs(v) > MAX_CELL:
        raise fail(path, line, column, f"{cell!r} is too large (more than 2^53)")
    if minimum is not None and v < minimum:
        raise fail(path, line, column, f"{v:g} is below {minimum:g}")
    return v


def integer(path: Path, line: int, column: str, value: object) -> int:
    """An integer cell or JSON value (BigQuery exports INT64 as a string or a number)."""
    if isinstance(value, bool) or value is None or value == "":
        raise fail(path, line, column, "is missing" if value in (None, "") else f"{value!r} is not an integer")
    if isinstance(value, int):
        return value
    try:
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            return int(value)
        return int(str(value).strip())
    except ValueError:
        raise fail(path, line, column, f"{value!r} is not an integer") from None


def field_of(path: Path, line: int, obj: dict, dotted: str, *, required: bool = True) -> object:
    """``obj["a"]["b"]`` for ``"a.b"``; a missing required field names the line and the field."""
    cur: object = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur or cur[part] is None:
            if required:
                raise fail(path, line, dotted, "is missing")
            return None
        cur = cur[part]
    return cur


def classify(paths: Sequence[Path], tables: Sequence[str], fmt: str) -> dict[str, list[Path]]:
    """Files by table, from their names (``batch_task.csv``, ``batch_task-part2.csv.gz`` ...)."""
    out: dict[str, list[Path]] = {t: [] for t in tables}
    for p in paths:
        name = p.name.lower()
        match = [t for t in tables if name.startswith(t.lower())]
        if not match:
            raise TraceFormatError(f"{p}: cannot tell which {fmt} table this is: its name must start with one of "
                                   f"{', '.join(tables)} (is this the right format?)")
        out[max(match, key=len)].append(p)
    return out


def total_size(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


# ---- usage ------------------------------------------------------------------------------------------------
class UsageSeries:
    """Per pod, mean usage per step of ``step_s`` trace seconds (a weighted mean of the samples that start in
    the step). Memory: one entry per pod and step that has samples."""

    def __init__(self, step_s: float) -> None:
        self.step = float(step_s)
        self._acc: dict[object, dict[int, list[float]]] = {}

    def add(self, key: object, t: float, value: float, weight: float = 1.0) -> None:
        b = int(math.floor(t / self.step))
        cell = self._acc.setdefault(key, {}).get(b)
        if cell is None:
            self._acc[key][b] = [value * weight, weight]
        else:
            cell[0] += value * weight
            cell[1] += weight

    def __contains__(self, key: object) -> bool:
        return key in self._acc

    def keys(self):
        return self._acc.keys()

    def series(self, key: object, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray] | None:
        """``(t, m)``: the step starts (trace seconds) and mean values times ``scale``; consecutive equal values
        merged. A gap without samples keeps the previous value."""
        acc = self._acc.get(key)
        if not acc:
            return None
        bs = sorted(acc)
        t = np.asarray(bs, dtype=np.float64) * self.step
        m = np.asarray([acc[b][0] / acc[b][1] if acc[b][1] > 0 else 0.0 for b in bs]) * scale
        keep = np.concatenate(([True], m[1:] != m[:-1]))
        return t[keep], m[keep]

    def span(self, key: object) -> tuple[float, float] | None:
        """First and last step start with samples."""
        acc = self._acc.get(key)
        if not acc:
            return None
        return min(acc) * self.step, max(acc) * self.step


# ---- pods -------------------------------------------------------------------------------------------------
SPAN_BIN_S = 3600.0  # the span's resolution: submissions are counted per trace hour
SPAN_QUANTILE = 0.01  # the suggested window starts where this share of the submissions has come


class PodSink:
    """Pods in trace time, converted to the twin's pod model and cut to the window.

    A job runs from ``start`` to ``end`` (its work is ``end - start``); one the trace never ends ran until
    ``trace_end`` (counted as truncated). A service lives from ``submit`` to ``end`` (``None``: until the
    scenario ends). A pod alive when the window opens is submitted at the twin's 0 with what is left of it;
    one submitted after the window closes, or gone before it opens, is dropped.
    """

    def __init__(self, options: ImportOptions) -> None:
        self.opt = options
        self.pods = PodBuilder()
        self.counts: dict[str, int] = {}
        w = options.window
        self.w0, self.w1 = (0.0, math.inf) if w is None else (float(w[0]), float(w[1]))
        # Submissions per trace hour and the last end, over every pod offered (inside the window or not): the
        # trace's time span and a suggested window, in memory bounded by the span's hours, not the pods.
        self._hours: dict[int, int] = {}
        self._first, self._last, self._last_end = math.inf, -math.inf, -math.inf

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def add(self, *, submit: float, kind: int, cpu_req: int, mem_req: int, start: float | None = None,
            end: float | None = None, trace_end: float | None = None, cpu_lim: int = NO_LIMIT,
            mem_lim: int = NO_LIMIT, usage_m: float | None = None,
            series: tuple[np.ndarray, np.ndarray] | None = None, priority: int = 0, owner: str = "", app: str = "",
            namespace: str = DEFAULT_NAMESPACE, slo: str = "", series_key: object = None, gpu: int = 0,
            gpu_milli: int = 1000, gpu_spec: frozenset[str] | None = None, name: str = "") -> bool:
        """Add one pod; returns whether it was kept. ``series`` is its usage in absolute trace seconds."""
        w0, w1 = self.w0, self.w1
        start = submit if start is None else max(start, submit)
        hour = int(submit // SPAN_BIN_S)
        self._hours[hour] = self._hours.get(hour, 0) + 1
        self._first, self._last = min(self._first, submit), max(self._last, submit)
        if end is not None or trace_end is not None:
            self._last_end = max(self._last_end, end if end is not None else trace_end)
        if kind == JOB and end is None:
            if trace_end is None:
                self.count("jobs without an end or a trace end (skipped)")
                return False
            end = max(trace_end, start)
            self.count("jobs still running when the trace ends (cut there)")
        if submit >= w1:
            self.count("pods submitted after the window (dropped)")
            return False
        if end is not None and end <= w0:
            self.count("pods gone before the window (dropped)")
            return False
        for what, v in (("cpu request", cpu_req), ("memory request", mem_req), ("cpu limit", cpu_lim),
                        ("memory limit", mem_lim)):
            if v > MAX_CELL:  # a corrupt cell times the format's unit: it would overflow the twin's columns
                raise TraceFormatError(f"pod {name or f'submitted at {submit:g} s'}: its {what} converts to "
                                       f"{v:.3g}, more than 2^53 (is --cpu-unit-m / --memory-unit-mib right?)")
        # As the apiserver does: a resource with a limit and no request is requested at its limit.
        if cpu_req == NO_REQUEST and cpu_lim != NO_LIMIT:
            cpu_req = cpu_lim
        if mem_req == NO_REQUEST and mem_lim != NO_LIMIT:
            mem_req = mem_lim
        if cpu_lim != NO_LIMIT and cpu_req != NO_REQUEST and cpu_lim < cpu_req:
            cpu_lim = cpu_req
            self.count("cpu limits below the request (raised to it)")
        if mem_lim != NO_LIMIT and mem_req != NO_REQUEST and mem_lim < mem_req:
            mem_lim = mem_req
            self.count("memory limits below the request (raised to it)")
        if kind == JOB:
            assert end is not None
            begin = max(start, w0)  # the twin sees the work left when the window opens
            work = end - begin
            if work < 1.0:
                work = 1.0
                self.count("jobs shorter than 1 s (lengthened to 1 s)")
            sub = max(submit, w0) - w0
            offset = begin - start  # progress already made when the window opens
            duration = work
        else:
            sub = max(submit, w0) - w0
            offset = 0.0
            duration = math.inf if end is None else max(end - max(submit, w0), 1.0)
        profile, mean = -1, usage_m
        if series is not None and len(series[0]):
            t, m = series
            if kind == JOB:
                x = t - start - offset  # absolute -> progress since the window opened
                k = max(int(np.searchsorted(x, 0.0, side="right")) - 1, 0)
                x, m = np.concatenate(([0.0], x[k + 1:])), m[k:]
                lo, hi = 0.0, duration
            else:
                x = t - w0
                lo, hi = sub, sub + duration
            mean = _mean_over(x, m, lo, hi)
            if len(m) > 1:
                profile = self.pods.add_profile(x, m, key=(series_key, offset) if series_key is not None else None)
            else:
                mean = float(m[0])
        if mean is None:
            mean = max(cpu_req, 0) * self.opt.usage_fraction
            self.count("pods without usage in the trace (usage = request x --usage-fraction)")
        self.pods.add(sub, duration, int(cpu_req), int(mem_req), float(mean), kind=kind, cpu_lim=int(cpu_lim),
                      mem_lim=int(mem_lim), priority=int(priority), owner=owner, app=app, namespace=namespace,
                      slo=slo, profile=profile, gpu=gpu, gpu_milli=gpu_milli, gpu_spec=gpu_spec, name=name)
        self.count("services" if kind == SERVICE else "jobs")
        return True

    def span(self) -> dict | None:
        """When the trace's pods are submitted and end, in trace seconds, and a window that holds its activity:
        from where the first 1 % of submissions is reached (an idle prefix with a few stragglers, as OpenB's 115
        days, would otherwise dilute every ratio), rounded down to the day (the hour on a trace of a week or
        less), to the last end, rounded up to the hour."""
        if not self._hours:
            return None
        hours = sorted(self._hours)
        total = sum(self._hours.values())
        seen, start_h = 0, hours[0]
        for h in hours:
            seen += self._hours[h]
            if seen >= SPAN_QUANTILE * total:
                start_h = h
                break
        last_end = None if self._last_end == -math.inf else self._last_end
        end = math.ceil(max(self._last, last_end or 0.0) / SPAN_BIN_S + 1e-9) * SPAN_BIN_S
        # Rounded down to a whole day on a trace of more than a week (what a person would pick), else an hour.
        unit = 86400.0 if self._last - self._first > 7 * 86400 else SPAN_BIN_S
        # Never before 0, which --window refuses: a pod created before 0 is alive when a window from 0 opens.
        start = max(0.0, math.floor(start_h * SPAN_BIN_S / unit) * unit)
        before = sum(n for h, n in self._hours.items() if h * SPAN_BIN_S < start)
        return {"first_submit_s": self._first, "last_submit_s": self._last, "last_end_s": last_end,
                "suggested_window": f"{start:.0f}:{end:.0f}", "suggested_duration_s": end - start,
                "submitted_before_suggested_window": before, "pods_read": total}

    def workload(self, what: str) -> Workload:
        if not len(self.pods):
            raise TraceFormatError(f"{what}: no pod to import (window {self.w0:.10g}..{self.w1:.10g} s; "
                                   f"{self._counts_text()})")
        return self.pods.build()

    def _counts_text(self) -> str:
        return ", ".join(f"{v} {k}" for k, v in sorted(self.counts.items())) or "nothing read"


def _mean_over(x: np.ndarray, m: np.ndarray, lo: float, hi: float) -> float:
    if not math.isfinite(hi):  # open-ended: the mean over what was observed, the last step as long as the one before
        last = float(x[-1]) + (float(x[-1] - x[-2]) if len(x) > 1 else 1.0)
        hi = max(lo + 1.0, last)
    if hi <= lo:
        return float(m[0])
    starts = np.concatenate(([-math.inf], x[1:]))
    ends = np.concatenate((x[1:], [math.inf]))
    ov = np.clip(np.minimum(ends, hi) - np.maximum(starts, lo), 0.0, None)
    # math.fsum, not np.dot: BLAS sums in an order that changes between numpy builds, and the converted files
    # must be the same bytes everywhere (tests/cluster/test_trace_samples.py).
    return math.fsum((ov * m).tolist()) / (hi - lo)


# ---- machines ---------------------------------------------------------------------------------------------
def node_groups(machines: dict[object, tuple], prefix: str, options: ImportOptions,
                counts: dict[str, int] | None = None) -> list[dict]:
    """Scenario node groups from ``{machine: (cpu_m, memory_mib)}`` or ``(cpu_m, memory_mib, gpus, model)``:
    one group per distinct shape, largest first, each validated as a scenario node group. A machine without
    CPU or memory is left out, counted in ``counts`` (the import's summary)."""
    sizes: dict[tuple, int] = {}
    example: dict[tuple, object] = {}  # a machine of each shape, to name in an error
    for key, shape in machines.items():
        shape = tuple(shape) + (0, "")[len(shape) - 2:]
        if shape[0] > 0 and shape[1] > 0:
            sizes[shape] = sizes.get(shape, 0) + 1
            example.setdefault(shape, key)
        elif counts is not None:
            what = "machines without CPU or memory (left out of the node groups)"
            counts[what] = counts.get(what, 0) + 1
    groups = []
    for k, ((cpu, mem, gpus, model), n) in enumerate(sorted(sizes.items(), key=lambda kv: (-kv[0][0], -kv[0][1],
                                                                                          -kv[0][2], kv[0][3]))):
        tag = f"-{gpus}x{re.sub('[^a-z0-9]', '', model.lower()) or 'gpu'}" if gpus else ""
        g = {"name_prefix": f"{prefix}-{cpu // 1000}c{tag}-{k}", "count": n, "cpu_m": cpu, "memory_mib": mem,
             "max_pods": options.max_pods_per_node, "power_watts": options.power_profile}
        if gpus:
            g |= {"gpu_count": gpus, **({"gpu_model": model} if model else {})}
        check_node_group(g, f"machine {example[(cpu, mem, gpus, model)]} ({cpu} m CPU, {mem} MiB"
                            f"{f', {gpus} GPUs' if gpus else ''})")
        groups.append(g)
    return groups


def check_node_group(group: dict, what: str) -> None:
    """Raise :class:`TraceFormatError` naming ``what`` when ``group`` is no valid scenario node group (a machine
    no scenario can hold: a corrupt capacity cell, or units that make it one)."""
    try:
        NodeGroup.model_validate(group)
    except ValidationError as e:
        raise TraceFormatError(f"{what} makes no valid node group: {validation_summary(e)}") from None


def nodes_yaml(groups: list[dict], comment: str) -> str:
    """A file a scenario includes with ``nodes: [{include: FILE}]`` (each group on one line)."""
    import yaml

    lines = [f"# {c}" for c in comment.splitlines()] + ["nodes:"]
    for g in groups:
        lines.append("  - " + yaml.safe_dump(g, default_flow_style=True, sort_keys=False, width=1000).strip())
    return "\n".join(lines) + "\n"


def scaled(value: float, unit: float, at: tuple[Path, int, str] | None = None) -> int:
    """A normalised quantity in absolute units, rounded up (a request must not shrink). ``at``: the cell's file,
    line and column, named in the error where the product overflows the twin's columns (a corrupt cell, or a
    unit off by orders of magnitude; without ``at`` :meth:`PodSink.add` still refuses it, naming the pod)."""
    v = value * unit
    if at is not None and v > MAX_CELL:
        raise fail(*at, f"{value:g} in units of {unit:g} is {v:.3g}, more than 2^53 "
                        "(is --cpu-unit-m / --memory-unit-mib right?)")
    return int(math.ceil(v - 1e-9))


def check_units(options: ImportOptions, defaults: dict[str, float]) -> tuple[float, float]:
    """The CPU and memory units (the options', else the format's defaults), each finite, above 0 and at most
    2^53 (a larger one overflows the twin's columns whatever the cell)."""
    cpu = options.cpu_unit_m if options.cpu_unit_m is not None else defaults.get("cpu_unit_m", 1.0)
    mem = options.memory_unit_mib if options.memory_unit_mib is not None else defaults.get("memory_unit_mib", 1.0)
    for option, v in (("--cpu-unit-m", cpu), ("--memory-unit-mib", mem)):
        if not (math.isfinite(v) and 0 < v <= MAX_CELL):
            raise TraceFormatError(f"{option} {v:g}: a unit must be a finite number above 0 and at most 2^53")
    return float(cpu), float(mem)


def is_terminal(word: str, words: frozenset[str]) -> bool:
    return word.strip().lower() in words


__all__ = ["DEFAULT_POWER_PROFILE", "MAX_CELL", "ImportOptions", "ImportResult", "PodSink", "Progress",
           "TraceFormatError", "UsageSeries", "check_node_group", "check_units", "classify", "csv_dicts", "csv_rows",
           "fail", "field_of", "integer", "is_terminal", "json_lines", "node_groups", "nodes_yaml", "number",
           "scaled", "text_lines", "total_size", "where", "JOB", "SERVICE", "NO_LIMIT", "NO_REQUEST"]
