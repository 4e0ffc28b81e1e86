"""The /proc readings attribution needs: node CPU time, per-process CPU time, pod and VM identity.

Everything takes a ``proc_root`` so tests run on synthetic trees. The per-process path is the hot loop of the
exporter (hundreds of processes a second), so it uses raw ``os.open``/``os.read`` and caches identity
(cgroup, cmdline) per process incarnation, keyed by pid and start time.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from joulesched.power.meter import MeterError, ReadFn, default_read


class CpuTimes(NamedTuple):
    """Aggregate ``cpu`` line of /proc/stat, in clock ticks."""

    total: int
    idle: int
    iowait: int

    @property
    def active(self) -> int:
        return self.total - self.idle - self.iowait


def parse_cpu_times(text: str | bytes) -> CpuTimes:
    line = (text.decode() if isinstance(text, bytes) else text).split("\n", 1)[0]
    fields = line.split()
    if not fields or fields[0] != "cpu":
        raise ValueError(f"/proc/stat does not start with the aggregate cpu line: {line!r}")
    v = [int(x) for x in fields[1:]] + [0] * 10
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already inside user and
    # nice, so adding it would count VM CPU twice.
    return CpuTimes(total=sum(v[:8]), idle=v[3], iowait=v[4])


def usage_ratio(prev: CpuTimes, cur: CpuTimes) -> float:
    """Kepler's node usage ratio: (Δtotal − Δidle − Δiowait) / Δtotal, clamped to [0, 1]."""
    d_total = cur.total - prev.total
    if d_total <= 0:
        return 0.0
    return min(1.0, max(0.0, (cur.active - prev.active) / d_total))


def read_cpu_times(proc_root: str = "/proc", read_fn: ReadFn = default_read) -> CpuTimes:
    """The node's CPU time; a :class:`MeterError` names the file when it cannot be read or parsed (a wrong
    --proc-root), where attribution cannot go on."""
    path = os.path.join(proc_root, "stat")
    try:
        return parse_cpu_times(read_fn(path))
    except OSError as e:
        raise MeterError(f"cannot read {path}: {e.strerror or e} (is --proc-root a procfs?)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise MeterError(f"{path}: not a /proc/stat: {e}") from None


class ProcStat(NamedTuple):
    comm: str
    cpu_ticks: int  # utime + stime
    start_time: int  # field 22: tells a reused pid from the process that had it before
    ppid: int = 0
    child_ticks: int = 0  # cutime + cstime: the CPU time of its children it has reaped (waited for)


def parse_pid_stat(data: bytes) -> ProcStat:
    """Parse /proc/PID/stat. ``comm`` may hold spaces and parentheses, so fields are split after the LAST ')'."""
    open_ = data.index(b"(")
    close = data.rindex(b")")
    rest = data[close + 2:].split()
    # rest[0] is field 3 (state); field k is rest[k - 3]: ppid 4, utime 14, stime 15, cutime 16, cstime 17,
    # starttime 22.
    return ProcStat(data[open_ + 1:close].decode("utf-8", "replace"), int(rest[11]) + int(rest[12]), int(rest[19]),
                    int(rest[1]), int(rest[13]) + int(rest[14]))


#: A static pod's UID is the kubelet's 32-hex hash of its manifest (the mirror pod's annotation
#: ``kubernetes.io/config.hash``), not a dashed UUID: the apiserver, etcd and the control plane's other pods.
_STATIC_UID = r"[0-9a-fA-F]{32}(?![0-9a-fA-F])"
_POD = re.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
                  rf"|{_STATIC_UID})")
#: A cgroupfs driver's pod directory, the whole path component (``pod<uid>``): recognised without "kubepods" in
#: the path, which a reader in a private cgroup namespace does not see (``0::/../../burstable/pod<uid>/<id>``).
_POD_DIR = re.compile(r"pod([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
                      rf"|{_STATIC_UID})")
_CONTAINER = re.compile(r"^(?:cri-containerd-|docker-|crio-|cri-o-|libpod-)?([0-9a-f]{64})(?:\.scope)?\Z")


class PodRef(NamedTuple):
    pod_uid: str
    container_id: str  # "" for a process in the pod's own cgroup (e.g. between container starts)


