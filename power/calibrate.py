"""Calibration: measure watts against CPU utilisation and fit the twin's 11-point power curve.

The curve is piecewise linear with knots at 0, 10, ..., 100 %, so fitting it is linear least squares on hat
basis functions. A small second-difference penalty fills knots that no sample reaches by linear
extrapolation instead of leaving the system singular; the result is then made non-decreasing (pool adjacent
violators), because the twin rejects curves that fall with load.

Samples must cover the curve: spanning less than :data:`MIN_SPAN` of utilisation, or leaving more than
:data:`MAX_EXTRAPOLATED` knots with no sample near them, is refused unless extrapolation is allowed (the CLI
allows it for its own live steps, which cover 0..100 % unless other load interferes, and flags it). Then the
unsupported knots continue the fitted line of their measured neighbours (power keeps rising with load, so a
held end value would make the load above the measured range look free), and are listed in the fit.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from joulesched.core import yamlio
from joulesched.core.fsio import read_text_input
from joulesched.core.errors import UsageError
from joulesched.core.fsio import atomic_write_text
from joulesched.core.names import is_dns_label
from joulesched.power.burner import Sample, measure  # noqa: F401  (re-exported: the CLI and tests use them from here)
from joulesched.power.curves import N_POINTS, SPECPOWER, interp, validate_curve

KNOTS = np.linspace(0.0, 1.0, N_POINTS)
#: Without ``allow_extrapolation``: the least spread of utilisation the samples must cover, and the most knots
#: that may lack a sample within 5 % (0 and 10 % on a host that never idles, say).
MIN_SPAN = 0.5
MAX_EXTRAPOLATED = 2


class CalibrationError(UsageError):
    """Bad calibration input; the message names the file, line and field."""


@dataclass(frozen=True)
class Fit:
    curve: tuple[float, ...]
    rmse_w: float
    mape_pct: float
    max_abs_w: float
    samples: int
    #: Knots no sample was within 5 % utilisation of: their value is extrapolated, not measured.
    unsupported_knots: tuple[int, ...]

    def summary(self) -> str:
        s = (f"fit over {self.samples} samples: RMSE {self.rmse_w:.2f} W, MAPE {self.mape_pct:.2f} %, "
             f"max error {self.max_abs_w:.2f} W")
        if self.unsupported_knots:
            s += f"; extrapolated at {', '.join(f'{k * 10}%' for k in self.unsupported_knots)}"
        return s


def _hat_matrix(u: np.ndarray) -> np.ndarray:
    """Row i holds the weights of the 11 knots in the linear interpolation at u[i]."""
    x = np.clip(u, 0.0, 1.0) * (N_POINTS - 1)
    i = np.minimum(x.astype(int), N_POINTS - 2)
    frac = x - i
    a = np.zeros((len(u), N_POINTS))
    a[np.arange(len(u)), i] = 1.0 - frac
    a[np.arange(len(u)), i + 1] = frac
    return a


def _pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) regression by pool adjacent violators."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for yi, wi in zip(y, w):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.concatenate([np.full(c, m) for m, _, c in blocks])


def _unsupported(u: np.ndarray) -> tuple[int, ...]:
    return tuple(int(k) for k in range(N_POINTS) if not np.any(np.abs(u - KNOTS[k]) <= 0.05))


def fit_curve(samples: Sequence[Sample], *, allow_extrapolation: bool = False) -> Fit:
    """Least-squares 11-point curve through ``samples``. Needs two distinct utilisations at least, and (unless
    ``allow_extrapolation``) samples over :data:`MIN_SPAN` of utilisation leaving at most
    :data:`MAX_EXTRAPOLATED` knots unsupported."""
    if len(samples) < 2:
        raise CalibrationError(f"need at least 2 samples to fit a curve, got {len(samples)}")
    u = np.array([s.utilization for s in samples], dtype=float)
    y = np.array([s.watts for s in samples], dtype=float)
    if np.ptp(u) < 0.05:
        raise CalibrationError("all samples sit at one utilisation (spread < 5 %); nothing to fit a curve to")
    unsupported = _unsupported(u)
    if not allow_extrapolation and (np.ptp(u) < MIN_SPAN or len(unsupported) > MAX_EXTRAPOLATED):
        raise CalibrationError(
            f"the samples cover {u.min() * 100:.0f}-{u.max() * 100:.0f} % utilisation and leave "
            f"{len(unsupported)} of {N_POINTS} load steps ({', '.join(f'{k * 10}%' for k in unsupported)}) with no "
            f"sample within 5 %: too little to fit a power curve to (need a spread of {MIN_SPAN * 100:.0f} % and "
            f"at most {MAX_EXTRAPOLATED} such steps). Measure more of the range (an otherwise idle host), or pass "
            "--allow-extrapolation to continue the fitted line there (flagged in the profile)")
    a = _hat_matrix(u)
    d2 = np.diff(np.eye(N_POINTS), n=2, axis=0)
    # Small enough not to bias supported knots, large enough to pin the unsupported ones.
    lam = 1e-6 * max(float(np.trace(a.T @ a)), 1.0) / N_POINTS
    coef = np.linalg.solve(a.T @ a + lam * d2.T @ d2, a.T @ y)
    support = a.sum(axis=0)
    coef = np.maximum(_pava(coef, np.maximum(support, 1e-6)), 0.0)
    curve = tuple(float(round(c, 3)) for c in coef)
    if curve[-1] <= 0:
        raise CalibrationError(f"the meter read no power: the fitted curve is 0 W at full load ({len(samples)} "
                               f"samples, the most {float(y.max()):g} W); check that its energy counter advances")
    pred = np.array([interp(curve, ui) for ui in u])
    err = pred - y
    nonzero = np.abs(y) > 1e-9
    mape = float(np.mean(np.abs(err[nonzero] / y[nonzero])) * 100) if nonzero.any() else 0.0
    try:
        checked = validate_curve(curve)
    except ValueError as e:  # samples of absurd watts (1e300) fit a curve no scenario takes: was a traceback
        raise CalibrationError(f"the fitted curve is not a node's: {e}") from None
    return Fit(checked, float(np.sqrt(np.mean(err**2))), mape, float(np.max(np.abs(err))), len(samples),
               unsupported)


def read_samples_csv(path: str | Path) -> list[Sample]:
    """Samples from a CSV with columns ``utilization`` (a fraction, 0..1) and ``watts``."""
    path = Path(path)
    text = read_text_input(path, "a samples CSV", CalibrationError, missing=f"{path}: file not found")
    with io.StringIO(text, newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip().lower() for h in (reader.fieldnames or [])]
        if "utilization" not in header or "watts" not in header:
            raise CalibrationError(f"{path}: needs a header with columns utilization,watts; got {header or 'none'}")
        if dup := sorted({h for h in header if header.count(h) > 1}):
            raise CalibrationError(f"{path}: column(s) {', '.join(dup)} given twice in the header")
        reader.fieldnames = header
        samples = []
        for row in reader:
            line = reader.line_num
            if None in row or len(row) != len(header) or any(v is None for v in row.values()):  # DictReader pads
                cells = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or [])
                raise CalibrationError(f"{path}:{line}: {cells} cell(s) where the header has {len(header)}")
            try:
                u, w = float(row["utilization"]), float(row["watts"])
            except (TypeError, ValueError):
                raise CalibrationError(f"{path}:{line}: utilization and watts must be numbers, got "
                                       f"{row.get('utilization')!r}, {row.get('watts')!r}") from None
            if not (math.isfinite(u) and 0.0 <= u <= 1.0):
                raise CalibrationError(f"{path}:{line}: utilization {u!r} is not a fraction in [0, 1] "
                                       "(divide percentages by 100)")
            if not (math.isfinite(w) and w >= 0):
                raise CalibrationError(f"{path}:{line}: watts {w!r} must be finite and >= 0")
            samples.append(Sample(u, w))
    return samples


def _dns_prefix(name: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50].strip("-")
    return label or "calibrated"


def host_facts(proc_root: str = "/proc") -> dict[str, int | str]:
    """Defaults for the node group: this host's name, cores and memory."""
    mem_mib = 1024
    try:
        with open(os.path.join(proc_root, "meminfo"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_mib = int(line.split()[1]) // 1024
                    break
    except OSError:
        pass
    return {"name_prefix": _dns_prefix(socket.gethostname()), "cpu_m": (os.cpu_count() or 1) * 1000,
            "memory_mib": mem_mib}


def node_group(fit: Fit, *, name_prefix: str, count: int, cpu_m: int, memory_mib: int,
               max_pods: int) -> dict:
    if not is_dns_label(name_prefix, 50):
        raise CalibrationError(f"name prefix {name_prefix!r} must be a lowercase DNS label of at most 50 chars")
    for key, v in (("count", count), ("cpu_m", cpu_m), ("memory_mib", memory_mib), ("max_pods", max_pods)):
        if v < 1:
            raise CalibrationError(f"{key} must be >= 1, got {v}")
    return {"name_prefix": name_prefix, "count": count, "cpu_m": cpu_m, "memory_mib": memory_mib,
            "max_pods": max_pods, "power_watts": [round(w, 2) for w in fit.curve]}


def write_profile(path: str | Path, group: dict, header: str) -> None:
    """Write the node group atomically: a temp file in the same folder, renamed over ``path``."""
    path = Path(path)
    text = "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(group, sort_keys=False,
                                                                                   default_flow_style=None)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CalibrationError(f"{path}: folder {parent} does not exist")
    atomic_write_text(path, text)


def read_profile_curve(path: str | Path) -> tuple[float, ...]:
    """The 11-point curve of a node profile written by :func:`write_profile` (a node group, or a one-group
    ``nodes:`` list); ``power_watts`` may also name a SPECpower table. Raises :class:`CalibrationError`."""
    path = Path(path)
    try:
        data = yamlio.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CalibrationError(f"{path}: cannot read node profile: {e}".replace("\n", " ")) from None
    if isinstance(data, dict) and isinstance(data.get("nodes"), list) and len(data["nodes"]) == 1:
        data = data["nodes"][0]
    if not isinstance(data, dict) or "power_watts" not in data:
        raise CalibrationError(f"{path}: not a node profile (expected a node group with power_watts)")
    watts = data["power_watts"]
    if isinstance(watts, str):
        if watts not in SPECPOWER:
            raise CalibrationError(f"{path}: power_watts names unknown curve {watts!r}")
        return SPECPOWER[watts]
    try:
        return validate_curve(watts if isinstance(watts, list) else [])
    except (TypeError, ValueError) as e:
        raise CalibrationError(f"{path}: power_watts: {e}") from None
