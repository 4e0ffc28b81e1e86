"""The clairvoyant offline optimum: a mixed-integer program over the twin's own semantics, solved with HiGHS.

docs/optimum.md states the model and proves what it is exact for. In short, it chooses for every placeable pod
a node and a *start mode* and charges exactly the energy the twin would meter for that choice:

* a pod is bound when it arrives (so the twin's filter must pass: CPU, memory and pod-slot requests of the
  pods bound to the node, including those waiting on a waking node, fit its allocatable);
* it starts at once when its node is on, at the end of the node's wake-up when the node is waking, and
  ``wake_s`` after its arrival when the node is asleep (it wakes the node);
* a node is awake on the union of ``[bind, end + sleep_after_s)`` over its pods and on ``[0, sleep_after_s)``,
  and asleep elsewhere; awake it draws its idle watts plus its curve's rise at its demand, asleep
  ``sleep_watts``;
* the power curve is the twin's exact piecewise-linear interpolation (segment binaries at every point where
  the curve bends down), and the run lasts ``max(duration_s, last completion)``.

Its schedules never queue a pod and never overload a node (demand above capacity would stretch durations by
processor sharing, which no linear model can state). On instances where no policy can overload a node (every
pod's CPU usage at most its request, no best-effort pods) and none has to queue a pod, it is the exact optimum
over every run the twin can produce; elsewhere it is the optimum over the runs that neither queue nor
throttle. :func:`replay` drives the twin with the optimum's assignment and returns the twin's own result, which
is how the model is checked against the twin.

:func:`evaluate` prices a given schedule (a heuristic's twin run) in the model, a second check.

:func:`lp_bound` is a time-indexed LP over kinds of node (served CPU, nodes serving, holding pods and awake,
requests per core served, the sleep and wake windows, the curve's convex envelope) that no run of the twin can
beat, queued or throttled runs included; it is never below the fluid bound and scales to the 240-node scenario.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from joulesched.agent.lower_bound import _lower_hull, lower_bound
from joulesched.agent.policy import decide
from joulesched.cluster.scenario import Scenario, Sleep
from joulesched.cluster.twin import RunResult, Twin, extend_run
from joulesched.cluster.workload import SERVICE, Workload, build_workload
from joulesched.core.errors import UsageError

TOL = 1e-6  # seconds: event times closer than this are the same instant (the twin's departures come first)


class OptimumError(UsageError):
    """An option of the optimum is malformed, or the instance is outside what the model can state."""


class PodModelUnsupported(OptimumError):
    """The workload has services or time-varying usage, which the MIP does not model yet."""


class SleepModelUnsupported(PodModelUnsupported):
    """A node draws more asleep than awake and idle: the MIP assumes sleeping saves power (a benchmark's row is
    'unsupported'; its bounds still hold)."""


class GpuModelUnsupported(PodModelUnsupported):
    """Pods share GPUs whose power curve is not linear: the MIP cannot state the twin's GPU watts exactly (a
    benchmark's row is 'unsupported', as for services)."""


@dataclass(frozen=True)
class Instance:
    """What the model reads: the cluster, the idle policy and the placeable pods of one (scenario, seed)."""

    name: str
    seed: int
    cap: np.ndarray  # allocatable millicores per node
    mem: np.ndarray
    slots: np.ndarray
    curves: np.ndarray  # (N, 11) watts
    sleep_w: np.ndarray
    kinds: np.ndarray  # nodes with equal kinds are interchangeable
    can_sleep: bool
    sleep_after: float
    wake: float
    horizon: float
    pod: np.ndarray  # index of each modelled pod in the workload
    a: np.ndarray  # arrival
    d: np.ndarray  # duration
    c: np.ndarray  # CPU request as the filter reads it (absent = 0)
    m: np.ndarray
    u: np.ndarray  # CPU demand
    never_placed: int  # pods that fit no empty node: the twin never places them either
    never_sleep: np.ndarray | None = None  # nodes that stay awake (a group's never_sleep)
    scenario: Scenario | None = None  # where it came from, for warm starts and replays
    workload: Workload | None = field(default=None, repr=False, compare=False)  # its workload, built once
    seed_offset: int = 0
    # GPUs (docs/optimum.md, "GPUs"): per node its GPU count, model ("" without) and one GPU's curve (watts at
    # 0..100 % of its share, power/gpu.py); per pod its GPU count, milli-GPU per GPU (1000: whole GPUs) and the
    # code of its allowed models in gspec_table (None: any). All zero / empty on a cluster without GPUs.
    gpu: np.ndarray | None = None
    gpu_model: tuple[str, ...] = ()
    gpu_curves: np.ndarray | None = None
    g: np.ndarray | None = None
    gm: np.ndarray | None = None
    gspec: np.ndarray | None = None
    gspec_table: tuple = (None,)
    # Services (bounds only, ``instance(bounds_only=True)``): held from bind to their stop, no work to serve.
    service: np.ndarray | None = None

    def __post_init__(self) -> None:
        s = object.__setattr__
        n, p = len(self.cap), len(self.a)
        if self.gpu is None:
            s(self, "gpu", np.zeros(n, dtype=np.int64))
        if not self.gpu_model:
            s(self, "gpu_model", ("",) * n)
        if self.gpu_curves is None:
            s(self, "gpu_curves", np.zeros((n, 11)))
        if self.g is None:
            s(self, "g", np.zeros(p, dtype=np.int64))
        if self.gm is None:
            s(self, "gm", np.full(p, 1000, dtype=np.int64))
        if self.gspec is None:
            s(self, "gspec", np.zeros(p, dtype=np.int64))
        if self.service is None:
            s(self, "service", np.zeros(p, dtype=bool))

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpu.any())

    @property
    def gpu_idle_w(self) -> np.ndarray:
        """Each node's GPUs' idle draw in all (what an awake node's GPUs draw with nothing allocated)."""
        return self.gpu * self.gpu_curves[:, 0]

    @property
    def node_curves(self) -> np.ndarray:
        """Each node's awake draw at 0..100 % CPU with its GPUs idle: the CPU-side curve plus the GPUs' idle."""
        return self.curves + self.gpu_idle_w[:, None]

    def gpu_fits(self) -> np.ndarray:
        """(P, N): the pod's GPUs fit the empty node (count and model, as GpuFit reads them); True without GPUs."""
        ok = np.ones((self.pods, self.nodes), dtype=bool)
        for p in np.flatnonzero(self.g > 0).tolist():
            need = int(self.g[p]) if self.gm[p] >= 1000 else 1
            row = self.gpu >= need
            models = self.gspec_table[int(self.gspec[p])]
            if models is not None:
                row &= np.array([m in models for m in self.gpu_model], dtype=bool)
            ok[p] = row
        return ok

    def gpu_watts(self) -> np.ndarray:
        """(P, N): the GPU watts pod p adds on node i while it runs (its GPUs' rise above idle at its share);
        exact for whole GPUs on any curve and for shares on a linear curve (:func:`instance` refuses the rest)."""
        rise_full = self.gpu_curves[:, 10] - self.gpu_curves[:, 0]
        share = self.g * self.gm / 1000.0
        return share[:, None] * rise_full[None, :]

    @property
    def nodes(self) -> int:
        return len(self.cap)

    @property
    def pods(self) -> int:
        return len(self.a)

    @property
    def overload_free(self) -> bool:
        """True when no policy can overload a node: demand never exceeds the requests the filter admits."""
        return bool(np.all(self.u <= self.c))


def instance(scenario: Scenario, seed_offset: int = 0, workload: Workload | None = None, *,
             bounds_only: bool = False) -> Instance:
    """The instance of run ``seed_offset`` of ``scenario`` (workload seed ``scenario.seed + seed_offset``;
    ``workload``: that workload, already built). ``bounds_only``: an instance for the fluid, LP and
    bind-on-arrival bounds alone, which state services (``Instance.service``) and any GPU curve; the MIP
    needs neither (it refuses them)."""
    ip = scenario.idle_policy
    if isinstance(ip, Sleep):
        # max_sleeps_per_hour too: a node the cap keeps awake takes a later pod at once, which the MIP cannot say
        # (a review: a schedule certified optimal used 20 % more than a run of the twin).
        extra = [f"{k}={getattr(ip, k)!r}" for k, off in (("min_awake", 0), ("spare_cpu_m", 0), ("consolidation", None),
                                                          ("max_sleeps_per_hour", 0))
                 if getattr(ip, k, off) != off]
        if extra:
            raise OptimumError(f"{scenario.name}: the optimum models the plain sleep rule (an empty node sleeps after "
                               f"sleep_after_s); this scenario sets idle_policy {', '.join(extra)}")
    if scenario.gpu_runtime is not None:
        raise OptimumError(f"{scenario.name}: the optimum models a job's run time as its duration on every node; "
                           "this scenario sets gpu_runtime (the benchmark's lower bound still applies)")
    seed = scenario.seed + seed_offset
    wl = build_workload(scenario, seed) if workload is None else workload
    if (wl.profile >= 0).any() or (wl.has_pod_model and not bounds_only):
        raise PodModelUnsupported(f"{scenario.name}: the optimum models jobs with constant usage; this workload "
                                  "has services or usage profiles (the fluid lower bound still applies"
                                  + ("" if (wl.profile >= 0).any() else "; --bound-only gives the LP bounds") + ")")
    twin = Twin(scenario, wl)
    st = twin.state
    keep = np.flatnonzero(twin.placeable)
    never = np.array([bool(getattr(scenario.nodes[g], "never_sleep", False)) for g in st.group.tolist()])
    kinds_map: dict[tuple, int] = {}
    kinds = []
    for i in range(len(st)):
        key = (int(st.alloc_cpu[i]), int(st.alloc_mem[i]), int(st.alloc_pods[i]), tuple(st.curves[i].tolist()),
               float(st.sleep_watts[i]), bool(never[i]), int(st.alloc_gpu[i]), st.gpu_model[i],
               tuple(st.gpu_curves[i].tolist()))
        kinds.append(kinds_map.setdefault(key, len(kinds_map)))
    gk = {}
    if st.has_gpus or wl.has_gpus:
        gk = dict(gpu=st.alloc_gpu.astype(np.int64), gpu_model=tuple(st.gpu_model), gpu_curves=st.gpu_curves.copy(),
                  g=wl.gpu[keep].astype(np.int64), gm=wl.gpu_milli[keep].astype(np.int64),
                  gspec=wl.gpu_spec[keep].astype(np.int64), gspec_table=tuple(wl.gpu_spec_table))
        if not bounds_only:
            _check_gpus(scenario.name, st, gk)
    inst = Instance(
        name=scenario.name, seed=seed, cap=st.alloc_cpu.astype(np.float64), mem=st.alloc_mem.astype(np.float64),
        slots=st.alloc_pods.astype(np.float64), curves=st.curves.copy(), sleep_w=st.sleep_watts.copy(),
        kinds=np.asarray(kinds), can_sleep=st.can_sleep,
        sleep_after=float(twin.sleep_after) if st.can_sleep else math.inf, wake=st.wake_s if st.can_sleep else 0.0,
        horizon=float(scenario.duration_s), pod=keep, a=wl.submit_s[keep].astype(np.float64),
        d=wl.duration_s[keep].astype(np.float64), c=np.maximum(wl.cpu_req[keep], 0).astype(np.float64),
        m=np.maximum(wl.mem_req[keep], 0).astype(np.float64), u=wl.usage_m[keep].astype(np.float64),
        never_placed=int(len(wl) - keep.size), never_sleep=never, scenario=scenario, seed_offset=seed_offset,
        workload=wl, service=wl.kind[keep] == SERVICE, **gk)
    if not bounds_only and st.can_sleep:
        costly = np.flatnonzero(inst.node_curves[:, 0] < inst.sleep_w)
        if costly.size:
            i = int(costly[0])
            raise SleepModelUnsupported(
                f"{scenario.name}: node {st.names[i]} draws {inst.sleep_w[i]:g} W asleep, more than its "
                f"{inst.node_curves[i, 0]:g} W awake and idle: the optimum assumes sleeping saves power (lower "
                "sleep_watts; the fluid and LP bounds still apply)")
    return inst


def _check_gpus(name: str, st, gk: dict) -> None:
    """Refuse (OptimumError) what the model cannot state exactly: a share of a GPU whose curve is not linear
    (the node's GPU watts would then depend on how the shares are spread over its GPUs, which the twin decides
    by best fit). Whole GPUs sit at 0 or 100 % of their curve, so any curve is exact for them."""
    shared = (gk["g"] > 0) & (gk["gm"] < 1000)
    if not shared.any():
        return
    curves = gk["gpu_curves"]
    for i in np.flatnonzero(gk["gpu"] > 0).tolist():
        line = curves[i, 0] + (curves[i, 10] - curves[i, 0]) * np.arange(11) / 10.0
        if not np.allclose(curves[i], line, rtol=1e-12, atol=1e-9):
            raise GpuModelUnsupported(f"{name}: node {st.names[i]}'s GPU curve is not linear and pods share GPUs: the "
                               "optimum models shared GPUs on linear GPU power curves only ([idle, max]); the "
                               "fluid lower bound still applies")


