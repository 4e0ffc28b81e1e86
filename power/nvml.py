"""GPU energy through NVML (``nvidia-ml-py``, imported as ``pynvml``), behind the EnergyMeter seam.

One zone per GPU, ``gpu<index>`` (its name and UUID in :attr:`NvmlMeter.devices`). The counter preferred is
``nvmlDeviceGetTotalEnergyConsumption``: millijoules since the driver loaded, on Volta and later; the meter
reports joules since it was opened. When that counter goes back (the driver reloaded) the joules counted so far
are carried forward and the new reading becomes the baseline, so what the meter returns never decreases (the
interval of the reload counts nothing). A read that finds NVML uninitialised, the driver gone or a GPU lost (a
driver upgrade, a GPU reset) re-opens NVML, at most every :data:`REOPEN_EVERY_S`, and finds each GPU again by its
UUID (indices may change), so a long-running exporter recovers without a restart. Reads are per GPU: one that
cannot be read (an NVML error, lost, not found again after a re-open: *gone*, looked for again at the same
rate) holds its total, as :class:`~joulesched.power.powercap.PowercapMeter` holds a zone that has gone, and the
others go on counting; only when every GPU fails does the read fail. A GPU without the counter
(``NVML_ERROR_NOT_SUPPORTED``: Pascal and older) is read through ``nvmlDeviceGetPowerUsage`` (milliwatts) and
integrated by the trapezoid rule between readings, so its energy is as good as the reading rate (the time it
could not be read is not integrated). Every GPU is a primary zone: boards are disjoint.

The NVML module is injected (``nvml=``), so that the logic is tested with recorded responses
(tests/power/test_nvml.py) and a machine without a GPU fails with :class:`MeterUnavailable`, not an import error.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from joulesched.power.meter import Clock, Joules, LoggedMeter, MeterError, MeterUnavailable

log = logging.getLogger(__name__)

#: The least time between two attempts to re-open NVML after reads failed with a stale handle.
REOPEN_EVERY_S = 30.0


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    uuid: str
    counter: bool  # reads nvmlDeviceGetTotalEnergyConsumption (else integrates nvmlDeviceGetPowerUsage)


class _ReadFailed(Exception):
    """An NVML read of one GPU failed (``error``: the NVMLError)."""

    def __init__(self, device: GpuDevice, error: Exception) -> None:
        super().__init__(str(error))
        self.device, self.error = device, error


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _load_nvml():
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise MeterUnavailable(f"nvidia-ml-py is not installed ({e})") from None
    return pynvml


class NvmlMeter(LoggedMeter):
    """Cumulative joules per GPU since the meter was opened (module docstring)."""

    source = "nvml"

    def __init__(self, *, nvml: Any = None, clock: Clock = time.monotonic) -> None:
        self._nvml = nv = nvml if nvml is not None else _load_nvml()
        self._clock = clock
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise MeterUnavailable(f"NVML cannot start: {e} (no NVIDIA driver or GPU here)") from None
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise MeterUnavailable(f"NVML lists no GPUs: {e}") from None
        if count == 0:
            raise MeterUnavailable("NVML sees no GPU")
        self._handles: list[Any] = []  # None: a GPU a re-open did not find (gone)
        devices = []
        for i in range(count):
            call = "nvmlDeviceGetHandleByIndex"
            try:  # a GPU lost or not ours (NO_PERMISSION) here is a meter that cannot open, said as such
                h = nv.nvmlDeviceGetHandleByIndex(i)
                call = "nvmlDeviceGetTotalEnergyConsumption"
                try:
                    nv.nvmlDeviceGetTotalEnergyConsumption(h)
                    counter = True
                except nv.NVMLError as e:
                    if getattr(e, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                        raise
                    counter = False
                call = "nvmlDeviceGetName/UUID"
                name, uuid = _text(nv.nvmlDeviceGetName(h)), _text(nv.nvmlDeviceGetUUID(h))
            except nv.NVMLError as e:
                raise MeterError(f"gpu{i}: {call}: {e}") from None
            self._handles.append(h)
            devices.append(GpuDevice(i, name, uuid, counter))
        self.devices = tuple(devices)
        self.zones = self.primary_zones = tuple(f"gpu{d.index}" for d in devices)
        self._mj0: dict[int, int] = {}  # counter GPUs: the baseline reading, mJ (rebased when the counter goes back)
        self._mj_last: dict[int, int] = {}  # counter GPUs: the last reading, mJ
        self._carried: dict[int, float] = {}  # counter GPUs: joules counted before the last rebase
        self._last: dict[int, tuple[float, float | None, float]] = {}  # power GPUs: (t, watts, joules so far)
        self._reopened_at: float | None = None
        self._sought_at = float("-inf")  # when the GPUs a re-open did not find were last looked for
        self._failing: set[int] = set()  # GPUs that could not be read at the last read (their totals held)
        #: The zones (``gpu<index>``) whose totals were held at the last read: they could not be read.
        self.held_zones: tuple[str, ...] = ()
        # The codes after which the handles are stale: a re-open may mend them.
        self._stale = {nv.NVML_ERROR_UNINITIALIZED, nv.NVML_ERROR_DRIVER_NOT_LOADED, nv.NVML_ERROR_GPU_IS_LOST,
                       nv.NVML_ERROR_RESET_REQUIRED}
        self.read()

    def _energy(self, d: GpuDevice, now: float) -> float:
        nv, h = self._nvml, self._handles[d.index]
        try:
            if d.counter:
                return self._counted(d.index, int(nv.nvmlDeviceGetTotalEnergyConsumption(h)))
            w = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except nv.NVMLError as e:
            raise _ReadFailed(d, e) from None
        last = self._last.get(d.index)
        if last is None:
            j = 0.0
        elif last[1] is None:  # the first reading after NVML was re-opened
            j = last[2]
        else:
            j = last[2] + (now - last[0]) * (w + last[1]) / 2.0
        self._last[d.index] = (now, w, j)
        return j

    def _counted(self, i: int, mj: int) -> float:
        """Joules since the meter opened from a reading of the counter (mJ since the driver loaded)."""
        last = self._mj_last.get(i)
        if last is None:
            self._mj0[i] = mj
        elif mj < last:
            # The driver reloaded and its counter restarted: keep what was counted, count on from the new value.
            self._carried[i] = self._carried.get(i, 0.0) + (last - self._mj0[i]) / 1000.0
            self._mj0[i] = mj
            log.warning("gpu%d: the energy counter went back from %d to %d mJ (the driver reloaded?); the total "
                        "is carried forward from the new reading", i, last, mj)
        self._mj_last[i] = mj
        return self._carried.get(i, 0.0) + (mj - self._mj0[i]) / 1000.0

    def _held(self, d: GpuDevice) -> float:
        """The joules counted so far on ``d``: what a GPU that cannot be read reports until it reads again."""
        i = d.index
        if d.counter:
            return self._carried.get(i, 0.0) + ((self._mj_last[i] - self._mj0[i]) / 1000.0 if i in self._mj_last
                                                else 0.0)
        last = self._last.get(i)
        return last[2] if last is not None else 0.0

    def _read_each(self, now: float) -> tuple[dict[str, Joules], dict[int, str], bool]:
        """Every GPU's joules, a failing one's held; (joules, why each failing GPU failed, whether a failure was
        a stale handle that re-opening NVML may mend)."""
        out: dict[str, Joules] = {}
        why: dict[int, str] = {}
        stale = False
        for d in self.devices:
            if self._handles[d.index] is None:
                why[d.index] = f"gpu{d.index} ({d.name}, {d.uuid}) is gone: not found by its UUID after re-opening NVML"
            else:
                try:
                    out[f"gpu{d.index}"] = self._energy(d, now)
                    continue
                except _ReadFailed as f:
                    why[d.index] = f"gpu{d.index}: NVML read failed: {f.error}"
                    stale = stale or getattr(f.error, "value", None) in self._stale
            j = out[f"gpu{d.index}"] = self._held(d)
            if not d.counter:  # power only: the time it could not be read is not integrated
                self._last[d.index] = (now, None, j)
        return out, why, stale

    def read(self) -> dict[str, Joules]:
        """Every GPU's joules. A GPU that cannot be read (an NVML call failing, the GPU lost, or not found by its
        UUID after NVML was re-opened) holds its total while the others go on being counted (one lost GPU used to
        fail every read, so the healthy ones stopped counting until a restart); :attr:`held_zones` names them.
        A stale handle re-opens NVML first (:meth:`_reopen`). With every GPU failing the read fails."""
        now = self._clock()
        self._find_gone(now)
        out, why, stale = self._read_each(now)
        if stale and self._reopen(now):
            out, why, _ = self._read_each(now)
        for i in sorted(why.keys() - self._failing):
            log.warning("%s; its total is held at %.3f J and counted on when it reads again", why[i], out[f"gpu{i}"])
        for i in sorted(self._failing - why.keys()):
            log.warning("gpu%d reads again", i)
        self._failing = set(why)
        self.held_zones = tuple(f"gpu{i}" for i in sorted(why))
        if len(why) == len(self.devices):
            raise MeterError("; ".join(why[i] for i in sorted(why)))
        return self._logged(out)

    def _find_gone(self, now: float) -> None:
        """Look again, by UUID, for the GPUs a re-open did not find (at most every :data:`REOPEN_EVERY_S`). One
        found counts on from its next reading: what it drew while gone is not known (a reset may restart its
        counter), so nothing is counted for that time."""
        gone = [d for d in self.devices if self._handles[d.index] is None]
        if not gone or now - self._sought_at < REOPEN_EVERY_S:
            return
        self._sought_at = now
        nv = self._nvml
        for d in gone:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(d.uuid)
            except nv.NVMLError:
                continue
            held = self._held(d)
            if d.counter:  # a new baseline: the next reading counts nothing, later ones count on from it
                self._carried[d.index] = held
                self._mj_last.pop(d.index, None)
                self._mj0.pop(d.index, None)
            else:
                self._last[d.index] = (now, None, held)
            self._handles[d.index] = h
            log.warning("gpu%d (%s, %s) is found again", d.index, d.name, d.uuid)

    def _reopen(self, now: float) -> bool:
        """Open NVML again and find each GPU by its UUID; False when it was tried too recently. The zones keep
        their names (``gpu<index at open>``); a GPU not found is marked gone (no handle: its total is held and
        it is looked for again, :meth:`_find_gone`) and the others are read on. NVML not opening again is a
        :class:`MeterError` (no GPU can be read)."""
        if self._reopened_at is not None and now - self._reopened_at < REOPEN_EVERY_S:
            return False
        self._reopened_at = now
        nv = self._nvml
        log.warning("NVML handles are stale (the driver reloaded or a GPU was reset?): re-opening NVML")
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass  # already shut down with the driver
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise MeterError(f"NVML cannot be re-opened: {e}") from None
        handles: list[Any] = []
        for d in self.devices:
            try:
                handles.append(nv.nvmlDeviceGetHandleByUUID(d.uuid))
            except nv.NVMLError as e:
                handles.append(None)
                self._sought_at = now
                log.warning("gpu%d (%s, %s) is not found after re-opening NVML (%s): looked for again every %g s",
                            d.index, d.name, d.uuid, e, REOPEN_EVERY_S)
        self._handles = handles
        # Power-only GPUs: the gap is not integrated, the joules so far are kept (counters rebase on their own).
        self._last = {i: (t, None, j) for i, (t, _w, j) in self._last.items()}
        return True

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
