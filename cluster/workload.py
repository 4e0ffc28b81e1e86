"""Pod streams for the twin: trace CSVs and the synthetic generator.

A :class:`Workload` is a struct of arrays sorted by submission time. A request of ``-1`` means the pod has
no request for that resource (best-effort for both); ``0`` is an explicit zero, which kube-scheduler treats
differently when scoring.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from joulesched.cluster.scenario import Scenario, ScenarioError, Synthetic
from joulesched.core.fsio import atomic_path

TRACE_COLUMNS = ("submit_s", "duration_s", "cpu_request_m", "memory_request_mib", "cpu_usage_m")
NO_REQUEST = -1

# Alibaba GPU trace 2023 pod CPU request quantiles (cores), reference.md section 6. The tails (p0, p100) are
# our choice so the quantile function is defined everywhere.
_CPU_Q = np.array([0.0, 0.25, 0.50, 0.75, 0.90, 0.99, 1.0])
_CPU_CORES = np.array([1.0, 4.0, 11.3, 12.0, 16.4, 32.0, 64.0])


@dataclass(frozen=True)
class Workload:
    """Pods sorted by ``submit_s``. Requests are int64 (``-1`` = none); usage is demanded millicores."""

    submit_s: np.ndarray
    duration_s: np.ndarray
    cpu_req: np.ndarray
    mem_req: np.ndarray
    usage_m: np.ndarray
    dropped: int = 0  # trace rows past the scenario's duration

    def __post_init__(self) -> None:
        n = len(self.submit_s)
        for name in ("duration_s", "cpu_req", "mem_req", "usage_m"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"workload column {name} has {len(getattr(self, name))} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.submit_s)

    @property
    def work_m_s(self) -> float:
        """Total demanded CPU work, millicore-seconds."""
        return float(np.dot(self.usage_m, self.duration_s))


def load_trace(path: str | Path, duration_s: float | None = None) -> Workload:
    """Read a trace CSV. Rows submitted at or after ``duration_s`` are dropped and counted.

    Raises :class:`ScenarioError` naming the line and column of the first bad cell.
    """
    path = Path(path)
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read trace: {e}") from None
    cols: dict[str, list[float]] = {c: [] for c in TRACE_COLUMNS}
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise ScenarioError(f"{path}: empty trace; expected header {','.join(TRACE_COLUMNS)}") from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise ScenarioError(f"{path}: line 1: unreadable CSV: {e}") from None
        header = [h.strip() for h in header]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise ScenarioError(f"{path}: line 1: missing column(s) {', '.join(missing)}; header must include "
                                f"{','.join(TRACE_COLUMNS)}")
        idx = {c: header.index(c) for c in TRACE_COLUMNS}
        try:
            for lineno, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise ScenarioError(f"{path}: line {lineno}: {len(row)} cells, header has {len(header)}")
                for c in TRACE_COLUMNS:
                    cols[c].append(_parse_cell(path, lineno, c, row[idx[c]].strip()))
        except csv.Error as e:
            raise ScenarioError(f"{path}: unreadable CSV: {e}") from None
        except UnicodeDecodeError as e:
            raise ScenarioError(f"{path}: not UTF-8 text: {e}") from None
    if not cols["submit_s"]:
        raise ScenarioError(f"{path}: trace has a header but no pods")
    submit = np.asarray(cols["submit_s"], dtype=np.float64)
    order = np.argsort(submit, kind="stable")
    wl = Workload(
        submit_s=submit[order],
        duration_s=np.asarray(cols["duration_s"], dtype=np.float64)[order],
        cpu_req=np.asarray(cols["cpu_request_m"], dtype=np.int64)[order],
        mem_req=np.asarray(cols["memory_request_mib"], dtype=np.int64)[order],
        usage_m=np.asarray(cols["cpu_usage_m"], dtype=np.float64)[order],
    )
    if duration_s is not None:
        keep = wl.submit_s < duration_s
        dropped = int((~keep).sum())
        if dropped:
            if not keep.any():
                raise ScenarioError(f"{path}: every pod is submitted at or after duration_s={duration_s}")
            wl = Workload(wl.submit_s[keep], wl.duration_s[keep], wl.cpu_req[keep], wl.mem_req[keep],
                          wl.usage_m[keep], dropped=dropped)
    return wl


def write_trace(wl: Workload, dest: str | Path | TextIO) -> None:
    """Write ``wl`` as a trace CSV that :func:`load_trace` reads back to the same pods: to a file (atomically)
    or to an open text stream such as stdout."""
    if not isinstance(dest, (str, Path)):
        _write_rows(wl, dest)
        return
    with atomic_path(dest) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        _write_rows(wl, fh)


def _write_rows(wl: Workload, fh: TextIO) -> None:
    w = csv.writer(fh)
    w.writerow(TRACE_COLUMNS)
    for s, d, c, m, u in zip(wl.submit_s.tolist(), wl.duration_s.tolist(), wl.cpu_req.tolist(),
                             wl.mem_req.tolist(), wl.usage_m.tolist()):
        w.writerow((repr(s), repr(d), "" if c < 0 else c, "" if m < 0 else m, repr(u)))


def _parse_cell(path: Path, lineno: int, col: str, cell: str) -> float:
    where = f"{path}: line {lineno}, column {col}"
    if col in ("cpu_request_m", "memory_request_mib"):
        if cell == "":
            return NO_REQUEST
        try:
            v = int(cell)
        except ValueError:
            raise ScenarioError(f"{where}: {cell!r} is not an integer (leave it empty for no request)") from None
        if v < 0:
            raise ScenarioError(f"{where}: {v} is negative")
        return v
    try:
        v = float(cell)
    except ValueError:
        raise ScenarioError(f"{where}: {cell!r} is not a number") from None
    if not math.isfinite(v):
        raise ScenarioError(f"{where}: {cell!r} is not finite")
    if col == "duration_s" and v <= 0:
        raise ScenarioError(f"{where}: duration must be > 0, got {v}")
    if v < 0:
        raise ScenarioError(f"{where}: {v} is negative")
    return v


def _arrivals(spec: Synthetic, horizon: float, rng: np.random.Generator) -> np.ndarray:
    """Submission times: bursts of geometric size (mean ``burst_mean``) at Poisson or diurnal epochs."""
    n = spec.pods
    mean_gap = spec.mean_interarrival_s * spec.burst_mean  # keeps the mean pod rate at 1/mean_interarrival_s
    n_epochs = int(math.ceil(n / spec.burst_mean)) + 16
    # Draw generously, then trim: a burst can overshoot n, and diurnal thinning rejects epochs.
    if spec.arrival == "poisson":
        epochs = np.cumsum(rng.exponential(mean_gap, size=n_epochs))
    else:
        # Thinning of a homogeneous process at the peak rate: rate(t) = base (1 + a sin(2 pi t / P)),
        # with a = (swing - 1) / (swing + 1) so that peak / trough = swing and the mean rate is base.
        a = (spec.diurnal_swing - 1.0) / (spec.diurnal_swing + 1.0)
        peak_gap = mean_gap / (1.0 + a)
        epochs_list: list[np.ndarray] = []
        t0, have = 0.0, 0
        while have < n_epochs:
            cand = t0 + np.cumsum(rng.exponential(peak_gap, size=2 * n_epochs))
            t0 = float(cand[-1])
            accept = rng.random(cand.size) < (1.0 + a * np.sin(2 * np.pi * cand / spec.diurnal_period_s)) / (1 + a)
            epochs_list.append(cand[accept])
            have += int(accept.sum())
            if t0 > horizon:
                break
        epochs = np.concatenate(epochs_list)[:n_epochs]
    if spec.burst_mean > 1.0:
        sizes = rng.geometric(1.0 / spec.burst_mean, size=epochs.size)
        times = np.repeat(epochs, sizes)
    else:
        times = epochs
    times = times[:n]
    return times[times < horizon]


def synthesize(spec: Synthetic, horizon: float, seed: int) -> Workload:
    """Generate a workload from ``spec``; identical for identical (spec, horizon, seed)."""
    rng = np.random.default_rng(seed)
    submit = _arrivals(spec, horizon, rng)
    n = submit.size
    if n == 0:
        raise ScenarioError("workload.synthetic: no pod arrives before duration_s; lower mean_interarrival_s")
    max_d = spec.max_duration_s if spec.max_duration_s is not None else horizon
    dur = np.clip(spec.duration_median_s * np.exp(spec.duration_sigma * rng.standard_normal(n)),
                  spec.min_duration_s, max(max_d, spec.min_duration_s))
    cores = np.interp(rng.random(n), _CPU_Q, _CPU_CORES) * spec.cpu_scale
    g = spec.cpu_granularity_m
    cpu = np.maximum(g, np.round(cores * 1000.0 / g) * g).astype(np.int64)
    mem = cpu / 1000.0 * spec.memory_per_core_mib * np.exp(0.3 * rng.standard_normal(n))
    mem = np.maximum(64, np.round(mem / 64.0) * 64).astype(np.int64)
    lo, hi = spec.usage_fraction
    frac = rng.uniform(lo, hi, n) * np.exp(spec.usage_noise_sigma * rng.standard_normal(n))
    usage = np.maximum(1.0, cpu * frac)
    best_effort = rng.random(n) < spec.best_effort_fraction
    cpu[best_effort] = NO_REQUEST
    mem[best_effort] = NO_REQUEST
    return Workload(submit, dur, cpu, mem, usage)


def build_workload(scenario: Scenario, seed: int | None = None) -> Workload:
    """The workload of ``scenario`` for run ``seed`` (default: the scenario's own seed)."""
    seed = scenario.seed if seed is None else seed
    if scenario.workload.synthetic is not None:
        return synthesize(scenario.workload.synthetic, scenario.duration_s, seed)
    assert scenario.trace_path is not None
    return load_trace(scenario.trace_path, scenario.duration_s)
