"""The meter seams: :class:`EnergyMeter` (joules between two instants) and :class:`PowerMeter` (cumulative
joules per hardware zone).

Results and reports read energy only through an :class:`EnergyMeter`: the twin's integral
(:class:`joulesched.cluster.twin.TwinMeter`), Prometheus's ``increase()`` of ``*_joules_total``
(:class:`joulesched.power.prometheus.PrometheusMeter`) and the host meters below, which are both.

The host meters (powercap, MSR, the calibrated model) report cumulative joules per zone and name their
``source``; they are tried from an ordered preference list (:func:`joulesched.power.meters.open_meter`), like
Kepler's device layer. Counters from hardware wrap; each meter folds wrap-aware deltas into exact integer totals
in a :class:`CounterBank`, so what it returns never decreases and the layers above never see a wrap. Every
``read`` is logged (:class:`ReadingLog`), so ``joules(start, end)`` answers for any window between two readings.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from joulesched.core.errors import JouleschedError
from joulesched.power.units import PEAK_ZONE_WATTS, Joules, max_read_interval_s, wrap_delta

log = logging.getLogger(__name__)

PERMISSION_HINT = (
    "energy_uj is readable by root only since Linux 5.10 (CVE-2020-8694). Run as root, or install "
    "deploy/systemd/joulesched-power-exporter.service, whose ExecStartPre makes energy_uj readable by the "
    "service's group; or use --meter model."
)

#: Reads a whole small file (sysfs, procfs). Injected so tests can simulate permission errors as root.
ReadFn = Callable[[str], bytes]
Clock = Callable[[], float]


def read_bytes(path: str) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def default_read(path: str) -> bytes:
    """Late-bound :func:`read_bytes`, so a test can patch ``power.meter.read_bytes`` for every meter."""
    return read_bytes(path)


class MeterError(JouleschedError, RuntimeError):
    """A meter cannot be used; the message says why and what to do."""


class MeterUnavailable(MeterError):
    """The meter's interface is absent on this machine (no powercap tree, no msr device, no curve)."""


class MeterPermissionError(MeterError):
    """The interface exists but may not be read by this user."""


class EnergyMeter(Protocol):
    """Joules the metered system used between two instants, in seconds on the meter's own clock."""

    def joules(self, start: float, end: float) -> float: ...


@runtime_checkable
class PowerMeter(Protocol):
    """Cumulative energy per zone.

    ``read`` returns joules consumed per zone since the meter was opened; values never decrease.
    ``primary_zones`` are disjoint zones whose sum is the energy attributed to workloads (the packages, never a
    package together with its own core or uncore child).
    """

    source: str
    zones: tuple[str, ...]
    primary_zones: tuple[str, ...]

    def read(self) -> dict[str, Joules]: ...

    def mark(self) -> float:
        """Read now and return the instant, so that it can bound a :meth:`joules` window."""
        ...

    def joules(self, start: float, end: float) -> float: ...


#: The most one counter is believed to advance per second, in watts: twice a high zone's power. A step above it
#: is no wrap but a reset (the driver reloaded, the host resumed) or jitter backwards.
IMPLAUSIBLE_ZONE_WATTS = 2 * PEAK_ZONE_WATTS

#: Joules any counter may step between two readings however close their instants: the instant is read once
#: before the counters, and a process descheduled in between (a VM's stolen time, a busy host) reads counters
#: that ran on for longer than it measured. 1 kJ is a second of that at the implausible rate, and under 0.4 % of
#: the common 262 kJ range: the steps this bound is for (a misread wrap) are a range's size.
_STEP_SLACK_J = 1000.0


@dataclass
class CounterBank:
    """Exact wrap-corrected totals of raw counters, in the counters' own unit (integers, so no float drift).

    A step no zone could draw in the time since the previous reading (:data:`IMPLAUSIBLE_ZONE_WATTS`) is taken
    for a reset, not a wrap: counted as nothing, warned about, and counted on from the new value. A reading 1 mJ
    below the last one read as a wrap was a whole range (262 kJ on most parts) published as used."""

    _prev: dict[object, tuple[int, float | None]] = field(default_factory=dict)
    _total: dict[object, int] = field(default_factory=dict)

    def update(self, key: object, raw: int, max_range: int, *, now: float | None = None,
               units_per_joule: float | None = None) -> int:
        """Fold one raw reading, taken at ``now`` (seconds), in and return the counter's total since its first
        reading. Without ``now`` and ``units_per_joule`` no step is bounded."""
        prev = self._prev.get(key)
        if prev is None:  # the first reading, or the first since :meth:`rebase`: the total so far is kept
            self._total.setdefault(key, 0)
        else:
            step = wrap_delta(raw, prev[0], max_range)
            if now is not None and prev[1] is not None and units_per_joule:
                limit = (IMPLAUSIBLE_ZONE_WATTS * max(now - prev[1], 0.0) + _STEP_SLACK_J) * units_per_joule
                if step > limit:
                    log.warning("counter %s went from %d to %d in %.3f s: %s %.0f J, more than any zone draws; "
                                "taken as a reset (driver reload, resume) and counted on from the new value",
                                key, prev[0], raw, now - prev[1], "a wrap of" if raw < prev[0] else "a step of",
                                step / units_per_joule)
                    step = 0
            self._total[key] += step
        self._prev[key] = (raw, now)
        return self._total[key]

    def total(self, key: object) -> int:
        """The counter's total so far (0 before its first reading)."""
        return self._total.get(key, 0)

    def rebase(self, key: object) -> None:
        """Forget the counter's last reading, keeping its total: the next reading is a new baseline (a counter
        that went away and came back, restarted by its driver, is no step from the old one)."""
        self._prev.pop(key, None)


