"""The digital twin: an event-driven simulated cluster fast enough to train on.

Model (docs/twin.md has the full statement):

* Events are pod arrivals (from the workload, in order), departures, node sleeps and wake-ups.
* A pod that fits no node waits in a FIFO pending queue and is retried when a departure frees resources.
* Node power is its curve at u = min(1, demand / allocatable); a sleeping node draws ``sleep_watts``; a waking
  node draws its idle watts for ``wake_s`` and its pods start when it is up.
* CPU is processor-shared and work-conserving: when demand exceeds a node's capacity every pod on it gets
  capacity / demand of what it asks for, and runs correspondingly longer. A pod violates its SLO when it was
  served below ``slo_fraction`` of its demand for more than ``slo_tolerance`` of its life.
* The run ends when every placeable pod has finished, and never before the scenario's ``duration_s``. Pods
  whose requests fit no node even when the cluster is empty are counted as never placed.

Each node keeps a virtual clock that advances at its service rate, so a departure is one heap entry per node
and a change of rate reschedules one entry, not one per pod.

The twin is a :class:`~joulesched.cluster.backend.Backend` (``start``, ``next_decision``, ``bind``, ``abandon``,
``result``) and its energy is read through a :class:`~joulesched.power.meter.EnergyMeter`, :class:`TwinMeter`.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import insort
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from joulesched.cluster.backend import Decision
from joulesched.cluster.scenario import Scenario, Sleep
from joulesched.cluster.state import ASLEEP, ON, WAKING, ClusterState, PodRequest
from joulesched.cluster.workload import Workload
from joulesched.power.curves import interp

_DEPART, _SLEEP, _WAKE = 0, 1, 2
_NOT_PLACED, _WAITING, _RUNNING, _DONE = 0, 1, 2, 3


def cluster_from_scenario(scenario: Scenario) -> ClusterState:
    """Build the ClusterState of ``scenario``'s node groups (names ``prefix-0``, ``prefix-1``, ...)."""
    names, cpu, mem, pods, curves, group = [], [], [], [], [], []
    for gi, g in enumerate(scenario.nodes):
        for k in range(g.count):
            names.append(f"{g.name_prefix}-{k}")
            cpu.append(g.cpu_m)
            mem.append(g.memory_mib)
            pods.append(g.max_pods)
            curves.append(g.curve)
            group.append(gi)
    idle = [c[0] for c in curves]
    sleeping = isinstance(scenario.idle_policy, Sleep)
    sleep_w = [scenario.idle_policy.sleep_watts] * len(names) if sleeping else idle
    return ClusterState(names, cpu, mem, pods, curves, sleep_watts=sleep_w, group=group,
                        group_names=[g.name_prefix for g in scenario.nodes],
                        wake_s=scenario.idle_policy.wake_s if sleeping else 0.0, can_sleep=sleeping)


