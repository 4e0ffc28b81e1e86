"""The model meter: a calibrated 11-point power curve applied to /proc/stat utilisation.

This is what runs on hosts without RAPL (VMs, our AMD EPYC guests). Power is the curve at the interval's mean
utilisation; energy is that power integrated over the time between readings, with an injected clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from joulesched.power.curves import SPECPOWER, interp, validate_curve
from joulesched.power.meter import Clock, LoggedMeter, MeterError, MeterUnavailable, ReadFn, default_read
from joulesched.power.procfs import CpuTimes, parse_cpu_times, usage_ratio
from joulesched.power.units import Joules

#: Used when no calibrated profile is given. A guess, so the exporter warns; calibrate, or pass --profile.
DEFAULT_CURVE_NAME = "hp-ml110-g5"
DEFAULT_CURVE = SPECPOWER[DEFAULT_CURVE_NAME]
ZONE = "platform"


class ModelMeter(LoggedMeter):
    """Cumulative modelled joules in one zone, ``platform`` (the curve describes the whole server)."""

    source = "model"
    zones = (ZONE,)
    primary_zones = (ZONE,)

    def __init__(self, curve: Sequence[float], *, proc_root: str = "/proc", clock: Clock = time.monotonic,
                 read_fn: ReadFn = default_read) -> None:
        try:
            self.curve = validate_curve(curve)
        except ValueError as e:
            raise MeterError(f"model curve: {e}") from None
        self._path = os.path.join(proc_root, "stat")
        self._clock = clock
        self._read_fn = read_fn
        self._joules = 0.0
        self.last_utilization = 0.0
        self._prev: tuple[float, CpuTimes] = (clock(), self._cpu())

    def _cpu(self) -> CpuTimes:
        try:
            return parse_cpu_times(self._read_fn(self._path))
        except FileNotFoundError:
            raise MeterUnavailable(f"{self._path} not found") from None
        except OSError as e:  # a file given as --proc-root (ENOTDIR), EIO
            raise MeterError(f"cannot read {self._path}: {e.strerror or e} (is --proc-root a procfs?)") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise MeterError(f"{self._path}: {e}") from None

    def read(self) -> dict[str, Joules]:
        now, cpu = self._clock(), self._cpu()
        t0, cpu0 = self._prev
        if now > t0:
            self.last_utilization = usage_ratio(cpu0, cpu)
            self._joules += interp(self.curve, self.last_utilization) * (now - t0)
            self._prev = (now, cpu)
        return self._logged({ZONE: Joules(self._joules)})
