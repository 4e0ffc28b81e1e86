"""Confidence intervals as a careful reader expects them: Student-t on the seeds actually run, n shown.

With n seeds the half-width of the 95 % interval of a mean is ``t(0.975, n - 1) * s / sqrt(n)``; with n = 2 the
t quantile is 12.7, not the normal 1.96. One seed has no interval (None, shown as n/a), never a made-up zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def t_halfwidth(values: Sequence[float], level: float = 0.95) -> float | None:
    """Half-width of the Student-t ``level`` interval of the mean of ``values``; None below two values."""
    n = len(values)
    if n < 2:
        return None
    sd = float(np.std(np.asarray(values, dtype=np.float64), ddof=1))
    return float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)


def ratios(num: Sequence[float], den: Sequence[float | None]) -> list[float] | None:
    """``num / den`` per seed; None when a denominator is missing or not positive (a cluster whose curves start
    at 0 W can draw nothing, and so can its lower bound): no ratio rather than a division by zero."""
    if any(d is None or not d > 0 for d in den):
        return None
    return [n / d for n, d in zip(num, den)]


def mean_ci(values: Sequence[float], level: float = 0.95) -> dict:
    """``{"mean", "ci95", "n"}`` of ``values`` (``ci95`` None below two values)."""
    return {"mean": float(np.mean(values)), "ci95": t_halfwidth(values, level), "n": len(values)}