def parse_cgroup(text: str | bytes) -> PodRef | None:
    """Pod UID and container id from /proc/PID/cgroup, cgroup v1 or v2, systemd or cgroupfs driver.

    systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
    cri-containerd-<id>.scope``; cgroupfs: ``/kubepods/burstable/pod<uid>/<id>``. Seen from a private cgroup
    namespace the cgroupfs path is relative and may lack "kubepods" (``/../../burstable/pod<uid>/<id>``): a
    component that is exactly ``pod<uid>`` is then enough.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        kube = "kubepods" in path
        parts = path.strip("/").split("/")
        for i, part in enumerate(parts):
            m = _POD.search(part) if kube else _POD_DIR.fullmatch(part)
            if not m:
                continue
            uid = m.group(1).replace("_", "-").lower()
            container = ""
            if i + 1 < len(parts):
                c = _CONTAINER.match(parts[i + 1])
                if c:
                    container = c.group(1)
            return PodRef(uid, container)
    return None


def parse_vm_name(cmdline: bytes) -> str | None:
    """The VM name of a qemu process: ``-name guest=NAME,debug-threads=on`` (libvirt) or ``-name NAME``.

    QEMU escapes a comma inside a value as ``,,``.
    """
    args = cmdline.rstrip(b"\0").split(b"\0")
    if not args or b"qemu" not in os.path.basename(args[0]):
        return None
    for i, arg in enumerate(args):
        if arg in (b"-name", b"--name") and i + 1 < len(args):
            value = args[i + 1].decode("utf-8", "replace")
            options = re.split(r"(?<!,),(?!,)", value)
            for opt in options:
                if opt.startswith("guest="):
                    return opt[len("guest="):].replace(",,", ",")
            if "=" not in options[0]:
                return options[0].replace(",,", ",")
    return None


@dataclass(frozen=True)
class Identity:
    pod: PodRef | None
    vm_name: str | None


#: A process with neither a pod nor a VM has its identity read again this often: ``runc init`` is moved into its
#: pod's cgroup after it starts, and a process found before it was put there would otherwise stay no pod's.
UNKNOWN_IDENTITY_RECHECK_S = 10.0


class ProcScanner:
    """Reads CPU time of every process; identity is read once per process incarnation and program (an exec
    changes the program: a qemu found between fork and exec is a VM from its exec on), and again every
    :data:`UNKNOWN_IDENTITY_RECHECK_S` while it is neither a pod's nor a VM's."""

    def __init__(self, proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = proc_root
        self.clock = clock
        # (pid, start time) -> (comm it was read for, identity, when read)
        self._identity: dict[tuple[int, int], tuple[str, Identity, float]] = {}

    def _read(self, path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 65536)
        finally:
            os.close(fd)

    def scan(self) -> dict[int, ProcStat]:
        out: dict[int, ProcStat] = {}
        root = self.proc_root
        for name in os.listdir(root):
            if not name.isdigit():
                continue
            try:
                out[int(name)] = parse_pid_stat(self._read(f"{root}/{name}/stat"))
            except (OSError, ValueError, IndexError):
                continue  # exited between listdir and read, or a kernel oddity: skip this round
        live = {(pid, st.start_time) for pid, st in out.items()}
        for key in [k for k in self._identity if k not in live]:
            del self._identity[key]
        return out

    def identity(self, pid: int, stat: ProcStat) -> Identity:
        key = (pid, stat.start_time)
        cached = self._identity.get(key)
        now = self.clock()
        if cached is not None and cached[0] == stat.comm and (
                cached[1].pod is not None or cached[1].vm_name is not None
                or now - cached[2] < UNKNOWN_IDENTITY_RECHECK_S):
            return cached[1]
        base = f"{self.proc_root}/{pid}"
        try:
            pod = parse_cgroup(self._read(f"{base}/cgroup"))
        except OSError:
            pod = None
        try:
            vm = parse_vm_name(self._read(f"{base}/cmdline"))
        except OSError:
            vm = None
        ident = Identity(pod, vm)
        self._identity[key] = (stat.comm, ident, now)
        return ident
