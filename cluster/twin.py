"""The digital twin: an event-driven simulated cluster fast enough to train on.

Model (docs/twin.md has the full statement):

* Events are pod arrivals (from the workload, in order), departures, node sleeps and wake-ups, and (with
  consolidation) consolidation ticks and restarts of evicted pods.
* When a node sleeps, and whether one is emptied by consolidation, is decided by the node power decision
  core (:mod:`joulesched.cluster.nodepower`), the same code the live controller runs.
* A pod that fits no node waits in a FIFO pending queue and is retried when a departure frees resources.
* Node power is its curve at u = min(1, demand / allocatable); a sleeping node draws ``sleep_watts``; a waking
  node draws its idle watts for ``wake_s`` and its pods start when it is up.
* CPU is processor-shared and work-conserving: when demand exceeds a node's capacity every pod on it gets
  capacity / demand of what it asks for, and a job runs correspondingly longer. A job violates its SLO when it
  was served below ``slo_fraction`` of its demand for more than ``slo_tolerance`` of its life; a service is
  judged the same way per ``slo_interval_s`` of absolute time.
* The pod model (docs/twin.md): a *service* has no work; it runs until its stop time or the run's end, and its
  demand follows the absolute clock (one event per distinct breakpoint time, shared by every service that
  changes then). A *job* with a usage profile changes demand at breakpoints of its progress, which are entries
  in its node's virtual-time heap, like its departure.
* GPU speed (opt-in, the scenario's ``gpu_runtime``): a GPU job's work is its duration, and a node runs it at
  its GPUs' speed over the reference's, so it takes duration x reference / speed there.
* The run ends when every placeable job has finished, and never before the scenario's ``duration_s``;
  services never extend it. Pods whose requests fit no node even when the cluster is empty are counted as
  never placed.

Each node keeps a virtual clock that advances at its service rate, so a departure is one heap entry per node
and a change of rate reschedules one entry, not one per pod. A workload of constant-usage jobs runs the
original code path: the pod model's handlers are swapped in only when a workload has services or profiles.

The twin is a :class:`~joulesched.cluster.backend.Backend` (``start``, ``next_decision``, ``bind``, ``abandon``,
``result``) and its energy is read through a :class:`~joulesched.power.meter.EnergyMeter`, :class:`TwinMeter`.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
import time
from bisect import bisect_left, bisect_right, insort
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from joulesched.cluster.backend import Decision
from joulesched.cluster.filters import GpuDemand
from joulesched.cluster.nodepower import HELD_MIN_AWAKE, HELD_SPARE, TWIN_EPOCH_S, MovablePod, NodePowerCore
from joulesched.cluster.scenario import Scenario, ScenarioError, Sleep
from joulesched.cluster.state import ASLEEP, ON, WAKING, ClusterState, PodRequest
from joulesched.cluster.workload import Workload
from joulesched.power.curves import interp

_DEPART, _SLEEP, _WAKE, _CONSOLIDATE, _RESTART = 0, 1, 2, 3, 4
# The pod model's events: services' demand changes (one per distinct time), a service's stop, an SLO interval's end.
_USAGE, _STOP, _SLO_TICK = 5, 6, 7
_NOT_PLACED, _WAITING, _RUNNING, _DONE = 0, 1, 2, 3


def gpu_runtime_scales(sc: Scenario, wl: Workload) -> np.ndarray | None:
    """Which pods' run time follows their GPUs' speed under the scenario's ``gpu_runtime`` (None: it is off, or
    the workload has no GPU pod). Raises :class:`ScenarioError` for a ``slo`` list that matches no pod's class
    (a misspelling would scale nothing) and for a scaled job with a usage profile."""
    rt = sc.gpu_runtime
    if rt is None or not wl.has_gpus:
        return None
    scales = (wl.gpu > 0) & ~wl.is_service
    if rt.slo is not None:
        codes = [k for k, n in enumerate(wl.slo_names) if n in rt.slo]
        if not codes:
            have = ", ".join(sorted(n for n in wl.slo_names if n)) or "none"
            raise ScenarioError(f"{sc.source or sc.name}: gpu_runtime.slo {rt.slo} matches no pod's service class; "
                                f"the workload's classes: {have}")
        scales &= np.isin(wl.slo, codes)
    if (scales & (wl.profile >= 0)).any():
        raise ScenarioError(f"{sc.source or sc.name}: gpu_runtime scales GPU jobs with a usage profile; the twin "
                            "scales constant-usage jobs only (limit gpu_runtime.slo to the others)")
    return scales


def cluster_from_scenario(scenario: Scenario) -> ClusterState:
    """Build the ClusterState of ``scenario``'s node groups (names ``prefix-0``, ``prefix-1``, ...)."""
    names, cpu, mem, pods, curves, group, traits = [], [], [], [], [], [], []
    gpus, models, gcurves = [], [], []
    for gi, g in enumerate(scenario.nodes):
        t = g.traits
        traits += [t] * g.count
        gpus += [g.gpu_count] * g.count
        models += [g.gpu_model] * g.count
        gcurves += [g.gpu_curve] * g.count
        for k in range(g.count):
            names.append(f"{g.name_prefix}-{k}")
            cpu.append(g.cpu_m)
            mem.append(g.memory_mib)
            pods.append(g.max_pods)
            curves.append(g.curve)
            group.append(gi)
    idle = [c[0] for c in curves]
    sleeping = isinstance(scenario.idle_policy, Sleep)
    # A node that never sleeps draws its idle when empty, as ClusterState documents: the policy's sleep watts
    # would be a saving it can never make (the lower bound floored it there, the features offered it).
    never = [scenario.nodes[g].never_sleep for g in group]
    sleep_w = [w if n else scenario.idle_policy.sleep_watts for w, n in zip(idle, never)] if sleeping else idle
    return ClusterState(names, cpu, mem, pods, curves, sleep_watts=sleep_w, group=group,
                        group_names=[g.name_prefix for g in scenario.nodes],
                        wake_s=scenario.idle_policy.wake_s if sleeping else 0.0, can_sleep=sleeping,
                        may_sleep=[sleeping and not scenario.nodes[g].never_sleep for g in group],
                        traits=None if all(t.plain for t in traits) else traits,
                        **({} if not any(gpus) else dict(gpu_count=gpus, gpu_model=models, gpu_curves=gcurves)))


class PodObserver(Protocol):
    """What :meth:`Twin.observe_pods` reports, as it happens: pod ``key`` bound to ``node`` at ``t`` (its
    metadata and non-zero CPU request), and pod ``key`` gone at ``t`` (``completed``: it finished or stopped;
    False: evicted or cut off at the horizon)."""

    def bound(self, t: float, key: int, node: int, meta: object, cpu_m: float) -> None: ...

    def ended(self, t: float, key: int, completed: bool) -> None: ...


class _PodObservers:
    """Several observers told of every bind and end, in the order they were added (:meth:`Twin.add_pod_observer`)."""

    def __init__(self, observers: list[PodObserver]) -> None:
        self.observers = observers

    def bound(self, t: float, key: int, node: int, meta: object, cpu_m: float) -> None:
        for o in self.observers:
            o.bound(t, key, node, meta, cpu_m)

    def ended(self, t: float, key: int, completed: bool) -> None:
        for o in self.observers:
            o.ended(t, key, completed)


class _TwinDecision(Decision):
    """The twin's one reused :class:`Decision`. Its ``meta`` is read from the workload's per-pod list by ``key``
    when a policy asks for it, so handing out a decision costs what it did before the pod model."""

    __slots__ = ("_metas",)

    @property
    def meta(self):
        return None if self.key is None else self._metas[self.key]

    @meta.setter
    def meta(self, value) -> None:  # Decision.__init__ sets it; the twin's comes from the workload
        pass


def bin_count(end_s: float, bin_s: float) -> int:
    """How many timeline bins cover ``[0, end_s)``: a bin that would start a float's width before the end (240 x
    (245 / 240) < 245) is none (its sliver would read as about 0 W: a review). The twin's run and
    :func:`extend_run` count their bins with it alike."""
    n = max(1, math.ceil(end_s / bin_s))
    return n - 1 if n > 1 and (n - 1) * bin_s >= end_s - 1e-9 * max(end_s, 1.0) else n


@dataclass
class Timeline:
    """Power and utilisation sampled on a fixed grid, for plots: bin ``k`` covers ``[k bin_s, (k + 1) bin_s)``,
    the last one up to ``end_s`` (the window's end: it may hold only part of a bin)."""

    bin_s: float
    energy_j: list[float] = field(default_factory=list)  # joules per bin (mean watts = energy / its length)
    util: list[np.ndarray] = field(default_factory=list)  # per-node utilisation at each bin's start
    awake: list[int] = field(default_factory=list)  # nodes not asleep at each bin's start
    end_s: float | None = None  # None: every bin whole

    def watts(self) -> np.ndarray:
        """Mean watts per bin, the last one over the part of it the window covers (a review: a run ending 30 s
        into a bin plotted a tenth of its power there)."""
        e = np.asarray(self.energy_j, dtype=float)
        length = np.full(len(e), self.bin_s)
        if self.end_s is not None and len(e):
            length[-1] = min(self.bin_s, max(self.end_s - (len(e) - 1) * self.bin_s, 1e-9))
        return e / length


