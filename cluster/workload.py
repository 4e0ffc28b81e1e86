"""Pod streams for the twin: the pod model, trace CSVs and the synthetic generators.

A :class:`Workload` is a struct of arrays sorted by submission time. A request of ``-1`` means the pod has
no request for that resource (best-effort for both); ``0`` is an explicit zero, which kube-scheduler treats
differently when scoring. Limits sit beside requests (``-1`` = no limit).

The pod model (docs/twin.md, "The pod model"):

* **Kind.** A *job* (:data:`JOB`) has work to do: ``duration_s`` is its run time at full service (on a GPU of
  the reference speed where the scenario sets ``gpu_runtime``), and throttling stretches it. A *service* (:data:`SERVICE`) has no work: it runs from submission until
  ``submit_s + duration_s`` (a Deployment scaling it down, or the trace ending it), or, with
  ``duration_s = inf``, until the scenario ends; the twin stops every service at the scenario's end at the
  latest (only jobs may run past it).
* **Usage over time.** A pod's demanded CPU is piecewise constant. Most pods have one value, ``usage_m``;
  a pod with a *profile* (``profile >= 0``) follows a step series from the profile table (``prof_ptr``,
  ``prof_t``, ``prof_m``, compressed-row like a CSR matrix; replicas of one service share one profile). The
  clock of a profile depends on the kind: a job's breakpoints are seconds of *progress* (work done, so a
  throttled job reaches them later), a service's are *absolute* scenario seconds (its load follows the
  clock, not its age). Value ``prof_m[k]`` holds from ``prof_t[k]`` to the next breakpoint; the first value
  also holds before the first breakpoint and the last one after the last. A twin integrates this exactly
  event by event: a change of demand is one more event, never a tick. ``usage_m`` of a profiled pod is its
  mean demand over its planned life.
* **Metadata.** Owner kind, priority (an integer, higher is more important, as Kubernetes), the QoS class
  (derived from requests and limits as Kubernetes does: :attr:`Workload.qos`), an app/workload key,
  namespace, and the trace's own service class (``slo_class``: Alibaba's LS/BE, Azure's high/low, ...).
  Strings are stored as codes into small tables (``app`` and ``app_names``, ...).

Every new field has a default that reproduces the workloads of before the pod model exactly: a job, no
limits, priority 0, namespace ``default``, empty owner/app/class, constant usage.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TextIO

import numpy as np

from joulesched.cluster.filters import PodConstraints
from joulesched.cluster.fitted import draw_fitted, load_fit
from joulesched.cluster.scenario import (
    MAX_CPU_M,
    MAX_GPUS,
    Fitted,
    PodPlacement,
    Scenario,
    ScenarioError,
    Services,
    Synthetic,
)
from joulesched.core.fsio import atomic_path

TRACE_COLUMNS = ("submit_s", "duration_s", "cpu_request_m", "memory_request_mib", "cpu_usage_m")
#: Optional columns of the twin's CSV (the pod model); a file without them loads as before.
OPTIONAL_COLUMNS = ("kind", "cpu_limit_m", "memory_limit_mib", "priority", "owner_kind", "app", "namespace",
                    "slo_class", "usage_profile", "name", "gpu_count", "gpu_milli", "gpu_spec")
#: A GPU's whole share, milli-GPU (a share below it is of one GPU: the gpushare convention of the OpenB trace).
GPU_MILLI = 1000
NO_REQUEST = -1
NO_LIMIT = -1
#: The largest request or limit a trace CSV may give: beyond it the twin's 64-bit columns overflow (a corrupt
#: cell, not a pod of 10^15 millicores).
MAX_QUANTITY = 2**53
#: The most demand steps a ``services`` entry may generate (its profiles' memory: 8 bytes a step).
MAX_SERVICE_STEPS = 10**8

JOB, SERVICE = 0, 1
KINDS = ("job", "service")
#: QoS classes, as codes of :attr:`Workload.qos` (the names are Kubernetes' ``status.qosClass`` values).
BEST_EFFORT, BURSTABLE, GUARANTEED = 0, 1, 2
QOS_CLASSES = ("BestEffort", "Burstable", "Guaranteed")
#: Owner kinds whose pods are services (they restart and never finish on their own), as Kubernetes runs them.
SERVICE_OWNERS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "ReplicationController"})
DEFAULT_NAMESPACE = "default"

# Alibaba GPU trace 2023 pod CPU request quantiles (cores), reference.md section 6. The tails (p0, p100) are
# our choice so the quantile function is defined everywhere.
_CPU_Q = np.array([0.0, 0.25, 0.50, 0.75, 0.90, 0.99, 1.0])
_CPU_CORES = np.array([1.0, 4.0, 11.3, 12.0, 16.4, 32.0, 64.0])


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What a policy may know about a pod beyond its requests, the same in the twin
    (:meth:`Workload.meta`) and on a cluster (:func:`joulesched.cluster.kube.objects.pod_meta`).

    ``kind`` is ``"job"`` or ``"service"``; ``qos_class`` one of :data:`QOS_CLASSES`; limits are ``None`` when
    the pod sets none; ``app`` is the workload key (a Deployment's name, a trace's job or app group)."""

    kind: str = "job"
    owner_kind: str = ""
    priority: int = 0
    qos_class: str = "BestEffort"
    app: str = ""
    namespace: str = DEFAULT_NAMESPACE
    slo_class: str = ""
    cpu_limit_m: int | None = None
    memory_limit_mib: int | None = None


def qos_codes(cpu_req: np.ndarray, mem_req: np.ndarray, cpu_lim: np.ndarray, mem_lim: np.ndarray) -> np.ndarray:
    """Kubernetes' QoS class (``ComputePodQOS``, pkg/apis/core/helper/qos) of one-container pods, as codes.

    Only values > 0 count as set. *Guaranteed*: CPU and memory limits set, and every set request equal to its
    limit (an unset request defaults to the limit, as the apiserver does). *BestEffort*: no request and no
    limit set. Otherwise *Burstable*. A pod-level view cannot tell containers apart: a pod whose containers
    mix guaranteed and unlimited ones is read here as its sums say (the live view computes it per container).
    """
    lim_c, lim_m = cpu_lim > 0, mem_lim > 0
    # The apiserver defaults a missing request to the limit before anything computes the class.
    req_c = np.where((cpu_req < 0) & lim_c, cpu_lim, cpu_req)
    req_m = np.where((mem_req < 0) & lim_m, mem_lim, mem_req)
    set_c, set_m = req_c > 0, req_m > 0
    out = np.full(len(cpu_req), BURSTABLE, dtype=np.int8)
    out[~(set_c | set_m | lim_c | lim_m)] = BEST_EFFORT
    guaranteed = lim_c & lim_m & (~set_c | (req_c == cpu_lim)) & (~set_m | (req_m == mem_lim))
    # ... and as many distinct requested resources as limited ones (both limits are set here, so both requests).
    guaranteed &= set_c & set_m
    out[guaranteed] = GUARANTEED
    return out


def _codes(n: int, dtype=np.int32) -> np.ndarray:
    return np.zeros(n, dtype=dtype)


_META_TABLES = (("owner", "owner_names", ("",)), ("app", "app_names", ("",)),
                ("namespace", "namespace_names", (DEFAULT_NAMESPACE,)), ("slo", "slo_names", ("",)),
                ("placement", "placement_table", (None,)), ("gpu_spec", "gpu_spec_table", (None,)),
                ("pod_name", "pod_names", ("",)))


