"""The optimum as a teacher: labels from the MIP's best schedule of the very episode a learner runs (issue 27).

``optimum`` solves agent/optimum.py's MIP for the twin's cluster and workload when it is attached (an offline
computation on the episode's whole future: a training label, never something a deployed policy could do) and
answers each decision with the node that schedule gives the pod. When the run leaves the schedule (a learner
exploring, or acting on its own), the rest is re-solved with the past held as the run made it, up to
``resolve`` times per episode at ``resolve_s`` seconds each (DAgger's relabelling with the optimum as the
expert, Ross et al. 2011); after that the last schedule is followed where its node is feasible. Where the MIP
cannot state an instance (services, usage profiles, GPUs, more than :data:`~joulesched.agent.optimum.MIP_MAX_NODES`
nodes or :data:`~joulesched.agent.optimum.MIP_MAX_PODS` pods, a pod no node fits without overload) or finds no
schedule in time, and on a decision its schedule cannot answer (a queued pod, an infeasible node), it decides as
``clairvoyant`` does (exact lifetimes): the next best known teacher. :meth:`accepts` lets a teacher pool
(agent/train.py) leave it out of episodes it cannot solve.

Schedules are cached per process and, with ``cache=DIR``, on disk (one JSON file per cluster, workload and time
limit, written through a temporary file and renamed): a training run draws the same workload many times.

Family ``clairvoyant``: twin only, in no "best heuristic" comparison, not in the default policy set.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from joulesched.agent.baselines import _float_opt, _int_opt
from joulesched.agent.clairvoyant import Clairvoyant
from joulesched.agent.policy import PolicyError
from joulesched.agent.runner import Pinned
from joulesched.cluster.state import ASLEEP, ClusterState, PodRequest

#: Bumped when the MIP or the key changes what a cached schedule means.
CACHE_VERSION = 2  # 2: statuses certified (6d04c96), instant-wake warm starts (ff4a862)
_PLANS: dict[str, dict[int, int] | None] = {}  # per process: key -> the schedule (None: the MIP found none)
_SIZED = False  # this process's HiGHS scheduler has one thread (a teacher runs inside one training worker)


def _one_thread() -> None:
    global _SIZED
    if not _SIZED:
        from joulesched.agent.optimum import _highs_threads

        _highs_threads(1)
        _SIZED = True


def _workload_key(twin, time_limit: float) -> str:
    wl = twin.workload
    h = hashlib.sha256()
    h.update(f"{CACHE_VERSION}|{time_limit!r}|".encode())
    h.update(twin.scenario.model_dump_json().encode())
    for a in (wl.submit_s, wl.duration_s, wl.cpu_req, wl.mem_req, wl.usage_m, wl.kind, wl.profile):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class OptimumTeacher(Clairvoyant):
    """The MIP's best schedule of the episode as labels (twin only; a training teacher, never deployable).

    :param time_limit: seconds for the MIP of the whole episode (default 10).
    :param resolve: re-solves with the past held, per episode, when the run leaves the schedule (default 0).
    :param resolve_s: seconds for each re-solve (default 5).
    :param cache: a directory for solved schedules (default: none, a per-process cache only).
    """

    name = "optimum"

    def __init__(self, time_limit: str | float = "10", resolve: str | int = "0", resolve_s: str | float = "5",
                 cache: str = "") -> None:
        super().__init__()
        self.time_limit = _float_opt(self.name, "time_limit", str(time_limit), 0.0, math.inf)
        self.resolve = _int_opt(self.name, "resolve", str(resolve), 0, 1_000_000)
        self.resolve_s = _float_opt(self.name, "resolve_s", str(resolve_s), 0.0, math.inf)
        self.cache = Path(cache) if cache else None
        if self.cache is not None and self.cache.exists() and not self.cache.is_dir():
            raise PolicyError(f"policy 'optimum': option cache={cache} is a file; it names a folder for the solved "
                              "schedules (made when missing)")
        self._inst = None
        self._plan: dict[int, int] | None = None
        self._prev = -1  # the pod of the previous decision, checked against the schedule at the next one
        self._twins: frozenset[int] = frozenset()  # the nodes interchangeable with the previous label when given
        self._used: set[int] = set()  # nodes that have held a pod in this run
        self._left = 0
        self.stats = {"labels": 0, "fallbacks": 0, "resolves": 0, "resolve_failures": 0, "left_schedule": 0}

    # ---- which episodes it can teach ----------------------------------------------------------------------
    @staticmethod
    def _instance(twin):
        """The MIP's instance of the twin's episode, or None where the model cannot state it."""
        from joulesched.agent.optimum import MIP_MAX_NODES, MIP_MAX_PODS, OptimumError, instance

        if twin.scenario.node_count > MIP_MAX_NODES:
            return None
        try:
            inst = instance(twin.scenario, workload=twin.workload)
        except OptimumError:
            return None
        if inst.pods > MIP_MAX_PODS or inst.has_gpus:
            return None
        return inst

    def accepts(self, twin) -> bool:
        """Whether the MIP can state the twin's episode (a teacher pool leaves this teacher out where not)."""
        return self._instance(twin) is not None

    # ---- the schedule ---------------------------------------------------------------------------------------
    def attach(self, backend: object) -> None:
        super().attach(backend)
        self._inst = self._instance(backend)
        self._plan, self._prev, self._left, self._twins, self._used = None, -1, self.resolve, frozenset(), set()
        if self._inst is not None:
            plan = self._solved(backend)
            self._plan = None if plan is None else dict(plan)  # swaps and re-solves must not touch the cache

    def detach(self, backend: object) -> None:
        super().detach(backend)
        self._inst = self._plan = None

    def _solved(self, twin) -> dict[int, int] | None:
        key = _workload_key(twin, self.time_limit)
        if key in _PLANS:
            return _PLANS[key]
        path = self.cache / f"{key}.json" if self.cache is not None else None
        if path is not None and path.is_file():
            try:
                doc = json.loads(path.read_text())
                plan = None if doc["assignment"] is None else {int(k): int(v) for k, v in doc["assignment"].items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise PolicyError(f"policy 'optimum': cached schedule {path} is unreadable ({e}); delete it") from None
        else:
            from joulesched.agent.optimum import solve

            _one_thread()
            r = solve(self._inst, time_limit=self.time_limit, threads=1, with_bounds=False)
            plan = dict(r.assignment) if r.assignment else None
            if path is not None:
                from joulesched.core.fsio import atomic_write_text

                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise PolicyError(f"policy 'optimum': cannot make the cache folder {path.parent}: "
                                      f"{e.strerror or e}") from None
                atomic_write_text(path, json.dumps({
                    "scenario": twin.scenario.name, "time_limit": self.time_limit, "status": r.status,
                    "energy_joules": r.energy_joules, "assignment": None if plan is None else
                    {str(k): v for k, v in sorted(plan.items())}}))
        _PLANS[key] = plan
        return plan

    def _equivalent(self, state: ClusterState, node: int) -> np.ndarray:
        """The nodes interchangeable with ``node`` now (itself included, ascending): the same kind of node, no pod
        bound, and the same future if left alone: never used yet (all awake from the start, asleep after
        ``sleep_after_s``), both asleep, or both awake on a cluster where nodes never sleep. A learner's network
        sees the same row for each, so the schedule's choice among them is no label to learn."""
        kinds = self._inst.kinds
        same = np.flatnonzero((kinds == kinds[node]) & (state.pods == 0))
        if state.pods[node] != 0 or same.size < 2:
            return np.array([node])
        if node not in self._used:
            return same[[int(i) not in self._used for i in same]]
        ps = state.power_state
        if ps[node] == ASLEEP or not state.can_sleep:
            return same[(ps[same] == ps[node]) & np.array([int(i) in self._used for i in same])]
        return np.array([node])

    def _swap(self, a: int, b: int) -> None:
        """Exchange the futures of interchangeable nodes ``a`` and ``b`` in the schedule (pods not yet bound)."""
        tw = self._twin
        for q, n in self._plan.items():
            if tw.pod_node[q] < 0 and n in (a, b):
                self._plan[q] = b if n == a else a

    def _on_schedule(self) -> bool:
        """Whether the previous decision followed the schedule (re-solving from the run's past if not)."""
        tw, p = self._twin, self._prev
        if p >= 0 and tw.pod_node[p] >= 0:
            self._used.add(int(tw.pod_node[p]))
        if p < 0 or self._plan is None or p not in self._plan or tw.pod_node[p] == self._plan[p]:
            return self._plan is not None
        actual = int(tw.pod_node[p])
        if actual in self._twins:  # an interchangeable node: the same schedule with the two nodes' futures swapped
            self._swap(self._plan[p], actual)
            self._plan[p] = actual
            return True
        self.stats["left_schedule"] += 1
        if self._left <= 0:
            return True  # the budget is spent: follow the last schedule where it can be followed
        self._left -= 1
        self.stats["resolves"] += 1
        past = self._past()
        hint = None if past is None else self._continued(past)
        rest = None
        if hint is not None:
            from joulesched.agent.optimum import solve_rest

            _one_thread()
            rest = solve_rest(self._inst, past, hint, time_limit=self.resolve_s)
        if rest is None:
            self.stats["resolve_failures"] += 1
            return True
        self._plan = rest
        return True

    def _past(self) -> dict[int, tuple[int, float | None]] | None:
        """Every modelled pod the run has bound: its node and start (None while its node wakes), or None when one
        was queued (bound after its arrival: a start the model cannot state)."""
        from joulesched.agent.optimum import TOL

        tw, inst = self._twin, self._inst
        out: dict[int, tuple[int, float | None]] = {}
        for k, pod in enumerate(inst.pod.tolist()):
            node = tw.pod_node[pod]
            if node < 0:
                continue
            if abs(tw.pod_bind[pod] - inst.a[k]) > TOL:
                return None
            start = tw.pod_start[pod]
            out[pod] = (int(node), None if math.isnan(start) else float(start))
        return out

    def _continued(self, past: dict[int, tuple[int, float | None]]):
        """The run's past continued to the end in a twin of its own, by the last schedule where its node is
        feasible and as ``clairvoyant`` elsewhere: a whole schedule to start the re-solve from, or None when that
        continuation leaves the model's class or the run's past."""
        from joulesched.agent.optimum import twin_schedule

        # The run's past where it put it, then the old schedule where feasible, then clairvoyant: the start.
        pins = {**(self._plan or {}), **{p: node for p, (node, _) in past.items()}}
        sched = twin_schedule(self._inst, Pinned(pins, Clairvoyant()))
        if sched is None or any(sched.assignment[p] != n for p, (n, _) in past.items()):
            return None
        return sched

    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray) -> int:
        if self._twin is None:
            raise PolicyError("policy 'optimum' was not attached to a twin (run it with run_policy)")
        p = self._twin.deciding_pod()[0]
        on = self._on_schedule()
        self._twins = frozenset()
        if on:
            node = self._plan.get(p, -1)
            self._prev = p
            if 0 <= node < len(mask) and mask[node]:
                # Among interchangeable nodes the label is the lowest index, as a network's tie goes; the
                # schedule follows it (the two nodes' futures swapped).
                eq = self._equivalent(state, node)
                self._twins = frozenset(int(i) for i in eq)
                label = int(eq[0])
                if label != node:
                    self._swap(node, label)
                self.stats["labels"] += 1
                return label
        self._prev = p
        self.stats["fallbacks"] += 1
        return super().choose(state, pod, mask)
