"""Open the best host meter that works here: ``auto`` tries powercap, then MSRs, then the calibrated model.

Like Kepler's device layer, the preference list is explicit and every skipped meter says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from joulesched.power.meter import (
    Clock,
    MeterError,
    MeterPermissionError,
    MeterUnavailable,
    PowerMeter,
    ReadFn,
    default_read,
)
from joulesched.power.model import DEFAULT_CURVE, ModelMeter
from joulesched.power.msr import MsrMeter
from joulesched.power.powercap import PowercapMeter

log = logging.getLogger(__name__)

SOURCES = ("powercap", "msr", "model")
AUTO_ORDER = SOURCES


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
    factories: dict[str, Callable[[], PowerMeter]] = {
        "powercap": lambda: PowercapMeter(powercap_root, read_fn=read_fn, clock=clock),
        "msr": lambda: MsrMeter(dev_root=dev_root, proc_root=proc_root, clock=clock),
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