@dataclass(frozen=True)
class Workload:
    """Pods sorted by ``submit_s``. Requests and limits are int64 (``-1`` = none); usage is demanded
    millicores. The keyword-only fields are the pod model (module docstring); each defaults to what a
    workload of constant-usage jobs without metadata had."""

    submit_s: np.ndarray
    duration_s: np.ndarray
    cpu_req: np.ndarray
    mem_req: np.ndarray
    usage_m: np.ndarray
    dropped: int = 0  # trace rows past the scenario's duration
    kind: np.ndarray | None = field(default=None, kw_only=True)  # int8: JOB or SERVICE
    cpu_lim: np.ndarray | None = field(default=None, kw_only=True)  # int64 millicores, -1 = no limit
    mem_lim: np.ndarray | None = field(default=None, kw_only=True)  # int64 MiB, -1 = no limit
    priority: np.ndarray | None = field(default=None, kw_only=True)  # int32
    owner: np.ndarray | None = field(default=None, kw_only=True)  # int32 codes into owner_names
    owner_names: tuple[str, ...] = field(default=("",), kw_only=True)
    app: np.ndarray | None = field(default=None, kw_only=True)
    app_names: tuple[str, ...] = field(default=("",), kw_only=True)
    namespace: np.ndarray | None = field(default=None, kw_only=True)
    namespace_names: tuple[str, ...] = field(default=(DEFAULT_NAMESPACE,), kw_only=True)
    slo: np.ndarray | None = field(default=None, kw_only=True)
    slo_names: tuple[str, ...] = field(default=("",), kw_only=True)
    # Scheduling constraints (nodeSelector, tolerations, required node affinity): codes into placement_table,
    # 0 = none (cluster/filters.py).
    placement: np.ndarray | None = field(default=None, kw_only=True)
    placement_table: tuple[PodConstraints | None, ...] = field(default=(None,), kw_only=True)
    # GPUs (docs/twin.md, "GPUs"): gpu GPUs of gpu_milli each (0: none; a share < 1000 is of one GPU), on a
    # model in gpu_spec_table[gpu_spec] (None: any); pod_name: the trace's own name ("" when it has none).
    gpu: np.ndarray | None = field(default=None, kw_only=True)  # int16
    gpu_milli: np.ndarray | None = field(default=None, kw_only=True)  # int16, 1..1000
    gpu_spec: np.ndarray | None = field(default=None, kw_only=True)
    gpu_spec_table: tuple[frozenset[str] | None, ...] = field(default=(None,), kw_only=True)
    pod_name: np.ndarray | None = field(default=None, kw_only=True)
    pod_names: tuple[str, ...] = field(default=("",), kw_only=True)
    profile: np.ndarray | None = field(default=None, kw_only=True)  # int32 into the profile table, -1 = constant
    prof_ptr: np.ndarray | None = field(default=None, kw_only=True)  # int64, profiles + 1 offsets
    prof_t: np.ndarray | None = field(default=None, kw_only=True)  # float64 breakpoints (see module docstring)
    prof_m: np.ndarray | None = field(default=None, kw_only=True)  # float64 millicores from each breakpoint on

    def __post_init__(self) -> None:
        n = len(self.submit_s)
        for name in ("duration_s", "cpu_req", "mem_req", "usage_m"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"workload column {name} has {len(getattr(self, name))} rows, expected {n}")
        s = object.__setattr__
        for name, default, dtype in (("kind", JOB, np.int8), ("cpu_lim", NO_LIMIT, np.int64),
                                     ("mem_lim", NO_LIMIT, np.int64), ("priority", 0, np.int32),
                                     ("profile", -1, np.int32), ("gpu", 0, np.int16),
                                     ("gpu_milli", GPU_MILLI, np.int16)):
            v = getattr(self, name)
            if v is None:
                s(self, name, np.full(n, default, dtype=dtype))
            elif len(v) != n:
                raise ValueError(f"workload column {name} has {len(v)} rows, expected {n}")
        for name, table, _ in _META_TABLES:
            v, names = getattr(self, name), getattr(self, table)
            if v is None:
                s(self, name, _codes(n))
            elif len(v) != n:
                raise ValueError(f"workload column {name} has {len(v)} rows, expected {n}")
            if not names:
                raise ValueError(f"workload table {table} is empty")
            if n and (int(getattr(self, name).max()) >= len(names) or int(getattr(self, name).min()) < 0):
                raise ValueError(f"workload column {name} has codes outside {table}")
        if self.prof_ptr is None:
            s(self, "prof_ptr", np.zeros(1, dtype=np.int64))
            s(self, "prof_t", np.zeros(0))
            s(self, "prof_m", np.zeros(0))
        ptr = self.prof_ptr
        if len(self.prof_t) != len(self.prof_m) or ptr[0] != 0 or ptr[-1] != len(self.prof_t) \
                or (np.diff(ptr) < 1).any():
            raise ValueError("workload profile table is inconsistent (every profile needs at least one step)")
        if n and (int(self.profile.max()) >= len(ptr) - 1 or int(self.profile.min()) < -1):
            raise ValueError("workload column profile refers to no profile")

    def __len__(self) -> int:
        return len(self.submit_s)

    @cached_property
    def has_gpus(self) -> bool:
        return bool((self.gpu > 0).any())

    def name_of(self, i: int) -> str:
        """Pod ``i``'s trace name, or ``pod-<i>`` when the trace gave none."""
        return self.pod_names[int(self.pod_name[i])] or f"pod-{i}"

    # ---- what the twin and the lower bound read -------------------------------------------------------------
    @property
    def work_m_s(self) -> float:
        """Total demanded CPU work, millicore-seconds (infinite while an open-ended service is in it: use
        :meth:`demand_m_s` with a horizon)."""
        if not self.has_pod_model:
            return float(np.dot(self.usage_m, self.duration_s))
        return self.demand_m_s()

    @cached_property
    def has_pod_model(self) -> bool:
        """Whether any pod is a service or has time-varying usage: the twin then runs its pod-model event
        handlers; without them it keeps the plain jobs' code path. Metadata and limits alone do not count: they
        change nothing in the twin's physics."""
        return bool((self.kind == SERVICE).any() or (self.profile >= 0).any())

    @property
    def is_service(self) -> np.ndarray:
        return self.kind == SERVICE

    @cached_property
    def qos(self) -> np.ndarray:
        """Kubernetes QoS class per pod, codes into :data:`QOS_CLASSES` (:func:`qos_codes`)."""
        return qos_codes(self.cpu_req, self.mem_req, self.cpu_lim, self.mem_lim)

    def meta(self, i: int) -> PodMeta:
        """Pod ``i``'s metadata as a policy sees it (the same type the live backend fills)."""
        cl, ml = int(self.cpu_lim[i]), int(self.mem_lim[i])
        return PodMeta(kind=KINDS[int(self.kind[i])], owner_kind=self.owner_names[int(self.owner[i])],
                       priority=int(self.priority[i]), qos_class=QOS_CLASSES[int(self.qos[i])],
                       app=self.app_names[int(self.app[i])],
                       namespace=self.namespace_names[int(self.namespace[i])],
                       slo_class=self.slo_names[int(self.slo[i])],
                       cpu_limit_m=None if cl < 0 else cl, memory_limit_mib=None if ml < 0 else ml)

    def pod_metas(self) -> list[PodMeta]:
        """:meth:`meta` of every pod, as one list (what a twin hands each decision). Pods with equal metadata
        share one object, so a workload of identical pods costs one :class:`PodMeta`, not one per pod."""
        n = len(self)
        if not n:
            return []
        cols = np.stack([self.kind.astype(np.int64), self.owner, self.priority, self.qos, self.app, self.namespace,
                         self.slo, self.cpu_lim, self.mem_lim], axis=1)
        _, first, inverse = np.unique(cols, axis=0, return_index=True, return_inverse=True)
        metas = [self.meta(int(i)) for i in first.tolist()]
        return [metas[k] for k in inverse.reshape(-1).tolist()]

    # ---- lifetimes ----------------------------------------------------------------------------------------
    def service_end_s(self, i: int) -> float | None:
        """When service ``i`` stops (absolute seconds: its Deployment scales it down, or the trace ends it), or
        ``None`` when it runs until the scenario ends. ``None`` for a job too (a job ends when its work is
        done: :meth:`planned_end_s`)."""
        if self.kind[i] != SERVICE:
            return None
        d = float(self.duration_s[i])
        return None if math.isinf(d) else float(self.submit_s[i]) + d

    def planned_end_s(self, i: int, start_s: float) -> float | None:
        """Pod ``i``'s end if it starts at ``start_s`` and is never throttled: a job's start plus its work, a
        service's stop time (which does not depend on when it started), ``None`` for an open-ended service."""
        if self.kind[i] == SERVICE:
            return self.service_end_s(i)
        return start_s + float(self.duration_s[i])

    # ---- usage over time ----------------------------------------------------------------------------------
    def profile_bounds(self, i: int) -> tuple[int, int]:
        """``(a, b)``: pod ``i``'s steps are ``prof_t[a:b]``, ``prof_m[a:b]``; ``(0, 0)`` for constant usage.
        A twin walks them with a cursor (one index per pod) instead of searching."""
        p = int(self.profile[i])
        if p < 0:
            return 0, 0
        return int(self.prof_ptr[p]), int(self.prof_ptr[p + 1])

    def usage_segments(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Pod ``i``'s breakpoints and demands in its clock (a job: progress seconds; a service: absolute
        seconds). A constant pod is one step at 0 (job) or at its submission (service)."""
        a, b = self.profile_bounds(i)
        if a == b:
            t0 = float(self.submit_s[i]) if self.kind[i] == SERVICE else 0.0
            return np.array([t0]), np.array([float(self.usage_m[i])])
        return self.prof_t[a:b], self.prof_m[a:b]

    def usage_step(self, i: int, x: float) -> tuple[float, float]:
        """``(millicores, next_change)``: pod ``i``'s demand at clock value ``x`` and the clock value of its next
        change (``inf`` when it never changes again). The twin calls this when a pod starts and whenever
        its previous ``next_change`` is reached (for a job, in progress, so the wall time of that event is
        ``now + (next_change - progress) / rate``)."""
        a, b = self.profile_bounds(i)
        if a == b:
            return float(self.usage_m[i]), math.inf
        t = self.prof_t[a:b]
        k = int(np.searchsorted(t, x, side="right")) - 1
        nxt = float(t[k + 1]) if k + 1 < b - a else math.inf
        return float(self.prof_m[a + max(k, 0)]), nxt

    def usage_at(self, i: int, x: float) -> float:
        return self.usage_step(i, x)[0]

    def usage_integral(self, i: int, x0: float, x1: float) -> float:
        """Exact millicore-seconds pod ``i`` demands over clock interval ``[x0, x1)``."""
        if not x1 > x0:
            return 0.0
        a, b = self.profile_bounds(i)
        if a == b:
            return float(self.usage_m[i]) * (x1 - x0)
        t, m = self.prof_t[a:b], self.prof_m[a:b]
        starts = np.concatenate(([-math.inf], t[1:]))
        ends = np.concatenate((t[1:], [math.inf]))
        overlap = np.clip(np.minimum(ends, x1) - np.maximum(starts, x0), 0.0, None)
        return float(np.dot(overlap, m))

    def life_window(self, i: int, horizon: float | None = None) -> tuple[float, float]:
        """Pod ``i``'s planned life in its own clock, unthrottled: a job ``[0, duration)`` of progress, a service
        ``[submit, end)`` of absolute time, its end capped at ``horizon`` when given."""
        if self.kind[i] == SERVICE:
            s = float(self.submit_s[i])
            e = s + float(self.duration_s[i])
            return s, e if horizon is None else min(e, max(horizon, s))
        return 0.0, float(self.duration_s[i])

    def demand_m_s(self, horizon: float | None = None) -> float:
        """Total demanded CPU, millicore-seconds: each job's over its work, each service's from submission to
        its end or ``horizon``, whichever comes first (infinite for an open-ended service without one)."""
        const = self.profile < 0
        job = self.kind == JOB
        total = float(np.dot(self.usage_m[const & job], self.duration_s[const & job]))
        svc = const & ~job
        if svc.any():
            end = self.submit_s[svc] + self.duration_s[svc]
            if horizon is not None:
                end = np.minimum(end, np.maximum(horizon, self.submit_s[svc]))
            total += float(np.dot(self.usage_m[svc], end - self.submit_s[svc]))
        for i in np.flatnonzero(~const).tolist():
            total += self.usage_integral(i, *self.life_window(i, horizon))
        return total

    # ---- building ------------------------------------------------------------------------------------------
    def subset(self, keep: np.ndarray, dropped: int | None = None) -> "Workload":
        """The pods where ``keep`` is true (order kept), or at the indices ``keep`` (repeats allowed); the profile
        and name tables are shared."""
        cols = {k: getattr(self, k)[keep] for k in _POD_COLUMNS}
        tables = {k: getattr(self, k) for k in _TABLES}
        return Workload(**cols, dropped=self.dropped if dropped is None else dropped, **tables)


_POD_COLUMNS = ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m", "kind", "cpu_lim", "mem_lim",
                "priority", "owner", "app", "namespace", "slo", "profile", "placement", "gpu", "gpu_milli",
                "gpu_spec", "pod_name")
_TABLES = ("owner_names", "app_names", "namespace_names", "slo_names", "placement_table", "gpu_spec_table",
           "pod_names", "prof_ptr", "prof_t", "prof_m")


def merge_workloads(parts: Sequence[Workload]) -> Workload:
    """One workload of all ``parts``' pods, stably sorted by submission (ties keep the parts' order), with the
    name and profile tables merged."""
    if len(parts) == 1:
        return parts[0]
    cols: dict[str, list[np.ndarray]] = {k: [] for k in _POD_COLUMNS}
    index: dict[str, dict[str, int]] = {}  # per name table: name -> code, in order of first appearance
    ptr, pt, pm, nprof, nsteps = [np.zeros(1, dtype=np.int64)], [], [], 0, 0
    for wl in parts:
        for k in ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m", "kind", "cpu_lim", "mem_lim",
                  "priority", "gpu", "gpu_milli"):
            cols[k].append(getattr(wl, k))
        for name, table, default in _META_TABLES:
            idx = index.setdefault(table, {default[0]: 0})
            remap = np.array([idx.setdefault(s, len(idx)) for s in getattr(wl, table)], dtype=np.int32)
            cols[name].append(remap[getattr(wl, name)])
        prof = wl.profile.copy()
        prof[prof >= 0] += nprof
        cols["profile"].append(prof)
        ptr.append(wl.prof_ptr[1:] + nsteps)
        nsteps += len(wl.prof_t)
        pt.append(wl.prof_t)
        pm.append(wl.prof_m)
        nprof += len(wl.prof_ptr) - 1
    merged = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.argsort(merged["submit_s"], kind="stable")
    return Workload(**{k: v[order] for k, v in merged.items()}, dropped=sum(p.dropped for p in parts),
                    **{t: tuple(index[t]) for _, t, _ in _META_TABLES},
                    prof_ptr=np.concatenate(ptr), prof_t=np.concatenate(pt), prof_m=np.concatenate(pm))


class PodBuilder:
    """Collects pods one at a time (trace readers, importers) and builds a :class:`Workload`.

    Numbers go into compact typed arrays and strings into code tables, so that a million pods cost tens of
    megabytes, not a Python object each. Profiles are added once (:meth:`add_profile`) and shared by index.
    """

    def __init__(self) -> None:
        from array import array

        self._f = {k: array("d") for k in ("submit_s", "duration_s", "usage_m")}
        self._i = {k: array("q") for k in ("cpu_req", "mem_req", "cpu_lim", "mem_lim")}
        self._c = {k: array("i") for k in ("priority", "owner", "app", "namespace", "slo", "profile", "gpu_spec",
                                           "pod_name")}
        self._g = {k: array("h") for k in ("gpu", "gpu_milli")}
        self._kind = array("b")
        self._names = {t: {d[0]: 0} for _, t, d in _META_TABLES}
        self._ptr, self._pt, self._pm = array("q", [0]), array("d"), array("d")
        self._prof_key: dict[object, int] = {}

    def __len__(self) -> int:
        return len(self._kind)

    def code(self, table: str, name: str) -> int:
        idx = self._names[table]
        return idx.setdefault(name, len(idx))

    def add_profile(self, t: Sequence[float], m: Sequence[float], key: object = None) -> int:
        """Add a step series (breakpoints ``t``, strictly increasing; millicores ``m``) and return its index;
        with ``key``, a series added before under the same key is reused."""
        if key is not None and key in self._prof_key:
            return self._prof_key[key]
        self._pt.extend(t)
        self._pm.extend(m)
        self._ptr.append(len(self._pt))
        p = len(self._ptr) - 2
        if key is not None:
            self._prof_key[key] = p
        return p

    def add(self, submit_s: float, duration_s: float, cpu_req: int, mem_req: int, usage_m: float, *,
            kind: int = JOB, cpu_lim: int = NO_LIMIT, mem_lim: int = NO_LIMIT, priority: int = 0,
            owner: str = "", app: str = "", namespace: str = DEFAULT_NAMESPACE, slo: str = "",
            profile: int = -1, gpu: int = 0, gpu_milli: int = GPU_MILLI, gpu_spec: frozenset[str] | None = None,
            name: str = "") -> None:
        f, i, c = self._f, self._i, self._c
        f["submit_s"].append(submit_s)
        f["duration_s"].append(duration_s)
        f["usage_m"].append(usage_m)
        i["cpu_req"].append(cpu_req)
        i["mem_req"].append(mem_req)
        i["cpu_lim"].append(cpu_lim)
        i["mem_lim"].append(mem_lim)
        c["priority"].append(priority)
        c["owner"].append(self.code("owner_names", owner) if owner else 0)
        c["app"].append(self.code("app_names", app) if app else 0)
        c["namespace"].append(0 if namespace == DEFAULT_NAMESPACE else self.code("namespace_names", namespace))
        c["slo"].append(self.code("slo_names", slo) if slo else 0)
        c["profile"].append(profile)
        c["gpu_spec"].append(0 if gpu_spec is None else self.code("gpu_spec_table", gpu_spec))
        c["pod_name"].append(self.code("pod_names", name) if name else 0)
        self._g["gpu"].append(gpu)
        self._g["gpu_milli"].append(gpu_milli)
        self._kind.append(kind)

    def build(self) -> Workload:
        """The pods, stably sorted by submission time."""
        cols: dict[str, np.ndarray] = {k: np.frombuffer(v, dtype=np.float64).copy() if len(v) else np.zeros(0)
                                       for k, v in self._f.items()}
        cols |= {k: np.asarray(v, dtype=np.int64) for k, v in self._i.items()}
        cols |= {k: np.asarray(v, dtype=np.int32) for k, v in self._c.items()}
        cols |= {k: np.asarray(v, dtype=np.int16) for k, v in self._g.items()}
        cols["kind"] = np.asarray(self._kind, dtype=np.int8)
        order = np.argsort(cols["submit_s"], kind="stable")
        return Workload(**{k: v[order] for k, v in cols.items()},
                        **{t: tuple(idx) for t, idx in self._names.items()},
                        prof_ptr=np.asarray(self._ptr, dtype=np.int64), prof_t=np.asarray(self._pt, dtype=np.float64),
                        prof_m=np.asarray(self._pm, dtype=np.float64))


def load_trace(path: str | Path, duration_s: float | None = None) -> Workload:
    """Read a trace CSV. Rows submitted at or after ``duration_s`` are dropped and counted.

    The five columns of :data:`TRACE_COLUMNS` are required; the pod model's :data:`OPTIONAL_COLUMNS` are
    read when present (docs/twin.md lists them), and other columns are ignored. Raises
    :class:`ScenarioError` naming the line and column of the first bad cell.
    """
    path = Path(path)
    try:
        fh = path.open(newline="", encoding="utf-8-sig")  # a BOM (Excel's UTF-8 CSV) is no column name
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read trace: {e}") from None
    pods = PodBuilder()
    profiles: dict[str, int] = {}
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise ScenarioError(f"{path}: empty trace; expected header {','.join(TRACE_COLUMNS)}") from None
        except UnicodeDecodeError:
            raise ScenarioError(f"{path}: line {_first_bad_line(path)}: not UTF-8 text") from None
        except csv.Error as e:
            raise ScenarioError(f"{path}: line 1: unreadable CSV: {e}") from None
        header = [h.strip() for h in header]
        twice = next((c for c in TRACE_COLUMNS + OPTIONAL_COLUMNS if header.count(c) > 1), None)
        if twice is not None:  # which of the two would be read is a guess: say so instead
            raise ScenarioError(f"{path}: line 1: column {twice} appears {header.count(twice)} times")
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            # A public trace's own file is the commonest cause: say how to convert it.
            looks = (" (it looks like an Alibaba GPU 2023 / OpenB pod list: -f alibaba-gpu-2023)"
                     if {"cpu_milli", "creation_time"} <= set(header) else "")
            raise ScenarioError(f"{path}: line 1: missing column(s) {', '.join(missing)}; header must include "
                                f"{','.join(TRACE_COLUMNS)}. A public trace's files convert to this format with "
                                f"`joulesched trace import`{looks}; docs/twin.md, Trace formats")
        idx = {c: header.index(c) for c in TRACE_COLUMNS + OPTIONAL_COLUMNS if c in header}
        extra = [c for c in OPTIONAL_COLUMNS if c in idx]
        try:
            for lineno, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise ScenarioError(f"{path}: line {lineno}: {len(row)} cells, header has {len(header)}")
                if not extra:
                    pods.add(*(_parse_cell(path, lineno, c, row[idx[c]].strip()) for c in TRACE_COLUMNS))
                else:
                    _add_model_row(pods, profiles, path, lineno, {c: row[idx[c]].strip() for c in idx})
        except csv.Error as e:
            raise ScenarioError(f"{path}: unreadable CSV: {e}") from None
        except UnicodeDecodeError:
            # The decoder reads ahead by blocks: the error's offset is in a block, not the row being parsed.
            raise ScenarioError(f"{path}: line {_first_bad_line(path)}: not UTF-8 text") from None
    if not len(pods):
        raise ScenarioError(f"{path}: trace has a header but no pods")
    wl = pods.build()
    if duration_s is not None:
        keep = wl.submit_s < duration_s
        dropped = int((~keep).sum())
        if dropped:
            if not keep.any():
                raise ScenarioError(f"{path}: every pod is submitted at or after duration_s={duration_s}")
            wl = wl.subset(keep, dropped=dropped)
    return wl


def _first_bad_line(path: Path) -> int:
    """The number of the first line of ``path`` that is not UTF-8 (for an error message)."""
    with path.open("rb") as fh:
        for lineno, b in enumerate(fh, start=1):
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return 1


def _add_model_row(pods: PodBuilder, profiles: dict[str, int], path: Path, lineno: int, cells: dict[str, str]) -> None:
    """One row of a CSV with pod-model columns (see :func:`load_trace`)."""
    def where(col: str) -> str:
        return f"{path}: line {lineno}, column {col}"

    kind_s = cells.get("kind", "").lower() or "job"
    if kind_s not in KINDS:
        raise ScenarioError(f"{where('kind')}: {cells['kind']!r} is not one of {', '.join(KINDS)}")
    kind = KINDS.index(kind_s)
    d_cell = cells["duration_s"]
    if kind == SERVICE and d_cell.lower() in ("", "inf"):
        duration = math.inf  # a service the trace never stops runs until the scenario ends
    else:
        duration = _parse_cell(path, lineno, "duration_s", d_cell)
    submit = _parse_cell(path, lineno, "submit_s", cells["submit_s"])
    cpu = _parse_cell(path, lineno, "cpu_request_m", cells["cpu_request_m"])
    mem = _parse_cell(path, lineno, "memory_request_mib", cells["memory_request_mib"])
    usage = _parse_cell(path, lineno, "cpu_usage_m", cells["cpu_usage_m"])
    lim = {}
    for col, req in (("cpu_limit_m", cpu), ("memory_limit_mib", mem)):
        cell = cells.get(col, "")
        try:
            v = int(cell) if cell else NO_LIMIT
        except ValueError:
            raise ScenarioError(f"{where(col)}: {cell!r} is not an integer (leave it empty for no limit)") from None
        if cell and v < 0:
            raise ScenarioError(f"{where(col)}: {v} is negative")
        if v > MAX_QUANTITY:
            raise ScenarioError(f"{where(col)}: {v} is too large (more than 2^53)")
        if v != NO_LIMIT and req != NO_REQUEST and v < req:
            raise ScenarioError(f"{where(col)}: limit {v} is below the request {req} (Kubernetes refuses it)")
        lim[col] = v
    # As the apiserver does: a resource with a limit and no request is requested at its limit.
    if cpu == NO_REQUEST and lim["cpu_limit_m"] != NO_LIMIT:
        cpu = lim["cpu_limit_m"]
    if mem == NO_REQUEST and lim["memory_limit_mib"] != NO_LIMIT:
        mem = lim["memory_limit_mib"]
    prio_s = cells.get("priority", "")
    try:
        prio = int(prio_s) if prio_s else 0
    except ValueError:
        raise ScenarioError(f"{where('priority')}: {prio_s!r} is not an integer") from None
    if not -(2**31) <= prio < 2**31:
        raise ScenarioError(f"{where('priority')}: {prio} is outside the 32-bit range Kubernetes allows")
    prof_s = cells.get("usage_profile", "")
    profile = -1
    if prof_s:
        profile = profiles.get(prof_s, -1)
        if profile < 0:
            t, m = parse_profile(prof_s, where("usage_profile"), job=kind == JOB)
            profile = profiles[prof_s] = pods.add_profile(t, m)
    gpu, milli, spec = parse_gpu(cells.get("gpu_count", ""), cells.get("gpu_milli", ""), cells.get("gpu_spec", ""),
                                 where)
    pods.add(submit, duration, int(cpu), int(mem), usage, kind=kind, cpu_lim=int(lim["cpu_limit_m"]),
             mem_lim=int(lim["memory_limit_mib"]), priority=prio, owner=cells.get("owner_kind", ""),
             app=cells.get("app", ""), namespace=cells.get("namespace", "") or DEFAULT_NAMESPACE,
             slo=cells.get("slo_class", ""), profile=profile, gpu=gpu, gpu_milli=milli, gpu_spec=spec,
             name=cells.get("name", ""))


def parse_gpu(count_s: str, milli_s: str, spec_s: str, where) -> tuple[int, int, frozenset[str] | None]:
    """A pod's GPU cells: count (empty = 0), milli-GPU per GPU (empty = 1000; below 1000 a share of one GPU,
    at most 1000), allowed models ``A|B`` (empty = any). ``where(column)`` names the cell in an error."""
    try:
        count = int(count_s) if count_s else 0
    except ValueError:
        raise ScenarioError(f"{where('gpu_count')}: {count_s!r} is not an integer") from None
    if count < 0 or count > MAX_GPUS:
        raise ScenarioError(f"{where('gpu_count')}: {count} is not a GPU count (0..{MAX_GPUS})")
    try:
        milli = int(milli_s) if milli_s else GPU_MILLI
    except ValueError:
        raise ScenarioError(f"{where('gpu_milli')}: {milli_s!r} is not an integer (milli-GPU)") from None
    if count == 0:
        if milli_s and milli not in (0, GPU_MILLI) or spec_s:
            col = "gpu_spec" if spec_s else "gpu_milli"
            raise ScenarioError(f"{where(col)}: the pod asks for no GPU (gpu_count 0) but gives a {col}")
        return 0, GPU_MILLI, None
    if not 1 <= milli <= GPU_MILLI:
        raise ScenarioError(f"{where('gpu_milli')}: {milli} milli-GPU is outside 1..{GPU_MILLI} (a share of one "
                            f"GPU; {GPU_MILLI} is the whole GPU)")
    if count > 1 and milli != GPU_MILLI:
        raise ScenarioError(f"{where('gpu_milli')}: a share of {milli} milli-GPU is of one GPU, not {count}")
    models = frozenset(m.strip() for m in spec_s.split("|") if m.strip()) or None
    return count, milli, models


def parse_profile(text: str, where: str, *, job: bool) -> tuple[list[float], list[float]]:
    """``"t:m t:m ..."`` (seconds : millicores) -> breakpoints and values. A job's series starts at progress 0."""
    t: list[float] = []
    m: list[float] = []
    for k, tok in enumerate(text.split(), start=1):
        a, sep, b = tok.partition(":")
        try:
            x, v = float(a), float(b)
        except ValueError:
            raise ScenarioError(f"{where}: step {k} {tok!r} is not SECONDS:MILLICORES") from None
        if not sep or not (math.isfinite(x) and math.isfinite(v)) or v < 0:
            raise ScenarioError(f"{where}: step {k} {tok!r} is not SECONDS:MILLICORES with finite, non-negative "
                                "millicores")
        if v > MAX_CPU_M:
            raise ScenarioError(f"{where}: step {k} {tok!r} uses more than {MAX_CPU_M:,} millicores")
        if t and x <= t[-1]:
            raise ScenarioError(f"{where}: step {k} at {x} s does not come after the previous one at {t[-1]} s")
        t.append(x)
        m.append(v)
    if job and t[0] != 0.0:
        raise ScenarioError(f"{where}: a job's usage profile is in seconds of progress and must start at 0, "
                            f"not {t[0]}")
    return t, m