@dataclass
class OptimumResult:
    """The solver's answer for one instance. Energies are joules over the twin's whole run."""

    name: str
    seed: int
    nodes: int
    pods: int
    status: str  # optimal | time_limit | infeasible | no_solution | bound_conflict
    energy_joules: float | None  # the best schedule's energy as the model states it (None: none found)
    bound_joules: float | None  # the solver's proven lower bound on every schedule of the model
    gap: float | None  # (energy - bound) / energy
    wall_s: float
    variables: int
    binaries: int
    rows: int
    overload_free: bool
    assignment: dict[int, int] = field(default_factory=dict)  # workload pod index -> node
    starts: dict[int, float] = field(default_factory=dict)  # workload pod index -> start time in the schedule
    message: str = ""
    solver: str = "highs"
    mip_nodes: int | None = None  # branch-and-bound nodes the solver explored
    mip_dual_bound: float | None = None  # the solver's own proven bound (before the LP and fluid bounds join)
    warm_joules: float | None = None  # the warm start's energy (the best in-class run of warm_specs), if any
    root_bound: float | None = None  # the MIP's LP relaxation (interior point), a valid bound on the model
    schedule_solver: str | None = None  # highs | cpsat: who found the schedule
    bound_solver: str | None = None  # highs (its MIP, LP, root and fluid bounds) | cpsat: who proved the bound
    cpsat_bound: float | None = None  # CP-SAT's bound on the model (its relaxation's, less the scaling error)
    cpsat: dict | None = None  # CP-SAT's status on its relaxation, the scaling error eps, its seconds, branches

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("name", "seed", "nodes", "pods", "status", "energy_joules",
                                               "bound_joules", "gap", "wall_s", "variables", "binaries", "rows",
                                               "overload_free", "message", "solver", "mip_nodes", "mip_dual_bound",
                                               "warm_joules", "root_bound", "schedule_solver", "bound_solver",
                                               "cpsat_bound", "cpsat")}
        return out


# ---- the model ---------------------------------------------------------------------------------------------
class _Model:
    """A sparse linear model assembled in numpy-friendly lists, handed to HiGHS in one call."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.cost: list[float] = []
        self.integer: list[bool] = []
        self.rlo: list[float] = []
        self.rhi: list[float] = []
        self.ri: list[int] = []
        self.ci: list[int] = []
        self.v: list[float] = []
        self.offset = 0.0

    def var(self, lb: float, ub: float, cost: float = 0.0, integer: bool = False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.lb) - 1

    def row(self, cols, vals, lo: float, hi: float) -> None:
        r = len(self.rlo)
        self.rlo.append(lo)
        self.rhi.append(hi)
        self.ri.extend([r] * len(cols))
        self.ci.extend(cols)
        self.v.extend(vals)

    @property
    def ncols(self) -> int:
        return len(self.lb)

    @property
    def nrows(self) -> int:
        return len(self.rlo)

    def entries(self, *, by_row: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, columns, values) of the matrix, duplicates (the same variable twice in one row) summed, sorted
        by row (``by_row``) or by column."""
        ri = np.asarray(self.ri, dtype=np.int64)
        ci = np.asarray(self.ci, dtype=np.int64)
        vv = np.asarray(self.v, dtype=np.float64)
        major, minor, k = (ri, ci, max(self.ncols, 1)) if by_row else (ci, ri, max(self.nrows, 1))
        key = major * k + minor
        order = np.argsort(key, kind="stable")
        key, vv = key[order], vv[order]
        uniq, first = np.unique(key, return_index=True)
        vals = np.add.reduceat(vv, first) if vv.size else vv
        a, b = uniq // k, uniq % k
        return (a, b, vals) if by_row else (b, a, vals)

    def highs(self, *, integral: bool, time_limit: float, threads: int | None, gap: float):
        import highspy

        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_rel_gap", gap)
        h.setOptionValue("random_seed", 0)
        if threads:
            h.setOptionValue("threads", int(threads))
        lp = highspy.HighsLp()
        n, m = self.ncols, self.nrows
        lp.num_col_ = n
        lp.num_row_ = m
        lp.col_cost_ = np.asarray(self.cost, dtype=np.float64)
        lp.col_lower_ = np.asarray(self.lb, dtype=np.float64)
        lp.col_upper_ = np.asarray(self.ub, dtype=np.float64)
        lp.row_lower_ = np.asarray(self.rlo, dtype=np.float64)
        lp.row_upper_ = np.asarray(self.rhi, dtype=np.float64)
        lp.offset_ = self.offset
        # Column-wise storage, duplicates (the same variable twice in one row) summed.
        rows, cols, vals = self.entries(by_row=False)
        starts = np.searchsorted(cols, np.arange(n + 1))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = starts.astype(np.int32)
        lp.a_matrix_.index_ = rows.astype(np.int32)
        lp.a_matrix_.value_ = vals
        lp.a_matrix_.num_col_ = n
        lp.a_matrix_.num_row_ = m
        if integral and any(self.integer):
            lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                               for b in self.integer]
        h.passModel(lp)
        return h

    def cpsat(self, *, time_limit: float, threads: int, gap: float, hint: np.ndarray | None = None):
        """The same model solved by CP-SAT, on an integer relaxation whose bound stays valid for this model
        (agent/optimum_cpsat.py: the scaling of the continuous variables and the error it allows for)."""
        from joulesched.agent.optimum_cpsat import solve_cpsat

        return solve_cpsat(self, time_limit=time_limit, threads=threads, gap=gap, hint=hint)


def _unique_times(times: np.ndarray) -> np.ndarray:
    t = np.sort(np.asarray(times, dtype=np.float64))
    if t.size == 0:
        return t
    keep = np.concatenate(([True], np.diff(t) > TOL))
    return t[keep]


def _index(grid: np.ndarray, t) -> np.ndarray:
    """Index of the grid point equal to ``t`` (within TOL); ``t`` must be on the grid."""
    return np.searchsorted(grid, np.asarray(t) - TOL)


def _env_pieces(xs: np.ndarray, ys: np.ndarray) -> list[tuple[float, float]]:
    """(intercept, slope) of each segment of the lower convex hull of the points, left to right."""
    hx, hy = _lower_hull(xs, ys)
    out = []
    for k in range(len(hx) - 1):
        s = (hy[k + 1] - hy[k]) / (hx[k + 1] - hx[k])
        out.append((float(hy[k] - s * hx[k]), float(s)))
    return out


class _Spans:
    """Columns that count over index ranges [lo, hi), read back per index."""

    def __init__(self, n: int) -> None:
        self.cols: list[list[int]] = [[] for _ in range(n)]
        self.vals: list[list[float]] = [[] for _ in range(n)]
        self.keys: list[list[int]] = [[] for _ in range(n)]

    def add(self, col: int, val: float, lo: int, hi: int, key: int = -1) -> None:
        for j in range(max(lo, 0), min(hi, len(self.cols))):
            self.cols[j].append(col)
            self.vals[j].append(val)
            self.keys[j].append(key)

    def at(self, j: int) -> tuple[list[int], list[float]]:
        return self.cols[j], self.vals[j]

    def by_key(self, j: int) -> list[list[int]]:
        """The columns at ``j`` grouped by key (a pod's modes)."""
        out: dict[int, list[int]] = {}
        for col, key in zip(self.cols[j], self.keys[j]):
            out.setdefault(key, []).append(col)
        return list(out.values())


_spans = _Spans


@dataclass
class _Built:
    model: _Model
    y: dict  # (p, unit, mode) -> column
    modes: list  # per pod: list of (start, trigger check index or -1)
    inst: Instance
    units: list  # per unit: list of node indices
    wake_order: bool = True  # the orbit rule among identical sleeping nodes is in the model


