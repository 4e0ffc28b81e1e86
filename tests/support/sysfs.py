"""Writers of synthetic powercap, MSR and /proc trees, for tests, the overhead benchmark and demos.

Files are replaced atomically (write, then rename) so a reader running in another thread never sees half a
number, just as sysfs never shows one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


class SyntheticPowercap:
    """A /sys/class/powercap tree. ``add`` a zone by directory name, then ``advance`` its counter in µJ."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._uj: dict[str, int] = {}
        self._max: dict[str, int] = {}
        self._paths: dict[str, Path] = {}

    def add(self, dirname: str, name: str, *, energy_uj: int = 0, max_range_uj: int = 262_143_328_850,
            nested: bool = False) -> Path:
        """``intel-rapl:0`` → top-level zone; ``intel-rapl:0:1`` → subzone (nested inside its parent when
        ``nested``, as the real sysfs does, else listed at the top as the real symlinks are)."""
        parts = dirname.split(":")
        path = self.root / (f"{parts[0]}:{parts[1]}/{dirname}" if nested and len(parts) == 3 else dirname)
        _write(path / "name", name + "\n")
        _write(path / "max_energy_range_uj", f"{max_range_uj}\n")
        self._max[dirname], self._uj[dirname] = max_range_uj, energy_uj
        self._paths[dirname] = path
        self.set(dirname, energy_uj)
        return path

    def set(self, dirname: str, energy_uj: int) -> None:
        self._uj[dirname] = energy_uj
        _write(self._paths[dirname] / "energy_uj", f"{energy_uj}\n")

    def advance(self, dirname: str, delta_uj: int) -> int:
        """Add ``delta_uj`` (less than one range), wrapping like the hardware. Returns the new raw value."""
        assert 0 <= delta_uj < self._max[dirname]
        raw = self._uj[dirname] + delta_uj
        if raw > self._max[dirname]:
            raw -= self._max[dirname]
        self.set(dirname, raw)
        return raw

    def energy_path(self, dirname: str) -> Path:
        return self._paths[dirname] / "energy_uj"


class SyntheticMsr:
    """An in-memory ``/dev/cpu/N/msr``: pass ``opener`` and ``pread`` to :class:`power.msr.MsrMeter`.

    A plain file cannot stand in for the device: the device's offset is a register number, and AMD's energy
    registers are adjacent numbers whose 8-byte values would overlap in a file.
    """

    def __init__(self, dev_root: Path) -> None:
        self.dev_root = Path(dev_root)
        self.registers: dict[int, dict[int, int]] = {}  # cpu -> register -> value
        self._fds: dict[int, int] = {}

    def write(self, cpu: int, register: int, value: int) -> None:
        self.registers.setdefault(cpu, {})[register] = value

    def opener(self, path: str, flags: int) -> int:
        rel = Path(path).relative_to(self.dev_root).parts  # ("cpu", "N", "msr")
        cpu = int(rel[1])
        if cpu not in self.registers:
            raise FileNotFoundError(2, "No such file or directory", path)
        fd = 1000 + cpu
        self._fds[fd] = cpu
        return fd

    def pread(self, fd: int, n: int, register: int) -> bytes:
        try:
            return self.registers[self._fds[fd]][register].to_bytes(8, "little")[:n]
        except KeyError:
            raise OSError(5, "Input/output error") from None  # what the msr driver answers for a bad register


@dataclass
class FakeProcess:
    pid: int
    comm: str = "worker"
    utime: int = 0
    stime: int = 0
    start_time: int = 100
    cgroup: str = "0::/user.slice/session-1.scope\n"
    cmdline: bytes = b"/usr/bin/worker\0"
    ppid: int = 1
    cutime: int = 0  # the reaped children's CPU time (cutime + cstime counted here as one)


