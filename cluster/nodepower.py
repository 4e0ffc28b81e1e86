"""The node power decision core: when an idle node may sleep, which node to wake, and whether to consolidate.

One implementation, driven by both sides, so that the twin and a real cluster cannot diverge:

* the twin (:class:`joulesched.cluster.twin.Twin`, ``idle_policy: {mode: sleep, ...}``) calls it at its sleep
  timers and consolidation ticks;
* the live controller (:mod:`joulesched.live.nodepower`, ``joulesched node-power``) calls it on every
  reconcile, with a :class:`~joulesched.cluster.state.ClusterState` built from the informers.

Rules (docs/node-power.md):

* **sleep**: a node may sleep when it has held no workload pod (DaemonSet and mirror pods do not count) for
  ``sleep_after_s``, is not protected (a control-plane node, or annotated ``joulesched.io/never-sleep``), and
  at least ``min_awake`` nodes with ``spare_cpu_m`` of free requested CPU among them stay awake. A node held
  awake by those two is looked at again every ``recheck_s``.
* **wake**: pods pending that fit no awake node wake the node the scheduler nominated, when it picked a
  sleeping one; otherwise the most efficient sleeping node that fits (lowest watts per millicore at full load).
* **consolidation** (optional): the pods of an awake node are evicted when every one of them fits on the other
  awake nodes, none is protected (a PDB that does not allow it, local storage, ``safe-to-evict: "false"``),
  the eviction budget (``max_evictions_per_hour``) allows them all, and the predicted saving exceeds the cost
  of restarting them. The saving is the node's idle-minus-sleep draw (plus the change in its pods' dynamic
  power on their new nodes) over ``horizon_s``, or only until the node would have emptied by itself where its
  pods' remaining run times are known; the cost is each pod's share of its new node's power over
  ``restart_s``, plus, for the progress it loses, a node kept awake while it is redone. Then the node sleeps.
  Karpenter's knobs ride on it: **disruption budgets** (at most ``nodes`` disrupted at once, a count or a
  percentage of the nodes rounded up, optionally only in a cron ``schedule`` window of ``duration_s``; the
  most restrictive active budget wins) and a **Balanced** acceptance rule: a move is approved only if its
  savings fraction (watts saved over the cluster's draw) over its disruption fraction (pods evicted over the
  pods running) is at least ``balanced_k``.

The core is pure: no clock, no I/O. Callers pass ``now`` (twin seconds, or the controller's monotonic clock).
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Sequence

import numpy as np

# ASLEEP_TAINT: the taint a sleeping node carries (with the cordon), so that the state is visible and
# tolerable; defined with the filter chain, which gates on it.
from joulesched.cluster.filters import ASLEEP_TAINT, fits_free  # noqa: F401 (ASLEEP_TAINT is re-exported)
from joulesched.cluster.state import ASLEEP, ON, ClusterState, PodRequest, gpu_take

#: A sleeping node's estimated draw and wake time where nothing better is known: the node power controller's
#: joules-saved estimate, and the sleep model the scheduler is given beside it (serve --node-power, --sleep runs).
DEFAULT_SLEEP_WATTS = 10.0
DEFAULT_WAKE_S = 60.0

#: Node annotation: the node must never be put to sleep (any value but "false").
NEVER_SLEEP_ANNOTATION = "joulesched.io/never-sleep"
#: Node annotation: the power address of the node (``libvirt:///domain``, ``redfish://...``, ...).
POWER_ADDRESS_ANNOTATION = "joulesched.io/power"
#: Node annotation written by the controller: ``awake``, ``sleeping``, ``asleep``, ``waking`` and the time.
POWER_STATE_ANNOTATION = "joulesched.io/power-state"
POWER_SINCE_ANNOTATION = "joulesched.io/power-state-since"
#: Node annotation on an intermediate state (sleeping, waking, draining): the replica (Lease identity) acting.
POWER_OWNER_ANNOTATION = "joulesched.io/power-owner"
#: Node annotation: the cordon is the controller's own (only such a cordon is ever lifted by it).
CORDONED_ANNOTATION = "joulesched.io/cordoned"
#: Node annotation written by the controller just before it asks an actuator to switch the machine off, removed once
#: the machine is confirmed off or running: while it stands, a power-off may be under way, for any replica.
OFF_REQUESTED_ANNOTATION = "joulesched.io/power-off-requested"
#: The controller's states, in joulesched.io/power-state.
POWER_STATES = ("awake", "sleeping", "asleep", "waking", "draining")
#: Labels that mark a control-plane node (never put to sleep).
CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
#: Pod annotations that forbid evicting it (cluster-autoscaler's and ours).
SAFE_TO_EVICT_ANNOTATIONS = ("cluster-autoscaler.kubernetes.io/safe-to-evict", "joulesched.io/safe-to-evict")

_BUDGET_NODES = re.compile(r"^(\d+)(%?)\Z")


@dataclass(frozen=True)
class DisruptionBudget:
    """At most ``nodes`` nodes disrupted (being emptied by consolidation) at once: ``"3"`` or ``"10%"`` of the
    nodes, rounded up (Karpenter's NodePool ``disruption.budgets``). With ``schedule`` (cron, UTC) the budget
    applies only from each of its ticks for ``duration_s``; without, always. ``nodes: "0"`` in a window stops
    consolidation there (e.g. business hours)."""

    nodes: str = "10%"
    schedule: str | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if not _BUDGET_NODES.match(str(self.nodes)):
            raise ValueError(f"budget nodes {self.nodes!r}: a count (3) or a percentage (10%)")
        if str(self.nodes).endswith("%") and int(str(self.nodes)[:-1]) > 100:
            raise ValueError(f"budget nodes {self.nodes!r}: a percentage is at most 100%")
        if (self.schedule is None) != (self.duration_s is None):
            raise ValueError("a budget's schedule and duration_s go together")
        if self.schedule is not None:
            from croniter import croniter

            if not croniter.is_valid(self.schedule):
                raise ValueError(f"budget schedule {self.schedule!r} is not a cron expression")
            if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
                raise ValueError(f"budget duration_s must be > 0, got {self.duration_s!r}")

    def allowed(self, total_nodes: int) -> int:
        n, pct = _BUDGET_NODES.match(str(self.nodes)).groups()
        return math.ceil(total_nodes * int(n) / 100) if pct else int(n)

    def active(self, wall_s: float) -> bool:
        """Whether the budget applies at ``wall_s`` (seconds since the epoch, UTC)."""
        if self.schedule is None:
            return True
        from croniter import croniter

        t = datetime.fromtimestamp(math.floor(wall_s), timezone.utc)  # whole seconds: 08:59:59.5 is before 09:00
        prev = croniter(self.schedule, t + timedelta(seconds=1)).get_prev(datetime)  # the last tick at or before t
        return (t - prev).total_seconds() < self.duration_s


#: The twin's clock on the wall: its time 0 is Monday 2024-01-01 00:00 UTC, so scheduled budgets (cron, UTC) fall
#: on the days and hours a scenario's diurnal load has.
TWIN_EPOCH_S = 1_704_067_200.0
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)\Z")


def parse_budget(text: str) -> DisruptionBudget:
    """``NODES`` or ``NODES;CRON;DURATION`` (``10%``, ``0;0 9 * * 1-5;8h``), as the command line takes it."""
    parts = [x.strip() for x in str(text).split(";")]
    if len(parts) == 1:
        return DisruptionBudget(parts[0])
    if len(parts) != 3:
        raise ValueError(f"disruption budget {text!r}: NODES or NODES;CRON;DURATION (e.g. '0;0 9 * * 1-5;8h')")
    m = _DURATION.match(parts[2])
    if not m:
        raise ValueError(f"disruption budget {text!r}: duration {parts[2]!r} is not like 30m, 8h or 3600")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    return DisruptionBudget(parts[0], parts[1], float(m.group(1)) * scale)


@dataclass(frozen=True)
class PowerPolicy:
    """The decision parameters (the scenario's ``idle_policy: sleep`` and the controller's options).

    :param sleep_after_s: an empty node sleeps after this long.
    :param min_awake: at least this many nodes stay awake.
    :param spare_cpu_m: the awake nodes keep at least this much free requested CPU among them.
    :param recheck_s: a node held awake by ``min_awake`` or ``spare_cpu_m`` is looked at again after this.
    :param consolidate: evict the pods of under-used nodes so that they can sleep.
    :param consolidate_interval_s: how often consolidation is considered.
    :param max_evictions_per_hour: the eviction budget, over any sliding hour.
    :param restart_s: what restarting one evicted pod costs, in seconds at its demand.
    :param horizon_s: how long a consolidation's saving is counted for.
    :param budgets: disruption budgets (:class:`DisruptionBudget`); none = no limit beyond one node per round.
    :param balanced_k: approve a move only if savings fraction / disruption fraction >= this (0 = off;
        Karpenter's Balanced policy uses 0.5).
    :param max_sleeps_per_hour: the twin's cap: at most this many sleeps started over any sliding hour (0 = no
        limit): idle sleeps wait for room, a node consolidation emptied sleeps at once and counts
        (:class:`SleepCap`). The live controller counts with the same rule under its own option,
        ``NodePowerConfig.max_sleeps_per_hour`` (``--max-sleeps-per-hour``, 60 by default).
    """

    sleep_after_s: float = 300.0
    min_awake: int = 0
    spare_cpu_m: int = 0
    recheck_s: float = 60.0
    consolidate: bool = False
    consolidate_interval_s: float = 300.0
    max_evictions_per_hour: int = 60
    restart_s: float = 30.0
    horizon_s: float = 3600.0
    budgets: tuple[DisruptionBudget, ...] = ()
    balanced_k: float = 0.0
    max_sleeps_per_hour: int = 0

    def __post_init__(self) -> None:
        if not (self.balanced_k >= 0 and math.isfinite(self.balanced_k)):
            raise ValueError(f"balanced_k must be a finite number >= 0, got {self.balanced_k!r}")
        for name in ("sleep_after_s", "recheck_s", "consolidate_interval_s", "restart_s", "horizon_s"):
            v = getattr(self, name)
            if not (v >= 0 and np.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.recheck_s <= 0 or self.consolidate_interval_s <= 0:
            raise ValueError("recheck_s and consolidate_interval_s must be > 0")
        for name in ("min_awake", "spare_cpu_m", "max_evictions_per_hour", "max_sleeps_per_hour"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


class SleepCap:
    """At most ``per_hour`` sleeps started over any sliding hour (0 = no limit): a bound on how many machines a
    misconfiguration or a bug can switch off, and on power cycles. The live controller and the twin count with
    it alike."""

    def __init__(self, per_hour: int):
        self.per_hour = per_hour
        self.started: deque[float] = deque()  # when each sleep of the last hour started, in order

    def room_at(self, now: float) -> float:
        """When one more sleep may start: ``now``, or the instant the oldest counted sleep leaves the hour. Both
        the expiry and the answer are ``started[0] + 3600``, one expression: a gap computed as ``3600 - (now -
        started[0])`` could be positive yet too small to move ``now`` (a review: the twin re-queued its check at
        the same instant for ever)."""
        while self.started and now >= self.started[0] + 3600.0:
            self.started.popleft()
        if not self.per_hour or len(self.started) < self.per_hour:
            return now
        return self.started[0] + 3600.0

    def wait(self, now: float) -> float:
        """Seconds until one more sleep may start (0: now)."""
        return self.room_at(now) - now

    def record(self, now: float) -> None:
        """A sleep started at ``now`` (one that goes ahead whatever the cap counts too)."""
        if self.per_hour:
            self.started.append(now)

    def copy(self) -> "SleepCap":
        """The same count, to play forward without changing this one (the twin's idle tail)."""
        out = SleepCap(self.per_hour)
        out.started = deque(self.started)
        return out


@dataclass(frozen=True, slots=True)
class MovablePod:
    """A pod consolidation might evict. ``key`` is the caller's handle (a twin index, a pod uid).

    :param usage_m: its CPU demand (for the saving); :param lost_s: the progress an eviction throws away
        (0 for a service or a checkpointing job); :param blocker: why it may not be evicted ("" = it may);
    :param remaining_s: how long it will still run if left alone, where known (the twin knows; a live pod's is
        unknown, infinity): the node would empty by itself then, so the saving counts only until then.
    """

    key: object
    request: PodRequest
    usage_m: float = 0.0
    lost_s: float = 0.0
    blocker: str = ""
    remaining_s: float = float("inf")


@dataclass
class Plan:
    """Evict ``moves`` (pod key, target node index) from ``node``; predicted saving and cost in joules."""

    node: int
    moves: list[tuple[object, int]]
    saving_j: float
    cost_j: float


# Verdicts of may_sleep (the empty string means yes).
HELD_MIN_AWAKE = "min_awake"
HELD_SPARE = "spare_cpu"


@dataclass
class NodePowerCore:
    """The decisions, for one cluster of ``n`` nodes. ``protected[i]``: node ``i`` never sleeps and is never
    consolidated. ``counted[i]``: node ``i`` counts toward ``min_awake`` and ``spare_cpu_m`` while awake (the
    live controller: Ready, schedulable workers only; empty = every node, as in the twin). Keeps only the
    eviction history (for the budget)."""

    policy: PowerPolicy
    protected: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    counted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    evictions: deque = field(default_factory=deque)  # times of past evictions
    sleep_cap: SleepCap = field(init=False)

    def __post_init__(self) -> None:
        self.sleep_cap = SleepCap(self.policy.max_sleeps_per_hour)

    # ---- sleep -------------------------------------------------------------------------------------------
    def may_sleep(self, st: ClusterState, i: int, workload_pods: int | None = None) -> str:
        """Whether node ``i``, empty for ``sleep_after_s`` already, may sleep now: "" (yes), or why not:
        ``protected``, ``busy``, ``not awake``, or one of the reasons to look again later
        (:data:`HELD_MIN_AWAKE`, :data:`HELD_SPARE`). Nodes counted awake: those not ASLEEP (waking ones
        count, they are on their way)."""
        if len(self.protected) and self.protected[i]:
            return "protected"
        if st.power_state[i] != ON:
            return "not awake"
        if (st.pods[i] if workload_pods is None else workload_pods) > 0:
            return "busy"
        p = self.policy
        if p.min_awake or p.spare_cpu_m:  # the common case (neither set) costs nothing
            awake = self._awake(st)
            mine = bool(awake[i])
            if int(awake.sum()) - mine < p.min_awake:
                return HELD_MIN_AWAKE
            if p.spare_cpu_m and int(st.free_cpu[awake].sum()) - mine * int(st.free_cpu[i]) < p.spare_cpu_m:
                return HELD_SPARE
        return ""

    def _awake(self, st: ClusterState) -> np.ndarray:
        """The nodes that count as awake: not asleep and, where the caller says which count, counted."""
        awake = st.power_state != ASLEEP
        if len(self.counted) == len(awake):
            awake &= self.counted
        return awake

    # ---- wake --------------------------------------------------------------------------------------------
    @staticmethod
    def efficiency(st: ClusterState) -> np.ndarray:
        """Watts per millicore at full load (lower is better); the order in which sleeping nodes are woken."""
        return st.peak_watts / np.maximum(st.alloc_cpu, 1)

    def choose_wake(self, st: ClusterState, pending: Sequence[PodRequest],
                    nominated: Sequence[int] = (), fits: np.ndarray | None = None) -> list[int]:
        """Sleeping nodes to wake for ``pending`` pods that fit no awake node, in order of preference.

        ``nominated`` are the nodes the scheduler chose for pods (sleeping ones are woken first, in order).
        The rest are served greedily: each pod that fits no awake or already-chosen node picks the most
        efficient sleeping node it fits (``fits``, optional, masks nodes a pod may use at all, e.g. by its
        selectors; shape (len(pending), n))."""
        asleep = st.power_state == ASLEEP
        chosen: list[int] = []
        for i in nominated:
            if 0 <= i < len(st) and asleep[i] and i not in chosen:
                chosen.append(i)
        free_c = st.free_cpu.astype(np.int64).copy()
        free_m = st.free_mem.astype(np.int64).copy()
        free_p = st.free_pods.astype(np.int64).copy()
        free_g = st.gpu_free.copy() if st.has_gpus else None  # per-GPU what-if room (the chain's GpuFit)
        everyone = np.arange(len(st))
        usable = ~asleep
        usable[chosen] = True
        order = np.argsort(self.efficiency(st), kind="stable")
        for k, req in enumerate(pending):
            c, m = req.filter_cpu, req.filter_mem
            ok = fits_free(free_c, free_m, free_p, req)  # the chain's NodeResourcesFit on what-if room
            if req.gpu:
                ok &= st.gpu_fits(free_g, everyone, req) if free_g is not None else False
            if fits is not None:
                ok &= fits[k]
            hit = np.flatnonzero(ok & usable)
            if len(hit):
                j = int(hit[0])
            else:
                cand = [int(j) for j in order if ok[j] and asleep[j]]
                if not cand:
                    continue  # fits no node at all: waking would not help
                j = cand[0]
                chosen.append(j)
                usable[j] = True
            free_c[j] -= c
            free_m[j] -= m
            free_p[j] -= 1
            if req.gpu:
                gpu_take(free_g[j], req)
        return chosen

    # ---- consolidation -----------------------------------------------------------------------------------
    def _balanced(self, saving_w: float, cluster_w: float, moved: int, running: int) -> bool:
        """Karpenter's Balanced rule: savings fraction over disruption fraction at least ``balanced_k``."""
        if moved == 0:
            return True  # an empty node disrupts nothing
        if saving_w <= 0 or cluster_w <= 0 or running <= 0:
            return False
        return (saving_w / cluster_w) / (moved / running) >= self.policy.balanced_k

    def eviction_budget(self, now: float) -> int:
        """Evictions still allowed in the hour ending at ``now``."""
        ev = self.evictions
        while ev and ev[0] <= now - 3600.0:
            ev.popleft()
        return max(0, self.policy.max_evictions_per_hour - len(ev))

    def record_evictions(self, now: float, count: int) -> None:
        self.evictions.extend([now] * count)

    def disruptions_allowed(self, total_nodes: int, wall_s: float) -> int | None:
        """Nodes that may be disrupted at once at ``wall_s`` by the most restrictive active budget (None: no
        budget applies)."""
        active = [b.allowed(total_nodes) for b in self.policy.budgets if b.active(wall_s)]
        return min(active) if active else None

    def plan(self, st: ClusterState, now: float, pods: dict[int, Sequence[MovablePod]],
             fits: dict[object, np.ndarray] | None = None, *, wall_s: float | None = None,
             disrupting: int = 0) -> Plan | None:
        """The best node to empty now, or None. ``pods`` maps each awake node to its workload pods (a node
        missing from it is not considered). One node per call, as Karpenter's single-node consolidation does;
        the caller evicts, records the evictions, and sleeps the node once it is empty.

        Candidates are tried least requested CPU first; the first that passes every check wins. A pod goes to
        the most efficient other awake node with room (``fits[key]`` optionally restricts where it may go).

        ``wall_s`` (seconds since the epoch, UTC; default ``now``) places scheduled budgets; ``disrupting`` is
        how many nodes are being emptied already (the live controller's draining nodes)."""
        p = self.policy
        budget = self.eviction_budget(now)
        if budget <= 0:
            return None
        if p.budgets:
            allowed = self.disruptions_allowed(len(st), now if wall_s is None else wall_s)
            if allowed is not None and disrupting >= allowed:
                return None
        if p.balanced_k:
            awake = np.flatnonzero(st.power_state != ASLEEP)
            # the awake nodes' GPUs too: saving_w below counts a node's idle GPUs, so the share it is of the
            # cluster's draw must count every GPU (on GPU clusters the CPU side alone overstated the share)
            cluster_w = float(st.power()[awake].sum()) + (
                sum(st.gpu_power(int(i)) for i in awake) if st.has_gpus else 0.0)
            running = sum(len(ps) for ps in pods.values())
        on = st.power_state == ON
        eff = self.efficiency(st)
        slope = (st.peak_watts - st.idle_watts) / np.maximum(st.alloc_cpu, 1)  # marginal W per millicore
        awake_mask = self._awake(st)
        awake_n = int(awake_mask.sum())
        cands = [i for i, ps in pods.items() if ps and on[i] and not (len(self.protected) and self.protected[i])
                 and len(ps) <= budget and not any(m.blocker for m in ps)]
        cands.sort(key=lambda i: (st.req_cpu[i] / max(int(st.alloc_cpu[i]), 1), -st.idle_watts[i], i))
        for i in cands:
            if awake_n - int(awake_mask[i]) < p.min_awake:
                return None
            free_c = st.free_cpu.astype(np.int64).copy()
            free_m = st.free_mem.astype(np.int64).copy()
            free_p = st.free_pods.astype(np.int64).copy()
            free_g = st.gpu_free.copy() if st.has_gpus else None
            targets = np.flatnonzero(on)
            targets = targets[targets != i]
            targets = targets[np.argsort(eff[targets], kind="stable")]
            moves: list[tuple[object, int]] = []
            # Asleep, the node's GPUs draw nothing either: their idle watts are saved too.
            saving_w = float(st.idle_watts[i] - st.sleep_watts[i]) + (
                float(st.gpu_curves[i, 0]) * int(st.alloc_gpu[i]) if st.has_gpus else 0.0)
            cost_j = 0.0
            until = min(p.horizon_s, max(m.remaining_s for m in pods[i]))  # it empties by itself after that
            for m in sorted(pods[i], key=lambda m: -m.request.filter_cpu):
                c, mm = m.request.filter_cpu, m.request.filter_mem
                ok = fits_free(free_c[targets], free_m[targets], free_p[targets], m.request)
                if m.request.gpu:
                    ok &= st.gpu_fits(free_g, targets, m.request) if free_g is not None else False
                if fits is not None and m.key in fits:
                    ok &= fits[m.key][targets]
                hit = np.flatnonzero(ok)
                if not len(hit):
                    break
                j = int(targets[hit[0]])
                free_c[j] -= c
                free_m[j] -= mm
                free_p[j] -= 1
                if m.request.gpu:
                    gpu_take(free_g[j], m.request)
                moves.append((m.key, j))
                saving_w += m.usage_m * float(slope[i] - slope[j])
                # Restarting costs the pod's share of its new node for restart_s; progress thrown away must be
                # redone, and keeps a node awake that long (its whole idle draw): a long job is rarely worth it.
                share = float(slope[j] + st.idle_watts[j] / max(int(st.alloc_cpu[j]), 1))
                cost_j += m.usage_m * share * p.restart_s + (m.usage_m * float(slope[j]) + float(st.idle_watts[j])) \
                    * m.lost_s
            else:
                if p.spare_cpu_m:
                    awake = self._awake(st)
                    awake[i] = False
                    if int(free_c[awake].sum()) < p.spare_cpu_m:
                        continue
                saving_j = saving_w * until
                if p.balanced_k and not self._balanced(saving_w, cluster_w, len(moves), running):
                    continue
                if saving_j > cost_j:
                    return Plan(i, moves, saving_j, cost_j)
        return None