def _build(inst: Instance, *, wake_order: bool = True, partial: bool = False) -> _Built:
    """Assemble the MIP (docs/optimum.md): one unit per node, ``y[p, node, mode]`` binaries and the rest.

    ``partial``: each pod placed at most once rather than exactly once, and a pod no node fits simply left out:
    the nodes' own model, which the Lagrangian bound prices pods into (agent/optimum_lagrange.py)."""
    N, P = inst.nodes, inst.pods
    sleep = inst.can_sleep
    Z, W = inst.sleep_after, inst.wake
    # Units: CPU in cores and memory in GiB keep the coefficients near 1 (HiGHS is much faster so).
    a, d = inst.a, inst.d
    c, mreq, u = inst.c / 1000.0, inst.m / 1024.0, inst.u / 1000.0
    capN, memN = inst.cap / 1000.0, inst.mem / 1024.0
    idle = inst.node_curves[:, 0]  # awake with nothing running: the CPU side's idle and the GPUs' idle draw
    premium = idle - inst.sleep_w
    if sleep and (premium < 0).any():
        raise OptimumError("a node's sleep_watts exceeds its idle watts: the model assumes sleeping saves power")
    integral = True
    units = [[i] for i in range(N)]
    U = len(units)
    rep = [un[0] for un in units]  # a representative node per unit
    mult = np.array([len(un) for un in units], dtype=np.float64)
    cap = capN[rep]
    M = _Model()

    # Pods a unit can take: its requests fit an empty node and its demand fits the CPU (no overload).
    allowed = ((c[:, None] <= cap[None, :]) & (mreq[:, None] <= memN[rep][None, :])
               & (inst.slots[rep][None, :] >= 1) & (u[:, None] <= cap[None, :] + 1e-12)
               & inst.gpu_fits()[:, rep])
    gpu_w = inst.gpu_watts()[:, rep] if inst.has_gpus else None  # GPU watts above idle while the pod runs
    bad = np.flatnonzero(~allowed.any(axis=1))
    if bad.size and not partial:
        raise _Infeasible(f"pod {int(inst.pod[bad[0]])} demands {inst.u[bad[0]]:g}m, more than any node it fits: "
                          "every schedule overloads a node, which the model does not state")

    # Check grid: arrivals, the run's earliest end T0 and the later ends a delayed pod may cause.
    T0 = max(inst.horizon, float((a + d).max()) if P else 0.0)
    arr = _unique_times(a)
    jp = _index(arr, a)  # arrival index of each pod (into arr)
    # Start modes: on arrival (node on), or at the end of a wake-up triggered at an arrival in (a - W, a].
    modes: list[list[tuple[float, int]]] = []
    for p in range(P):
        ms = [(float(a[p]), -1)]
        if sleep:
            lo = a[p] - W
            for j in range(int(jp[p]), -1, -1):
                t = arr[j]
                if t <= lo + TOL and not (W <= TOL and j == jp[p]):
                    break
                if t >= Z - TOL:  # a node can be asleep only from sleep_after_s on
                    ms.append((float(t + W), j))
        modes.append(ms)
    ends = np.array([s + d[p] for p in range(P) for s, _ in modes[p]]) if P else np.zeros(0)
    tail = ends[ends > T0 + TOL]
    chk = _unique_times(np.concatenate(([0.0], arr, [T0], tail)))
    jchk = _index(chk, arr)  # arrival j -> check index
    J = len(chk)
    iT0 = int(_index(chk, T0))
    pods_at: dict[int, list[int]] = {}
    for p in range(P):
        pods_at.setdefault(int(jchk[jp[p]]), []).append(p)

    # ---- assignment ----
    y: dict[tuple[int, int, int], int] = {}
    for p in range(P):
        cols = []
        for i in range(U):
            if not allowed[p, i]:
                continue
            # Its GPUs' rise above idle, charged for the d seconds it runs on the node (allocated GPUs of a
            # waking node draw idle until it is up, and the pod starts then).
            gcost = float(gpu_w[p, i] * d[p]) if gpu_w is not None else 0.0
            for k in range(len(modes[p])):
                y[(p, i, k)] = col = M.var(0.0, 1.0, gcost, integral)
                cols.append(col)
        M.row(cols, [1.0] * len(cols), 0.0 if partial else 1.0, 1.0)  # row p: pod p's (the Lagrangian's duals)

    def ymodes(p, i):
        return [(k, y[(p, i, k)]) for k in range(len(modes[p])) if (p, i, k) in y]

    # ---- the run's window: ext[j] = 1 while some pod is still running after check point j (j >= iT0) ----
    ext: dict[int, int] = {}
    for j in range(iT0, J - 1):
        ext[j] = M.var(0.0, 1.0, 0.0, False)
        if j > iT0:
            M.row([ext[j], ext[j - 1]], [1.0, -1.0], -math.inf, 0.0)
    for (p, i, k), col in y.items():
        e = modes[p][k][0] + d[p]
        for j in range(iT0, J - 1):
            if chk[j] < e - TOL:
                M.row([col, ext[j]], [1.0, -1.0], -math.inf, 0.0)

    # Sleep draw (all nodes) over the window; the awake premium is added per node below.
    base_w = float((inst.sleep_w if sleep else idle).sum())
    M.offset += base_w * T0
    for j in range(iT0, J - 1):
        M.cost[ext[j]] += base_w * (chk[j + 1] - chk[j])

    # ---- per unit: awake state on the check grid, requests, dynamic power on the event grid ----
    dyn_times = [0.0, T0]
    for p in range(P):
        for s, _ in modes[p]:
            dyn_times += [s, s + d[p]]
    tg = _unique_times(np.concatenate((np.asarray(dyn_times), arr)))
    G = len(tg) - 1  # dyn intervals [tg[g], tg[g+1])
    jof = np.searchsorted(chk, tg[:-1] + TOL, side="right") - 1  # check point at or before each dyn interval
    aw_cols: dict[tuple[int, int], int] = {}
    wk_cols: dict[tuple[int, int], int] = {}
    at_cols: dict[tuple[int, int], int] = {}
    for i in range(U):
        n = mult[i]
        node = rep[i]
        Pi = [p for p in range(P) if allowed[p, i]]
        # Awake state: aw[j] (awake before the arrivals at chk[j]), wk[j] (woken at chk[j]).
        aw: dict[int, int | None] = {}
        wk: dict[int, int] = {}
        never = inst.never_sleep is not None and bool(inst.never_sleep[node])
        if sleep:
            for j in range(J):
                # None: awake for sure (before the first sleep timer can fire, or a node that never sleeps)
                aw[j] = None if chk[j] < Z - TOL or never else M.var(0.0, n, 0.0, integral)
            for j, ps in ([] if never else pods_at.items()):
                if chk[j] >= Z - TOL and any(allowed[p, i] for p in ps):
                    wk[j] = M.var(0.0, n, 0.0, integral)
        for j, col in aw.items():
            if col is not None:
                aw_cols[(i, j)] = col
        for j, col in wk.items():
            wk_cols[(i, j)] = col

        def awake_after(j):
            """(cols, vals, const): nodes of the unit awake just after the arrivals at check point j."""
            cols, vals, const = [], [], 0.0
            if not sleep or aw.get(j) is None:
                const = n
            else:
                cols.append(aw[j])
                vals.append(1.0)
            if sleep and j in wk:
                cols.append(wk[j])
                vals.append(1.0)
            return cols, vals, const

        if sleep:
            # Cover count before the arrivals at j: pods bound earlier whose end + sleep_after is after chk[j].
            # Cover count before the arrivals at j (pods bound earlier whose end + sleep_after is after chk[j]),
            # written out per check point: a running sum would make the LP's bases dense and the simplex slow.
            cover = _spans(J)
            kmax = np.zeros(J)
            for p in Pi:
                j0 = int(jchk[jp[p]])
                emax = 0.0
                for k, col in ymodes(p, i):
                    E = modes[p][k][0] + d[p] + Z
                    emax = max(emax, E)
                    cover.add(col, 1.0, j0 + 1, int(np.searchsorted(chk, E - TOL)), p)  # gone at the first point >= E
                kmax[j0 + 1:int(np.searchsorted(chk, emax - TOL))] += 1
            for j in range(J):
                if aw[j] is None:
                    continue
                cols, vals = cover.at(j)
                M.row([aw[j]] + cols, [1.0] + [-v for v in vals], -math.inf, 0.0)  # awake only if covered
                for pc in cover.by_key(j):  # covered by any pod: awake (a row per pod keeps the relaxation strong)
                    M.row(pc + [aw[j]], [1.0] * len(pc) + [-1.0], -math.inf, 0.0)
            # Start modes against the node's state at the pod's arrival.
            for p in Pi:
                j = int(jchk[jp[p]])
                lo_w = int(np.searchsorted(chk, chk[j] - W + TOL, side="right"))
                window = [jj for jj in range(lo_w, j) if jj in wk]
                for k, col in ymodes(p, i):
                    trig = modes[p][k][1]
                    if trig < 0:  # on: awake and not waking
                        cols, vals = [col] + [wk[jj] for jj in window], [1.0] + [1.0] * len(window)
                        if aw[j] is None:
                            M.row(cols, vals, -math.inf, n)
                        else:
                            M.row(cols + [aw[j]], vals + [-1.0], -math.inf, 0.0)
                    else:
                        jt = int(jchk[trig])
                        if jt in wk:
                            M.row([col, wk[jt]], [1.0, -1.0], -math.inf, 0.0)
                        else:
                            M.ub[col] = 0.0
            for j, col in wk.items():
                if aw[j] is not None:
                    M.row([col, aw[j]], [1.0, 1.0], -math.inf, n)
                else:
                    M.ub[col] = 0.0  # awake for sure: never woken here
                trig_cols = [y[(p, i, k)] for p in pods_at[j] for k in range(len(modes[p]))
                             if (p, i, k) in y and modes[p][k][1] >= 0 and int(jchk[modes[p][k][1]]) == j]
                M.row([col] + trig_cols, [1.0] + [-1.0] * len(trig_cols), -math.inf, 0.0)
            # Awake time between check points j and j+1: the whole gap when the node is still covered at j+1,
            # else the latest cover end inside the gap, so at[j] >= (E - chk[j]) y for each (pod, mode) whose cover
            # ends there, and the initial cover [0, sleep_after) likewise.
            ending: list[list[tuple[int, float]]] = [[] for _ in range(J)]
            for p in Pi:
                for k, col in ymodes(p, i):
                    E = modes[p][k][0] + d[p] + Z
                    jr = int(np.searchsorted(chk, E - TOL))
                    if 1 <= jr < J:
                        ending[jr - 1].append((col, min(E, chk[jr]) - chk[jr - 1]))
            jz = int(np.searchsorted(chk, Z - TOL))
            for j in range(J - 1):
                gap = chk[j + 1] - chk[j]
                nxt = aw[j + 1]
                cost = premium[node] if j < iT0 else 0.0  # at is in node-seconds
                if nxt is None:
                    M.offset += n * premium[node] * gap if j < iT0 else 0.0
                    if j >= iT0:
                        M.cost[ext[j]] += n * premium[node] * gap
                    continue
                at = M.var(n * (Z - chk[j]) if j == jz - 1 else 0.0, n * gap, cost)
                at_cols[(i, j)] = at
                M.row([at, nxt], [1.0, -gap], 0.0, math.inf)
                for col, span in ending[j]:
                    M.row([at, col], [1.0, -span], 0.0, math.inf)
                if j >= iT0:  # charged only while the run lasts
                    atc = M.var(0.0, n * gap, premium[node])
                    M.row([atc, at, ext[j]], [1.0, -1.0, -n * gap], -n * gap, math.inf)
                    M.cost[at] = 0.0
        # Requests held on the check grid: from arrival to end, checked just after each arrival batch.
        for res, cap_r in ((c, capN[node]), (mreq, memN[node]), (None, inst.slots[node])):
            need = np.ones(P) if res is None else res
            if need[Pi].sum() <= cap_r and res is not c:
                continue  # never binding on this node (CPU stays: its rows tie requests to awake nodes)
            held = _spans(J)
            first = J
            for p in Pi:
                if need[p] == 0:
                    continue
                j0 = int(jchk[jp[p]])
                first = min(first, j0)
                for k, col in ymodes(p, i):
                    held.add(col, need[p], j0, int(np.searchsorted(chk, modes[p][k][0] + d[p] - TOL)))
            for j in range(first, J):
                if not (j in pods_at and any(allowed[p, i] and need[p] for p in pods_at[j])):
                    continue  # requests only grow at arrivals: checking just after them is enough
                cols, vals = held.at(j)
                ac, av, const = awake_after(j) if sleep else ([], [], n)
                M.row(cols + ac, vals + [-cap_r * v for v in av], -math.inf, cap_r * const)
        if int(inst.gpu[node]) > 0:
            _gpu_rows(M, inst, node, [p for p in Pi if inst.g[p] > 0], ymodes, modes, chk, jchk, jp, pods_at, d)
        # Dynamic power on the event grid: the demand U(g) of the pods running in each interval.
        running = _spans(G)
        maxu = np.zeros(G + 1)
        for p in Pi:
            for k, col in ymodes(p, i):
                st_ = modes[p][k][0]
                gs, ge = int(_index(tg, st_)), int(_index(tg, st_ + d[p]))
                running.add(col, u[p], gs, ge, p)
                maxu[gs:ge] += u[p]
        curve = inst.curves[node]
        w = cap[i] / 10.0
        slopes = np.diff(curve) / w  # watts per millicore on each tenth
        concave = [b for b in range(1, 10) if slopes[b] < slopes[b - 1] - 1e-12]
        dyn_pieces = _env_pieces(np.linspace(0.0, cap[i], 11), curve - curve[0])
        awake_in: dict[int, list[tuple[int, float]]] = {}  # check interval -> (v, seconds) of its dyn intervals
        for g in range(G):
            dt = tg[g + 1] - tg[g]
            # Only the tenths the demand can reach here get a column: the pods that may run bound it.
            lim = min(cap[i], maxu[g])
            nseg = int(min(10, math.ceil(lim / w - 1e-9))) if lim > 1e-9 else 0
            cols = [M.var(0.0, w, slopes[s] * dt) for s in range(nseg)]
            rc, rv = running.at(g)
            if rc or cols:
                M.row(cols + rc, [1.0] * len(cols) + [-x for x in rv], 0.0, 0.0)
            if not cols:
                continue
            j = int(jof[g])
            ac, av, const = awake_after(j) if sleep else ([], [], n)
            if sleep and ac:
                # v: nodes awake through this interval (every node with demand here is). Bounded by the nodes
                # awake after the last arrival and, summed over the check interval, by its awake time; the
                # demand and the envelope cut below read v, which ties the idle premium to the demand.
                v = M.var(0.0, n)
                M.row([v] + ac, [1.0] + [-x for x in av], -math.inf, const)
                awake_in.setdefault(j, []).append((v, dt))
                for pc in running.by_key(g):  # a node with a pod running is awake through the interval
                    M.row(pc + [v], [1.0] * len(pc) + [-1.0], -math.inf, 0.0)
                ac, av, const = [v], [1.0], 0.0
            # Segment order where the curve bends down: a later tenth only once the earlier ones are full.
            zs = []
            for b in concave:
                if b >= len(cols):
                    break
                z = M.var(0.0, 1.0, 0.0, True)
                M.row(cols[:b] + [z], [1.0] * b + [-w * b], 0.0, math.inf)
                nb = next((bb for bb in concave if bb > b), 10)
                for s in range(b, min(nb, len(cols))):
                    M.row([cols[s], z], [1.0, -w], -math.inf, 0.0)
                if zs:
                    M.row([z, zs[-1]], [1.0, -1.0], -math.inf, 0.0)
                zs.append(z)
            if sleep and ac:
                M.row(cols + ac, [1.0] * len(cols) + [-cap[i] * v for v in av], -math.inf, cap[i] * const)
            # The convex envelope, a valid cut that tightens the relaxation.
            for alpha, beta in dyn_pieces:
                rcols = cols + ac
                rvals = [slopes[s] - beta for s in range(len(cols))] + [-alpha * v for v in av]
                M.row(rcols, rvals, alpha * const, math.inf)
        for j, vs in awake_in.items():
            at = at_cols.get((i, j))
            if at is not None:
                M.row([at] + [v for v, _ in vs], [1.0] + [-dt for _, dt in vs], 0.0, math.inf)
    # Interchangeable nodes are used in order (relabelling any schedule makes it so): x[p, i'] <= sum_{q<p} x[q, i].
    for i in range(U - 1):
        i2 = i + 1
        if inst.kinds[rep[i]] != inst.kinds[rep[i2]]:
            continue
        fprev = None
        for p in range(P):
            if (p, i2, 0) in y and fprev is None:
                for _, col in ymodes(p, i2):
                    M.ub[col] = 0.0
            elif (p, i2, 0) in y:
                cols2 = [col for _, col in ymodes(p, i2)]
                M.row(cols2 + [fprev], [1.0] * len(cols2) + [-1.0], -math.inf, 0.0)
            if (p, i, 0) in y:
                f = M.var(0.0, float(P))  # pods bound so far: at most P (a finite bound, which CP-SAT needs)
                cols1 = [col for _, col in ymodes(p, i)]
                rc = [f] + cols1 + ([fprev] if fprev is not None else [])
                rv = [1.0] + [-1.0] * len(cols1) + ([-1.0] if fprev is not None else [])
                M.row(rc, rv, 0.0, 0.0)
                fprev = f
    if sleep and wake_order:
        _wake_order_rows(M, inst, rep, aw_cols, wk_cols)
    return _Built(M, y, modes, inst, units, wake_order)


def _wake_order_rows(M: _Model, inst: Instance, rep: list[int], aw_cols: dict, wk_cols: dict) -> None:
    """Orbit rule for identical nodes (docs/optimum.md, "Symmetry"): two identical nodes both asleep are in the
    same state, so any schedule can swap their futures from then on; sorting them at every arrival by their next
    use (and at time 0 by their first use, the first-use rows above) gives a schedule of the same energy in which
    a node of a kind is woken only if the one before it in the kind is awake or woken at the same instant:
    ``wk[i+1, j] <= aw[i, j] + wk[i, j]``."""
    for i in range(len(rep) - 1):
        i2 = i + 1
        if inst.kinds[rep[i]] != inst.kinds[rep[i2]]:
            continue
        for (u, j), w2 in wk_cols.items():
            if u != i2:
                continue
            a1 = aw_cols.get((i, j))
            if a1 is None:
                continue  # node i is awake for sure before j: nothing to order
            w1 = wk_cols.get((i, j))
            M.row([w2, a1] + ([w1] if w1 is not None else []), [1.0, -1.0] + ([-1.0] if w1 is not None else []),
                  -math.inf, 0.0)


