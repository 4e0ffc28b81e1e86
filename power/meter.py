"""The meter seam: every energy source reports cumulative joules per zone and names its ``source``.

Meters are tried from an ordered preference list (``auto`` = powercap, msr, model), like Kepler's device
layer. Counters from hardware wrap; each meter folds wrap-aware deltas into exact integer totals in a
:class:`CounterBank`, so what it returns never decreases and the layers above never see a wrap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from power.units import Joules, wrap_delta

log = logging.getLogger(__name__)

SOURCES = ("powercap", "msr", "model")
AUTO_ORDER = SOURCES

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


class MeterError(RuntimeError):
    """A meter cannot be used; the message says why and what to do."""


class MeterUnavailable(MeterError):
    """The meter's interface is absent on this machine (no powercap tree, no msr device, no curve)."""


class MeterPermissionError(MeterError):
    """The interface exists but may not be read by this user."""


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


@dataclass
class CounterBank:
    """Exact wrap-corrected totals of raw counters, in the counters' own unit (integers, so no float drift)."""

    _prev: dict[object, int] = field(default_factory=dict)
    _total: dict[object, int] = field(default_factory=dict)

    def update(self, key: object, raw: int, max_range: int) -> int:
        """Fold one raw reading in and return the counter's total since its first reading."""
        prev = self._prev.get(key)
        if prev is None:
            self._total[key] = 0
        else:
            self._total[key] += wrap_delta(raw, prev, max_range)
        self._prev[key] = raw
        return self._total[key]


@dataclass(frozen=True)
class MeterChoice:
    meter: PowerMeter
    #: Why the meters before it in the preference list were skipped (empty when the first one worked).
    skipped: tuple[str, ...]


def open_meter(
    kind: str = "auto",
    *,
    powercap_root: str = "/sys/class/powercap",
    proc_root: str = "/proc",
    dev_root: str = "/dev",
    curve: Sequence[float] | None = None,
    clock: Clock = time.monotonic,
    read_fn: ReadFn = default_read,
) -> MeterChoice:
    """Open the meter ``kind`` or, for ``auto``, the first that works of powercap, msr, model.

    An explicit kind that fails raises its :class:`MeterError`. ``auto`` logs why each skipped meter failed
    and raises only when none works.
    """
    from power.model import DEFAULT_CURVE, ModelMeter
    from power.msr import MsrMeter
    from power.powercap import PowercapMeter

    factories: dict[str, Callable[[], PowerMeter]] = {
        "powercap": lambda: PowercapMeter(powercap_root, read_fn=read_fn),
        "msr": lambda: MsrMeter(dev_root=dev_root, proc_root=proc_root),
        "model": lambda: ModelMeter(curve if curve is not None else DEFAULT_CURVE, proc_root=proc_root,
                                    clock=clock, read_fn=read_fn),
    }
    if kind != "auto" and kind not in factories:
        raise MeterError(f"unknown meter {kind!r}; choose auto, {', '.join(SOURCES)}")
    order = AUTO_ORDER if kind == "auto" else (kind,)
    skipped: list[str] = []
    for name in order:
        try:
            meter = factories[name]()
        except MeterError as e:
            if kind != "auto":
                raise
            skipped.append(f"{name}: {e}")
            # Permission problems deserve a warning: RAPL is there and would be better than the model.
            (log.warning if isinstance(e, MeterPermissionError) else log.info)("meter %s skipped: %s", name, e)
            continue
        return MeterChoice(meter, tuple(skipped))
    raise MeterUnavailable("no meter works here: " + "; ".join(skipped))