def write_trace(wl: Workload, dest: str | Path | TextIO) -> None:
    """Write ``wl`` as a trace CSV that :func:`load_trace` reads back to the same pods: to a file (atomically)
    or to an open text stream such as stdout. The pod model's optional columns are written only when some pod
    uses them, so a workload of plain jobs gives the same five-column file as before."""
    if not isinstance(dest, (str, Path)):
        _write_rows(wl, dest)
        return
    with atomic_path(dest) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        _write_rows(wl, fh)


def _model_columns(wl: Workload) -> list[str]:
    used = {"kind": (wl.kind != JOB).any(), "cpu_limit_m": (wl.cpu_lim >= 0).any(),
            "memory_limit_mib": (wl.mem_lim >= 0).any(), "priority": (wl.priority != 0).any(),
            "owner_kind": (wl.owner != 0).any(), "app": (wl.app != 0).any(), "namespace": (wl.namespace != 0).any(),
            "slo_class": (wl.slo != 0).any(), "usage_profile": (wl.profile >= 0).any(),
            "name": (wl.pod_name != 0).any(), "gpu_count": wl.has_gpus, "gpu_milli": wl.has_gpus,
            "gpu_spec": (wl.gpu_spec != 0).any()}
    return [c for c in OPTIONAL_COLUMNS if used[c]]


