"""Attribution by the Kepler 0.10 formula, producing one immutable :class:`Snapshot` per refresh.

For each refresh interval::

    usage_ratio = (Δtotal − Δidle − Δiowait) / Δtotal            (/proc/stat)
    active      = ΔE · usage_ratio,   idle = ΔE − active          (per zone)
    workload    = (ΔCPUtime_w / ΣΔCPUtime_processes) · active     (primary zones)

The denominator is the sum of all processes' CPU time deltas, as in Kepler 0.10 (``ProcessTotalCPUTimeDelta``),
so the processes share exactly the node's active energy and idle energy goes to no workload. Containers, pods
and VMs are sums of their processes; their counters live while any of their processes does (idle or not) and
outlive the last one by ``stale_after_s``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, NamedTuple

from joulesched.power.meter import Clock, MeterError, PowerMeter, ReadFn, default_read
from joulesched.power.procfs import CpuTimes, PodRef, ProcScanner, ProcStat, read_cpu_times, usage_ratio

log = logging.getLogger(__name__)


class ZoneEnergy(NamedTuple):
    joules_total: float
    active_joules_total: float
    idle_joules_total: float
    watts: float


class WorkloadEnergy(NamedTuple):
    joules_total: float
    watts: float  # average over the last interval


class ProcessEnergy(NamedTuple):
    pid: int
    comm: str
    joules_total: float
    watts: float


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True)
class Snapshot:
    """Everything the exporter renders, taken at ``timestamp`` (the monitor's clock)."""

    timestamp: float
    source: str
    interval_s: float = 0.0
    usage_ratio: float = 0.0
    zones: Mapping[str, ZoneEnergy] = field(default_factory=_empty)
    primary_zones: tuple[str, ...] = ()
    processes: tuple[ProcessEnergy, ...] = ()  # top N by joules, largest first
    pods: Mapping[PodRef, WorkloadEnergy] = field(default_factory=_empty)
    vms: Mapping[str, WorkloadEnergy] = field(default_factory=_empty)
    #: Per GPU (``gpu0``, ...): joules since the exporter started and watts over the last interval (GPU meter).
    gpus: Mapping[str, WorkloadEnergy] = field(default_factory=_empty)
    #: GPU readings that failed, for every GPU or some, since the monitor started (the CPU side and the GPUs that
    #: could be read went on; a failing GPU's joules held and its watts read 0).
    gpu_errors: int = 0

    @property
    def primary_watts(self) -> float:
        return sum(self.zones[z].watts for z in self.primary_zones if z in self.zones)


@dataclass
class _Acc:
    joules: float = 0.0
    last_delta: float = 0.0
    last_seen: float = 0.0


@dataclass
class PowerMonitor:
    """Turns meter readings and /proc deltas into snapshots. Call :meth:`refresh` on a timer.

    :param meter: the energy source.
    :param proc_root: where /proc is (a synthetic tree in tests).
    :param clock: monotonic seconds; injected so tests control elapsed time.
    :param top_n: how many processes a snapshot keeps (by cumulative joules); all are still attributed.
    :param stale_after_s: how long pod and VM counters survive their last process (not their last CPU tick).
    :param gpu_meter: the GPUs' energy source (:class:`joulesched.power.nvml.NvmlMeter`), or None.
    """

    meter: PowerMeter
    proc_root: str = "/proc"
    clock: Clock = time.monotonic
    top_n: int = 20
    stale_after_s: float = 300.0
    read_fn: ReadFn = default_read
    gpu_meter: PowerMeter | None = None
    # GPU -> (instant, joules) of its last good reading: a GPU that reads again is averaged over the time since.
    _gpu_prev: dict[str, tuple[float, float]] = field(init=False, default_factory=dict)
    _gpu_errors: int = field(init=False, default=0)
    _gpu_total: dict[str, float] = field(init=False, default_factory=dict)
    _gpu_watts: dict[str, float] = field(init=False, default_factory=dict)
    _scanner: ProcScanner = field(init=False)
    _snapshot: Snapshot = field(init=False)
    _prev: tuple[float, dict[str, float], CpuTimes, dict[int, ProcStat]] | None = field(init=False, default=None)
    _zone_totals: dict[str, list[float]] = field(init=False, default_factory=dict)
    _procs: dict[tuple[int, int], _Acc] = field(init=False, default_factory=dict)
    _pods: dict[PodRef, _Acc] = field(init=False, default_factory=dict)
    _vms: dict[str, _Acc] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.top_n < 0:
            raise ValueError("top_n must be >= 0")
        self._scanner = ProcScanner(self.proc_root, clock=self.clock)
        self._snapshot = Snapshot(timestamp=self.clock(), source=self.meter.source)

    @property
    def snapshot(self) -> Snapshot:
        """The latest snapshot. Replaced whole on refresh, so a scrape never sees half an update."""
        return self._snapshot

    def _refresh_gpus(self, now: float) -> None:
        """GPU joules since the first reading (never decreasing) and watts since each GPU's last good reading.

        Read after the CPU side and on its own: a GPU that cannot be read (an NVML call failing, the GPU lost) is
        counted in ``gpu_errors``, its joules hold and its watts read 0 (no power is known for it: its last value
        would go on saying it draws what it drew), while the other GPUs and the CPU zones, pods and VMs go on."""
        try:
            e = self.gpu_meter.read()
        except MeterError as err:  # every GPU failed
            self._gpu_errors += 1
            self._gpu_watts = dict.fromkeys(self._gpu_watts, 0.0)
            log.warning("GPU energy not read this time (CPU metrics go on): %s", err)
            return
        held = set(getattr(self.gpu_meter, "held_zones", ()))  # NvmlMeter's: not read this time, totals held
        if held:
            self._gpu_errors += 1
        for g, j in e.items():
            self._gpu_total.setdefault(g, 0.0)
            prev = self._gpu_prev.get(g)
            if g in held:
                self._gpu_watts[g] = 0.0
                continue
            self._gpu_prev[g] = (now, j)
            d = 0.0 if prev is None else max(j - prev[1], 0.0)
            dt = now - prev[0] if prev is not None else 0.0
            self._gpu_total[g] += d
            self._gpu_watts[g] = d / dt if dt > 0 else 0.0

    def refresh(self) -> Snapshot:
        now = self.clock()
        # The CPU side first: a GPU that fails must not stop the RAPL counters from being sampled (they wrap).
        energy = self.meter.read()
        cpu = read_cpu_times(self.proc_root, self.read_fn)
        procs = self._scanner.scan()
        if self.gpu_meter is not None:
            self._refresh_gpus(now)
        prev, self._prev = self._prev, (now, energy, cpu, procs)
        if prev is None:
            # The first reading is the baseline: counters start at zero.
            self._zone_totals = {z: [0.0, 0.0, 0.0] for z in energy}
            self._snapshot = self._build(now, 0.0, 0.0, {z: 0.0 for z in energy}, procs)
            return self._snapshot
        t0, energy0, cpu0, procs0 = prev
        dt = max(now - t0, 0.0)
        ratio = usage_ratio(cpu0, cpu)

        d_energy: dict[str, float] = {}
        for zone, joules in energy.items():
            # Meters never decrease; the clamp keeps a misbehaving one from making our counters do so.
            d = max(joules - energy0.get(zone, joules), 0.0)
            d_energy[zone] = d
            tot = self._zone_totals.setdefault(zone, [0.0, 0.0, 0.0])
            active = d * ratio
            tot[0] += d
            tot[1] += active
            tot[2] += d - active

        # Per-process CPU time deltas; a pid whose start time changed is a new process. A child that exited and was
        # reaped since the last read is no longer there to be read, but its whole CPU time is now in its parent's
        # cutime/cstime: the parent is credited what of it was not seen while the child lived (short-lived workers
        # and a process's last partial interval; before, their time was lost and their energy went to the others).
        seen = self._seen_in_gone(procs0, procs)
        deltas: dict[int, int] = {}
        for pid, st in procs.items():
            old = procs0.get(pid)
            if old is not None and old.start_time == st.start_time:
                reaped = st.child_ticks - old.child_ticks
                d_ticks = st.cpu_ticks - old.cpu_ticks + (max(0, reaped - seen.get(pid, 0)) if reaped > 0 else 0)
            else:
                d_ticks = st.cpu_ticks + st.child_ticks
            if d_ticks > 0:
                deltas[pid] = d_ticks
        total_ticks = sum(deltas.values())
        active_primary = sum(d_energy.get(z, 0.0) for z in self.meter.primary_zones) * ratio

        for acc in (*self._procs.values(), *self._pods.values(), *self._vms.values()):
            acc.last_delta = 0.0
        if total_ticks > 0 and active_primary > 0:
            for pid, d_ticks in deltas.items():
                share = active_primary * d_ticks / total_ticks
                st = procs[pid]
                self._add(self._procs, (pid, st.start_time), share, now)
                ident = self._scanner.identity(pid, st)
                if ident.pod is not None:
                    self._add(self._pods, ident.pod, share, now)
                if ident.vm_name is not None:
                    self._add(self._vms, ident.vm_name, share, now)

        if self._pods or self._vms:
            # A pod or VM lives while any of its processes does, busy or not: an idle one keeps its series (a
            # series dropped and reborn at zero loses its joules to increase()). Identity is cached per process.
            for pid, st in procs.items():
                ident = self._scanner.identity(pid, st)
                for table, key in ((self._pods, ident.pod), (self._vms, ident.vm_name)):
                    acc = table.get(key) if key is not None else None
                    if acc is not None:
                        acc.last_seen = now
        live = {(pid, st.start_time) for pid, st in procs.items()}
        self._procs = {k: v for k, v in self._procs.items() if k in live}
        for table in (self._pods, self._vms):
            for key in [k for k, v in table.items() if now - v.last_seen > self.stale_after_s]:
                del table[key]
        self._snapshot = self._build(now, dt, ratio, d_energy, procs)
        return self._snapshot

    @staticmethod
    def _seen_in_gone(procs0: dict, procs: dict) -> dict[int, int]:
        """Parent pid -> the ticks already counted of its children gone since the last read, and of theirs: a
        child reaped by a parent that is itself gone and reaped reaches the grandparent's cutime whole, with
        what the gone parent had reaped of it (a review: only the parent's own ticks were subtracted, so a
        long-lived grandchild's whole life was credited again to the grandparent, a container's shim)."""
        gone = {pid: old for pid, old in procs0.items()
                if (st := procs.get(pid)) is None or st.start_time != old.start_time}
        children: dict[int, list[int]] = {}
        for pid, old in gone.items():
            children.setdefault(old.ppid, []).append(pid)
        below: dict[int, int] = {}  # gone pid -> what its own gone descendants had been counted

        def under(pid: int) -> int:  # iterative post-order: a chain of gone processes can be long
            stack, order, visiting = [pid], [], set()
            while stack:
                p = stack.pop()
                if p in visiting or p in below:
                    continue
                visiting.add(p)  # (a pid reused within one interval cannot loop us)
                order.append(p)
                stack.extend(c for c in children.get(p, ()) if c in gone and c not in below)
            for p in reversed(order):
                below[p] = sum(gone[c].cpu_ticks + gone[c].child_ticks + below.get(c, 0)
                               for c in children.get(p, ()) if c != p)
            return below[pid]

        return {parent: sum(gone[c].cpu_ticks + gone[c].child_ticks + under(c) for c in kids)
                for parent, kids in children.items()}

    @staticmethod
    def _add(table: dict, key: object, joules: float, now: float) -> None:
        acc = table.get(key)
        if acc is None:
            acc = table[key] = _Acc()
        acc.joules += joules
        acc.last_delta += joules
        acc.last_seen = now

    def _build(self, now: float, dt: float, ratio: float, d_energy: dict[str, float],
               procs: dict[int, ProcStat]) -> Snapshot:
        def w(j: float) -> float:
            return j / dt if dt > 0 else 0.0

        zones = {z: ZoneEnergy(t[0], t[1], t[2], w(d_energy.get(z, 0.0))) for z, t in self._zone_totals.items()}
        top = sorted(self._procs.items(), key=lambda kv: (-kv[1].joules, kv[0]))[: self.top_n]  # ties by pid
        return Snapshot(
            timestamp=now,
            source=self.meter.source,
            interval_s=dt,
            usage_ratio=ratio,
            zones=MappingProxyType(zones),
            primary_zones=tuple(self.meter.primary_zones),
            processes=tuple(ProcessEnergy(pid, procs[pid].comm, a.joules, w(a.last_delta)) for (pid, _), a in top),
            pods=MappingProxyType({k: WorkloadEnergy(a.joules, w(a.last_delta)) for k, a in self._pods.items()}),
            vms=MappingProxyType({k: WorkloadEnergy(a.joules, w(a.last_delta)) for k, a in self._vms.items()}),
            gpus=MappingProxyType({g: WorkloadEnergy(j, self._gpu_watts.get(g, 0.0))
                                   for g, j in sorted(self._gpu_total.items())}),
            gpu_errors=self._gpu_errors,
        )