@dataclass
class RunResult:
    """What one run of one policy on one workload measured."""

    energy_joules: float
    end_s: float
    placements: int
    unschedulable_pods: int
    completed_pods: int
    slo_violations: int
    mean_pending_s: float
    mean_throttling: float
    decision_us_p99: float
    decisions: int
    timeline: Timeline | None = None
    #: What the cluster draws after ``end_s`` (:meth:`Twin.idle_tail`): :func:`common_window` meters runs compared
    #: side by side over one window with it.
    idle_tail: "IdleTail | None" = None
    #: The end of the window the energies cover: ``end_s``, or later once :func:`extend_run` metered the idle tail.
    window_end_s: float | None = None
    evictions: int = 0  # pods evicted by consolidation (each restarted elsewhere)
    # The pod model: services that ran to their stop or the run's end (they are in completed_pods too), and
    # their SLO judged per interval (slo_violations counts jobs only).
    completed_services: int = 0
    service_intervals: int = 0
    service_slo_violations: int = 0
    # Every pod is placed (bound to a node: placed_pods) or unplaced (unschedulable_pods), for one of three
    # reasons: it fits no node even empty; it is still pending when the run ends; or its stop came before it
    # ran (while it queued, or while the node it was bound to woke up). Unplaced pods are not SLO judgements.
    # ``placements`` counts binds instead: a pod bound twice (evicted, or stopped while its node woke) counts twice.
    placed_pods: int = 0
    unplaced_fits_no_node: int = 0
    unplaced_pending_at_end: int = 0
    unplaced_stopped_before_running: int = 0
    # GPU clusters: the GPUs' share of energy_joules, and per node (names as the state's) total and GPU joules.
    gpu_energy_joules: float = 0.0
    node_energy_joules: list[float] | None = None
    node_gpu_joules: list[float] | None = None
    # FGD's fragmentation measure in a replay: the cluster's unallocated GPU share (of its capacity) at each
    # moment a GPU pod found no node, averaged (None: no GPU pod ever waited), and how many such moments.
    gpu_unallocated_when_blocked: float | None = None
    gpu_blocked: int = 0

    @property
    def cpu_energy_joules(self) -> float:
        """Everything but the GPUs: the node's CPU-side curve (CPU, memory, board) and its sleep draw."""
        return self.energy_joules - self.gpu_energy_joules

    @property
    def completed_jobs(self) -> int:
        return self.completed_pods - self.completed_services

    @property
    def slo_violation_rate(self) -> float:
        """Failed SLO judgements over all judgements: one per completed job (its whole life) and one per
        service-interval. With jobs only, the share of completed pods that violated their SLO."""
        n = self.completed_jobs + self.service_intervals
        return (self.slo_violations + self.service_slo_violations) / n if n else 0.0

    @property
    def job_slo_violation_rate(self) -> float:
        return self.slo_violations / self.completed_jobs if self.completed_jobs else 0.0

    @property
    def service_slo_violation_rate(self) -> float:
        """Violating service-intervals over service-intervals (docs/twin.md, "Service quality")."""
        return self.service_slo_violations / self.service_intervals if self.service_intervals else 0.0


@dataclass(frozen=True)
class IdleTail:
    """The cluster after a run's end, every pod gone: only sleep timers (and wakes under way) still change what it
    draws. From ``times[k]`` on (``times[0]`` the run's end) it draws ``watts[k]`` (``gpu_watts[k]`` of it the
    GPUs') with ``awake[k]`` nodes not asleep; the last entry holds for ever. Per node (GPU clusters, whose
    results have per-node energies): ``node_watts`` and ``node_gpu_watts`` at the end and ``node_changes``
    ``(t, node, watts, gpu watts)``.

    Why: policies compared side by side must be metered over one window. A run that finishes its last job
    later would otherwise pay for the whole cluster's idle or sleep draw while the others are not metered at all
    (docs/twin.md, "The run's window")."""

    times: tuple[float, ...]
    watts: tuple[float, ...]
    gpu_watts: tuple[float, ...]
    awake: tuple[int, ...]
    node_watts: tuple[float, ...] | None = None
    node_gpu_watts: tuple[float, ...] | None = None
    node_changes: tuple[tuple[float, int, float, float], ...] = ()

    def energy(self, start: float, end: float) -> tuple[float, float]:
        """Joules, and the GPUs' share, drawn over ``[start, end]`` (``start`` at or after the run's end)."""
        total = gpu = 0.0
        t = self.times
        for k in range(len(t)):
            a = max(start, t[k])
            b = min(end, t[k + 1]) if k + 1 < len(t) else end
            if b > a:
                total += self.watts[k] * (b - a)
                gpu += self.gpu_watts[k] * (b - a)
        return total, gpu

    def node_energy(self, end: float) -> tuple[list[float], list[float]]:
        """Per node, joules and GPU joules from the run's end to ``end``."""
        if self.node_watts is None or self.node_gpu_watts is None:
            raise ValueError("this tail has no per-node power (not a GPU cluster)")
        w, g = list(self.node_watts), list(self.node_gpu_watts)
        since = [self.times[0]] * len(w)
        e, eg = [0.0] * len(w), [0.0] * len(w)
        for t, i, wi, gi in [*self.node_changes, *((math.inf, i, 0.0, 0.0) for i in range(len(w)))]:
            dt = max(0.0, min(t, end) - since[i])
            e[i] += w[i] * dt
            eg[i] += g[i] * dt
            since[i], w[i], g[i] = min(t, end), wi, gi
        return e, eg

    def awake_at(self, t: float) -> int:
        """Nodes not asleep just before ``t`` (as a timeline's bin records them at its opening, before the events
        of that instant)."""
        return self.awake[max(0, bisect_left(self.times, t) - 1)]


def extend_run(r: RunResult, until_s: float) -> RunResult:
    """``r`` metered to ``until_s`` instead of its own end: the idle tail's joules added to its energies (total,
    GPU, per node) and its timeline padded with the tail's bins. ``r`` itself is not changed."""
    if r.window_end_s is not None and r.window_end_s != r.end_s:
        raise ValueError("this run is already metered past its end; extend the run itself")
    if until_s <= r.end_s:
        return r if r.window_end_s == r.end_s else dataclasses.replace(r, window_end_s=r.end_s)
    tail = r.idle_tail
    if tail is None:
        raise ValueError("this run has no idle tail: a twin's result() records one")
    e, g = tail.energy(r.end_s, until_s)
    extra = {}
    if r.node_energy_joules is not None and r.node_gpu_joules is not None:
        ne, ng = tail.node_energy(until_s)
        extra = {"node_energy_joules": [a + b for a, b in zip(r.node_energy_joules, ne)],
                 "node_gpu_joules": [a + b for a, b in zip(r.node_gpu_joules, ng)]}
    tl = r.timeline
    if tl is not None and tl.energy_j:
        b = tl.bin_s
        k = len(tl.energy_j)  # the twin's bins end with the one its end falls in (or ends at)
        energy_j = list(tl.energy_j)
        energy_j[-1] += tail.energy(r.end_s, min(k * b, until_s))[0]
        util, awake = list(tl.util), list(tl.awake)
        idle = np.zeros_like(util[-1]) if util else None
        for j in range(k, bin_count(until_s, b)):  # the last bin is the one until_s falls in (or ends at)
            energy_j.append(tail.energy(j * b, min((j + 1) * b, until_s))[0])
            awake.append(tail.awake_at(j * b))
            if idle is not None:
                util.append(idle)
        tl = Timeline(bin_s=b, energy_j=energy_j, util=util, awake=awake, end_s=until_s)
    return dataclasses.replace(r, energy_joules=r.energy_joules + e, gpu_energy_joules=r.gpu_energy_joules + g,
                               window_end_s=until_s, timeline=tl, **extra)


def common_window(runs: dict) -> dict:
    """Runs of one workload (any keys) metered over one window, up to the latest ``end_s`` among them
    (:func:`extend_run`): how policies are compared side by side."""
    until = max(r.end_s for r in runs.values())
    return {k: extend_run(r, until) for k, r in runs.items()}


class TwinMeter:
    """The twin's energy: the exact integral of its piecewise-constant power.

    ``joules(0, end)`` of a finished run is the run's total. Other windows need the breakpoints a twin built
    with ``record=True`` keeps (cumulative joules at every event); without them only whole runs are answered.
    """

    def __init__(self, twin: "Twin") -> None:
        self._twin = twin

    def joules(self, start: float, end: float) -> float:
        tw = self._twin
        if not start <= end:
            raise ValueError(f"energy window [{start}, {end}] is empty or reversed")
        if start == 0.0 and tw.done and end == tw._end_s:
            return tw._energy
        log_t, log_e = tw._energy_log
        if not log_t:
            raise ValueError("this twin kept no energy breakpoints: build it with record=True to meter "
                             "windows other than the whole run")
        if start < 0.0 or end > tw.now:
            raise ValueError(f"energy window [{start}, {end}] lies outside the simulated [0, {tw.now}]")
        return float(np.interp(end, log_t, log_e) - np.interp(start, log_t, log_e))