def _write_rows(wl: Workload, fh: TextIO) -> None:
    w = csv.writer(fh)
    extra = _model_columns(wl)
    w.writerow(TRACE_COLUMNS + tuple(extra))
    base = zip(wl.submit_s.tolist(), wl.duration_s.tolist(), wl.cpu_req.tolist(), wl.mem_req.tolist(),
               wl.usage_m.tolist())
    if not extra:
        for s, d, c, m, u in base:
            w.writerow((repr(s), repr(d), "" if c < 0 else c, "" if m < 0 else m, repr(u)))
        return
    prof_text: dict[int, str] = {}
    for i, (s, d, c, m, u) in enumerate(base):
        row = [repr(s), repr(d), "" if c < 0 else c, "" if m < 0 else m, repr(u)]
        for col in extra:
            if col == "kind":
                row.append(KINDS[wl.kind[i]])
            elif col == "cpu_limit_m":
                row.append("" if wl.cpu_lim[i] < 0 else int(wl.cpu_lim[i]))
            elif col == "memory_limit_mib":
                row.append("" if wl.mem_lim[i] < 0 else int(wl.mem_lim[i]))
            elif col == "priority":
                row.append(int(wl.priority[i]))
            elif col == "owner_kind":
                row.append(wl.owner_names[wl.owner[i]])
            elif col == "app":
                row.append(wl.app_names[wl.app[i]])
            elif col == "namespace":
                row.append(wl.namespace_names[wl.namespace[i]])
            elif col == "slo_class":
                row.append(wl.slo_names[wl.slo[i]])
            elif col == "name":
                row.append(wl.pod_names[wl.pod_name[i]])
            elif col == "gpu_count":
                row.append(int(wl.gpu[i]) or "")
            elif col == "gpu_milli":
                row.append(int(wl.gpu_milli[i]) if wl.gpu[i] else "")
            elif col == "gpu_spec":
                spec = wl.gpu_spec_table[wl.gpu_spec[i]]
                row.append("" if spec is None else "|".join(sorted(spec)))
            else:
                p = int(wl.profile[i])
                if p < 0:
                    row.append("")
                else:
                    if p not in prof_text:
                        a, b = int(wl.prof_ptr[p]), int(wl.prof_ptr[p + 1])
                        prof_text[p] = " ".join(f"{t!r}:{v!r}" for t, v in zip(wl.prof_t[a:b].tolist(),
                                                                                wl.prof_m[a:b].tolist()))
                    row.append(prof_text[p])
        w.writerow(row)