def _gpu_rows(M: _Model, inst: Instance, node: int, gP: list[int], ymodes, modes, chk, jchk, jp, pods_at,
              d) -> None:
    """The GPU filter's capacity on ``node`` (docs/optimum.md, "GPUs"), checked just after each arrival batch
    (holdings only grow at arrivals; a pod holds its GPUs from its bind to its end).

    With one GPU, or only whole-GPU pods able to land here, the aggregate is exact: the milli-GPUs held (a whole
    GPU counts 1000) at most 1000 x the count. With shares on a node of several GPUs, each share is given one
    GPU (``z[p, g]``, summing to the pod's ``y``): the shares on a GPU fit it, and the GPUs holding a share plus
    the whole GPUs held fit the count. Every schedule the twin's filter admits satisfies these (its best-fit
    assignment is one such ``z``); whether the twin's own best fit follows the MIP's node choice is what the
    replay checks, and a schedule it does not follow is never called optimal."""
    kg = int(inst.gpu[node])
    if not gP:
        return
    gneed = inst.g * inst.gm / 1000.0  # GPUs' worth of share per pod
    shared = [p for p in gP if inst.gm[p] < 1000]
    J = len(chk)
    ends = {(p, k): int(np.searchsorted(chk, modes[p][k][0] + d[p] - TOL)) for p in gP for k, _ in ymodes(p, node)}
    checks = [j for j in sorted(pods_at) if any(inst.g[p] > 0 and p in gP for p in pods_at[j])]

    def held(pods, j):
        return [(p, k, col) for p in pods if int(jchk[jp[p]]) <= j for k, col in ymodes(p, node) if j < ends[(p, k)]]

    if kg == 1 or not shared:
        if gneed[gP].sum() <= kg + 1e-9:
            return  # never binding
        for j in checks:
            h = held(gP, j)
            if h:
                M.row([col for _, _, col in h], [float(gneed[p]) for p, _, _ in h], -math.inf, float(kg))
        return
    whole = [p for p in gP if inst.gm[p] >= 1000]
    z: dict[tuple[int, int, int], int] = {}
    first = min(shared)  # the node's GPUs are interchangeable: the first share that may land here takes GPU 0
    for p in shared:
        for k, col in ymodes(p, node):
            zs = [M.var(0.0, 1.0 if (p != first or g == 0) else 0.0, 0.0, True) for g in range(kg)]
            for g, zc in enumerate(zs):
                z[(p, k, g)] = zc
            M.row(zs + [col], [1.0] * kg + [-1.0], 0.0, 0.0)
    for j in checks:
        hw = held(whole, j)
        hs = held(shared, j)
        ecols = []
        for g in range(kg):
            cols = [z[(p, k, g)] for p, k, _ in hs]
            vals = [float(gneed[p]) for p, _, _ in hs]
            if not cols:
                continue
            M.row(cols, vals, -math.inf, 1.0)
            if hw:  # a GPU holding a share is not free for a whole-GPU pod
                e = M.var(0.0, 1.0)
                for zc in cols:
                    M.row([zc, e], [1.0, -1.0], -math.inf, 0.0)
                ecols.append(e)
        if hw:
            M.row([col for _, _, col in hw] + ecols, [float(inst.g[p]) for p, _, _ in hw] + [1.0] * len(ecols),
                  -math.inf, float(kg))


class _Infeasible(Exception):
    pass


@dataclass(frozen=True)
class Schedule:
    """One schedule of the model's class: a node and a start time per modelled pod (workload indices)."""

    source: str
    assignment: dict[int, int]
    starts: dict[int, float]
    twin_joules: float | None = None  # the twin's energy for it, when it came from a twin run


def twin_schedule(inst: Instance, policy) -> Schedule | None:
    """Run ``policy`` (a spec, or a policy object) in the twin on the instance, attached to it as
    :func:`~joulesched.agent.runner.run_policy` does; its schedule if the run is in the model's class (every pod
    bound on arrival, no node overloaded), else None."""
    from joulesched.agent.registry import make_policy

    sc = inst.scenario
    if sc is None:
        raise ValueError("the instance has no scenario to run")
    wl = build_workload(sc, inst.seed) if inst.workload is None else inst.workload
    twin = Twin(sc, wl)
    pol = make_policy(policy) if isinstance(policy, str) else policy
    rng = np.random.default_rng(inst.seed)
    if (attach := getattr(pol, "attach", None)) is not None:
        attach(twin)
    try:
        twin.begin()
        state = None
        while (dcs := twin.next_decision()) is not None:
            if dcs.state is not state:
                state = dcs.state
                pol.reset(state, rng)
            if abs(twin.now - float(wl.submit_s[int(dcs.key)])) > TOL:
                return None  # a pod was queued
            twin.bind(dcs, decide(pol, state, dcs.pod, dcs.mask, dcs.meta))
    finally:
        if (detach := getattr(pol, "detach", None)) is not None:
            detach(twin)
    res = twin.result()
    if res.mean_throttling > 0 or res.unschedulable_pods != inst.never_placed:
        return None
    pods = inst.pod.tolist()
    return Schedule(policy if isinstance(policy, str) else pol.name, {p: int(twin.pod_node[p]) for p in pods},
                    {p: float(twin.pod_start[p]) for p in pods}, res.energy_joules)


def _fix(b: _Built, sched: Schedule) -> tuple[list[int], list[float]] | None:
    """The y columns of ``sched`` (1 for its (node, mode), 0 for the others), or None if the model has no such
    column (a start the model does not know, or a node it forbids)."""
    inst = b.inst
    unit_of = {node: i for i, un in enumerate(b.units) for node in un}
    relabel = _first_use(inst, [sched.assignment[pod] for pod in inst.pod.tolist()])
    lab = [relabel[sched.assignment[pod]] for pod in inst.pod.tolist()]
    if inst.can_sleep and b.wake_order:
        _wake_relabel(inst, lab, [sched.starts[pod] for pod in inst.pod.tolist()])
    starts = [sched.starts[pod] for pod in inst.pod.tolist()]
    ones = set()
    for p, pod in enumerate(inst.pod.tolist()):
        i, st = unit_of[lab[p]], starts[p]
        ks = [k for k, (s0, _) in enumerate(b.modes[p]) if abs(s0 - st) <= 1e-6 * max(1.0, abs(st))]
        ks = [k for k in ks if (p, i, k) in b.y]
        if not ks:
            return None
        if len(ks) > 1:
            # With wake_s = 0, "on" and "woken at a_p" both start on arrival: the twin's state decides, the node
            # asleep just before the arrivals at a_p (the "on" mode is infeasible then, the warm start lost).
            woken = _asleep_before(inst, lab, starts, p)
            ks = [k for k in ks if (b.modes[p][k][1] >= 0) == woken] or ks
        ones.update((p, i, k) for k in ks[:1])
    cols = list(b.y.values())
    vals = [1.0 if key in ones else 0.0 for key in b.y]
    return cols, vals


def _asleep_before(inst: Instance, lab: list[int], starts: list[float], p: int) -> bool:
    """Whether pod ``p``'s node (``lab``: node per modelled pod) is asleep just before the arrivals at ``a_p`` in
    the schedule ``starts``: the model's ``aw`` = 0, the node awake on ``[0, sleep_after_s)`` and on every
    ``[bind, end + sleep_after_s)`` of its pods, a departure or sleep at t before an arrival at t."""
    a, d, Z, t = inst.a, inst.d, inst.sleep_after, float(inst.a[p])
    if not inst.can_sleep or t < Z - TOL or (inst.never_sleep is not None and inst.never_sleep[lab[p]]):
        return False
    return not any(lab[q] == lab[p] and a[q] < t - TOL and t < starts[q] + d[q] + Z - TOL for q in range(len(lab)))


def _first_use(inst: Instance, nodes: list[int]) -> dict[int, int]:
    """Interchangeable nodes relabelled in order of first use by ``nodes`` (the node of each modelled pod, in
    the model's pod order, or of a prefix of them), as the model's order rows want: node -> its label, a
    permutation within each kind. The twin cannot tell the difference."""
    first: dict[int, list[int]] = {}
    for node in nodes:
        seen = first.setdefault(int(inst.kinds[node]), [])
        if node not in seen:
            seen.append(node)
    relabel = {i: i for i in range(inst.nodes)}
    for kind, used in first.items():
        same = [i for i in range(inst.nodes) if inst.kinds[i] == kind]
        relabel.update(zip(used + [i for i in same if i not in used], same))
    return relabel


def solve_rest(inst: Instance, past: dict[int, tuple[int, float | None]], hint: Schedule, *,
               time_limit: float = 5.0) -> dict[int, int] | None:
    """The best schedule found in ``time_limit`` seconds with the pods of ``past`` held where a run put them
    (workload pod index -> (node, start; None while the pod waits for its node to wake)), starting from
    ``hint`` (a whole schedule that keeps that past: the run continued by some rule): every modelled pod's node
    (workload index -> node), or None when the model cannot state the hint or the past (a queued pod, a start
    the model has no mode for).

    DAgger's relabelling with the optimum as the expert (agent/optimum_teacher.py): the optimum's answer from a
    state a learner reached. On the sleeping instances HiGHS does not finish its root LP in seconds, so the time
    goes to the large-neighbourhood search over the pods still to come, from the hint. Identical nodes are
    relabelled by first use so the model's order rows hold (and mapped back after); the orbit rule among
    sleeping nodes is left out, since a run's past need not follow it."""
    time_limit = check_time_limit(time_limit)
    deadline = time.perf_counter() + time_limit
    for pod, (node, _) in past.items():
        if hint.assignment.get(pod) != node:
            raise ValueError(f"the hint moves pod {pod} of the past from node {node}")
    try:
        b = _build(inst, wake_order=False)
    except _Infeasible:
        return None
    fixed = _fix(b, hint)
    if fixed is None:
        return None
    order = [int(pod) for pod in inst.pod.tolist()]
    relabel = _first_use(inst, [hint.assignment[pod] for pod in order])
    back = {v: k for k, v in relabel.items()}
    held: dict[int, tuple[int, float | None]] = {}
    for p, pod in enumerate(order):
        if pod in past:
            node, start = past[pod]
            held[p] = (relabel[node], start)
    for (p, i, k), col in b.y.items():
        h = held.get(p)
        if h is not None and not (i == h[0] and (h[1] is None or abs(b.modes[p][k][0] - h[1])
                                                 <= 1e-6 * max(1.0, abs(h[1])))):
            b.model.ub[col] = 0.0
    priced = _price(b, *fixed, time_limit=max(1.0, 0.2 * time_limit))
    if priced is None:
        return None
    energy, x = priced
    x, energy = _neighbourhoods(b, x, energy, deadline, None, first=max(held, default=-1) + 1)
    return {order[p]: back[b.units[i][0]] for (p, i, k), col in b.y.items() if x[col] > 0.5}


def _wake_relabel(inst: Instance, lab: list[int], starts: list[float]) -> None:
    """Relabel identical nodes (``lab``: node per modelled pod, in place) as :func:`_wake_order_rows` wants: at
    every arrival from ``sleep_after_s`` on, the futures of a kind's sleeping nodes go to them in order of next
    use (its earliest pod, then the lowest pod index). The twin cannot tell the difference."""
    a, d, Z = inst.a, inst.d, inst.sleep_after
    never = inst.never_sleep if inst.never_sleep is not None else np.zeros(inst.nodes, dtype=bool)
    kinds: dict[int, list[int]] = {}
    for i, k in enumerate(inst.kinds.tolist()):
        if not never[i]:
            kinds.setdefault(k, []).append(i)
    kinds = {k: v for k, v in kinds.items() if len(v) > 1}
    if not kinds:
        return
    P = len(lab)
    for t in _unique_times(a).tolist():
        if t < Z - TOL:
            continue
        for same in kinds.values():
            covered = {lab[q] for q in range(P) if a[q] < t - TOL and t < starts[q] + d[q] + Z - TOL}
            asleep = [L for L in same if L not in covered]
            if len(asleep) < 2:
                continue
            fut: dict[int, list[int]] = {L: [] for L in asleep}
            for q in range(P):
                if lab[q] in fut and a[q] >= t - TOL:
                    fut[lab[q]].append(q)
            order = sorted(asleep, key=lambda L: min(((a[q], q) for q in fut[L]), default=(math.inf, P)))
            for new, old in zip(asleep, order):
                for q in fut[old]:
                    lab[q] = new


def evaluate(inst: Instance, sched: Schedule, *, time_limit: float = 60.0) -> float | None:
    """The model's energy for a given schedule (its pod-to-node-and-start columns fixed), or None when the model
    cannot state it. Equal to the twin's energy for that schedule when the model is right."""
    b = _build(inst)
    fixed = _fix(b, sched)
    if fixed is None:
        return None
    for col, v in zip(*fixed):
        if v == 0.0:
            b.model.ub[col] = 0.0
    h = b.model.highs(integral=True, time_limit=time_limit, threads=None, gap=1e-9)
    h.run()
    import highspy

    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value)


#: Policies whose twin runs seed the MIP with a first schedule (the best one in the model's class is used), on
#: top of every heuristic of the registry.
WARM_START = ("default-k8s", "awake-first:fit=efficient", "awake-first:headroom=0.8")
#: The bases of the clairvoyant rollout that seeds the MIP too (agent/planner.py, a parallel rollout on the true
#: future): each was the best heuristic of some case of the small suite. Its schedules are 0-6 % below the best
#: heuristic's there, which the MIP had not reached in 20 s (docs/optimum.md, "The rollout's warm start").
WARM_ROLLOUT_BASES = ("awake-first:fit=efficient", "energy-greedy", "lifetime-aware", "gpu-dot-product", "pabfd",
                      "most-allocated")
#: The share of the time limit the rollout may plan for (then it follows its best base to the end).
WARM_ROLLOUT_SHARE = 0.25


def warm_specs(rollout_budget_s: float = 0.0) -> tuple[str, ...]:
    """The warm-start policies: :data:`WARM_START` and every heuristic, and, given a budget in seconds, the
    clairvoyant rollout over :data:`WARM_ROLLOUT_BASES` planning for at most that long."""
    from joulesched.agent.registry import HEURISTICS

    rollout = (f"rollout-oracle:base={'|'.join(WARM_ROLLOUT_BASES)},budget_s={rollout_budget_s:g}",)
    return tuple(dict.fromkeys((*WARM_START, *HEURISTICS, *(rollout if rollout_budget_s > 0 else ()))))


#: The MIP's solvers: HiGHS, CP-SAT (OR-Tools) on an integer relaxation with a valid bound, or both at once.
SOLVERS = ("highs", "cpsat", "race")
#: The one that measured better on the small suite (docs/optimum.md, "Solving").
DEFAULT_SOLVER = "highs"