class Twin:
    """A simulated cluster driven one placement decision at a time.

    As a :class:`~joulesched.cluster.backend.Backend`: :meth:`begin` resets it, :meth:`next_decision` advances
    to the next pod that needs a node (``None`` when the run is over), :meth:`bind` places it, and
    :meth:`result` reads the run. :func:`joulesched.agent.runner.run_policy` is that loop. The Gymnasium env
    uses the same calls without the latency bookkeeping: :meth:`next_decision`, then :meth:`place`.
    """

    def __init__(self, scenario: Scenario, workload: Workload, *, record: bool = False, timeline_bins: int = 240):
        self.scenario = scenario
        self.workload = workload
        self.record = record
        self.timeline_bins = timeline_bins
        # Per-pod inputs never change between runs: build them once. Lists, because scalar indexing of a list
        # is several times faster than of a numpy array.
        wl = workload
        self._submit = wl.submit_s.tolist()
        self._dur = wl.duration_s.tolist()
        self._usage = wl.usage_m.tolist()
        cpu, mem, where = wl.cpu_req.tolist(), wl.mem_req.tolist(), wl.placement.tolist()
        table = wl.placement_table
        self._req = [PodRequest(None if c < 0 else c, None if m < 0 else m, table[k])
                     for c, m, k in zip(cpu, mem, where)]
        if wl.has_gpus:  # only GPU pods get GPU fields: the requests of a workload without them are as before
            specs = wl.gpu_spec_table
            for p in np.flatnonzero(wl.gpu > 0).tolist():
                r = self._req[p]
                self._req[p] = PodRequest(r.cpu_m, r.memory_mib, r.constraints, gpu=int(wl.gpu[p]),
                                          gpu_milli=int(wl.gpu_milli[p]), gpu_models=specs[int(wl.gpu_spec[p])])
        st0 = cluster_from_scenario(scenario)
        self.placeable = self._placeable_mask(st0, wl)
        self._setup_gpu_runtime(scenario, wl, st0)
        ip = scenario.idle_policy
        self.power_policy = ip.power_policy() if isinstance(ip, Sleep) else None
        cons = ip.consolidation if isinstance(ip, Sleep) else None
        # Which pods checkpoint (keep their progress when evicted): drawn once from the scenario's seed.
        self._ckpt = ((np.random.default_rng(scenario.seed).random(len(wl)) < cons.checkpoint_fraction).tolist()
                      if cons is not None else [])
        self._placeable = self.placeable.tolist()
        self._meta = wl.pod_metas()  # what each decision hands the policy (shared objects for equal metadata)
        self._observer: PodObserver | None = None  # observe_pods(): told of binds and ends as they happen
        self._pm = wl.has_pod_model
        self._stop_at: dict[int, float] = {}  # services' stop times (the pod model's)
        if self._pm:
            self._setup_pod_model(wl)
        self.meter = TwinMeter(self)
        self.reset()

    def _setup_gpu_runtime(self, sc: Scenario, wl: Workload, st: ClusterState) -> None:
        """Where the scenario sets ``gpu_runtime``: which jobs' run time follows their GPUs' speed
        (``_gscale``) and the factor each node applies (``_gfac``: reference / speed). ``_gscale`` is None
        otherwise, and every pod runs its duration."""
        self._gscale: list[bool] | None = None  # lists for the hot path's scalar reads, arrays for the rest
        self._gfac: list[float] = []
        scales = gpu_runtime_scales(sc, wl)
        if scales is None:
            return
        rt = sc.gpu_runtime
        self._gscale_a = scales
        self._gfac_a = np.array([rt.reference / sc.nodes[g].speed for g in st.group.tolist()])
        self._gscale, self._gfac = scales.tolist(), self._gfac_a.tolist()
        self._gfast = self._fastest_factors(wl, st, scales)

    def _fastest_factors(self, wl: Workload, st: ClusterState, scales: np.ndarray) -> np.ndarray:
        """Per pod, the least runtime factor of any node whose GPUs could hold it (its model and GPU count; 1
        where nothing scales): a bound for every placement."""
        out = np.ones(len(wl))
        fac = self._gfac_a
        rows = np.flatnonzero(scales)
        for spec, count in {(int(wl.gpu_spec[p]), int(wl.gpu[p])) for p in rows.tolist()}:
            models = wl.gpu_spec_table[spec]
            ok = st.alloc_gpu >= count
            if models is not None:
                ok &= st.gpu_model_mask(models)
            pods = rows[(wl.gpu_spec[rows] == spec) & (wl.gpu[rows] == count)]
            out[pods] = float(fac[ok].min()) if ok.any() else 1.0  # unplaceable: never runs
        return out

    def _runtime_factor(self, p: int, i: int) -> float:
        """How much longer than its duration pod ``p`` runs on node ``i`` (1 unless gpu_runtime scales it)."""
        return self._gfac[i] if self._gscale is not None and self._gscale[p] else 1.0

    def runtime_factors(self, pods: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """:meth:`_runtime_factor` of each pod on its node (1 where a node is -1 or nothing scales): a run time
        over it is the pod's work in the duration's units."""
        out = np.ones(len(pods))
        if self._gscale is None or not len(pods):
            return out
        on = self._gscale_a[pods] & (nodes >= 0)
        out[on] = self._gfac_a[nodes[on]]
        return out

    def fastest_workload(self) -> Workload:
        """The workload with every speed-scaled job at its shortest run time on any node that could hold it: what
        a lower bound may assume of it (the workload itself where nothing scales)."""
        if self._gscale is None:
            return self.workload
        wl = self.workload
        return dataclasses.replace(wl, duration_s=wl.duration_s.astype(np.float64) * self._gfast)

    def _setup_pod_model(self, wl: Workload) -> None:
        """Per-pod inputs of services and profiles (built once, as the requests are), and the pod model's
        handlers in place of the plain jobs' ones (instance attributes shadow the methods)."""
        self._usage0 = self._usage  # a run changes _usage (the current demand of profiled pods): reset copies it
        self._is_svc = wl.is_service.tolist()
        has = wl.profile >= 0
        pa, pb = np.zeros(len(wl), dtype=np.int64), np.zeros(len(wl), dtype=np.int64)
        pa[has], pb[has] = wl.prof_ptr[wl.profile[has]], wl.prof_ptr[wl.profile[has] + 1]
        self._pa, self._pb = pa.tolist(), pb.tolist()  # pod p's steps are [_pa[p], _pb[p]); empty: constant
        self._pt, self._pv = wl.prof_t.tolist(), wl.prof_m.tolist()
        # A service stops at its own stop time or at the scenario's end, whichever comes first: after duration_s
        # only jobs run (they may run past it), so no job can wait behind services forever.
        end = np.minimum(wl.submit_s + wl.duration_s, self.scenario.duration_s)
        svc = np.flatnonzero(wl.is_service & self.placeable)
        self._stops = list(zip(end[svc].tolist(), svc.tolist()))
        self._stop_at = {q: t for t, q in self._stops}  # a queued service is not retried at or past its stop
        self._has_svc = bool(wl.is_service.any())
        self._slo_interval = float(self.scenario.workload.slo_interval_s)
        self._start = self._start_pm
        self._depart = self._depart_pm
        self._may_end = self._may_end_pm

    # ---- set-up -------------------------------------------------------------------------------------------
    def reset(self) -> None:
        sc, wl = self.scenario, self.workload
        self.state = st = cluster_from_scenario(sc)
        n, p = len(st), len(wl)
        self.horizon = sc.duration_s
        self.sleep_after = sc.idle_policy.sleep_after_s if st.can_sleep else math.inf
        protected = np.array([sc.nodes[g].never_sleep for g in st.group.tolist()], dtype=bool)
        self.power = NodePowerCore(self.power_policy, protected) if self.power_policy is not None else None
        consolidate = self.power is not None and self.power_policy.consolidate
        # Work left per pod at its next start: the workload's durations, copied only when evictions can change them.
        self._work = list(self._dur) if consolidate else self._dur
        self._restarting = 0  # evicted pods waiting to restart
        self.evictions = 0
        self._carry: dict[int, tuple[float, float, float]] = {}  # evicted pod -> (bad s, throttle integral, life s)
        self._first_start: dict[int, float] = {}
        self.power_log: list[tuple[float, str, int]] = []  # (time, "sleep" | "wake" | "evict", node)
        self.slo_fraction = sc.slo_fraction
        self.slo_tolerance = sc.slo_tolerance
        self.pod_node = [-1] * p
        self.pod_status = [_NOT_PLACED] * p
        self._stopped_early: set[int] = set()  # services stopped at their own arrival time: the arrival skips them
        self.pod_start = [math.nan] * p
        self.pod_end = [math.nan] * p
        self.pod_bind = [math.nan] * p  # when it was (last) bound: its start, or earlier on a waking node
        self._gpu_blocked: list[float] = []  # free GPU share of the cluster whenever a GPU pod found no node
        self._bad0 = [0.0] * p
        self._thr0 = [0.0] * p
        # Nodes.
        self._cap = st.alloc_cpu.astype(float).tolist()
        self._curves = [tuple(c) for c in st.curves.tolist()]
        self._dem = [0.0] * n
        self._rate = [1.0] * n
        self._vclock = [0.0] * n
        self._vtime = [0.0] * n
        self._bad = [0.0] * n  # seconds served below slo_fraction
        self._thr = [0.0] * n  # integral of (1 - rate) dt
        self._running: list[list[tuple[float, int]]] = [[] for _ in range(n)]  # heaps of (vfinish, pod)
        self._waiting: list[list[int]] = [[] for _ in range(n)]  # pods bound to a waking node
        self._up_at = [0.0] * n  # when a waking node is up: its waiting pods start then
        self._ver = [0] * n
        self._scheduled: list[tuple[float, int] | None] = [None] * n  # heap top its departure event is for
        self._sleep_ver = [0] * n
        self._pstate = [ON] * n
        self._pwr = [c[0] for c in self._curves]
        self._gpu = st.has_gpus
        if self._gpu:
            self._setup_gpu_power(st, n)
        self._ptot = math.fsum(self._pwr)
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._next_arrival = 0
        self._ready: deque[int] = deque()
        self._pending: list[int] = []
        self.now = 0.0
        self._energy = 0.0
        self._t_energy = 0.0
        self._live = 0  # pods bound and not yet finished
        self.unschedulable = 0
        self.placements = 0
        self.pod: int = -1
        self.request: PodRequest | None = None
        self.mask: np.ndarray | None = None
        self.decision_t0 = 0  # perf_counter_ns() when the current decision's filtering began
        self._decision = _TwinDecision(st, PodRequest(), np.zeros(n, dtype=bool))
        self._decision._metas = self._meta
        self._lat: list[int] = []  # decision latencies (filter plus policy), ns
        self.done = False
        self._end_s = math.nan
        self._energy_log: tuple[list[float], list[float]] = ([], [])
        if self.record:
            self.timeline = Timeline(bin_s=self.horizon / self.timeline_bins)
            self._bin_end = 0.0
            self._energy_log = ([0.0], [0.0])
        else:
            self.timeline = None
        for i in range(n):
            self._arm_sleep(i, 0.0)
        if consolidate:
            self._push(self.power_policy.consolidate_interval_s, _CONSOLIDATE, -1, 0)
        self._svcs: list[dict[int, None]] = [{} for _ in range(n)]  # running services per node (ordered)
        if self._pm:
            self._reset_pod_model(p)

    def _setup_gpu_power(self, st: ClusterState, n: int) -> None:
        """GPU nodes: power is CPU curve plus GPUs (state.gpu_power), kept apart per node so that results split
        CPU and GPU joules per run and per node (node energy integrated whenever a node's power changes)."""
        self._gidle = [float(st.gpu_curves[i, 0]) * int(st.alloc_gpu[i]) for i in range(n)]
        self._gpwr = list(self._gidle)
        self._pwr = [w + g for w, g in zip(self._pwr, self._gpwr)]
        self._gtot = math.fsum(self._gpwr)
        self._genergy = 0.0
        self._node_t = [0.0] * n  # when node i's energies were last brought up to date
        self._node_e = [0.0] * n  # joules per node (CPU and GPU)
        self._node_g = [0.0] * n  # of which GPU
        self._set_power = self._set_power_gpu

    def _set_power_gpu(self, i: int, w: float, g: float | None = None) -> None:
        """:meth:`_set_power` on a GPU cluster: ``w`` the node's CPU-side watts, ``g`` its GPUs' (default: as
        the state's allocation says while on, idle while waking, 0 asleep)."""
        if g is None:
            ps = self._pstate[i]
            g = self.state.gpu_power(i) if ps == ON else self._gidle[i] if ps == WAKING else 0.0
        dt = self.now - self._node_t[i]
        self._node_e[i] += self._pwr[i] * dt
        self._node_g[i] += self._gpwr[i] * dt
        self._node_t[i] = self.now
        self._ptot += w + g - self._pwr[i]
        self._pwr[i] = w + g
        self._gtot += g - self._gpwr[i]
        self._gpwr[i] = g

    def _reset_pod_model(self, p: int) -> None:
        self._usage = list(self._usage0)  # current demand per pod
        self._pk = [0] * p  # index of the profile step a running pod is in
        self._vfin = [0.0] * p  # a running job's departure in its node's virtual clock
        self._epoch = [0] * p  # starts of the pod so far: tells stale registrations apart
        self._chg: dict[float, list[tuple[int, int]]] = {}  # time -> services (pod, epoch) whose demand changes
        self._expired = 0  # services whose stop came before they ran (queued, or bound to a node still waking)
        for t, q in self._stops:
            self._push(t, _STOP, q, 0)
        # SLO per interval: per service, bad and alive seconds of the current interval, and the snapshot
        # (node's bad integral, time) its running stint was last accounted from.
        self._sacc: dict[int, list[float]] = {}
        self._sb0 = [0.0] * p
        self._st0 = [0.0] * p
        self._svc_intervals = 0
        self._svc_viol = 0
        self._tick_k = 1
        if self._has_svc:
            self._push(self._slo_interval, _SLO_TICK, -1, 0)

    @staticmethod
    def _placeable_mask(st: ClusterState, wl: Workload) -> np.ndarray:
        """Pods that pass the filter chain on at least one empty node; the others can never be placed."""
        gpu = GpuDemand(wl.gpu, wl.gpu_milli, wl.gpu_spec, wl.gpu_spec_table) if wl.has_gpus else None
        return st.chain.placeable(st, st.filter_table, wl.cpu_req, wl.mem_req, wl.placement, wl.placement_table,
                                  gpu)

    @property
    def pod_observer(self) -> PodObserver | None:
        """The observer :meth:`observe_pods` set (None: none)."""
        return self._observer

    def observe_pods(self, observer: PodObserver | None) -> None:
        """Tell ``observer`` of every bind and every end as it happens, instead of any observer before (None:
        stop). It sees what a cluster shows, never a pod's duration: the predictor of docs/dqn.md learns from
        this. It stays across runs."""
        self._observer = observer

    def add_pod_observer(self, observer: PodObserver) -> None:
        """Tell ``observer`` too, beside those already told (a planner's several predictor bases: with one slot,
        the last attached was fed and the others saw no pod)."""
        have = self._observer_list(self._observer)
        for o in self._observer_list(observer):
            if not any(h is o for h in have):
                have.append(o)
        self._observer = have[0] if len(have) == 1 else _PodObservers(have)

    @staticmethod
    def _observer_list(observer: PodObserver | None) -> list[PodObserver]:
        if observer is None:
            return []
        return list(observer.observers) if isinstance(observer, _PodObservers) else [observer]

    def remove_pod_observer(self, observer: PodObserver) -> None:
        """Stop telling ``observer``; the others go on."""
        have = [o for o in self._observer_list(self._observer) if o is not observer]
        self._observer = None if not have else have[0] if len(have) == 1 else _PodObservers(have)

    def current_usage(self, pods: np.ndarray) -> np.ndarray:
        """The CPU millicores each of ``pods`` demands now (a profiled pod's current step): what a cluster
        measures of a running pod."""
        u = self._usage
        return np.array([u[p] for p in np.asarray(pods).tolist()], dtype=np.float64)

    # ---- what only a simulator knows (clairvoyant references, agent/clairvoyant.py) -------------------------
    def live_lives(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The bound pods' futures: per pod that runs or waits for its waking node, its index, its node, when its
        life began (a running job's start, a waiting job's start when its node is up, a service's submit time)
        and when it is due to end (began plus a job's work at its start, times its node's GPU runtime factor; a
        service's stop, the scenario's end at the latest). Throttling would make them later. The future itself:
        for clairvoyant references and training labels, never for a policy that could run on a cluster."""
        now = self.now
        node = np.fromiter(self.pod_node, np.int64, len(self.pod_node))
        status = np.fromiter(self.pod_status, np.int8, len(self.pod_status))
        live = np.flatnonzero((node >= 0) & ((status == _RUNNING) | (status == _WAITING)))
        up_at = np.asarray(self._up_at, dtype=np.float64)
        began = np.where(status[live] == _WAITING, up_at[node[live]],
                         np.asarray(self.pod_start, dtype=np.float64)[live])
        end = began + np.asarray(self._work, dtype=np.float64)[live] * self.runtime_factors(live, node[live])
        if self._pm and live.size:
            svc = np.asarray(self._is_svc, dtype=bool)[live]
            submit = np.asarray(self._submit, dtype=np.float64)[live]
            stop = np.minimum(submit + np.asarray(self._dur, dtype=np.float64)[live], self.horizon)
            began, end = np.where(svc, submit, began), np.where(svc, stop, end)
        return live, node[live], began, end

    def due_ends(self) -> np.ndarray:
        """Per node, when its last bound pod is due to end (``now`` for a node that holds none), from
        :meth:`live_lives`. The future itself, as it."""
        out = np.full(len(self.state), self.now)
        _, node, _, end = self.live_lives()
        np.maximum.at(out, node, end)
        return out

    def deciding_pod(self) -> tuple[int, float, float]:
        """The pod awaiting a decision as :meth:`live_lives` sees a bound one: its index, when its life begins (a
        job: now; a service: its submit time) and when it is due to end (under ``gpu_runtime``, on a GPU of the
        reference speed: its node is not chosen yet)."""
        p = self.pod
        if p < 0:
            raise RuntimeError("deciding_pod() called with no pod awaiting a decision")
        if self._pm and self._is_svc[p]:
            return p, self._submit[p], min(self._submit[p] + self._dur[p], self.horizon)
        return p, self.now, self.now + float(self._work[p])

    def deciding_life(self, nodes: np.ndarray | None = None) -> float | np.ndarray:
        """How long the pod awaiting a decision will run once started (a service: until its stop): on each of
        ``nodes`` (under ``gpu_runtime`` a GPU job's life depends on its node), else on a GPU of the reference
        speed. The future itself, as :meth:`due_ends`."""
        p = self.pod
        if p < 0:
            raise RuntimeError("deciding_life() called with no pod awaiting a decision")
        if self._pm and self._is_svc[p]:
            life = max(min(self._submit[p] + self._dur[p], self.horizon) - self.now, 0.0)
        else:
            life = float(self._work[p])
        if nodes is None:
            return life
        nodes = np.asarray(nodes, dtype=np.int64)
        return life * self.runtime_factors(np.full(len(nodes), p), nodes)

    # ---- the Backend ----------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Begin a run from time 0 (the twin can run any number of times)."""
        self.reset()

    def bind(self, decision: Decision, node: int) -> None:
        """Record the decision's latency (filter plus policy), then :meth:`place`."""
        self._lat.append(time.perf_counter_ns() - self.decision_t0)
        self.place(node)

    def abandon(self, decision: Decision, error: BaseException) -> None:
        """A policy that fails in the twin is a bug: let it surface."""
        raise error

    # ---- the decision loop --------------------------------------------------------------------------------
    def next_decision(self) -> Decision | None:
        """Advance until a pod needs a node with at least one feasible node. ``None`` when the run is over.

        The returned :class:`Decision` is reused: it is valid until the next call."""
        st = self.state
        ready, events, submit = self._ready, self._events, self._submit
        n_pods = len(submit)
        placeable = self._placeable
        stopped_early = self._stopped_early  # the run's own set (reset() makes a new one), filled in place
        perf = time.perf_counter_ns
        while True:
            if ready:
                p = ready.popleft()
            else:
                t_ev = events[0][0] if events else math.inf
                k = self._next_arrival
                t_ar = submit[k] if k < n_pods else math.inf
                if t_ev <= t_ar:
                    if t_ev == math.inf or (self._live == 0 and k >= n_pods and self._may_end(t_ev)):
                        self._finish()
                        return None
                    t, _, kind, i, ver = heapq.heappop(events)
                    if kind == _DEPART:
                        if ver != self._ver[i]:
                            continue  # superseded by a later reschedule of this node
                        self._advance(t)
                        self._depart(i)
                    elif kind == _SLEEP:
                        self._advance(t)
                        self._sleep_event(i, ver)
                    elif kind == _WAKE:
                        self._advance(t)
                        self._wake(i)
                    elif kind == _RESTART:
                        self._advance(t)
                        if self._pm and self.pod_status[i] == _DONE:
                            continue  # a service whose stop came while it waited (and counted it out)
                        self._restarting -= 1
                        ready.append(i)  # i is the evicted pod: it is scheduled again
                    elif kind == _CONSOLIDATE:
                        self._advance(t)
                        self._consolidate()
                    else:
                        self._advance(t)
                        if kind == _USAGE:
                            self._usage_event(t)
                        elif kind == _STOP:
                            self._stop_service(i)
                        else:
                            self._slo_tick()
                    continue
                self._advance(t_ar)
                self._next_arrival = k + 1
                if stopped_early and k in stopped_early:
                    continue  # counted as stopped before running (_stop_service)
                if not placeable[k]:
                    self.unschedulable += 1
                    continue
                p = k  # an arrival goes straight to its decision, skipping the ready queue
            req = self._req[p]
            t0 = perf()
            mask = st.feasible(req)
            if mask.any():
                self.decision_t0 = t0
                self.pod, self.request, self.mask = p, req, mask
                d = self._decision
                d.pod, d.mask, d.key = req, mask, p  # d.meta is looked up from d.key when read
                return d
            if req.gpu and st.has_gpus:  # FGD's measure: GPU share left unallocated while a GPU pod waits
                self._gpu_blocked.append(float(np.clip(st.gpu_free, 0, None).sum()) / (1000.0 * st.alloc_gpu.sum()))
            insort(self._pending, p)

    def place(self, node: int) -> None:
        """Bind the current pod to ``node``. The node must be feasible."""
        p, req = self.pod, self.request
        if p < 0 or req is None:
            raise RuntimeError("place() called with no pod awaiting a decision")
        st = self.state
        if not (0 <= node < len(st.names)) or not self.mask[node]:
            raise ValueError(f"node {node} is not feasible for pod {p}")
        st.bind(node, req, p)
        self.pod_node[p] = node
        self.pod_bind[p] = self.now
        if self._observer is not None:
            self._observer.bound(self.now, p, node, self._meta[p], req.nz_cpu)
        self.placements += 1
        self._live += 1
        self._sleep_ver[node] += 1  # any pending sleep of this node is off
        self.pod, self.request, self.mask = -1, None, None
        ps = self._pstate[node]
        if ps == ON:
            self._start(p, node)
            self._refresh(node)
        else:
            self.pod_status[p] = _WAITING
            self._waiting[node].append(p)
            if ps == ASLEEP:
                self._set_pstate(node, WAKING)
                if self.record:
                    self.power_log.append((self.now, "wake", node))
                self._up_at[node] = self.now + st.wake_s
                self._push(self.now + st.wake_s, _WAKE, node, 0)

    # ---- internals ----------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, i: int, ver: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, i, ver))

    def _advance(self, t: float) -> None:
        """Move the clock to ``t``, integrating power (constant between events) into energy."""
        if self.record:
            self._record_until(t)
        self._energy += self._ptot * (t - self._t_energy)
        if self._gpu:
            self._genergy += self._gtot * (t - self._t_energy)
        self._t_energy = t
        self.now = t
        self.state.now = t
        if self.record:
            self._energy_log[0].append(t)
            self._energy_log[1].append(self._energy)

    def _record_until(self, t: float) -> None:
        tl = self.timeline
        t0 = self._t_energy
        while self._bin_end <= t:
            # Close the current bin (or open the first one) at its boundary.
            if self._bin_end > t0:
                self._energy_bin_add(self._ptot * (self._bin_end - t0))
                t0 = self._bin_end
            tl.energy_j.append(0.0)
            tl.util.append(self.state.utilization().astype(np.float32))
            tl.awake.append(int((self.state.power_state != ASLEEP).sum()))
            self._bin_end = len(tl.energy_j) * tl.bin_s  # a product: a sum of bin_s drifts
        self._energy_bin_add(self._ptot * (t - t0))

    def _energy_bin_add(self, joules: float) -> None:
        if self.timeline.energy_j:
            self.timeline.energy_j[-1] += joules

    def _touch(self, i: int) -> None:
        """Bring node ``i``'s virtual clock and SLO integrals up to now."""
        dt = self.now - self._vtime[i]
        if dt > 0.0:
            r = self._rate[i]
            self._vclock[i] += dt * r
            if r < 1.0:
                self._thr[i] += dt * (1.0 - r)
                if r < self.slo_fraction:
                    self._bad[i] += dt
        self._vtime[i] = self.now

    def _start(self, p: int, i: int) -> None:
        self._touch(i)
        self.pod_status[p] = _RUNNING
        self.pod_start[p] = self.now
        self._bad0[p] = self._bad[i]
        self._thr0[p] = self._thr[i]
        w = self._work[p]
        if self._gscale is not None and self._gscale[p]:
            w *= self._gfac[i]
        heapq.heappush(self._running[i], (self._vclock[i] + w, p))
        self._dem[i] += self._usage[p]

    def _refresh(self, i: int) -> None:
        """Demand on node ``i`` changed: update its rate, power and next departure."""
        st = self.state
        d = self._dem[i]
        if d < 1e-9:  # guard against float residue once the last pod has left
            d = self._dem[i] = 0.0
        cap = self._cap[i]
        rate = 1.0 if d <= cap else cap / d
        rate_changed = rate != self._rate[i]
        self._rate[i] = rate
        st.usage_cpu[i] = d
        if self._pstate[i] == ON:
            self._set_power(i, interp(self._curves[i], d / cap if cap > 0 else 1.0))
        heap = self._running[i]
        if heap:
            top = heap[0]
            # The scheduled departure stays valid while the same pod leads at the same rate: skip a heap entry.
            if rate_changed or top is not self._scheduled[i]:
                self._ver[i] += 1
                self._scheduled[i] = top
                t = self.now + (top[0] - self._vclock[i]) / rate
                st.next_departure_at[i] = t
                self._push(t, _DEPART, i, self._ver[i])
        else:
            self._ver[i] += 1
            self._scheduled[i] = None
            st.next_departure_at[i] = math.inf

    def _set_power(self, i: int, w: float) -> None:
        self._ptot += w - self._pwr[i]
        self._pwr[i] = w

    def _set_pstate(self, i: int, ps: int) -> None:
        self._pstate[i] = ps
        self.state.power_state[i] = ps
        if ps == ASLEEP:  # a sleeping node draws its sleep watts, GPUs included
            self._set_power(i, self.state.sleep_watts[i])
        elif ps == WAKING:  # a waking node's GPUs idle until its pods start
            self._set_power(i, self._curves[i][0])

    def _sleep_event(self, i: int, ver: int) -> None:
        """Node ``i``'s sleep timer fired: the decision core says whether it sleeps now, or is looked at again."""
        if ver != self._sleep_ver[i] or self._pstate[i] != ON or self.state.pods[i] != 0:
            return  # a pod came, or the node is not idle-awake: this timer is stale
        verdict = self.power.may_sleep(self.state, i)
        if not verdict and (room := self.power.sleep_cap.room_at(self.now)) > self.now:
            self._push(room, _SLEEP, i, ver)  # max_sleeps_per_hour: looked at again once there is room
        elif not verdict:
            self.power.sleep_cap.record(self.now)
            self._set_pstate(i, ASLEEP)
            if self.record:
                self.power_log.append((self.now, "sleep", i))
        elif verdict in (HELD_MIN_AWAKE, HELD_SPARE):
            self._push(self.now + self.power_policy.recheck_s, _SLEEP, i, ver)

    def _consolidate(self) -> None:
        """A consolidation tick: ask the core for a node to empty; evict its pods, which restart after
        ``restart_s``, and put it to sleep at once (it is empty and nothing may land on it meanwhile)."""
        pp, st = self.power_policy, self.state
        if self._live or self._next_arrival < len(self._submit) or self._restarting or \
                (self._pm and self.now < self.horizon):  # services run until the horizon at least
            self._push(self.now + pp.consolidate_interval_s, _CONSOLIDATE, -1, 0)
        pods: dict[int, list[MovablePod]] = {}
        prot = self.power.protected
        for i in range(len(st)):
            if self._pstate[i] != ON or not (self._running[i] or self._svcs[i]) or prot[i]:
                continue
            self._touch(i)
            v, rate = self._vclock[i], self._rate[i]
            # A job that does not checkpoint is evicted once at most (a review: the policy may put an evicted pod
            # straight back on the node it left, waking it, and such a job then lost its progress at every tick and
            # never ended: the run, and the benchmark, went on for ever). Services and checkpointing jobs keep what
            # they did, and may move again.
            again = self._first_start
            pods[i] = [MovablePod(p, self._req[p], self._usage[p],
                                  0.0 if self._ckpt[p] else self._work[p] * self._runtime_factor(p, i) - (vf - v),
                                  "evicted before" if p in again and not self._ckpt[p] else "", (vf - v) / rate)
                       for vf, p in self._running[i] if p >= 0]  # p < 0: a profiled job's next demand change
            # A service loses no work when evicted; it would empty the node by itself at its stop time.
            pods[i] += [MovablePod(p, self._req[p], self._usage[p], 0.0, "",
                                   self._svc_end(p) - self.now) for p in self._svcs[i]]
        # Where each constrained pod may go at all (the chain's node filters): a plan never counts on a node its
        # pod could not restart on. Pods that ask nothing of a node need no entry.
        table = st.filter_table
        fits = {m.key: v for ms in pods.values() for m in ms
                if (v := table.verdict(self._req[m.key].constraints)) is not None}
        plan = self.power.plan(st, self.now, pods, fits or None, wall_s=TWIN_EPOCH_S + self.now)
        if plan is not None:
            self.power.record_evictions(self.now, len(plan.moves))
            self._evict(plan.node)

    def _evict(self, i: int) -> None:
        st, now = self.state, self.now
        self._touch(i)
        v = self._vclock[i]
        heap = self._running[i]
        if self.record:
            self.power_log.append((now, "evict", i))
        restart = self.power_policy.restart_s
        svcs = self._svcs[i]
        for vf, p in [e for e in heap if e[1] >= 0] + [(math.inf, q) for q in svcs]:
            self._dem[i] -= self._usage[p]
            st.unbind(i, self._req[p], p)
            b, th, life = self._carry.get(p, (0.0, 0.0, 0.0))
            self._carry[p] = (b + self._bad[i] - self._bad0[p], th + self._thr[i] - self._thr0[p],
                              life + now - self.pod_start[p])
            self._first_start.setdefault(p, self.pod_start[p])
            if p in svcs:
                self._svc_accrue(p, i)  # its interval goes on; it is judged at the interval's end
            else:
                if self._ckpt[p]:  # work left, back in the duration's units (it restarts on another GPU)
                    self._work[p] = max(vf - v, 1e-9) / self._runtime_factor(p, i)
                self._live -= 1  # (a service left _live when it started)
            self.pod_node[p] = -1
            self.pod_status[p] = _NOT_PLACED
            if self._observer is not None:
                self._observer.ended(now, p, False)  # evicted: censored, it restarts elsewhere
            self._restarting += 1
            self.evictions += 1
            self._push(now + restart, _RESTART, p, 0)
        heap.clear()
        svcs.clear()
        self._refresh(i)
        self._sleep_ver[i] += 1
        self.power.sleep_cap.record(now)  # emptied to sleep: it goes ahead whatever the cap, and counts
        self._set_pstate(i, ASLEEP)
        if self.record:
            self.power_log.append((now, "sleep", i))
        if self._pending:  # a pending pod that fits only this node wakes it, as after any departure
            self._retry_pending(i)

    def _arm_sleep(self, i: int, t: float) -> None:
        if self.sleep_after < math.inf:
            self._sleep_ver[i] += 1
            self._push(t + self.sleep_after, _SLEEP, i, self._sleep_ver[i])

    def _wake(self, i: int) -> None:
        self._pstate[i] = ON
        self.state.power_state[i] = ON
        for p in self._waiting[i]:
            self._start(p, i)
        self._waiting[i].clear()
        self._refresh(i)
        if self.state.pods[i] == 0:  # every pod it woke for was a service that stopped meanwhile
            self._arm_sleep(i, self.now)

    def _depart(self, i: int) -> None:
        self._touch(i)
        heap = self._running[i]
        v = self._vclock[i]
        eps = 1e-9 * max(1.0, v)
        st = self.state
        obs = self._observer
        while heap and heap[0][0] <= v + eps:
            _, p = heapq.heappop(heap)
            self._dem[i] -= self._usage[p]
            life = self.now - self.pod_start[p]
            self.pod_end[p] = self.now
            self.pod_status[p] = _DONE
            self._bad0[p] = self._bad[i] - self._bad0[p]  # now: seconds below the SLO over its life
            self._thr0[p] = (self._thr[i] - self._thr0[p]) / life if life > 0 else 0.0  # now: mean throttling
            st.unbind(i, self._req[p], p)
            self._live -= 1
            if obs is not None:
                obs.ended(self.now, p, True)
        self._refresh(i)
        if not heap and self.sleep_after < math.inf:  # empty (pods on a running node are all in its heap)
            self._arm_sleep(i, self.now)
        if self._pending:
            self._retry_pending(i)

    def _retry_pending(self, i: int) -> None:
        """Queue for a new decision every pending pod that now fits node ``i`` (FIFO order kept). A service
        whose stop time has come stays queued: its stop event, at this same instant, counts it as stopped before
        running, whichever of the instant's events freed the room first."""
        st = self.state
        keep, retry = st.chain.retry(st, st.filter_table, i, self._pending, self._req)
        if retry:
            stop_at, now = self._stop_at, self.now
            if stop_at:
                late = [q for q in retry if stop_at.get(q, math.inf) <= now]
                if late:
                    retry = [q for q in retry if stop_at.get(q, math.inf) > now]
                    for q in late:
                        insort(keep, q)
            self._pending = keep
            self._ready.extend(retry)

    def _may_end(self, t: float) -> bool:
        """With no job bound and none to arrive: may the run end before the event at ``t``? (Jobs only: when
        none is restarting; nodes may still fall asleep before the horizon, see :meth:`_finish`.) A pod still
        pending then fits no empty node (each node's last departure retried it), so it never will: waiting
        for it would only run the sleep rechecks for ever."""
        return not self._restarting

    def _finish(self) -> None:
        """Close the run at max(horizon, last completion); nodes may still fall asleep before the horizon."""
        end = max(self.horizon, self.now)
        while self._events and self._events[0][0] <= end:
            t, _, kind, i, ver = heapq.heappop(self._events)
            self._advance(t)
            if kind == _SLEEP:
                self._sleep_event(i, ver)
        self._advance(end)
        if self._pm:
            self._close_services()
        self._end_s = end
        self.done = True
        if self.timeline is not None:
            tl = self.timeline
            # A bin opened at the end, or a float's width before it: its energy (none, or a sliver's) joins the
            # bin before (bin_count).
            while len(tl.energy_j) > bin_count(end, tl.bin_s):
                sliver = tl.energy_j.pop()
                tl.energy_j[-1] += sliver
                tl.util.pop()
                tl.awake.pop()
            tl.end_s = end

    # ---- the pod model: services and usage profiles --------------------------------------------------------
    # _live counts bound jobs, and services bound to a waking node until they start: the run waits for jobs only.
    def _svc_end(self, p: int) -> float:
        return min(self._submit[p] + self._dur[p], self.horizon)

    def _may_end_pm(self, t: float) -> bool:
        """The run ends at max(horizon, last job completion): services never extend it. Every service has
        stopped by the horizon, so what is restarting after it is a job, which the run waits for (what is pending
        then fits no empty node: see :meth:`_may_end`)."""
        return (t > self.horizon or not self._has_svc) and not self._restarting

    def _start_pm(self, p: int, i: int) -> None:
        """Start pod ``p`` on node ``i``: a constant job as always; a profiled job at the step of its progress,
        its next breakpoint an entry ``(vclock, ~p)`` in the node's virtual-time heap; a service at the step of
        the clock."""
        if self._is_svc[p]:
            self._start_svc(p, i)
            return
        a, b = self._pa[p], self._pb[p]
        if a == b:
            Twin._start(self, p, i)
            return
        self._touch(i)
        self.pod_status[p] = _RUNNING
        self.pod_start[p] = self.now
        self._bad0[p] = self._bad[i]
        self._thr0[p] = self._thr[i]
        work, dur, pt = self._work[p], self._dur[p], self._pt
        vf = self._vfin[p] = self._vclock[i] + work
        heap = self._running[i]
        heapq.heappush(heap, (vf, p))
        k = max(a, bisect_right(pt, dur - work, a, b) - 1)  # progress dur - work: more than 0 after a checkpoint
        self._pk[p] = k
        u = self._usage[p] = self._pv[k]
        self._dem[i] += u
        if k + 1 < b and pt[k + 1] < dur:
            # Progress x is reached at vclock vf - (dur - x): exact, with no drift over many steps.
            heapq.heappush(heap, (vf - dur + pt[k + 1], ~p))

    def _start_svc(self, p: int, i: int) -> None:
        self._touch(i)
        now = self.now
        self.pod_status[p] = _RUNNING
        self.pod_start[p] = now
        self._bad0[p] = self._bad[i]
        self._thr0[p] = self._thr[i]
        self._sb0[p] = self._bad[i]
        self._st0[p] = now
        self._live -= 1
        self._epoch[p] += 1
        a, b = self._pa[p], self._pb[p]
        if a < b:  # demand read afresh from the clock: also what an evicted service restarts with
            pt = self._pt
            k = max(a, bisect_right(pt, now, a, b) - 1)
            self._pk[p] = k
            self._usage[p] = self._pv[k]
            if k + 1 < b:
                self._register(p, pt[k + 1])
        self._dem[i] += self._usage[p]
        self._svcs[i][p] = None

    def _register(self, p: int, t: float) -> None:
        """Service ``p`` changes demand at ``t``: one event per distinct time, however many services share it
        (the generators' services share the absolute grid of their usage steps)."""
        lst = self._chg.get(t)
        if lst is None:
            self._chg[t] = [(p, self._epoch[p])]
            self._push(t, _USAGE, -1, 0)
        else:
            lst.append((p, self._epoch[p]))

    def _usage_event(self, t: float) -> None:
        touched: dict[int, None] = {}
        pt, pv, pb = self._pt, self._pv, self._pb
        for p, ep in self._chg.pop(t, ()):
            if ep != self._epoch[p] or self.pod_status[p] != _RUNNING:
                continue  # stopped, or evicted (and maybe restarted, registered again) since
            i = self.pod_node[p]
            if i not in touched:
                self._touch(i)  # integrate the node's clock at the old rate first
                touched[i] = None
            k = self._pk[p] = self._pk[p] + 1
            u = pv[k]
            self._dem[i] += u - self._usage[p]
            self._usage[p] = u
            if k + 1 < pb[p]:
                self._register(p, pt[k + 1])
        for i in touched:
            self._refresh(i)

    def _depart_pm(self, i: int) -> None:
        """:meth:`_depart` with profiled jobs: an entry ``(v, ~p)`` reached in the virtual clock is job ``p``'s
        next demand change; the node re-plans its next event as for a departure (:meth:`_refresh`)."""
        self._touch(i)
        heap = self._running[i]
        v = self._vclock[i]
        eps = 1e-9 * max(1.0, v)
        st = self.state
        pt, pv, pb, dur = self._pt, self._pv, self._pb, self._dur
        freed = False
        while heap and heap[0][0] <= v + eps:
            _, p = heapq.heappop(heap)
            if p < 0:
                p = ~p
                k = self._pk[p] = self._pk[p] + 1
                u = pv[k]
                self._dem[i] += u - self._usage[p]
                self._usage[p] = u
                if k + 1 < pb[p] and pt[k + 1] < dur[p]:
                    heapq.heappush(heap, (self._vfin[p] - dur[p] + pt[k + 1], ~p))
                continue
            freed = True
            self._dem[i] -= self._usage[p]
            life = self.now - self.pod_start[p]
            self.pod_end[p] = self.now
            self.pod_status[p] = _DONE
            self._bad0[p] = self._bad[i] - self._bad0[p]
            self._thr0[p] = (self._thr[i] - self._thr0[p]) / life if life > 0 else 0.0
            st.unbind(i, self._req[p], p)
            self._live -= 1
            if self._observer is not None:
                self._observer.ended(self.now, p, True)
        self._refresh(i)
        if freed:
            if not heap and not self._svcs[i] and self.sleep_after < math.inf:
                self._arm_sleep(i, self.now)
            if self._pending:
                self._retry_pending(i)

    def _stop_service(self, p: int) -> None:
        """Service ``p``'s stop time: its Deployment scales it in, its trace ends it, or the scenario ends."""
        s = self.pod_status[p]
        now = self.now
        if s == _RUNNING:
            i = self.pod_node[p]
            self._touch(i)
            self._svc_accrue(p, i)
            self._svc_judge(p)
            del self._svcs[i][p]
            self._dem[i] -= self._usage[p]
            self.state.unbind(i, self._req[p], p)
            life = now - self.pod_start[p]
            self.pod_end[p] = now
            self.pod_status[p] = _DONE
            self._bad0[p] = self._bad[i] - self._bad0[p]
            self._thr0[p] = (self._thr[i] - self._thr0[p]) / life if life > 0 else 0.0
            if self._observer is not None:  # cut off at the horizon: not a life that ended
                self._observer.ended(now, p, self._submit[p] + self._dur[p] <= self.horizon)
            self._refresh(i)
            if not self._running[i] and not self._svcs[i] and self.sleep_after < math.inf:
                self._arm_sleep(i, now)
            if self._pending:
                self._retry_pending(i)
            return
        if s == _DONE:
            return
        if s == _WAITING:  # bound to a node still waking up
            i = self.pod_node[p]
            self._waiting[i].remove(p)
            self.state.unbind(i, self._req[p], p)
            self._live -= 1
            if self._observer is not None:
                self._observer.ended(now, p, self._submit[p] + self._dur[p] <= self.horizon)
            if self._pending:  # the room it held on the waking node is free for a pod that fits only there
                self._retry_pending(i)
        elif p >= self._next_arrival:  # its stop fell on its own arrival time (a stop runs before an arrival)
            self._stopped_early.add(p)
            self._expired += 1
            return
        elif p in self._pending:
            self._pending.remove(p)
        else:  # evicted, waiting for its restart: the restart event will see it done and drop it
            self._restarting -= 1
        if p in self._carry:  # it ran before an eviction: its life ends here
            self.pod_start[p] = self.pod_end[p] = now
            self._bad0[p] = self._thr0[p] = 0.0
            self.pod_status[p] = _DONE
            self._svc_judge(p)
        else:  # never placed before its stop
            self.pod_node[p] = -1
            self._expired += 1

    def _svc_accrue(self, p: int, i: int) -> None:
        """Add running service ``p``'s time since its snapshot (node ``i`` touched to now) to its interval."""
        acc = self._sacc.get(p)
        if acc is None:
            acc = self._sacc[p] = [0.0, 0.0]
        b = self._bad[i]
        acc[0] += b - self._sb0[p]
        acc[1] += self.now - self._st0[p]
        self._sb0[p] = b
        self._st0[p] = self.now

    def _svc_judge(self, p: int) -> None:
        """Close service ``p``'s current interval: it violates when its seconds served below ``slo_fraction``
        exceed ``slo_tolerance`` of the seconds it was alive in it."""
        acc = self._sacc.pop(p, None)
        if acc is not None and acc[1] > 0.0:
            self._svc_intervals += 1
            if acc[0] > self.slo_tolerance * acc[1]:
                self._svc_viol += 1

    def _slo_tick(self) -> None:
        """An SLO interval ends (a multiple of ``slo_interval_s``): judge every service alive in it."""
        for i, svcs in enumerate(self._svcs):
            if svcs:
                self._touch(i)
                for p in svcs:
                    self._svc_accrue(p, i)
        for p in list(self._sacc):
            self._svc_judge(p)
        self._tick_k += 1
        self._push(self._tick_k * self._slo_interval, _SLO_TICK, -1, 0)

    def _close_services(self) -> None:
        """The run's end: services still running end here (their last interval is judged as it stands)."""
        now = self.now
        for i, svcs in enumerate(self._svcs):
            if not svcs:
                continue
            self._touch(i)
            for p in svcs:
                self._svc_accrue(p, i)
                life = now - self.pod_start[p]
                self.pod_end[p] = now
                self.pod_status[p] = _DONE
                self._bad0[p] = self._bad[i] - self._bad0[p]
                self._thr0[p] = (self._thr[i] - self._thr0[p]) / life if life > 0 else 0.0
        for p in list(self._sacc):
            self._svc_judge(p)

    # ---- results ------------------------------------------------------------------------------------------
    @property
    def energy_joules(self) -> float:
        return self._energy

    @property
    def pending_pods(self) -> int:
        """Pods waiting in the pending queue because no node fits them (not counting pods on waking nodes)."""
        return len(self._pending)

    def idle_tail(self) -> IdleTail:
        """What the cluster draws after the run's end (:class:`IdleTail`), worked out from its state then: no pod
        is left (jobs have ended, services stopped by the horizon and armed their nodes' timers), so every node
        still awake sleeps when its timer fires and the decision core lets it; a node held by ``min_awake`` or
        ``spare_cpu_m`` stays awake. The twin is not changed."""
        if not self.done:
            raise RuntimeError("the run is not finished")
        st, n, end = self.state, len(self.state), self._end_s
        view = copy.copy(st)  # what the decision core reads: every pod gone, power states as the tail makes them
        view.power_state, view.pods = st.power_state.copy(), np.zeros_like(st.pods)
        gidle = self._gidle if self._gpu else [0.0] * n
        idle = [float(self._curves[i][0]) + gidle[i] for i in range(n)]
        pstate, ver = list(self._pstate), list(self._sleep_ver)
        w = [float(st.sleep_watts[i]) if pstate[i] == ASLEEP else idle[i] for i in range(n)]
        g = [0.0 if pstate[i] == ASLEEP else gidle[i] for i in range(n)]
        w0, g0 = tuple(w), tuple(g)
        events = [e for e in self._events if e[2] == _WAKE or (e[2] == _SLEEP and e[4] == ver[e[3]])]
        seq = self._seq
        heapq.heapify(events)
        times, watts, gwatts, awake = [end], [math.fsum(w)], [math.fsum(g)], [sum(ps != ASLEEP for ps in pstate)]
        changes: list[tuple[float, int, float, float]] = []
        pp = self.power_policy
        # Past a whole round of timers after the last change, every held node has been looked at in the final
        # state (the decision core reads no clock): nothing changes any more.
        wait = max(self.sleep_after, pp.recheck_s if pp is not None else 0.0, st.wake_s)
        cap = self.power.sleep_cap.copy() if self.power is not None else None
        if cap is not None and cap.per_hour:
            wait = max(wait, 3600.0)  # a sleep held by max_sleeps_per_hour is looked at again within the hour
        last = end
        while events:
            t, _, kind, i, v = heapq.heappop(events)
            if t > last + wait:
                break
            if kind == _WAKE:
                pstate[i] = view.power_state[i] = ON
                if self.sleep_after < math.inf:
                    ver[i] += 1
                    seq += 1
                    heapq.heappush(events, (t + self.sleep_after, seq, _SLEEP, i, ver[i]))
                wi, gi = idle[i], gidle[i]
            else:
                if v != ver[i] or pstate[i] != ON:
                    continue
                verdict = self.power.may_sleep(view, i)
                if verdict in (HELD_MIN_AWAKE, HELD_SPARE):
                    seq += 1
                    heapq.heappush(events, (t + pp.recheck_s, seq, _SLEEP, i, v))
                    continue
                if verdict:
                    continue
                if (room := cap.room_at(t)) > t:  # as _sleep_event: looked at again once there is room
                    seq += 1
                    heapq.heappush(events, (room, seq, _SLEEP, i, v))
                    continue
                cap.record(t)
                pstate[i] = view.power_state[i] = ASLEEP
                wi, gi = float(st.sleep_watts[i]), 0.0
            changes.append((t, i, wi, gi))
            if times[-1] != t:
                times.append(t)
                watts.append(watts[-1])
                gwatts.append(gwatts[-1])
                awake.append(awake[-1])
            watts[-1] += wi - w[i]
            gwatts[-1] += gi - g[i]
            awake[-1] = sum(ps != ASLEEP for ps in pstate) if kind == _WAKE else awake[-1] - 1
            w[i], g[i] = wi, gi
            last = t
        node = {}
        if self._gpu:
            node = {"node_watts": w0, "node_gpu_watts": g0, "node_changes": tuple(changes)}
        return IdleTail(times=tuple(times), watts=tuple(watts), gpu_watts=tuple(gwatts), awake=tuple(awake), **node)

    def result(self) -> RunResult:
        """The finished run's measurements; energy comes from :attr:`meter`."""
        if not self.done:
            raise RuntimeError("the run is not finished")
        decision_ns = np.asarray(self._lat, dtype=np.int64)
        done = [p for p, s in enumerate(self.pod_status) if s == _DONE]
        life = [self.pod_end[p] - self.pod_start[p] for p in done]
        bad, thr = self._bad0, self._thr0
        if self._carry:  # evicted pods: add up their runs (bad seconds, throttling) over their whole life
            bad, thr = list(bad), list(thr)
            for k, p in enumerate(done):
                if p in self._carry:
                    cb, ct, cl = self._carry[p]
                    bad[p] += cb
                    total = life[k] + cl
                    thr[p] = (thr[p] * life[k] + ct) / total if total > 0 else 0.0
                    life[k] = total
        svc: dict[str, int] = {}
        if self._pm and self._has_svc:  # services are judged per interval (_svc_judge), not over their life
            is_svc = self._is_svc
            jobs = [(p, L) for p, L in zip(done, life) if not is_svc[p]]
            svc = {"completed_services": len(done) - len(jobs), "service_intervals": self._svc_intervals,
                   "service_slo_violations": self._svc_viol}
        else:
            jobs = zip(done, life)
        viol = sum(1 for p, L in jobs if bad[p] > self.slo_tolerance * L)
        first = self._first_start
        # Placed: bound now, or ever run (a service evicted whose stop came while it waited to restart).
        placed = [p for p, node in enumerate(self.pod_node) if node >= 0 or p in first]
        pending = [(first[p] if p in first else self.pod_start[p]) - self._submit[p] for p in placed]
        p99 = float(np.percentile(decision_ns, 99)) / 1000.0 if len(decision_ns) else 0.0
        if self._gpu:
            end = self._end_s
            node_e = [e + w * (end - t) for e, w, t in zip(self._node_e, self._pwr, self._node_t)]
            node_g = [e + w * (end - t) for e, w, t in zip(self._node_g, self._gpwr, self._node_t)]
            svc = {**svc, "gpu_energy_joules": self._genergy, "node_energy_joules": node_e, "node_gpu_joules": node_g,
                   "gpu_blocked": len(self._gpu_blocked),
                   "gpu_unallocated_when_blocked": float(np.mean(self._gpu_blocked)) if self._gpu_blocked else None}
        return RunResult(
            energy_joules=self.meter.joules(0.0, self._end_s),
            end_s=self._end_s,
            placements=self.placements,
            unschedulable_pods=self.unschedulable + len(self._pending) + (self._expired if self._pm else 0),
            placed_pods=len(placed),
            unplaced_fits_no_node=self.unschedulable,
            unplaced_pending_at_end=len(self._pending),
            unplaced_stopped_before_running=self._expired if self._pm else 0,
            completed_pods=len(done),
            slo_violations=viol,
            mean_pending_s=float(np.mean(pending)) if pending else 0.0,
            mean_throttling=float(np.mean([thr[p] for p in done])) if done else 0.0,
            decision_us_p99=p99,
            decisions=len(decision_ns) or self.placements,  # driven through place() alone: one per placement
            timeline=self.timeline,
            idle_tail=self.idle_tail(),
            window_end_s=self._end_s,
            evictions=self.evictions,
            **svc,
        )