def _parse_cell(path: Path, lineno: int, col: str, cell: str) -> float:
    where = f"{path}: line {lineno}, column {col}"
    if col in ("cpu_request_m", "memory_request_mib"):
        if cell == "":
            return NO_REQUEST
        try:
            v = int(cell)
        except ValueError:
            raise ScenarioError(f"{where}: {cell!r} is not an integer (leave it empty for no request)") from None
        if v < 0:
            raise ScenarioError(f"{where}: {v} is negative")
        if v > MAX_QUANTITY:
            raise ScenarioError(f"{where}: {v} is too large (more than 2^53)")
        return v
    try:
        v = float(cell)
    except ValueError:
        raise ScenarioError(f"{where}: {cell!r} is not a number") from None
    if not math.isfinite(v):
        raise ScenarioError(f"{where}: {cell!r} is not finite")
    if col == "duration_s" and v <= 0:
        raise ScenarioError(f"{where}: duration must be > 0, got {v}")
    if v < 0:
        raise ScenarioError(f"{where}: {v} is negative")
    if col == "cpu_usage_m" and v > MAX_CPU_M:  # a million cores: 1e18 stretched a job to 1e16 s and hung the run
        raise ScenarioError(f"{where}: {cell} millicores is more than any node has (at most {MAX_CPU_M:,})")
    return v


