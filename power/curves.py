"""Server power curves: 11 points of watts at 0, 10, ..., 100 % CPU, interpolated linearly.

The SPECpower_ssj2008 figures are from reference.md section 5. Interpolation is linear between the
10 % points; CloudSim Plus's `round(u * len)` indexing is off by one and is deliberately not copied.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_POINTS = 11
#: The most watts one node (or GPU) may be given: a megawatt, far above any machine, and small enough that energies
#: stay finite in float32 (timelines) and their sums in float64.
MAX_WATTS = 1e6

#: SPECpower_ssj2008 curves (watts at 0, 10, ..., 100 % load).
SPECPOWER: dict[str, tuple[float, ...]] = {
    "hp-ml110-g4": (86, 89.4, 92.6, 96, 99.5, 102, 106, 108, 112, 114, 117),
    "hp-ml110-g5": (93.7, 97, 101, 105, 110, 116, 121, 125, 129, 133, 135),
    "ibm-x3550-m3-x5670": (66, 107, 120, 131, 143, 156, 173, 191, 211, 229, 247),
    "ibm-x3550-m3-x5675": (58.4, 98, 109, 118, 128, 140, 153, 170, 189, 205, 222),
    "ibm-x3250-x3470": (41.6, 46.7, 52.3, 57.9, 65.4, 73, 80.7, 89.5, 99.6, 105, 113),
}


def validate_curve(curve: Sequence[float], *, busy_draw: bool = True) -> tuple[float, ...]:
    """Return the curve as a tuple, or raise ValueError saying what is wrong with it. ``busy_draw``: it must draw
    something at full load (a node's; a GPU curve of a node without GPUs is all 0)."""
    for w in curve:  # float() would read true as 1 W and "70" as 70 W (a node profile's [true, 70, ...])
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise ValueError(f"a power curve's points are numbers of watts, got {w!r}")
    values = tuple(float(w) for w in curve)
    if len(values) != N_POINTS:
        raise ValueError(f"a power curve needs {N_POINTS} points (0%..100% in 10% steps), got {len(values)}")
    for i, w in enumerate(values):
        if not 0 <= w <= MAX_WATTS:  # NaN fails it too
            raise ValueError(f"power curve point {i * 10}% is {w!r}: watts must be in 0..{MAX_WATTS:g}")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError("power curve must be non-decreasing with load")
    if busy_draw and values[-1] <= 0:  # a meter that read nothing: every energy figure and the DQN's reward scale would be 0
        raise ValueError("power curve is 0 W at full load: no machine draws nothing busy (a meter that read no "
                         "power?)")
    return values


def interp(curve: Sequence[float], u: float) -> float:
    """Watts at utilisation ``u`` (clamped to [0, 1]), linear between the 10 % points. Scalar and fast."""
    if u <= 0.0:
        return curve[0]
    if u >= 1.0:
        return curve[10]
    x = u * 10.0
    i = int(x)
    lo = curve[i]
    return lo + (x - i) * (curve[i + 1] - lo)


def interp_many(curves: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Vectorised :func:`interp`: ``curves`` is (N, 11), ``u`` is (N,) or broadcastable. Returns watts (N,)."""
    x = np.clip(np.asarray(u, dtype=np.float64), 0.0, 1.0) * 10.0
    i = np.minimum(x.astype(np.int64), 9)
    rows = np.arange(curves.shape[0])
    lo = curves[rows, i]
    return lo + (x - i) * (curves[rows, i + 1] - lo)


def fan_curve(idle_w: float, busy_w: float) -> tuple[float, ...]:
    """Fan, Weber and Barroso (2007): P = Pidle + (Pbusy - Pidle)(2u - u^1.4), sampled at the 11 points."""
    u = np.linspace(0.0, 1.0, N_POINTS)
    return tuple(float(w) for w in idle_w + (busy_w - idle_w) * (2 * u - u**1.4))
