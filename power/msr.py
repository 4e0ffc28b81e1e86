"""RAPL straight from model-specific registers, for kernels without powercap: ``pread`` of 8 bytes at
offset = register number from ``/dev/cpu/N/msr`` (needs root and the ``msr`` module).

The energy unit is 1/2^ESU joules, ESU being bits 12:8 of the unit register; the energy status registers
count in that unit in their low 32 bits and wrap there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from joulesched.power.meter import (
    PERMISSION_HINT,
    Clock,
    CounterBank,
    LoggedMeter,
    MeterError,
    MeterPermissionError,
    MeterUnavailable,
)
from joulesched.power.units import Joules

COUNTER_RANGE = 1 << 32


@dataclass(frozen=True)
class Registers:
    unit: int
    #: zone name -> (register, scope): "package" registers are read on one CPU per socket, "core" ones on one
    #: CPU per physical core and summed (AMD's core energy is per core).
    zones: dict[str, tuple[int, str]]


INTEL = Registers(0x606, {"package": (0x611, "package"), "core": (0x639, "package"), "dram": (0x619, "package")})
AMD = Registers(0xC0010299, {"package": (0xC001029B, "package"), "core": (0xC001029A, "core")})
VENDORS = {"GenuineIntel": INTEL, "AuthenticAMD": AMD, "HygonGenuine": AMD}


@dataclass(frozen=True)
class Cpu:
    number: int
    vendor: str
    package: int
    core: int


def parse_cpuinfo(text: str) -> list[Cpu]:
    """CPUs from /proc/cpuinfo. VMs often omit ``physical id``/``core id``; then each CPU is its own core on
    socket 0."""
    cpus = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if "processor" not in fields:
            continue
        n = int(fields["processor"])
        cpus.append(Cpu(n, fields.get("vendor_id", ""), int(fields.get("physical id", 0)),
                        int(fields.get("core id", n))))
    return cpus


def energy_unit_j(raw_unit: int) -> float:
    return 1.0 / (1 << ((raw_unit >> 8) & 0x1F))


class MsrMeter(LoggedMeter):
    """Cumulative joules per zone (``package-N``, ``core-N``, ``dram-N``) from MSRs."""

    source = "msr"

    def __init__(self, *, dev_root: str = "/dev", proc_root: str = "/proc",
                 opener: Callable[[str, int], int] = os.open,
                 pread: Callable[[int, int, int], bytes] = os.pread, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._pread_fn = pread
        self._close_fds = opener is os.open
        try:
            with open(os.path.join(proc_root, "cpuinfo"), encoding="utf-8") as f:
                cpus = parse_cpuinfo(f.read())
        except FileNotFoundError:
            raise MeterUnavailable(f"{proc_root}/cpuinfo not found") from None
        except (OSError, ValueError) as e:  # a file given as --proc-root, a garbled cpuinfo: not an absent MSR
            raise MeterError(f"cannot read {proc_root}/cpuinfo: {getattr(e, 'strerror', None) or e} "
                             "(is --proc-root a procfs?)") from None
        if not cpus:
            raise MeterUnavailable(f"no CPUs in {proc_root}/cpuinfo")
        regs = VENDORS.get(cpus[0].vendor)
        if regs is None:
            raise MeterUnavailable(f"CPU vendor {cpus[0].vendor!r} has no known RAPL MSRs")
        self._fds: dict[int, int] = {}
        self._bank = CounterBank()

        def fd(cpu: int) -> int:
            if cpu not in self._fds:
                path = os.path.join(dev_root, "cpu", str(cpu), "msr")
                try:
                    self._fds[cpu] = opener(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise MeterUnavailable(f"{path} not found (modprobe msr; none in a VM, nor under the exporter's "
                                           "systemd unit, whose PrivateDevices=yes hides it: use powercap)") from None
                except PermissionError:
                    raise MeterPermissionError(
                        f"cannot open {path}: permission denied. MSRs need root with CAP_SYS_RAWIO; "
                        f"prefer powercap. {PERMISSION_HINT}") from None
            return self._fds[cpu]

        first_in_package: dict[int, int] = {}
        first_in_core: dict[tuple[int, int], int] = {}
        for c in cpus:
            first_in_package.setdefault(c.package, c.number)
            first_in_core.setdefault((c.package, c.core), c.number)
        self._units: dict[int, float] = {}
        # (zone label, register, cpu) for every counter; a zone may sum several (AMD cores).
        self._counters: list[tuple[str, int, int]] = []
        try:
            for pkg, cpu in sorted(first_in_package.items()):
                try:
                    self._units[pkg] = energy_unit_j(self._pread(fd(cpu), regs.unit))
                except OSError as e:  # EIO in a VM that passes the msr device through without RAPL
                    raise MeterUnavailable(f"cannot read the RAPL power unit MSR {regs.unit:#x} on cpu {cpu}: "
                                           f"{e.strerror or e} (no RAPL MSRs here: a VM?)") from None
                for name, (reg, scope) in regs.zones.items():
                    members = [cn for (p, _), cn in first_in_core.items() if p == pkg] if scope == "core" else [cpu]
                    try:
                        for cn in members:
                            self._pread(fd(cn), reg)
                    except OSError:
                        continue  # e.g. no DRAM domain on client parts: the read fails with EIO
                    self._counters += [(f"{name}-{pkg}", reg, cn) for cn in members]
        except BaseException:
            self.close()
            raise
        self._cpu_pkg = {c.number: c.package for c in cpus}
        self.zones = tuple(dict.fromkeys(label for label, _, _ in self._counters))
        self.primary_zones = tuple(z for z in self.zones if z.startswith("package-"))
        self.wrap_joules = COUNTER_RANGE * min(self._units.values()) if self._units else None
        if not self.zones:
            self.close()
            raise MeterUnavailable("no RAPL energy MSR could be read")
        self.read()

    def _pread(self, fd: int, reg: int) -> int:
        data = self._pread_fn(fd, 8, reg)
        if len(data) != 8:
            raise OSError(f"short MSR read at {reg:#x}")
        return int.from_bytes(data, "little")

    def read(self) -> dict[str, Joules]:
        out: dict[str, float] = dict.fromkeys(self.zones, 0.0)
        now = self._clock()
        for label, reg, cpu in self._counters:
            try:
                raw = self._pread(self._fds[cpu], reg) & (COUNTER_RANGE - 1)
            except OSError as e:
                raise MeterError(f"reading MSR {reg:#x} on cpu {cpu}: {e}") from None
            unit = self._units[self._cpu_pkg[cpu]]
            counts = self._bank.update((reg, cpu), raw, COUNTER_RANGE, now=now, units_per_joule=1.0 / unit)
            out[label] += counts * unit
        return self._logged({k: Joules(v) for k, v in out.items()})

    def close(self) -> None:
        if self._close_fds:
            for fd in self._fds.values():
                os.close(fd)
        self._fds.clear()