def _arrivals(spec: Synthetic, horizon: float, rng: np.random.Generator) -> np.ndarray:
    """Submission times: bursts of geometric size (mean ``burst_mean``) at Poisson or diurnal epochs."""
    n = spec.pods
    mean_gap = spec.mean_interarrival_s * spec.burst_mean  # keeps the mean pod rate at 1/mean_interarrival_s
    n_epochs = int(math.ceil(n / spec.burst_mean)) + 16
    # Draw generously, then trim: a burst can overshoot n, and diurnal thinning rejects epochs.
    if spec.arrival == "poisson":
        epochs = np.cumsum(rng.exponential(mean_gap, size=n_epochs))
    else:
        # Thinning of a homogeneous process at the peak rate: rate(t) = base (1 + a sin(2 pi t / P)),
        # with a = (swing - 1) / (swing + 1) so that peak / trough = swing and the mean rate is base.
        a = (spec.diurnal_swing - 1.0) / (spec.diurnal_swing + 1.0)
        peak_gap = mean_gap / (1.0 + a)
        epochs_list: list[np.ndarray] = []
        t0, have = 0.0, 0
        while have < n_epochs:
            cand = t0 + np.cumsum(rng.exponential(peak_gap, size=2 * n_epochs))
            t0 = float(cand[-1])
            accept = rng.random(cand.size) < (1.0 + a * np.sin(2 * np.pi * cand / spec.diurnal_period_s)) / (1 + a)
            epochs_list.append(cand[accept])
            have += int(accept.sum())
            if t0 > horizon:
                break
        epochs = np.concatenate(epochs_list)[:n_epochs]
    if spec.burst_mean > 1.0:
        # (a burst beyond n pods is cut at n below anyway: capped first, so a huge burst_mean allocates n)
        sizes = np.minimum(rng.geometric(1.0 / spec.burst_mean, size=epochs.size), n)
        times = np.repeat(epochs, sizes)
    else:
        times = epochs
    times = times[:n]
    return times[times < horizon]


def synthesize(spec: Synthetic, horizon: float, seed: int) -> Workload:
    """Generate a workload from ``spec``; identical for identical (spec, horizon, seed)."""
    return _synthesize(spec, horizon, np.random.default_rng(seed))


def _synthesize(spec: Synthetic, horizon: float, rng: np.random.Generator,
                what: str = "workload.synthetic") -> Workload:
    submit = _arrivals(spec, horizon, rng)
    n = submit.size
    if n == 0:
        raise ScenarioError(f"{what}: no pod arrives before duration_s; lower mean_interarrival_s")
    max_d = spec.max_duration_s if spec.max_duration_s is not None else horizon
    dur = np.clip(spec.duration_median_s * np.exp(spec.duration_sigma * rng.standard_normal(n)),
                  spec.min_duration_s, max(max_d, spec.min_duration_s))
    cores = np.interp(rng.random(n), _CPU_Q, _CPU_CORES) * spec.cpu_scale
    g = spec.cpu_granularity_m
    cpu = np.maximum(g, np.round(cores * 1000.0 / g) * g).astype(np.int64)
    mem = cpu / 1000.0 * spec.memory_per_core_mib * np.exp(0.3 * rng.standard_normal(n))
    mem = np.maximum(64, np.round(mem / 64.0) * 64).astype(np.int64)
    lo, hi = spec.usage_fraction
    frac = rng.uniform(lo, hi, n) * np.exp(spec.usage_noise_sigma * rng.standard_normal(n))
    usage = np.maximum(1.0, cpu * frac)
    best_effort = rng.random(n) < spec.best_effort_fraction
    cpu[best_effort] = NO_REQUEST
    mem[best_effort] = NO_REQUEST
    # Metadata draws nothing from the stream, so the pods above are the same with or without it.
    return Workload(submit, dur, cpu, mem, usage, **_generator_meta(n, spec.owner_kind, spec.app, spec.namespace,
                                                                      spec.priority, spec.slo_class),
                    cpu_lim=_limits(cpu, spec.cpu_limit_factor), mem_lim=_limits(mem, spec.memory_limit_factor),
                    **_placement(n, spec))


def _placement(n: int, spec: PodPlacement) -> dict:
    """One generator's scheduling constraints, the same for all its ``n`` pods (none: the default columns)."""
    k = spec.constraints()
    return {} if k is None else {"placement": np.ones(n, dtype=np.int32), "placement_table": (None, k)}


def _limits(req: np.ndarray, factor: float | None) -> np.ndarray:
    if factor is None:
        return np.full(len(req), NO_LIMIT, dtype=np.int64)
    return np.where(req >= 0, np.ceil(req * factor), NO_LIMIT).astype(np.int64)


def _generator_meta(n: int, owner: str, app: str, namespace: str, priority: int, slo: str) -> dict:
    """One generator's metadata: the same for all its ``n`` pods."""
    out: dict = {"priority": np.full(n, priority, dtype=np.int32)}
    for col, table, default, value in (("owner", "owner_names", "", owner), ("app", "app_names", "", app),
                                       ("namespace", "namespace_names", DEFAULT_NAMESPACE, namespace),
                                       ("slo", "slo_names", "", slo)):
        if value != default:
            out[col] = np.ones(n, dtype=np.int32)
            out[table] = (default, value)
    return out