@dataclass
class Timeline:
    """Power and utilisation sampled on a fixed grid, for plots."""

    bin_s: float
    energy_j: list[float] = field(default_factory=list)  # joules per bin (mean watts = energy / bin_s)
    util: list[np.ndarray] = field(default_factory=list)  # per-node utilisation at each bin's start
    awake: list[int] = field(default_factory=list)  # nodes not asleep at each bin's start

    def watts(self) -> np.ndarray:
        return np.asarray(self.energy_j) / self.bin_s


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

    @property
    def slo_violation_rate(self) -> float:
        return self.slo_violations / self.completed_pods if self.completed_pods else 0.0


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
        cpu, mem = wl.cpu_req.tolist(), wl.mem_req.tolist()
        self._req = [PodRequest(None if c < 0 else c, None if m < 0 else m) for c, m in zip(cpu, mem)]
        self.placeable = self._placeable_mask(cluster_from_scenario(scenario), wl)
        self._placeable = self.placeable.tolist()
        self.meter = TwinMeter(self)
        self.reset()

    # ---- set-up -------------------------------------------------------------------------------------------
    def reset(self) -> None:
        sc, wl = self.scenario, self.workload
        self.state = st = cluster_from_scenario(sc)
        n, p = len(st), len(wl)
        self.horizon = sc.duration_s
        self.sleep_after = sc.idle_policy.sleep_after_s if st.can_sleep else math.inf
        self.slo_fraction = sc.slo_fraction
        self.slo_tolerance = sc.slo_tolerance
        self.pod_node = [-1] * p
        self.pod_status = [_NOT_PLACED] * p
        self.pod_start = [math.nan] * p
        self.pod_end = [math.nan] * p
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
        self._ver = [0] * n
        self._scheduled: list[tuple[float, int] | None] = [None] * n  # heap top its departure event is for
        self._sleep_ver = [0] * n
        self._pstate = [ON] * n
        self._pwr = [c[0] for c in self._curves]
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
        self._decision = Decision(st, PodRequest(), np.zeros(n, dtype=bool))
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

    @staticmethod
    def _placeable_mask(st: ClusterState, wl: Workload) -> np.ndarray:
        """Pods whose requests fit at least one empty node; the others can never be placed."""
        cpu = np.maximum(wl.cpu_req, 0)
        mem = np.maximum(wl.mem_req, 0)
        ok = np.zeros(len(wl), dtype=bool)
        for c, m in set(zip(st.alloc_cpu.tolist(), st.alloc_mem.tolist())):
            ok |= (cpu <= c) & (mem <= m)
        return ok & (st.alloc_pods.max() > 0)

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
        perf = time.perf_counter_ns
        while True:
            if ready:
                p = ready.popleft()
            else:
                t_ev = events[0][0] if events else math.inf
                k = self._next_arrival
                t_ar = submit[k] if k < n_pods else math.inf
                if t_ev <= t_ar:
                    if t_ev == math.inf or (self._live == 0 and k >= n_pods and not self._pending):
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
                        if ver == self._sleep_ver[i] and self._pstate[i] == ON and st.pods[i] == 0:
                            self._set_pstate(i, ASLEEP)
                    else:
                        self._advance(t)
                        self._wake(i)
                    continue
                self._advance(t_ar)
                self._next_arrival = k + 1
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
                d.pod, d.mask, d.key = req, mask, p
                return d
            insort(self._pending, p)

    def place(self, node: int) -> None:
        """Bind the current pod to ``node``. The node must be feasible."""
        p, req = self.pod, self.request
        if p < 0 or req is None:
            raise RuntimeError("place() called with no pod awaiting a decision")
        st = self.state
        if not (0 <= node < len(st.names)) or not self.mask[node]:
            raise ValueError(f"node {node} is not feasible for pod {p}")
        st.bind(node, req)
        self.pod_node[p] = node
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
            self._bin_end += tl.bin_s
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
        heapq.heappush(self._running[i], (self._vclock[i] + self._dur[p], p))
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
        if ps == ASLEEP:
            self._set_power(i, self.state.sleep_watts[i])
        elif ps == WAKING:
            self._set_power(i, self._curves[i][0])

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

    def _depart(self, i: int) -> None:
        self._touch(i)
        heap = self._running[i]
        v = self._vclock[i]
        eps = 1e-9 * max(1.0, v)
        st = self.state
        while heap and heap[0][0] <= v + eps:
            _, p = heapq.heappop(heap)
            self._dem[i] -= self._usage[p]
            life = self.now - self.pod_start[p]
            self.pod_end[p] = self.now
            self.pod_status[p] = _DONE
            self._bad0[p] = self._bad[i] - self._bad0[p]  # now: seconds below the SLO over its life
            self._thr0[p] = (self._thr[i] - self._thr0[p]) / life if life > 0 else 0.0  # now: mean throttling
            st.unbind(i, self._req[p])
            self._live -= 1
        self._refresh(i)
        if not heap and self.sleep_after < math.inf:  # empty (pods on a running node are all in its heap)
            self._arm_sleep(i, self.now)
        if self._pending:
            self._retry_pending(i)

    def _retry_pending(self, i: int) -> None:
        """Queue for a new decision every pending pod that now fits node ``i`` (FIFO order kept)."""
        st = self.state
        fc, fm, fp = int(st.free_cpu[i]), int(st.free_mem[i]), int(st.free_pods[i])
        if fp <= 0:
            return
        keep, retry = [], []
        for p in self._pending:
            r = self._req[p]
            (retry if r.filter_cpu <= fc and r.filter_mem <= fm else keep).append(p)
        if retry:
            self._pending = keep
            self._ready.extend(retry)

    def _finish(self) -> None:
        """Close the run at max(horizon, last completion); nodes may still fall asleep before the horizon."""
        end = max(self.horizon, self.now)
        while self._events and self._events[0][0] <= end:
            t, _, kind, i, ver = heapq.heappop(self._events)
            self._advance(t)
            if kind == _SLEEP and ver == self._sleep_ver[i] and self._pstate[i] == ON and self.state.pods[i] == 0:
                self._set_pstate(i, ASLEEP)
        self._advance(end)
        self._end_s = end
        self.done = True

    # ---- results ------------------------------------------------------------------------------------------
    @property
    def energy_joules(self) -> float:
        return self._energy

    @property
    def pending_pods(self) -> int:
        """Pods waiting in the pending queue because no node fits them (not counting pods on waking nodes)."""
        return len(self._pending)

    def result(self) -> RunResult:
        """The finished run's measurements; energy comes from :attr:`meter`."""
        if not self.done:
            raise RuntimeError("the run is not finished")
        decision_ns = np.asarray(self._lat, dtype=np.int64)
        done = [p for p, s in enumerate(self.pod_status) if s == _DONE]
        life = [self.pod_end[p] - self.pod_start[p] for p in done]
        viol = sum(1 for p, L in zip(done, life) if self._bad0[p] > self.slo_tolerance * L)
        placed = [p for p, node in enumerate(self.pod_node) if node >= 0]
        pending = [self.pod_start[p] - self._submit[p] for p in placed]
        p99 = float(np.percentile(decision_ns, 99)) / 1000.0 if len(decision_ns) else 0.0
        return RunResult(
            energy_joules=self.meter.joules(0.0, self._end_s),
            end_s=self._end_s,
            placements=self.placements,
            unschedulable_pods=self.unschedulable + len(self._pending),
            completed_pods=len(done),
            slo_violations=viol,
            mean_pending_s=float(np.mean(pending)) if pending else 0.0,
            mean_throttling=float(np.mean([self._thr0[p] for p in done])) if done else 0.0,
            decision_us_p99=p99,
            decisions=len(decision_ns) or self.placements,  # driven through place() alone: one per placement
            timeline=self.timeline,
        )