@dataclass
class SyntheticProc:
    """A /proc tree: the aggregate cpu line of ``stat``, ``cpuinfo``, ``meminfo`` and per-process files."""

    root: Path
    cpu: list[int] = field(default_factory=lambda: [0] * 10)  # user nice system idle iowait irq softirq steal guest gn
    processes: dict[int, FakeProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_stat()
        _write(self.root / "meminfo", "MemTotal:        8152268 kB\nMemFree:         1000000 kB\n")

    def write_stat(self) -> None:
        _write(self.root / "stat", "cpu  " + " ".join(map(str, self.cpu)) + "\n"
               + "cpu0 " + " ".join(map(str, self.cpu)) + "\nintr 0\nctxt 0\n")

    def tick(self, *, user: int = 0, system: int = 0, idle: int = 0, iowait: int = 0, guest: int = 0) -> None:
        """Advance node CPU time in clock ticks. Guest time is also user time, as the kernel counts it."""
        for i, v in ((0, user + guest), (2, system), (3, idle), (4, iowait), (8, guest)):
            self.cpu[i] += v
        self.write_stat()

    def cpuinfo(self, vendor: str, packages: int = 1, cores_per_package: int = 2, threads: int = 1) -> None:
        blocks, n = [], 0
        for pkg in range(packages):
            for core in range(cores_per_package):
                for _ in range(threads):
                    blocks.append(f"processor\t: {n}\nvendor_id\t: {vendor}\nphysical id\t: {pkg}\n"
                                  f"core id\t\t: {core}\n")
                    n += 1
        _write(self.root / "cpuinfo", "\n".join(blocks))

    def add(self, p: FakeProcess) -> FakeProcess:
        self.processes[p.pid] = p
        d = self.root / str(p.pid)
        _write(d / "cgroup", p.cgroup)
        _write(d / "cmdline", p.cmdline)
        self.write_process(p)
        return p

    def write_process(self, p: FakeProcess) -> None:
        # Fields 3..: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
        # cstime priority nice num_threads itrealvalue starttime ...
        rest = ["S", str(p.ppid), "1", "1", "0", "-1", "4194304", "0", "0", "0", "0", str(p.utime), str(p.stime),
                str(p.cutime), "0", "20", "0", "1", "0", str(p.start_time), "1000", "100"]
        _write(self.root / str(p.pid) / "stat", f"{p.pid} ({p.comm}) " + " ".join(rest) + "\n")

    def run(self, pid: int, *, utime: int = 0, stime: int = 0) -> None:
        p = self.processes[pid]
        p.utime += utime
        p.stime += stime
        self.write_process(p)

    def reap(self, pid: int) -> None:
        """Process ``pid`` exits and its parent waits for it: its CPU time moves to the parent's cutime."""
        p = self.processes[pid]
        parent = self.processes.get(p.ppid)
        self.remove(pid)
        if parent is not None:
            parent.cutime += p.utime + p.stime + p.cutime
            self.write_process(parent)

    def remove(self, pid: int) -> None:
        d = self.root / str(pid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
        del self.processes[pid]


def pod_cgroup_v2(uid: str, container_id: str, qos: str = "burstable") -> str:
    """systemd driver, cgroup v2: the UID's dashes become underscores in the slice name."""
    u = uid.replace("-", "_")
    return (f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/"
            f"cri-containerd-{container_id}.scope\n")


def pod_cgroup_v1(uid: str, container_id: str, qos: str = "burstable") -> str:
    """cgroupfs driver, cgroup v1: one line per hierarchy."""
    path = f"/kubepods/{qos}/pod{uid}/{container_id}"
    return "".join(f"{i}:{c}:{path}\n" for i, c in ((12, "memory"), (4, "cpu,cpuacct"), (2, "pids"))) \
        + "1:name=systemd:" + path + "\n"


__all__ = ["SyntheticPowercap", "SyntheticMsr", "SyntheticProc", "FakeProcess", "pod_cgroup_v1", "pod_cgroup_v2"]