def check_solver(solver: str, option: str = "--solver") -> str:
    """One of :data:`SOLVERS`, or :class:`OptimumError` naming ``option``."""
    if solver not in SOLVERS:
        raise OptimumError(f"{option} {solver!r} is not a solver; use one of {', '.join(SOLVERS)}")
    return solver


@dataclass
class _Run:
    """What one solver reached: its best point of the model (priced in the exact model), its valid bound."""

    solver: str
    x: np.ndarray | None = None
    energy: float | None = None
    bound: float | None = None
    optimal: bool = False  # the solver proved its point optimal (HiGHS only: CP-SAT's is on its relaxation)
    infeasible: bool = False
    nodes: int | None = None
    info: dict = field(default_factory=dict)


def solve(inst: Instance, *, time_limit: float = 60.0, threads: int | None = None, gap: float = 1e-6,
          warm: tuple[str, ...] | None = None, lp: LPBound | None = None, lns_share: float = 0.4,
          wake_order: bool = True, solver: str = DEFAULT_SOLVER, with_bounds: bool = True) -> OptimumResult:
    """Solve the MIP for ``inst`` within ``time_limit`` seconds (model building included).

    The solver starts from the best schedule among the ``warm`` policies' twin runs that the model can state
    (by default :func:`warm_specs` with a quarter of the time limit for the clairvoyant rollout), and its bound
    is the best of its own, the LP bound and the fluid bound. ``solver``: ``highs`` (when the MIP is not solved in ``1 - lns_share`` of the time, the rest improves its best schedule by re-solving it with
    the pods of one window of arrivals free and the others fixed, a large-neighbourhood search), ``cpsat``
    (CP-SAT on an integer relaxation of the same model, :meth:`_Model.cpsat`; its schedule is priced in the
    exact model) or ``race`` (both at once, each with half the threads; the better schedule and the better
    bound kept). ``status`` is ``optimal`` when the gap is closed to ``gap`` (relative), ``time_limit`` when the
    time ran out first. ``wake_order``: the orbit rule among identical sleeping nodes (:func:`_wake_order_rows`;
    off only to measure or test it). ``with_bounds=False`` skips the LP and root bounds, which take up to half
    the time and say nothing about the schedule (the training labels of agent/optimum_teacher.py want the
    schedule alone); the bound is then the solver's own."""
    time_limit = check_time_limit(time_limit)
    solver = check_solver(solver)
    t0 = time.perf_counter()
    base = dict(name=inst.name, seed=inst.seed, nodes=inst.nodes, pods=inst.pods, overload_free=inst.overload_free)
    try:
        b = _build(inst, wake_order=wake_order)
    except _Infeasible as e:
        return OptimumResult(**base, status="infeasible", energy_joules=None, bound_joules=None, gap=None,
                             wall_s=time.perf_counter() - t0, variables=0, binaries=0, rows=0, message=str(e),
                             solver=solver)
    M = b.model
    sizes = dict(variables=M.ncols, binaries=int(sum(M.integer)), rows=M.nrows)
    if not with_bounds:
        lp = LPBound(math.nan, math.nan, 0.0, 0, 0, "skipped")
    lp = lp or lp_bound(inst, time_limit=max(1.0, time_limit / 4))
    # The MIP's own LP relaxation by the interior point: 5x faster than the dual simplex HiGHS's branch-and-bound
    # starts with (2.8 s against 15 s on small-sleep-homogeneous), which on the sleeping instances does not even
    # finish its root in a minute. Its value is a valid bound; 1e-6 relative covers the IPM's tolerance. Where
    # nodes never sleep the root LP takes 0.3-4 s and HiGHS's own bound is above it: not worth the time there.
    root = _relaxation(M, max(1.0, time_limit / 4)) if inst.can_sleep and with_bounds else math.nan
    warm = warm_specs(WARM_ROLLOUT_SHARE * time_limit) if warm is None else warm
    scheds = [s for s in (twin_schedule(inst, w) for w in warm) if s is not None] if inst.scenario else []
    scheds.sort(key=lambda s: s.twin_joules)
    warm_j, fixed = None, None
    for sc_ in scheds:
        fixed = _fix(b, sc_)
        if fixed is not None:
            warm_j = sc_.twin_joules
            break
    deadline = t0 + time_limit
    if solver == "race":
        from concurrent.futures import ThreadPoolExecutor

        half = max(1, (threads or os.cpu_count() or 2) // 2)
        import threading

        sizing = threading.Barrier(2)

        def sized(fn, *args):
            # HiGHS's scheduler is per thread: each worker sizes its own, and neither solves before both have
            # (resetting a scheduler while another thread is inside HiGHS is not safe).
            try:
                _highs_threads(half)
            finally:
                sizing.wait()
            return fn(*args)

        with ThreadPoolExecutor(2) as pool:  # HiGHS releases the GIL while it solves, CP-SAT runs in a child
            fh = pool.submit(sized, _run_highs, _own_model(b), fixed, deadline, gap, lns_share)
            fc = pool.submit(sized, _run_cpsat, _own_model(b), fixed, deadline, half, gap)
            runs = [fh.result(), fc.result()]
    elif solver == "cpsat":
        runs = [_run_cpsat(b, fixed, deadline, threads or os.cpu_count() or 1, gap)]
    else:
        _highs_threads(threads)
        runs = [_run_highs(b, fixed, deadline, gap, lns_share)]
    rh = next((r for r in runs if r.solver == "highs"), None)
    rc = next((r for r in runs if r.solver == "cpsat"), None)
    sizes.update(mip_nodes=(rh or rc).nodes, mip_dual_bound=rh.bound if rh else None, warm_joules=warm_j,
                 root_bound=root if math.isfinite(root) else None, cpsat_bound=rc.bound if rc else None,
                 cpsat=rc.info if rc else None)
    if any(r.infeasible for r in runs):
        return OptimumResult(**base, status="infeasible", energy_joules=None, bound_joules=None, gap=None,
                             wall_s=time.perf_counter() - t0, **sizes, solver=solver,
                             message="no schedule binds every pod on arrival without overloading a node")
    # The best bound and who proved it: the LP, fluid and root bounds are HiGHS's (or closed form).
    bounds = [(x, "highs") for x in (lp.joules, lp.fluid_joules, root) if math.isfinite(x)]
    bounds += [(r.bound, r.solver) for r in runs if r.bound is not None and math.isfinite(r.bound)]
    bound, bound_by = max(bounds) if bounds else (None, None)
    best = min((r for r in runs if r.energy is not None), key=lambda r: r.energy, default=None)
    if best is None:
        return OptimumResult(**base, status="no_solution", energy_joules=None, bound_joules=bound, gap=None,
                             wall_s=time.perf_counter() - t0, **sizes, solver=bound_by or solver,
                             bound_solver=bound_by, message="no schedule found in the time limit")
    x, energy = best.x, best.energy
    assignment, starts = {}, {}
    for (p, i, k), col in b.y.items():
        if x[col] > 0.5:
            assignment[int(inst.pod[p])] = b.units[i][0]
            starts[int(inst.pod[p])] = b.modes[p][k][0]
    optimal = best.optimal
    if bound is not None and bound > energy * (1 + BOUND_TOL) + 1e-9:
        # No bound of every run (nor of the MIP's class) can exceed a schedule of the class: a bound or the model
        # is wrong. Neither is evidence then, and the schedule is not called optimal.
        return OptimumResult(**base, status="bound_conflict", energy_joules=energy, bound_joules=None, gap=None,
                             wall_s=time.perf_counter() - t0, **sizes, assignment=assignment, starts=starts,
                             solver=best.solver, schedule_solver=best.solver, bound_solver=bound_by,
                             message=f"the {bound_by} bound {bound:.9g} J is above the schedule's {energy:.9g} J: "
                                     "a bound or the model is wrong; no gap is reported")
    if bound is None and optimal or bound is not None and bound > energy:
        bound = energy  # the solver proved this schedule optimal, or a bound meets it within the tolerances
        bound_by = best.solver if bound_by is None else bound_by
    # Without any bound (with_bounds=False and no dual bound from the solver) nothing is proven: no gap.
    g = None if bound is None else (energy - bound) / energy if energy > 0 else 0.0
    return OptimumResult(**base, status="optimal" if optimal or (g is not None and g <= gap) else "time_limit",
                         energy_joules=energy,
                         bound_joules=bound, gap=g, wall_s=time.perf_counter() - t0, **sizes,
                         assignment=assignment, starts=starts,
                         solver=best.solver if bound_by == best.solver else f"{best.solver} (bound: {bound_by})",
                         schedule_solver=best.solver, bound_solver=bound_by)


def _highs_threads(threads: int | None) -> None:
    """Size the calling thread's HiGHS scheduler. HiGHS runs every solve of a thread on one scheduler, sized by
    its first solve (by default half the cores), and a later solve there that asks for another number of threads
    fails; so it is resized here, while the thread runs no HiGHS solve, and the solves leave ``threads`` unset."""
    if not threads:
        return
    import highspy

    highspy.Highs.resetGlobalScheduler(True)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    h.addVar(0.0, 1.0)  # a one-variable LP: its solve creates the scheduler with this size
    h.changeColCost(0, 1.0)
    h.run()


def _own_model(b: _Built) -> _Built:
    """``b`` with a model of its own bounds lists: the neighbourhood search and the pricing swap them, and in a
    race the two solvers must not see each other's."""
    import copy

    M = copy.copy(b.model)
    M.lb, M.ub = list(M.lb), list(M.ub)
    return dataclasses.replace(b, model=M)


def _run_highs(b: _Built, fixed, deadline: float, gap: float, lns_share: float) -> _Run:
    """HiGHS on the whole MIP for ``1 - lns_share`` of the time left, from the warm start ``fixed``; then, unless
    it proved optimality, the neighbourhood search until ``deadline``. Its threads: :func:`_highs_threads`."""
    threads = None
    import highspy

    M = b.model
    left = deadline - time.perf_counter()
    h = M.highs(integral=True, time_limit=max(1.0, left * (1.0 - lns_share)), threads=threads, gap=gap)
    if fixed is not None:
        h.setSolution(len(fixed[0]), np.asarray(fixed[0], dtype=np.int32), np.asarray(fixed[1]))
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    run = _Run("highs", nodes=int(info.mip_node_count),
               bound=float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else None)
    if status == highspy.HighsModelStatus.kInfeasible:
        run.infeasible = True
        return run
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        return run
    run.x, run.energy = np.asarray(h.getSolution().col_value), float(info.objective_function_value)
    run.optimal = status == highspy.HighsModelStatus.kOptimal
    if not run.optimal:
        run.x, run.energy = _neighbourhoods(b, run.x, run.energy, deadline, threads)
    return run


def _price(b: _Built, cols, vals, time_limit: float = 60.0) -> tuple[float, np.ndarray] | None:
    """The exact model's energy and point with the binaries ``cols`` fixed to ``vals`` (HiGHS), or None when the
    model admits no such point. This is how a CP-SAT schedule is priced: never by CP-SAT's own objective."""
    import copy

    import highspy

    M = copy.copy(b.model)
    M.lb, M.ub = list(M.lb), list(M.ub)
    for col, v in zip(cols, vals):
        M.lb[col] = M.ub[col] = float(v)
    h = M.highs(integral=True, time_limit=max(1.0, time_limit), threads=None, gap=1e-9)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value), np.asarray(h.getSolution().col_value)


def _run_cpsat(b: _Built, fixed, deadline: float, threads: int, gap: float) -> _Run:
    """CP-SAT on the whole model until ``deadline`` (less a margin to price its schedule), hinted with the warm
    start ``fixed`` completed by the exact model; its schedule's binaries priced in the exact model."""
    run = _Run("cpsat")
    ycols = list(b.y.values())
    hint = None
    if fixed is not None:
        # Pricing fixes the pods' binaries only (the rest are solved for): it gets a tenth of the time at most.
        priced = _price(b, *fixed, time_limit=0.1 * (deadline - time.perf_counter()))
        if priced is not None:
            run.energy, hint = priced
            run.x = hint
    left = deadline - time.perf_counter()
    try:
        cs = b.model.cpsat(time_limit=max(1.0, left - min(5.0, 0.1 * left)), threads=threads, gap=gap, hint=hint)
    except ValueError as e:  # the model has an unbounded variable: CP-SAT cannot state it
        run.info = {"status": "not_run", "message": str(e)}
        return run
    run.bound, run.nodes = cs.bound, cs.branches
    run.info = {"status": cs.status, "eps_joules": cs.eps, "wall_s": cs.wall_s, "branches": cs.branches}
    if cs.status == "infeasible":
        run.infeasible = True
    elif cs.x is not None:
        priced = _price(b, ycols, [float(round(cs.x[c])) for c in ycols], time_limit=deadline - time.perf_counter())
        run.info["priced"] = priced is not None
        if priced is not None and (run.energy is None or priced[0] < run.energy):
            run.energy, run.x = priced
    return run


def _ipm_or_simplex(h):
    """Solve an LP by the interior point without crossover; where it stops short of optimal (HiGHS says
    'Unknown' on some tiny degenerate LPs), by the simplex. Returns the model status."""
    import highspy

    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        h.setOptionValue("solver", "simplex")
        h.run()
    return h.getModelStatus()


def _relaxation(M: _Model, time_limit: float) -> float:
    """The model's LP relaxation value (interior point, no crossover) less 1e-6 relative, or NaN."""
    import highspy

    h = M.highs(integral=False, time_limit=time_limit, threads=None, gap=1e-6)
    if _ipm_or_simplex(h) != highspy.HighsModelStatus.kOptimal:
        return math.nan
    v = float(h.getInfo().objective_function_value)
    return v - 1e-6 * abs(v)