# ---- services ---------------------------------------------------------------------------------------------
def _shape_integral(u, t: np.ndarray) -> np.ndarray:
    """Integral from 0 to ``t`` of the usage shape (mean 1 over a period), with the peak at ``u.peak_s``."""
    if u.pattern == "constant":
        return t.astype(np.float64)
    p = u.period_s
    if u.pattern == "sinusoid":
        a = (u.swing - 1.0) / (u.swing + 1.0)  # peak / trough = (1 + a) / (1 - a) = swing
        w = 2.0 * math.pi / p
        return t + a / w * (np.sin(w * (t - u.peak_s)) - np.sin(w * (0.0 - u.peak_s)))
    # hourly: 24 levels at the hours (scaled to mean 1), linear in between, periodic.
    lv = np.asarray(u.hourly, dtype=np.float64)
    lv = lv / lv.mean()  # the mean of a periodic piecewise-linear curve is the mean of its knots
    knots = np.append(lv, lv[0])
    dh = p / 24.0
    cum = np.concatenate(([0.0], np.cumsum((knots[:-1] + knots[1:]) / 2.0 * dh)))  # cum[24] == p
    periods = np.floor(t / p)
    x = t - periods * p
    h = np.minimum((x // dh).astype(np.int64), 23)
    dx = x - h * dh
    return periods * p + cum[h] + knots[h] * dx + (knots[h + 1] - knots[h]) * dx * dx / (2.0 * dh)


def _step_means(u, starts: np.ndarray, ends: np.ndarray, shift: float) -> np.ndarray:
    """Exact mean of the shape over each step ``[starts, ends)``, the whole curve shifted by ``shift`` s."""
    return (_shape_integral(u, ends - shift) - _shape_integral(u, starts - shift)) / (ends - starts)


def generate_services(spec: Services, horizon: float, rng: np.random.Generator) -> Workload:
    """``spec.count`` services of ``spec.replicas`` pods (:class:`~joulesched.cluster.scenario.Services`).

    Each service's demand is piecewise constant on the absolute grid of ``usage.step_s`` (so all services
    change demand at the same instants), each step holding the exact mean of the curve over it times
    lognormal noise. Its replicas share one profile. With an autoscaler, replica slot ``r`` exists while the
    stabilised desired count exceeds ``r``: each stretch is one pod (a service pod with an end), and the last
    stretch of a slot still alive at the horizon is open-ended.
    """
    u, step, R = spec.usage, spec.usage.step_s, spec.replicas
    steps = spec.count * math.ceil(max(horizon - spec.start_s, 0.0) / step)
    if steps > MAX_SERVICE_STEPS:  # each service's demand is an array of its steps: refuse before allocating
        raise ScenarioError(f"workload.services {spec.name!r}: {spec.count} service(s) of usage.step_s {step:g} "
                            f"over duration_s {horizon:g} are {steps:.3g} demand steps, more than "
                            f"{MAX_SERVICE_STEPS:.0e} (raise usage.step_s)")
    pods = PodBuilder()
    meta = dict(kind=SERVICE, cpu_lim=NO_LIMIT if spec.cpu_limit_m is None else spec.cpu_limit_m,
                mem_lim=NO_LIMIT if spec.memory_limit_mib is None else spec.memory_limit_mib,
                priority=spec.priority, owner=spec.owner_kind, namespace=spec.namespace, slo=spec.slo_class)
    sig = u.service_sigma
    for j in range(spec.count):
        # A fixed number of draws per service, so that one service's parameters never shift another's.
        created = spec.start_s + (float(rng.uniform(0.0, spec.spread_s)) if spec.spread_s > 0 else 0.0)
        level = u.mean_fraction * math.exp(sig * float(rng.standard_normal()) - sig * sig / 2.0)
        shift = float(rng.normal(0.0, u.phase_jitter_s)) if u.phase_jitter_s > 0 else 0.0
        if created >= horizon:
            continue
        grid = np.arange(math.floor(created / step) + 1, math.ceil(horizon / step)) * step
        edges = np.concatenate(([created], grid[(grid > created) & (grid < horizon)], [horizon]))
        starts, ends = edges[:-1], edges[1:]
        noise = np.exp(u.noise_sigma * rng.standard_normal(len(starts)) - u.noise_sigma ** 2 / 2.0)
        per_replica = spec.cpu_m * level * _step_means(u, starts, ends, shift) * noise
        if spec.cpu_limit_m is not None:  # a replica uses no more than its limit (cap_at_limits), means included
            per_replica = np.minimum(per_replica, spec.cpu_limit_m)
        app = f"{spec.name}-{j}"
        a = spec.autoscale
        if a is None:
            prof = pods.add_profile(starts, per_replica)
            mean = float(np.dot(per_replica, ends - starts) / (horizon - created))
            for _ in range(R):
                pods.add(created, math.inf, spec.cpu_m, spec.memory_mib, mean, app=app, profile=prof, **meta)
            continue
        total = per_replica * R
        have = _autoscale(total, spec.cpu_m, R, a, step)
        per_pod = total / have
        if spec.cpu_limit_m is not None:  # the autoscaler saw the demand; each replica serves up to its limit
            per_pod = np.minimum(per_pod, spec.cpu_limit_m)
        prof = pods.add_profile(starts, per_pod)
        last = len(starts) - 1
        for r in range(int(have.max())):
            alive = np.concatenate(([False], have > r, [False])).astype(np.int8)
            d = np.diff(alive)
            for k0, k1 in zip(np.flatnonzero(d == 1).tolist(), (np.flatnonzero(d == -1) - 1).tolist()):
                s0, e0 = float(starts[k0]), float(ends[k1])
                life = slice(k0, k1 + 1)
                mean = float(np.dot(per_pod[life], ends[life] - starts[life]) / (e0 - s0))
                pods.add(s0, math.inf if k1 == last else e0 - s0, spec.cpu_m, spec.memory_mib, mean, app=app,
                         profile=prof, **meta)
    wl = pods.build()
    where = _placement(len(wl), spec)
    return replace(wl, **where) if where else wl


#: kube-controller-manager's --horizontal-pod-autoscaler-tolerance: no scaling while |ratio - 1| <= 0.1.
HPA_TOLERANCE = 0.1


def _autoscale(total: np.ndarray, cpu_m: int, replicas: int, a, step: float) -> np.ndarray:
    """Replicas per step under the HorizontalPodAutoscaler's rule (pkg/controller/podautoscaler): desired =
    ceil(current x utilisation / target) unless within the tolerance; scaling down only to the highest
    recommendation of the stabilisation window; clamped to [min, max]. Starts from ``replicas``."""
    lo = a.min_replicas
    hi = max(a.max_replicas if a.max_replicas is not None else replicas, lo)
    window = max(1, int(math.ceil(a.scale_down_delay_s / step)) + 1)  # recommendations within the window
    cur = min(max(replicas, lo), hi)
    recs: list[int] = []
    out = np.empty(len(total), dtype=np.float64)
    for k, demand in enumerate(total.tolist()):
        ratio = demand / (cur * a.target_fraction * cpu_m)
        desired = cur if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(ratio * cur - 1e-9)
        desired = min(max(desired, lo), hi)
        recs = (recs + [desired])[-window:]
        cur = desired if desired >= cur else min(cur, max(recs))
        out[k] = cur
    return out


# ---- scenarios --------------------------------------------------------------------------------------------
def build_workload(scenario: Scenario, seed: int | None = None, *, pod_model: bool = True) -> Workload:
    """The workload of ``scenario`` for run ``seed`` (default: the scenario's own seed).

    The original forms are built exactly as before (``synthetic`` from the seed, one ``trace`` read as it
    is). A mix draws its first job generator from the seed itself (so ``jobs: X`` is ``synthetic: X``), the
    others and the services from independent streams of it, and merges everything by submission time.

    The twin runs every workload (services and time-varying usage included); ``pod_model`` is accepted for the
    callers written while it did not, and changes nothing.
    """
    seed = scenario.seed if seed is None else seed
    spec, horizon = scenario.workload, scenario.duration_s
    if spec.synthetic is not None:
        wl = synthesize(spec.synthetic, horizon, seed)
    elif not spec.jobs and not spec.services and not spec.fitted and len(spec.traces) == 1:
        wl = load_trace(scenario.trace_paths[0], horizon)
    else:
        parts = [_synthesize(g, horizon, np.random.default_rng(seed if k == 0 else [seed, 1, k]),
                             what=f"workload.jobs.{k}") for k, g in enumerate(spec.jobs or [])]
        parts += [generate_services(sv, horizon, np.random.default_rng([seed, 2, k]))
                  for k, sv in enumerate(spec.services or [])]
        parts += [generate_fitted(f, path, horizon, np.random.default_rng([seed, 3, k]))
                  for k, (f, path) in enumerate(zip(spec.fitted or [], scenario.fit_paths))]
        # A trace listed twice adds its pods twice (twice its load), from one read of the file.
        traces = {p: load_trace(p, horizon) for p in dict.fromkeys(scenario.trace_paths)}
        parts += [traces[p] for p in scenario.trace_paths]
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ScenarioError(f"{scenario.source or scenario.name}: the workload has no pod before duration_s")
        wl = merge_workloads(parts)
    wl = cap_at_limits(wl)
    check_job_ends(scenario, wl)
    if wl.has_gpus:
        check_gpu_models(scenario, wl)
    return wl


def cap_at_limits(wl: Workload) -> Workload:
    """A container's CPU use stops at its limit (the kernel's CFS quota throttles it there): demand above a pod's
    CPU limit is cut to it, in its constant usage and in its profile's steps (a profile is cut where every pod
    that follows it has that one limit, as a service's replicas do; the service generator cuts its own, and keeps
    each pod's mean right). Every consumer of the workload (the twin, the bounds, the optimum) sees the cut
    demand. Without a limit, or with usage within it, the workload is returned as it was."""
    lim = wl.cpu_lim
    limited = lim > 0  # a limit of 0 sets no CFS quota (Kubernetes reads it as none, as qos_codes does)
    if not limited.any():
        return wl
    usage = wl.usage_m
    over = limited & (usage > lim)
    prof = wl.profile
    changes: dict = {}
    if over.any():
        changes["usage_m"] = np.where(over, lim, usage).astype(usage.dtype)
    if wl.prof_ptr is not None and (prof >= 0).any():
        prof_m = wl.prof_m
        for k in np.unique(prof[limited & (prof >= 0)]).tolist():
            users = lim[prof == k]
            a, b = int(wl.prof_ptr[k]), int(wl.prof_ptr[k + 1])
            if (users == users[0]).all() and (prof_m[a:b] > users[0]).any():
                if "prof_m" not in changes:
                    changes["prof_m"] = prof_m = prof_m.copy()
                np.minimum(prof_m[a:b], users[0], out=prof_m[a:b])
    return replace(wl, **changes) if changes else wl


#: A job may end at most this many times the scenario's duration_s after the start. The run lasts until its last
#: job ends, with hourly SLO ticks and (for the report) 240 timeline bins per duration_s, so a job of 1e15 s would
#: run for ever; the shipped scenarios' jobs end by 3x (real trace windows included).
MAX_JOB_END_FACTOR = 100


def _least_stretch(scenario: Scenario, wl: Workload) -> np.ndarray:
    """Per pod, the least factor a job's run is stretched by: alone on the largest node its requests fit, a
    demand above its cores runs at cores / demand (the twin's CPU share), segment by segment of a profile's
    progress; a pod that fits no node never runs (1)."""
    # The largest node each pod's requests fit (0: none, so it never runs and stretches nothing).
    cpu_req, mem_req = np.maximum(wl.cpu_req, 0), np.maximum(wl.mem_req, 0)
    cap = np.zeros(len(wl))
    for g in scenario.nodes:
        cap = np.where((cpu_req <= g.cpu_m) & (mem_req <= g.memory_mib), np.maximum(cap, float(g.cpu_m)), cap)
    runs = cap > 0
    stretch = np.where(runs, np.maximum(1.0, wl.usage_m / np.maximum(cap, 1.0)), 1.0)
    if wl.profile is not None:
        for k in np.flatnonzero((wl.profile >= 0) & (wl.kind == JOB) & runs).tolist():
            p = int(wl.profile[k])
            a, b = int(wl.prof_ptr[p]), int(wl.prof_ptr[p + 1])
            t = np.append(np.minimum(wl.prof_t[a:b], wl.duration_s[k]), wl.duration_s[k])
            stretch[k] = float(np.sum(np.diff(t) * np.maximum(1.0, wl.prof_m[a:b] / cap[k]))) / wl.duration_s[k]
    return stretch


def check_job_ends(scenario: Scenario, wl: Workload) -> None:
    """ScenarioError naming the first job that ends after :data:`MAX_JOB_END_FACTOR` x duration_s (services stop
    at duration_s, so they never lengthen a run), counting the least its demand stretches it (a review: a usage of
    1e18 millicores passed `validate`, then held `benchmark` for good)."""
    horizon = scenario.duration_s
    end = np.where(wl.kind == JOB, wl.submit_s + wl.duration_s * _least_stretch(scenario, wl), 0.0)
    bad = np.flatnonzero(~(end <= MAX_JOB_END_FACTOR * horizon))
    if bad.size:
        k = int(bad[0])
        raise ScenarioError(
            f"{scenario.source or scenario.name}: a job submitted at {wl.submit_s[k]:g} s runs at least "
            f"{end[k] - wl.submit_s[k]:g} s ({wl.duration_s[k]:g} s of work at its CPU demand), ending more than "
            f"{MAX_JOB_END_FACTOR} x duration_s ({horizon:g} s) after the start ({bad.size} such job(s)): the run "
            "would last until it ends. Lengthen duration_s, or drop or shorten such jobs")


def generate_fitted(spec: Fitted, path: Path, horizon: float, rng: np.random.Generator) -> Workload:
    """The pods of one ``fitted`` generator (cluster/fitted.py): the fit at ``path``, drawn until ``horizon``."""
    fit = load_fit(path)
    try:
        t, which, life = draw_fitted(spec, fit, horizon, rng)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None
    pods = PodBuilder()
    apps = fit["apps"]
    for ti, k, li in zip(t.tolist(), which.tolist(), life.tolist()):
        a = apps[k]
        cpu, mem, gpu = int(a["cpu_m"]), int(a["memory_mib"]), int(a.get("gpu_count") or 0)
        frac = a.get("usage_fraction")
        usage = cpu * float(frac) if frac is not None and cpu > 0 else float(a.get("usage_m") or 1.0)
        models = frozenset(a["gpu_spec"].split("|")) if gpu and a.get("gpu_spec") else None
        pods.add(ti, li, cpu, mem, max(usage, 1.0), kind=KINDS.index(a["kind"]), app=str(a["name"]),
                 slo=str(a.get("slo_class") or ""), gpu=gpu,
                 gpu_milli=int(a.get("gpu_milli") or GPU_MILLI) if gpu else GPU_MILLI, gpu_spec=models)
    return pods.build()


def check_gpu_models(scenario: Scenario, wl: Workload) -> None:
    """Every GPU pod has a node group with GPUs of a model it allows (ScenarioError naming the first pod that
    has none: a typo in a model, or a trace imported for another cluster)."""
    have = {g.gpu_model for g in scenario.nodes if g.gpu_count}
    where = scenario.source or scenario.name
    gpu_pods = np.flatnonzero(wl.gpu > 0)
    if not have:
        raise ScenarioError(f"{where}: pod {wl.name_of(int(gpu_pods[0]))} asks for GPUs but no node group has "
                            "any (give the groups gpu_count and gpu_model)")
    for code, spec in enumerate(wl.gpu_spec_table):
        if spec is None or spec & have:
            continue
        pods = gpu_pods[wl.gpu_spec[gpu_pods] == code]
        if len(pods):
            raise ScenarioError(f"{where}: pod {wl.name_of(int(pods[0]))} allows GPU model(s) "
                                f"{', '.join(sorted(spec))}, which no node group has (their models: "
                                f"{', '.join(sorted(have)) or 'none'})")
