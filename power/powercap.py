"""RAPL through Linux powercap: ``/sys/class/powercap/intel-rapl:N[:M]/{name,energy_uj,max_energy_range_uj}``.

Rules from reference.md section 4:

- zones overlap (package contains core and uncore), so each zone is reported on its own and only the package
  zones (disjoint sockets) are summed for attribution;
- ``intel-rapl-mmio:N`` repeats a package zone through another interface and is counted once;
- counters wrap at ``max_energy_range_uj``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass

from joulesched.power.meter import (
    PERMISSION_HINT,
    Clock,
    CounterBank,
    LoggedMeter,
    MeterError,
    MeterPermissionError,
    MeterUnavailable,
    ReadFn,
    default_read,
)
from joulesched.power.units import UJ_PER_J, Joules, uj_to_j

log = logging.getLogger(__name__)

_ZONE_DIR = re.compile(r"^(intel-rapl(?:-mmio)?):(\d+)(?::(\d+))?\Z")


@dataclass(frozen=True)
class Zone:
    """One powercap zone. ``label`` is what the exporter shows (``package-0``, ``core-0``, ``dram-1``, ``psys``)."""

    label: str
    name: str
    path: str
    interface: str  # intel-rapl or intel-rapl-mmio
    top_level: bool
    max_range_uj: int


#: The smallest counter range a zone may have: 500 W goes round 100 J in 0.2 s, so its readings would have to come
#: every 0.1 s. Real ranges are kilojoules (262 kJ on most Intel parts); a smaller one is a broken driver.
MIN_RANGE_UJ = 100 * UJ_PER_J


def _read_text(read_fn: ReadFn, path: str) -> str:
    try:
        return read_fn(path).decode("ascii", "replace").strip()
    except PermissionError:
        raise MeterPermissionError(f"cannot read {path}: permission denied. {PERMISSION_HINT}") from None
    except FileNotFoundError:
        raise  # the callers tell an optional file from a missing zone
    except OSError as e:  # EIO, ENODATA (psys on some laptops), a directory where the file should be
        raise MeterError(f"cannot read {path}: {e.strerror or e}") from None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except PermissionError:
        raise MeterPermissionError(f"cannot list {path}: permission denied. {PERMISSION_HINT}") from None


def _zone_dirs(root: str) -> list[tuple[str, str]]:
    """(dir name, path) of every zone, whether sysfs lists subzones at the top, nested, or both."""
    found: dict[str, str] = {}
    try:
        entries = _listdir(root)
    except FileNotFoundError:
        raise MeterUnavailable(f"{root} does not exist (no powercap/RAPL driver, or a VM)") from None
    except NotADirectoryError:  # a wrong root, not a missing driver: not skipped as merely unavailable
        raise MeterError(f"{root} is not a directory (give the powercap tree, /sys/class/powercap)") from None
    for entry in entries:
        path = os.path.join(root, entry)
        if not _ZONE_DIR.match(entry) or not os.path.isdir(path):
            continue
        found.setdefault(entry, path)
        for child in _listdir(path):
            if _ZONE_DIR.match(child) and os.path.isdir(os.path.join(path, child)):
                found.setdefault(child, os.path.join(path, child))

    def order(item: tuple[str, str]) -> tuple:
        m = _ZONE_DIR.match(item[0])
        assert m
        # intel-rapl before intel-rapl-mmio so that the MSR-backed zone wins the de-duplication.
        return (m.group(1) != "intel-rapl", int(m.group(2)), -1 if m.group(3) is None else int(m.group(3)))

    return sorted(found.items(), key=order)


def discover_zones(root: str, read_fn: ReadFn = default_read) -> tuple[list[Zone], list[str]]:
    """Zones to read, and notes on what was dropped (mmio duplicates, zones without a counter)."""
    zones: list[Zone] = []
    notes: list[str] = []
    parent_socket: dict[tuple[str, str], str] = {}
    labels: set[str] = set()
    for dirname, path in _zone_dirs(root):
        m = _ZONE_DIR.match(dirname)
        assert m
        interface, idx, sub = m.group(1), m.group(2), m.group(3)
        energy = os.path.join(path, "energy_uj")
        if not os.path.exists(energy):
            notes.append(f"{dirname}: no energy_uj, skipped")
            continue
        name_file = os.path.join(path, "name")
        name = _read_text(read_fn, name_file) if os.path.exists(name_file) else dirname
        if sub is None:
            label = name
            # Subzone labels carry their socket: "core" under package-1 becomes core-1.
            parent_socket[(interface, idx)] = name.rsplit("-", 1)[1] if re.fullmatch(r"package-\d+", name) else idx
        else:
            label = f"{name}-{parent_socket.get((interface, idx), idx)}"
        if interface == "intel-rapl-mmio" and label in labels:
            notes.append(f"{dirname}: duplicate of {label} through MMIO, counted once")
            continue
        if label in labels:  # two distinct zones with one name: keep both, visibly
            label = f"{label}@{dirname}"
        try:
            max_range = int(_read_text(read_fn, os.path.join(path, "max_energy_range_uj")))
        except (FileNotFoundError, ValueError):
            notes.append(f"{dirname}: no usable max_energy_range_uj, so wraps cannot be corrected; skipped")
            continue
        if max_range < MIN_RANGE_UJ:
            notes.append(f"{dirname}: max_energy_range_uj {max_range} is below {MIN_RANGE_UJ} (100 J): no counter "
                         "this small can be read often enough to correct its wraps; skipped")
            continue
        try:  # a zone whose counter errors (EIO, ENODATA) is dropped, not the meter; a permission problem is said
            int(_read_text(read_fn, energy))
        except (FileNotFoundError, ValueError, MeterError) as e:
            if isinstance(e, MeterPermissionError):
                raise
            notes.append(f"{dirname}: energy_uj cannot be read ({e}); skipped")
            continue
        labels.add(label)
        zones.append(Zone(label, name, energy, interface, sub is None, max_range))
    return zones, notes


class PowercapMeter(LoggedMeter):
    """Cumulative joules per powercap zone, wrap-corrected. Opening reads every zone once, so a permission
    problem surfaces at once with a message saying what to do."""

    source = "powercap"

    def __init__(self, root: str = "/sys/class/powercap", *, read_fn: ReadFn = default_read,
                 clock: Clock = time.monotonic) -> None:
        self.root = root
        self._clock = clock
        self._read_fn = read_fn
        found, self.notes = discover_zones(root, read_fn)
        if not found:  # the notes say why each zone there was dropped
            raise MeterUnavailable(f"no usable RAPL zones under {root}: {'; '.join(self.notes)}" if self.notes
                                   else f"no RAPL zones with energy_uj under {root}")
        self._zones = found
        self.zones = tuple(z.label for z in found)
        packages = tuple(z.label for z in found if z.top_level and z.name.startswith("package"))
        psys = tuple(z.label for z in found if z.top_level and z.name == "psys")
        # Packages are disjoint sockets; psys covers the platform and contains them, so it is the fallback only.
        self.primary_zones = packages or psys or tuple(z.label for z in found if z.top_level)
        if not self.primary_zones:  # only subzones left: summing them would miss or double-count, so say so
            raise MeterUnavailable(f"no package or platform zone to attribute under {root} (only "
                                   f"{', '.join(self.zones)}): {'; '.join(self.notes) or 'no top-level zone'}")
        self.wrap_joules = min(z.max_range_uj for z in found) / UJ_PER_J
        self._bank = CounterBank()
        self._path_of = {z.label: z.path for z in found}
        self._gone: set[str] = set()  # zones whose energy_uj was missing at the last read
        self.read()

    def _raw(self, zone: Zone) -> int:
        text = _read_text(self._read_fn, zone.path)
        try:
            value = int(text)
        except ValueError:
            raise MeterError(f"{zone.path}: not an integer: {text!r}") from None
        if not 0 <= value <= zone.max_range_uj:
            raise MeterError(f"{zone.path}: {value} is outside the counter's range 0..{zone.max_range_uj} "
                             "(max_energy_range_uj)")
        return value

    def read(self) -> dict[str, Joules]:
        """Every zone's joules. A zone whose ``energy_uj`` has gone (its package hot-removed, the driver
        reloading) or cannot be read (EIO, ENODATA, a value out of range) holds its total, with a warning, while
        the others go on being read (they wrap); when it comes back its first reading is a new baseline. With
        every primary zone gone or unreadable the read fails; a permission error always does."""
        now = self._clock()
        out: dict[str, Joules] = {}
        gone: set[str] = set()
        why: dict[str, str] = {}
        for z in self._zones:
            try:
                raw = self._raw(z)
            except (FileNotFoundError, MeterError) as e:
                if isinstance(e, MeterPermissionError):
                    raise
                # Gone, or unreadable (EIO, ENODATA: psys on some laptops; a value out of range): held, so that
                # one bad zone does not stop the others (a review: any error but a missing file failed the read)
                gone.add(z.label)
                why[z.label] = (f"{self._path_of[z.label]} has gone (package removed, RAPL driver unloaded?)"
                                if isinstance(e, FileNotFoundError) else str(e))
                if isinstance(e, FileNotFoundError):  # a counter that comes back has restarted: a new baseline
                    self._bank.rebase(z.label)
                # (an unreadable one has not: its next reading counts the whole gap from its last good one)
                out[z.label] = uj_to_j(self._bank.total(z.label))
                continue
            out[z.label] = uj_to_j(self._bank.update(z.label, raw, z.max_range_uj, now=now, units_per_joule=UJ_PER_J))
        for label in sorted(gone - self._gone):
            log.warning("powercap zone %s: %s; its total is held at %.3f J and counted on from its next reading",
                        label, why[label], out[label])
        for label in sorted(self._gone - gone):
            log.warning("powercap zone %s is back; counting on from its new reading", label)
        self._gone = gone
        if gone.issuperset(self.primary_zones):
            raise MeterError(f"no primary zone ({', '.join(self.primary_zones)}) can be read under {self.root}: "
                             + "; ".join(why[z] for z in self.primary_zones))
        return self._logged(out)