#: The zones whose sum is a whole node's energy, without double counting: RAPL packages and DRAM (core and uncore
#: sit inside a package, psys contains everything), or the model meter's platform zone. The measured energy of a
#: cluster run (``power.energy_sources``), the scheduler's watts feed and a calibration all count these.
NODE_ZONES = r"package-.*|dram-.*|platform.*"
_NODE_ZONE = re.compile(NODE_ZONES)


def node_total(zones: dict[str, float], primary: tuple[str, ...]) -> float:
    """``zones``' sum over :data:`NODE_ZONES`, or over ``primary`` where none matches (a psys-only host, GPUs)."""
    keys = [z for z in zones if _NODE_ZONE.fullmatch(z)] or [z for z in primary if z in zones]
    return float(sum(zones[z] for z in keys))


class ReadingLog:
    """The last ``maxlen`` readings of a cumulative meter as (instant, joules of the node's zones:
    :func:`node_total`).

    Between two readings energy is interpolated linearly (power assumed constant), so a window bounded by
    :meth:`PowerMeter.mark` instants is exact. Windows outside the log raise :class:`MeterError`.
    """

    def __init__(self, maxlen: int = 4096) -> None:
        self._t: deque[float] = deque(maxlen=maxlen)
        self._e: deque[float] = deque(maxlen=maxlen)

    def record(self, t: float, joules: float) -> None:
        if self._t and t < self._t[-1]:
            raise MeterError(f"meter clock went backwards ({t} < {self._t[-1]})")
        self._t.append(t)
        self._e.append(joules)

    def at(self, t: float) -> float:
        ts, es = self._t, self._e
        if not ts or t < ts[0] - 1e-9 or t > ts[-1] + 1e-9:
            span = f"[{ts[0]:.3f}, {ts[-1]:.3f}]" if ts else "nothing"
            raise MeterError(f"no reading around t={t:.3f}; the meter has read {span}: mark() the window's ends")
        # Readings are few per window: a linear scan from the end beats building arrays.
        for k in range(len(ts) - 1, 0, -1):
            if ts[k - 1] <= t:
                t0, t1 = ts[k - 1], ts[k]
                return es[k - 1] + (es[k] - es[k - 1]) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return es[0]


class LoggedMeter:
    """Mixin for cumulative meters: logs every reading so the meter is also an :class:`EnergyMeter`.

    Subclasses set ``self._clock`` and ``self.primary_zones`` and call :meth:`_logged` on what ``read``
    returns. A meter of wrapping counters sets ``wrap_joules``, the smallest range of its counters in joules: a
    reading that comes later than a wrap at :data:`~joulesched.power.units.PEAK_ZONE_WATTS` takes is logged
    as a warning (wraps in between cannot be told apart from one).
    """

    _clock: Clock
    primary_zones: tuple[str, ...]
    _log: ReadingLog
    wrap_joules: float | None = None

    def _logged(self, zones: dict[str, Joules]) -> dict[str, Joules]:
        if not hasattr(self, "_log"):
            self._log = ReadingLog()
        now = self._clock()
        if self.wrap_joules and self._log._t and (gap := now - self._log._t[-1]) * PEAK_ZONE_WATTS > self.wrap_joules:
            log.warning("%s meter: %.1f s between readings, longer than a counter wrap at %.0f W (its range is "
                        "%.0f J): wraps may have been missed, and their joules with them; read at least every %.0f s",
                        getattr(self, "source", "energy"), gap, PEAK_ZONE_WATTS, self.wrap_joules,
                        max_read_interval_s(self.wrap_joules))
        self._log.record(now, node_total(zones, self.primary_zones))
        return zones

    def read(self) -> dict[str, Joules]:  # pragma: no cover - every meter defines it
        raise NotImplementedError

    def max_read_interval_s(self) -> float | None:
        """The longest safe time between readings (:func:`~joulesched.power.units.max_read_interval_s`), or None
        for a meter whose counters do not wrap."""
        return max_read_interval_s(self.wrap_joules) if self.wrap_joules else None

    def mark(self) -> float:
        self.read()
        return self._log._t[-1]

    def joules(self, start: float, end: float) -> float:
        if end < start:
            raise ValueError(f"energy window [{start}, {end}] is reversed")
        if not hasattr(self, "_log"):
            self.read()
        return self._log.at(end) - self._log.at(start)
