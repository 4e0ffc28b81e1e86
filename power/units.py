"""Energy and power units. Counters arrive in microjoules; everything above the meters works in joules and watts.

The names are types (``NewType``) so that a signature says which unit it takes; the helpers are the only places
a factor of 1e6 appears, which is where the original project went 10x wrong ("mWatts" that were mJ per 100 ms).
"""

from __future__ import annotations

from typing import NewType

Microjoules = NewType("Microjoules", int)
Joules = NewType("Joules", float)
Watts = NewType("Watts", float)
Seconds = NewType("Seconds", float)

UJ_PER_J = 1_000_000

#: A high power for one RAPL zone (a top-bin server package is 350-400 W), used to bound how long a counter may go
#: unread: two wraps between readings look like one and lose a whole range of joules.
PEAK_ZONE_WATTS = 500.0


def uj_to_j(uj: int) -> Joules:
    return Joules(uj / UJ_PER_J)


def j_to_uj(j: float) -> Microjoules:
    return Microjoules(round(j * UJ_PER_J))


def watts(energy: Joules, elapsed: Seconds) -> Watts:
    """Average power over ``elapsed`` seconds; 0 when no time has passed (first reading)."""
    return Watts(energy / elapsed) if elapsed > 0 else Watts(0.0)


def wrap_delta(cur: int, prev: int, max_range: int) -> int:
    """Counter delta corrected for one wraparound (reference.md section 4).

    RAPL counters are 32-bit underneath and wrap; sysfs exposes the wrap point as ``max_energy_range_uj``. A
    reading below the previous one means the counter wrapped once, so the caller must sample well inside one
    wrap period (minutes at full load): :func:`max_read_interval_s`.
    """
    if cur >= prev:
        return cur - prev
    return (max_range - prev) + cur


def max_read_interval_s(range_j: float, peak_w: float = PEAK_ZONE_WATTS) -> float:
    """The longest time between readings of a counter that wraps every ``range_j`` joules: half the time
    ``peak_w`` takes to go round it, so that even at that power at most one wrap falls between two readings."""
    return range_j / (2.0 * peak_w)