def _neighbourhoods(b: _Built, x: np.ndarray, energy: float, deadline: float,
                    threads: int | None, first: int = 0) -> tuple[np.ndarray, float]:
    """Large-neighbourhood search: free the pods arriving in one window (a third of them, windows sliding by a
    sixth), fix the others to the incumbent's node and mode, re-solve, keep improvements, until ``deadline``.
    ``first``: the windows cover pods ``first..`` only (the ones before are held by their bounds)."""
    M = b.model
    P = b.inst.pods
    by_pod: dict[int, list[int]] = {}
    for (p, _, _), col in b.y.items():
        by_pod.setdefault(p, []).append(col)
    size = max(6, (P - first) // 3)
    step = max(1, size // 2)
    lb0, ub0 = list(M.lb), list(M.ub)
    start, stale = first, 0
    margin = min(2.0, 0.2 * max(deadline - time.perf_counter(), 0.0))
    try:
        while first < P and deadline - time.perf_counter() > margin and stale < max(1, -(-(P - first) // step)) * 2:
            free = set(range(start, min(P, start + size)))
            start = start + step if start + size < P else first
            lb, ub = list(lb0), list(ub0)
            for p, cols in by_pod.items():
                if p in free:
                    continue
                for col in cols:
                    if x[col] > 0.5:
                        lb[col] = 1.0
                    else:
                        ub[col] = 0.0
            M.lb, M.ub = lb, ub
            h = M.highs(integral=True, time_limit=min(10.0, deadline - time.perf_counter() - margin / 2),
                        threads=threads, gap=1e-6)
            ones = [c for cols in by_pod.values() for c in cols]
            h.setSolution(len(ones), np.asarray(ones, dtype=np.int32), np.asarray([float(x[c] > 0.5) for c in ones]))
            h.run()
            info = h.getInfo()
            if info.primal_solution_status == 2 and info.objective_function_value < energy * (1 - 1e-9):
                x, energy, stale = np.asarray(h.getSolution().col_value), float(info.objective_function_value), 0
            else:
                stale += 1
    finally:
        M.lb, M.ub = lb0, ub0
    return x, energy


@dataclass(frozen=True)
class LPBound:
    joules: float
    fluid_joules: float
    wall_s: float
    variables: int
    rows: int
    status: str
    coarse: bool = False


def _range_max_rows(M: _Model, x: list[int], ranges: list[tuple[int, int, int]]) -> None:
    """Rows ``col >= max(x[lo..hi])`` for each (col, lo, hi), through a sparse table of maxima (O(log) rows each)."""
    n = len(x)
    if not ranges or n == 0:
        return
    table = [list(x)]
    longest = max(hi - lo + 1 for _, lo, hi in ranges)
    while (1 << len(table)) <= longest:
        prev, half = table[-1], 1 << (len(table) - 1)
        level = []
        for k in range(n):
            v = M.var(0.0, math.inf)
            M.row([v, prev[k]], [1.0, -1.0], 0.0, math.inf)
            if k + half < n:
                M.row([v, prev[k + half]], [1.0, -1.0], 0.0, math.inf)
            level.append(v)
        table.append(level)
    for col, lo, hi in ranges:
        if hi < lo:
            continue
        lev = (hi - lo + 1).bit_length() - 1
        for k in {lo, hi - (1 << lev) + 1}:
            M.row([col, table[lev][k]], [1.0, -1.0], 0.0, math.inf)


def lp_bound(inst: Instance, *, time_limit: float = 600.0, classes: int = 3, max_bins: int = 1500,
             fluid_joules: float | None = None, bind_on_arrival: bool = False, min_solve_s: float = 1.0,
             hard_deadline: bool = False) -> LPBound:
    """A time-indexed LP over node kinds that bounds the energy of every run of the twin from below.

    Per interval between arrivals and per kind of node it keeps the served CPU, the nodes serving, holding pods
    and awake; requests (CPU, memory, pod slots) held per core served, which must fit the nodes holding pods; a
    node that holds a pod stays awake ``sleep_after_s`` and a node that serves was awake ``wake_s`` before; each
    node's power is at least its idle (awake) or sleep draw plus the convex envelope of its curve. Work obeys
    the fluid bound's causality, so the LP is never below the fluid bound, and everything it states holds for
    queued and throttled runs too (docs/optimum.md). Returns it with the fluid bound (``fluid_joules``).

    With more than ``max_bins`` distinct arrival times the grid is thinned to about that many points (every
    statement still holds on the coarser grid, but causality is checked at fewer instants, so the LP may then
    fall below the fluid bound: the larger of the two is returned, ``coarse`` says so). ``fluid_joules``: the
    fluid bound of the same pods and cluster when the caller has it (the benchmark's lower bound).

    ``bind_on_arrival``: a bound for the runs that bind every pod when it arrives (the MIP's class; throttled
    runs included, queued ones not). Between two arrivals no pod is bound, so the nodes of a kind holding pods
    only decrease: their mean over the stretch is at least their integer count just before its end, and those
    counts must hold the requests of the pods present then (arrived, not yet at ``a + d``). The counts are
    integers, so the model is a MIP over node kinds; under the time limit its proven dual bound is returned.

    Services (``inst.service``) have no work to serve and a run may leave them waiting, so the LP leaves them
    out (as the fluid bound does); a run that binds on arrival holds each from its arrival to its stop
    (``a + d``, at most the scenario's end), so the bind-on-arrival rows count their requests.

    ``time_limit`` counts model building; the solver gets what is left, at least ``min_solve_s``. A solve the
    limit stops has status ``time_limit``: the LP's value is then NaN (an interrupted interior point proves
    nothing), the bind-on-arrival MIP's its dual bound so far (NaN before its root LP is solved).
    ``hard_deadline``: the bind-on-arrival MIP's LP relaxation first, then the MIP in a child process killed at
    the limit (HiGHS's own limit can be overrun by minutes in its root LP); its best reported bound is kept.
    """
    import highspy

    t0 = time.perf_counter()
    fl = fluid(inst) if fluid_joules is None else fluid_joules
    P = inst.pods
    a, d = inst.a, inst.d
    job = ~inst.service
    u = np.where(job, inst.u / 1000.0, 0.0)  # a service's demand is not work any run must serve
    c, mreq = inst.c / 1000.0, inst.m / 1024.0
    sleep = inst.can_sleep
    Z, W = inst.sleep_after, inst.wake
    by_kind: dict[int, list[int]] = {}
    for i, k in enumerate(inst.kinds.tolist()):
        by_kind.setdefault(k, []).append(i)
    groups = list(by_kind.values())
    H1 = max(inst.horizon, float((a + d)[job].max()) if job.any() else 0.0)
    grid = _unique_times(np.concatenate(([0.0], a[a < H1], [H1])))
    grid = grid[grid <= H1 + TOL]
    coarse = len(grid) > max_bins + 1
    if coarse:
        step = H1 / max_bins
        keep = np.concatenate(([True], np.diff(np.floor(grid / step)) > 0))
        keep[-1] = True
        grid = grid[keep]
    K = len(grid) - 1
    dt = np.diff(grid)
    M = _Model()
    # Classes of pods by requests per core of demand: each holds at least its minimum ratio while served.
    busy = (u > 0) & job
    ratio = np.where(busy, c / np.maximum(u, 1e-12), 0.0)
    qs = np.unique(np.quantile(ratio[busy], np.linspace(0, 1, classes + 1)[1:-1])) if busy.any() else np.zeros(0)
    cls = np.searchsorted(qs, ratio, side="right")
    ncls = int(cls.max()) + 1 if P else 1
    per = []
    for q in range(ncls):
        sel = busy & (cls == q)
        if not sel.any():
            per.append(None)
            continue
        per.append(dict(rho=float((c[sel] / u[sel]).min()), mu=float((mreq[sel] / u[sel]).min()),
                        slot=float((1.0 / u[sel]).min()), sel=sel))
    # Work barriers per class at the grid points: A_q(t) = sum u clip(t - a, 0, d) over the class's pods.
    ycols = [[[None] * K for _ in groups] for _ in range(ncls)]
    held_cols: list[list[int]] = []  # per kind, per interval: the mean count of nodes holding pods
    for gi, nodes in enumerate(groups):
        i0 = nodes[0]
        n = float(len(nodes))
        cap, alloc_c, alloc_m, slots = inst.cap[i0] / 1000.0, inst.cap[i0] / 1000.0, inst.mem[i0] / 1024.0, inst.slots[i0]
        curve = inst.node_curves[i0]  # awake: the GPUs draw their idle watts too
        idle, sw = float(curve[0]), float(inst.sleep_w[i0])
        can = sleep and not (inst.never_sleep is not None and bool(inst.never_sleep[i0]))
        premium = idle - sw if can else 0.0
        M.offset += (sw if can else idle) * n * float(dt.sum())
        pieces = _env_pieces(np.linspace(0.0, cap, 11), curve - curve[0])
        busy_cols, serv_cols = [], []
        held_cols.append(busy_cols)
        av_cols = []
        for k in range(K):
            ys = []
            for q in range(ncls):
                if per[q] is None:
                    continue
                ycols[q][gi][k] = y = M.var(0.0, n * cap)
                ys.append((q, y))
            serv = M.var(0.0, n)
            bz = M.var(0.0, n)
            if can:
                # Every node is awake on [0, sleep_after): the bin's mean awake count is at least that share.
                lo_aw = n * min(1.0, max(0.0, (Z - grid[k]) / dt[k])) if dt[k] > 0 else 0.0
                av = M.var(lo_aw, n, premium * dt[k])
                M.row([bz, av], [1.0, -1.0], -math.inf, 0.0)
            else:
                av = None
            M.row([serv, bz], [1.0, -1.0], -math.inf, 0.0)
            ycs = [y for _, y in ys]
            M.row(ycs + [serv], [1.0] * len(ycs) + [-cap], -math.inf, 0.0)
            for attr, capr in (("rho", alloc_c), ("mu", alloc_m), ("slot", slots)):
                coef = [per[q][attr] for q, _ in ys]
                if any(v > 0 for v in coef):
                    M.row(ycs + [bz], coef + [-capr], -math.inf, 0.0)
            D = M.var(0.0, math.inf, dt[k])
            for alpha, beta in pieces:
                M.row([D] + ycs + [serv], [1.0] + [-beta] * len(ycs) + [-alpha], 0.0, math.inf)
            busy_cols.append(bz)
            serv_cols.append(serv)
            av_cols.append(av)
        if can:
            # Held pods keep a node awake sleep_after_s; a serving node was awake wake_s before.
            starts = grid[:-1]
            ends = grid[1:]
            hold, wake = [], []
            for k in range(K):
                lo = int(np.searchsorted(starts, ends[k] - Z - TOL))
                if lo <= k - 1:
                    hold.append((av_cols[k], lo, k - 1))
                hi = int(np.searchsorted(ends, starts[k] + W + TOL, side="right")) - 1
                if hi >= k + 1:
                    wake.append((av_cols[k], k + 1, hi))
            _range_max_rows(M, busy_cols, hold)
            _range_max_rows(M, serv_cols, wake)
    M.offset += _gpu_dynamic(inst)  # every GPU job's GPUs above idle while it runs: the same in every run
    if bind_on_arrival:
        end = np.where(job, a + d, np.minimum(a + d, inst.horizon))  # the twin stops services at duration_s
        _bind_on_arrival_rows(M, inst, groups, held_cols, grid, c, mreq, end)
    # Causality per class: cumulative served work by each grid point at most what the class could have asked.
    tail_w = []
    for q in range(ncls):
        if per[q] is None:
            continue
        sel = per[q]["sel"]
        aq, dq, uq = a[sel], d[sel], u[sel]
        prev = None
        for k in range(K):
            cum = M.var(0.0, float(np.dot(uq, np.clip(grid[k + 1] - aq, 0.0, dq))) + 1e-9)
            cols = [cum] + [ycols[q][gi][k] for gi in range(len(groups))]
            vals = [1.0] + [-dt[k]] * len(groups)
            if prev is not None:
                cols.append(prev)
                vals.append(-1.0)
            M.row(cols, vals, 0.0, 0.0)
            prev = cum
        wq = M.var(0.0, math.inf)
        tail_w.append(wq)
        total = float(np.dot(uq, dq))
        M.row(([prev] if prev is not None else []) + [wq], [1.0] * (1 if prev is not None else 0) + [1.0], total, total)
    # What is left after H' runs in a tail of free length at the cluster's fluid cost tau * G(w / tau).
    b0, gx, gy = _cluster_g(inst)
    L = M.var(0.0, math.inf)
    Et = M.var(0.0, math.inf, 1.0)
    for k in range(len(gx) - 1):
        beta = (gy[k + 1] - gy[k]) / (gx[k + 1] - gx[k])
        alpha = gy[k] - beta * gx[k]
        M.row([Et, L] + tail_w, [1.0, -alpha] + [-beta] * len(tail_w), 0.0, math.inf)
    M.row([Et, L], [1.0, -b0], 0.0, math.inf)
    left = max(min_solve_s, time_limit - (time.perf_counter() - t0))
    if left <= 0:  # the model took the whole limit: nothing solved, nothing proven beyond the fluid bound
        return LPBound(math.nan, fl, time.perf_counter() - t0, M.ncols, M.nrows, "time_limit", coarse)
    if bind_on_arrival and any(M.integer) and hard_deadline:
        # HiGHS's MIP can spend far past its limit in its root LP (openb-eval: 975 s of 490 s), so the relaxation
        # by the interior point first (a bound for the same runs), then the MIP in a child stopped at the deadline.
        deadline, ts = time.perf_counter() + left, time.perf_counter()
        status, relax = _lp_solve(M, left)
        # A relaxation of a few seconds: the root LP too, so the MIP runs here (a child's start-up costs seconds).
        val, status = _mip_until(M, deadline, relax, status, here=time.perf_counter() - ts < 3.0)
        ok = math.isfinite(val)
    elif bind_on_arrival and any(M.integer):  # (no pod present through any stretch: the plain LP)
        h = M.highs(integral=True, time_limit=left, threads=None, gap=1e-4)
        _stop_at(h, time.perf_counter() + left)
        h.run()
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInterrupt:
            status = highspy.HighsModelStatus.kTimeLimit
        info = h.getInfo()
        # Under the time limit the dual bound is the best proven so far: every branch-and-bound node's LP is.
        ok = math.isfinite(info.mip_dual_bound) and status != highspy.HighsModelStatus.kInfeasible
        val = float(info.mip_dual_bound) if ok else math.nan
    else:
        status, val = _lp_solve(M, left)
        ok = status == highspy.HighsModelStatus.kOptimal
    if coarse and ok:
        val = max(val, fl)
    done = status == highspy.HighsModelStatus.kOptimal
    timed_out = ok or status == highspy.HighsModelStatus.kTimeLimit
    return LPBound(val, fl, time.perf_counter() - t0, M.ncols, M.nrows,
                   "optimal" if done else "time_limit" if timed_out else highspy.Highs().modelStatusToString(status),
                   coarse)


def _lp_solve(M: _Model, left: float):
    """The model's LP (relaxation) by the interior point without crossover, the simplex in what is left where it
    stops short of optimal (as :func:`_ipm_or_simplex`): (status, value; NaN unless optimal)."""
    import highspy

    h = M.highs(integral=False, time_limit=left, threads=None, gap=1e-6)
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    ts = time.perf_counter()
    h.run()
    status = h.getModelStatus()
    rest = left - (time.perf_counter() - ts)
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit):
        if rest > 0:
            h.setOptionValue("solver", "simplex")
            h.setOptionValue("time_limit", rest)
            h.run()
            status = h.getModelStatus()
        else:
            status = highspy.HighsModelStatus.kTimeLimit
    # Without crossover the interior point's objective is the LP's optimum within its tolerance (1e-8 relative),
    # from either side: measured up to 2.6e-9 above the simplex's optimum on the small suite. Taking the tolerance
    # off keeps the value a bound (as _relaxation does with its 1e-6).
    val = float(h.getInfo().objective_function_value) if status == highspy.HighsModelStatus.kOptimal else math.nan
    return status, val - IPM_TOL * abs(val)


def _mip_until(M: _Model, deadline: float, relax: float, relax_status, here: bool = False):
    """Solve the MIP ``M`` in a child process until ``deadline`` at the latest (killed then), keeping the best dual
    bound it reported; ``relax``: its LP relaxation's value (NaN if not solved). ``here``: in this process, with
    HiGHS's time limit and the interrupt callback only. Returns (bound, status)."""
    import multiprocessing as mp
    import pickle

    import highspy

    S = highspy.HighsModelStatus
    best, status = relax, (S.kTimeLimit if relax_status == S.kOptimal else relax_status)
    if here and deadline > time.perf_counter():
        h = M.highs(integral=True, time_limit=deadline - time.perf_counter(), threads=None, gap=1e-4)
        _stop_at(h, deadline)
        h.run()
        status = h.getModelStatus()
        bound = float(h.getInfo().mip_dual_bound) if status != S.kInfeasible else math.nan
        best = max(best, bound) if math.isfinite(best) and math.isfinite(bound) else best if math.isfinite(best) \
            else bound
        return best, (S.kTimeLimit if status == S.kInterrupt else status)
    if deadline - time.perf_counter() < 5.0:  # not worth a child's start-up
        return best, S.kTimeLimit
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_mip_child, args=(send, vars(M), deadline - time.perf_counter()), daemon=True)
    try:
        child.start()
    except (OSError, RuntimeError, pickle.PicklingError):  # no child (no fork/spawn here): the relaxation stands
        send.close()
        recv.close()
        return best, S.kTimeLimit
    send.close()
    try:
        while (wait := deadline - time.perf_counter()) > 0:
            if not recv.poll(min(wait, 1.0)):
                if not child.is_alive():
                    break
                continue
            try:
                kind, bound, code = recv.recv()
            except EOFError:
                break
            if math.isfinite(bound):
                best = bound if not math.isfinite(best) else max(best, bound)
            if kind == "done":
                status = S(code)
                break
    finally:
        child.kill()
        child.join()
        recv.close()
    return best, (S.kTimeLimit if status == S.kInterrupt else status)


def _mip_child(conn, model: dict, time_limit: float) -> None:
    """:func:`_mip_until`'s child: solve, sending ("bound", dual bound, 0) as it goes and ("done", bound, status)."""
    import highspy

    M = _Model()
    M.__dict__.update(model)
    h = M.highs(integral=True, time_limit=time_limit, threads=None, gap=1e-4)
    h.cbMipInterrupt += lambda e: conn.send(("bound", float(e.data_out.mip_dual_bound), 0))
    h.run()
    status = h.getModelStatus()
    ok = status != highspy.HighsModelStatus.kInfeasible
    conn.send(("done", float(h.getInfo().mip_dual_bound) if ok else math.nan, int(status)))


def _stop_at(h, deadline: float) -> None:
    """Interrupt a HiGHS MIP at ``deadline`` (``time.perf_counter``) from its interrupt callback as well: its own
    time limit is checked too rarely in some stages (its root LP)."""
    def check(e) -> None:
        if time.perf_counter() >= deadline:
            e.interrupt()

    h.cbMipInterrupt += check


def _bind_on_arrival_rows(M: _Model, inst: Instance, groups: list[list[int]], held_cols: list[list[int]],
                          grid: np.ndarray, c: np.ndarray, mreq: np.ndarray, end: np.ndarray) -> None:
    """The integer cover rows of ``lp_bound(bind_on_arrival=True)``: per interval, integer nodes of each kind
    holding the pods present just before the interval's first arrival, and the mean holding count above them.
    ``end``: when each pod leaves at the earliest (a job's ``a + d``, a service's stop)."""
    a = inst.a
    arr = _unique_times(a)
    caps = [(inst.cap[g[0]] / 1000.0, inst.mem[g[0]] / 1024.0, float(inst.slots[g[0]])) for g in groups]
    # GPUs: a bound GPU pod holds its share (a whole GPU counts 1) on a node with GPUs, so the held GPU-capable
    # nodes' GPUs cover the shares present (a share never straddles GPUs, so ceil per pod is not needed here).
    gneed = inst.g * inst.gm / 1000.0
    gcaps = [float(inst.gpu[g[0]]) for g in groups]
    use_gpu = bool(gneed.any())
    for k in range(len(grid) - 1):
        t, dt = grid[k], grid[k + 1] - grid[k]
        # Pods present through the whole interval are held at every instant of it, by an integer number of nodes
        # of each kind: the rounded (Chvatal-Gomory) covers sum ceil(alloc_g / q) n_g >= ceil(R / q) hold at every
        # instant, so for the means too. q = each kind's allocatable, and 1 (the plain cover).
        through = (a <= t + TOL) & (end >= grid[k + 1] - TOL)
        if through.any():
            for r, total in enumerate((float(c[through].sum()), float(mreq[through].sum()), float(through.sum()))):
                if total <= 0:
                    continue
                per = [cp[r] for cp in caps]
                for q in sorted({*per}):
                    lhs = [math.ceil(v / q - 1e-9) for v in per]
                    M.row([held_cols[gi][k] for gi in range(len(groups))], lhs, math.ceil(total / q - 1e-9), math.inf)
                M.row([held_cols[gi][k] for gi in range(len(groups))], per, total, math.inf)
            if use_gpu and gneed[through].sum() > 0:
                M.row([held_cols[gi][k] for gi in range(len(groups))], gcaps, float(gneed[through].sum()), math.inf)
        nxt = arr[np.searchsorted(arr, t + TOL, side="left")] if arr.size and arr[-1] > t + TOL else grid[k + 1]
        ts = min(float(nxt), float(grid[k + 1]))  # no pod is bound in (t, ts): the holding set only shrinks
        if ts - t <= TOL or dt <= 0:
            continue
        here = (a <= t + TOL) & (end >= ts - TOL)
        if not here.any():
            continue
        need = ((float(c[here].sum()), [inst.cap[g[0]] / 1000.0 for g in groups]),
                (float(mreq[here].sum()), [inst.mem[g[0]] / 1024.0 for g in groups]),
                (float(here.sum()), [float(inst.slots[g[0]]) for g in groups]),
                (float(gneed[here].sum()) if use_gpu else 0.0, gcaps))
        n = [M.var(0.0, float(len(g)), 0.0, True) for g in groups]
        for total, per in need:
            if total > 0:
                M.row(n, per, total, math.inf)
        for gi in range(len(groups)):
            # mean holding count over the interval >= the count over [t, ts), which is >= n at ts^-
            M.row([held_cols[gi][k], n[gi]], [dt, -(ts - t)], 0.0, math.inf)


def _cluster_g(inst: Instance) -> tuple[float, np.ndarray, np.ndarray]:
    """The fluid bound's G (docs/lower-bound.md) in cores: floor watts, breakpoints, values."""
    from joulesched.agent.lower_bound import cluster_cost

    b, x, g = cluster_cost(_state(inst))
    return b, x / 1000.0, g


def _workload(inst: Instance) -> Workload:
    """The instance's pods as a workload (what the fluid bound reads), GPUs included."""
    gk = {} if not inst.g.any() else dict(gpu=inst.g.astype(np.int16), gpu_milli=inst.gm.astype(np.int16),
                                           gpu_spec=inst.gspec.astype(np.int32), gpu_spec_table=inst.gspec_table)
    return Workload(inst.a, inst.d, inst.c.astype(np.int64), inst.m.astype(np.int64), inst.u,
                    kind=inst.service.astype(np.int8) * SERVICE, **gk)


def fluid(inst: Instance) -> float:
    """The fluid lower bound (agent/lower_bound.py) of the instance's cluster and pods, GPU energy included."""
    return lower_bound(_state(inst), _workload(inst), inst.horizon).joules


def _gpu_dynamic(inst: Instance) -> float:
    """The GPU energy above idle that every run spends (agent/lower_bound.py, :func:`gpu_dynamic_joules`)."""
    from joulesched.agent.lower_bound import gpu_dynamic_joules

    return gpu_dynamic_joules(_state(inst), _workload(inst)) if inst.has_gpus else 0.0


def _state(inst: Instance):
    from joulesched.cluster.state import ClusterState

    gk = {} if not inst.has_gpus else dict(gpu_count=inst.gpu.tolist(), gpu_model=list(inst.gpu_model),
                                           gpu_curves=inst.gpu_curves)
    return ClusterState([f"n{i}" for i in range(inst.nodes)], inst.cap.astype(int), inst.mem.astype(int),
                        inst.slots.astype(int), inst.curves, sleep_watts=inst.sleep_w, can_sleep=inst.can_sleep,
                        wake_s=inst.wake, **gk)


# ---- replay in the twin ------------------------------------------------------------------------------------
class ReplayError(RuntimeError):
    """The twin would not follow the schedule: the model and the twin disagree."""


def replay(scenario: Scenario, seed_offset: int, assignment: dict[int, int],
           workload: Workload | None = None) -> RunResult:
    """Run the twin on the instance, binding each pod to the node of ``assignment`` (workload pod index ->
    node). Raises :class:`ReplayError` if the twin asks about a pod at another time than its arrival, or the
    assigned node is not feasible then: the schedule would not be the one the model priced."""
    seed = scenario.seed + seed_offset
    wl = build_workload(scenario, seed) if workload is None else workload
    twin = Twin(scenario, wl)
    twin.begin()
    while (dcs := twin.next_decision()) is not None:
        p = int(dcs.key)
        node = assignment.get(p)
        if node is None:
            raise ReplayError(f"pod {p} has no node in the schedule")
        if abs(twin.now - float(wl.submit_s[p])) > TOL:
            raise ReplayError(f"pod {p} was queued: the twin decided it at {twin.now:.6f}, it arrived at "
                              f"{float(wl.submit_s[p]):.6f}")
        if not dcs.mask[node]:
            raise ReplayError(f"pod {p}: node {node} does not pass the filter at {twin.now:.6f}")
        twin.bind(dcs, node)
    return twin.result()


#: The interior point's optimality tolerance (HiGHS's ipm_optimality_tolerance): an LP value it returns without
#: crossover may sit this far (relative) above the LP's optimum, so a bound takes it off.
IPM_TOL = 1e-8

#: How far (relative) a proven bound may sit above a schedule's energy and still be read as meeting it: the
#: solvers' tolerances (the interior point's 1e-8, HiGHS's MIP feasibility). Further above, the two contradict.
BOUND_TOL = 1e-6

#: Instances larger than this get the LP and fluid bounds only: the MIP would not get far in minutes.
MIP_MAX_NODES = 16
MIP_MAX_PODS = 200


def check_time_limit(time_limit: float, option: str = "--time-limit") -> float:
    """A positive, finite number of seconds, or :class:`OptimumError` naming ``option``."""
    try:
        t = float(time_limit)
    except (TypeError, ValueError):
        raise OptimumError(f"{option} {time_limit!r} is not a number of seconds") from None
    if not (t > 0 and math.isfinite(t)):
        raise OptimumError(f"{option} must be a positive number of seconds, got {time_limit!r}")
    return t


def optimum_entry(scenario: Scenario, seed_offset: int = 0, *, time_limit: float = 60.0,
                  max_nodes: int = MIP_MAX_NODES, max_pods: int = MIP_MAX_PODS, replay_check: bool = True,
                  workload: Workload | None = None, fluid_joules: float | None = None, bound_only: bool = False,
                  on_stage=None, solver: str = DEFAULT_SOLVER, on_replay=None) -> dict:
    """Everything known about the optimum of one (scenario, seed): the fluid and LP bounds for every run, and
    on a small enough instance the MIP's best schedule, its bound and gap, and that schedule replayed in the
    twin (``replay_joules``, ``replay_rel_error``: the model checked against the twin; ``on_replay(result)`` is
    handed the replay's RunResult, so that the benchmark meters it over its policies' window). ``workload`` and
    ``fluid_joules`` (its fluid lower bound): what the caller already built and computed, not done again.
    ``bound_only``: the bounds alone, within ``time_limit`` in all (:func:`bounds_entry`); ``on_stage(what,
    best_bound_joules)`` is told as each of its stages starts. ``solver``: the MIP's, one of :data:`SOLVERS`."""
    time_limit = check_time_limit(time_limit)
    solver = check_solver(solver)
    if bound_only:
        return bounds_entry(scenario, seed_offset, time_limit=time_limit, workload=workload,
                            fluid_joules=fluid_joules, on_stage=on_stage)
    try:
        inst = instance(scenario, seed_offset, workload)
    except PodModelUnsupported as e:
        # In a benchmark over a whole suite this scenario simply has no optimum row (shown as n/a).
        return {"name": scenario.name, "seed": scenario.seed + seed_offset, "nodes": scenario.node_count,
                "pods": None, "overload_free": None, "status": "unsupported",
                "fluid_joules": None, "lp_bound_joules": None, "optimum_joules": None, "bound_joules": None,
                "gap": None, "wall_s": None, "replay_joules": None, "replay_rel_error": None, "message": str(e),
                "certificate": "bound-only", "schedule_joules": None, "best_bound_joules": None, "best_gap": None,
                "bound_every_run_joules": None, "bound_assumes": None, "solver": None, "time_s": 0.0}
    lp = lp_bound(inst, time_limit=max(10.0, time_limit), fluid_joules=fluid_joules)
    out = {"name": scenario.name, "seed": inst.seed, "nodes": inst.nodes, "pods": inst.pods,
           "overload_free": inst.overload_free, "fluid_joules": lp.fluid_joules,
           "lp_bound_joules": lp.joules if math.isfinite(lp.joules) else None, "lp_wall_s": lp.wall_s,
           "lp_status": lp.status,  # why lp_bound_joules is null, when it is (time_limit: an interrupted IPM)
           "status": "skipped", "optimum_joules": None, "bound_joules": None, "gap": None, "wall_s": None,
           "replay_joules": None, "replay_rel_error": None, "message": ""}
    boa = lp_bound(inst, time_limit=max(10.0, time_limit), fluid_joules=lp.fluid_joules, bind_on_arrival=True)
    out.update(boa_bound_joules=boa.joules if math.isfinite(boa.joules) else None, boa_status=boa.status,
               boa_wall_s=boa.wall_s)
    if inst.nodes > max_nodes or inst.pods > max_pods:
        out["message"] = (f"{inst.nodes} nodes and {inst.pods} pods: above the MIP's limits ({max_nodes} nodes, "
                          f"{max_pods} pods); LP and fluid bounds only")
        return certify(out, replay_check)
    res = solve(inst, time_limit=time_limit, lp=lp, solver=solver)
    out.update(status=res.status, optimum_joules=res.energy_joules, bound_joules=res.bound_joules, gap=res.gap,
               wall_s=res.wall_s, message=res.message, variables=res.variables, binaries=res.binaries,
               rows=res.rows, solver=res.solver, mip_nodes=res.mip_nodes, mip_dual_bound_joules=res.mip_dual_bound,
               schedule_solver=res.schedule_solver, bound_solver=res.bound_solver, cpsat_bound_joules=res.cpsat_bound,
               cpsat=res.cpsat)
    if replay_check and res.energy_joules is not None:  # a schedule, an empty one too
        try:
            rr = replay(scenario, seed_offset, res.assignment, workload)
        except ReplayError as e:  # the model and the twin disagree: its claims are not evidence
            out.update(status="replay_failed", optimum_joules=None, bound_joules=None, gap=None,
                       message=f"the twin does not follow the MIP's schedule ({e}); its energy and bound are dropped")
        else:
            out["replay_joules"] = rr.energy_joules
            scale = max(abs(rr.energy_joules), abs(res.energy_joules))  # 0 J both (an idle-free cluster): agreed
            err = abs(rr.energy_joules - res.energy_joules) / scale if scale > 0 else 0.0
            out["replay_rel_error"] = err
            if err > REPLAY_TOL:  # the twin shows the model wrong for this schedule: its bound proves nothing
                out.update(bound_joules=None, gap=None, unproven_bound_joules=res.bound_joules,
                           message="; ".join(m for m in (out.get("message"), (
                               f"the twin meters the MIP's schedule {err:.2e} away from its figure: the MIP's "
                               "bound is dropped") ) if m))
            if on_replay is not None:
                on_replay(rr)
    return certify(out, replay_check)


def bounds_entry(scenario: Scenario, seed_offset: int = 0, *, time_limit: float = 600.0,
                 workload: Workload | None = None, fluid_joules: float | None = None, on_stage=None) -> dict:
    """The bounds at scale, within ``time_limit`` seconds in all (instance and models built included): the fluid
    bound, then the LP bound (every run), then the bind-on-arrival bound, each stage given what is left. When
    the time runs out the row keeps the best bound proven so far (the fluid bound at least) and says
    ``bound_status: time_limit``; ``optimal`` when every stage finished. Services are stated (bounds only,
    :func:`instance`). ``on_stage(what, best_bound_joules)``: told as each stage starts, and at the end."""
    t0 = time.perf_counter()
    tell = on_stage or (lambda what, best: None)
    inst = instance(scenario, seed_offset, workload, bounds_only=True)
    tell("fluid bound", None)
    fl = fluid(inst) if fluid_joules is None else fluid_joules
    out = {"name": scenario.name, "seed": inst.seed, "nodes": inst.nodes, "pods": inst.pods,
           "services": int(inst.service.sum()), "overload_free": inst.overload_free, "fluid_joules": fl,
           "lp_bound_joules": None, "lp_wall_s": 0.0, "lp_status": "skipped", "boa_bound_joules": None,
           "boa_wall_s": 0.0, "boa_status": "skipped", "status": "skipped", "optimum_joules": None,
           "bound_joules": None, "gap": None, "wall_s": None, "replay_joules": None, "replay_rel_error": None,
           "message": "bounds only", "solver": "highs"}
    for key, boa, what in (("lp", False, "LP bound (every run)"), ("boa", True, "bind-on-arrival bound")):
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            break
        tell(what, max(v for v in (fl, out["lp_bound_joules"], out["boa_bound_joules"]) if v is not None))
        b = lp_bound(inst, time_limit=left, fluid_joules=fl, bind_on_arrival=boa, min_solve_s=0.0,
                     hard_deadline=True)
        out.update({f"{key}_bound_joules": b.joules if math.isfinite(b.joules) else None, f"{key}_status": b.status,
                    f"{key}_wall_s": b.wall_s})
    done = out["lp_status"] == out["boa_status"] == "optimal"
    # Each stage's figure is proven whether or not the next one ran: time_limit only says more was possible.
    stopped = {out["lp_status"], out["boa_status"]} & {"time_limit", "skipped"}
    out["bound_status"] = "optimal" if done else "time_limit" if stopped else "incomplete"
    out["bound_wall_s"] = time.perf_counter() - t0
    if not done:
        out["message"] = (f"bounds only; the {time_limit:g} s limit stopped them (LP: {out['lp_status']}, "
                          f"bind-on-arrival: {out['boa_status']}): the best bound so far")
    row = certify(out, False)
    tell("done", row["best_bound_joules"])
    return row


#: A schedule is called optimal only if the twin replays it to its claimed energy within this (relative).
REPLAY_TOL = 1e-9


def certify(out: dict, replayed: bool) -> dict:
    """Add the row's certificate (``optimal`` / ``feasible`` / ``bound-only``), the schedule's energy, the best
    bound for every run the row states, the gap between them, the solver and the total time.

    ``optimal`` needs the solver's status ``optimal`` (proven, or a gap within :func:`solve`'s tolerance), a
    gap of at most 1e-4 *and* (when replayed) the twin's energy for the schedule equal
    to the MIP's within :data:`REPLAY_TOL`; a schedule the twin meters differently is at most ``feasible`` with
    the twin's energy. ``bound-only``: no schedule, only the LP and fluid bounds (or the MIP's, when it found no
    schedule)."""
    lp_fl = [v for v in (out.get("lp_bound_joules"), out.get("fluid_joules")) if v is not None]
    bounds = lp_fl + [out[k] for k in ("bound_joules", "boa_bound_joules") if out.get(k) is not None]
    bound = max(bounds) if bounds else None
    energy = out.get("optimum_joules")
    err = out.get("replay_rel_error")
    if energy is not None and out.get("replay_joules") is not None:
        energy = out["replay_joules"]  # what the twin meters is the schedule's energy
    if energy is None:
        cert = "bound-only"
    elif out["status"] == "optimal" and (not replayed or (err is not None and err <= REPLAY_TOL)) \
            and out.get("gap") is not None and out["gap"] <= 1e-4:
        cert = "optimal"
    else:
        cert = "feasible"
    every = max(lp_fl) if lp_fl else None
    gap = None if energy is None or bound is None or energy <= 0 else (energy - bound) / energy
    if gap is not None and gap < -BOUND_TOL:
        # A bound above the schedule it bounds: a bound or the model is wrong, so neither proves anything.
        cert, gap = ("feasible" if cert == "optimal" else cert), None
        out["message"] = "; ".join(m for m in (out.get("message"), f"a bound ({bound:.9g} J) is above the "
                                               f"schedule's {energy:.9g} J: no gap is reported") if m)
    elif gap is not None:
        gap = max(0.0, gap)  # a bound that meets the schedule within the solvers' tolerances
    out.update(certificate=cert, schedule_joules=energy, best_bound_joules=bound, best_gap=gap,
               bound_every_run_joules=every,
               # The MIP's own bound holds for the schedules that bind each pod on arrival without overloading a
               # node, the bind-on-arrival LP's for those binding on arrival (docs/optimum.md); the LP and fluid
               # bounds for every run, queued and throttled ones too.
               bound_assumes=_bound_assumes(out, bound, every),
               solver=out.get("solver"),
               time_s=sum(out.get(k) or 0.0 for k in ("lp_wall_s", "boa_wall_s", "wall_s")))
    return out


def _bound_assumes(out: dict, bound: float | None, every: float | None) -> str:
    """Which runs ``bound`` (the row's best) holds for: ``every-run``, ``bind-on-arrival`` (the bind-on-arrival
    LP's, or the MIP's where no run can overload a node), or ``bind-on-arrival, no overload`` (the MIP's alone,
    where a run can: a throttled run that binds on arrival may use less)."""
    if bound is None or bound == every:
        return "every-run"
    if out.get("overload_free") is False and bound == out.get("bound_joules") \
            and bound != out.get("boa_bound_joules"):
        return "bind-on-arrival, no overload"
    return "bind-on-arrival"


def window_schedule(opt: dict, replay: RunResult, until_s: float) -> None:
    """Meter the optimum's schedule (``opt``, a row of :func:`optimum_entry`; ``replay``, the twin's run of it)
    over a window that ends at ``until_s``, as the policies beside it are (:func:`~joulesched.cluster.twin.
    common_window`): ``schedule_joules`` gets the idle tail's joules (``window_tail_joules``). The bounds hold
    for any later window too; the certificate and gap stay the MIP's, over the schedule's own end."""
    tail = extend_run(replay, until_s).energy_joules - replay.energy_joules
    opt["window_end_s"] = max(until_s, replay.end_s)
    opt["window_tail_joules"] = tail
    if opt.get("schedule_joules") is not None:
        opt["schedule_joules"] += tail


def window_with_schedule(runs: dict, opt: dict | None = None, replay: RunResult | None = None) -> dict:
    """``runs`` (any keys) metered over one window (:func:`~joulesched.cluster.twin.common_window`) that also
    reaches the end of the optimum's replayed schedule, when there is one; ``opt``, its row, is metered over the
    same window (:func:`window_schedule`). How every comparison beside the optimum meters its runs."""
    until = max([r.end_s for r in runs.values()] + ([replay.end_s] if replay is not None else []))
    if replay is not None and opt is not None:
        window_schedule(opt, replay, until)
    return {k: extend_run(r, until) for k, r in runs.items()}


def policy_energies(scenario: Scenario, seed_offset: int, specs, opt: dict | None = None,
                    replay: RunResult | None = None) -> dict[str, float]:
    """Each policy's energy in the twin on the same (scenario, seed), as the benchmark meters it: every run, and
    the optimum's schedule (``opt``, its row, and ``replay``, its run: :func:`window_schedule`), over one window."""
    from joulesched.agent.registry import make_policy
    from joulesched.agent.runner import run_policy

    seed = scenario.seed + seed_offset
    twin = Twin(scenario, build_workload(scenario, seed))
    runs = {p: run_policy(twin, make_policy(p), seed) for p in specs}
    return {p: r.energy_joules for p, r in window_with_schedule(runs, opt, replay).items()} if runs else {}
