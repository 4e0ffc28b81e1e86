"""A Lagrangian bound on the optimum: the pods' "placed exactly once" rows priced out, one node at a time.

The MIP (agent/optimum.py) couples its nodes only through those rows (and through symmetry rows among
identical nodes, valid cuts that may be dropped). Pricing pod ``p`` at ``lam[p]`` and dropping the coupling
leaves one independent problem per node: choose which pods to run, when to wake and sleep, at energy less the
prices of the pods taken. For any prices,

    L(lam) = sum_p lam[p] + sum_nodes min_node (energy - sum of the prices it takes)  <=  the optimum,

and identical nodes share one such problem. Each node's problem is solved as an integer program (its awake
state whole, not the fractional awake share the LP relaxation lets the nodes of a sleeping cluster have); the
best ``L`` over all prices is at least the LP relaxation without the symmetry rows (the LP's own duals, which
include them, can give less: measured in docs/PERFORMANCE.md), and subgradient steps look for it.
Where a node's problem is not solved to optimality its proven dual bound stands in: ``L`` stays a valid bound.
This is a Dantzig-Wolfe bound (docs/optimum.md, "The Lagrangian bound"); it holds for the MIP's class of runs
(every pod bound on arrival, no node overloaded), as the MIP's own bound does.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from joulesched.agent.optimum import Instance, _build, _Built, _Infeasible, _ipm_or_simplex


@dataclass
class LagrangianBound:
    joules: float  # the best L(lam) found (NaN if no node problem was solved)
    lp_joules: float  # the LP relaxation the prices started from (NaN if it was not solved)
    iterations: int  # evaluations of L
    kinds: int  # distinct node problems per evaluation
    wall_s: float
    status: str  # "optimal": L met the upper bound; "time_limit"; "converged": the step shrank to nothing;
    # "infeasible": the MIP has no schedule (a pod overloads every node it fits)
    history: list[float] = field(default_factory=list)


def node_instance(inst: Instance, node: int) -> Instance:
    """``inst`` with only ``node`` (every pod kept, so the check grid and the run's end are the full model's)."""
    sl = slice(node, node + 1)
    per_node = dict(cap=inst.cap[sl], mem=inst.mem[sl], slots=inst.slots[sl], curves=inst.curves[sl],
                    sleep_w=inst.sleep_w[sl], kinds=inst.kinds[sl], gpu=inst.gpu[sl],
                    gpu_model=inst.gpu_model[node:node + 1], gpu_curves=inst.gpu_curves[sl],
                    never_sleep=None if inst.never_sleep is None else inst.never_sleep[sl])
    return dataclasses.replace(inst, **per_node)


class _NodeProblem:
    """One kind's node model, built once; re-solved under new prices by changing its assignment costs."""

    def __init__(self, inst: Instance, node: int, count: int):
        self.count = count
        self.built: _Built = _build(node_instance(inst, node), partial=True)
        M = self.built.model
        self.base = np.asarray(M.cost, dtype=np.float64)
        self.pod_of = np.array([p for (p, _, _) in self.built.y], dtype=np.int64)
        self.cols = np.array(list(self.built.y.values()), dtype=np.int64)
        self.h = M.highs(integral=True, time_limit=60.0, threads=None, gap=1e-7)

    def solve(self, lam: np.ndarray, time_limit: float) -> tuple[float, np.ndarray]:
        """(a proven lower bound of the node's min under ``lam``, the pods its best schedule takes as 0/1)."""
        import highspy

        cost = self.base.copy()
        cost[self.cols] -= lam[self.pod_of]
        self.h.changeColsCost(len(self.cols), self.cols.astype(np.int32), cost[self.cols])
        self.h.setOptionValue("time_limit", max(0.05, float(time_limit)))
        self.h.run()
        info = self.h.getInfo()
        status = self.h.getModelStatus()
        took = np.zeros(len(lam))
        # The proven dual bound, optimal or not: "optimal" allows HiGHS's relative and absolute gaps.
        bound = float(info.mip_dual_bound) if status != highspy.HighsModelStatus.kInfeasible else math.nan
        if info.primal_solution_status == 2:  # a feasible schedule: the subgradient's direction
            x = np.asarray(self.h.getSolution().col_value)
            np.add.at(took, self.pod_of, x[self.cols])
        return bound, np.round(took)


def lagrangian_bound(inst: Instance, *, time_limit: float = 60.0, upper: float | None = None,
                     lam0: np.ndarray | None = None, node_limit: float = 10.0) -> LagrangianBound:
    """The best ``L(lam)`` found in ``time_limit`` seconds: prices from the LP relaxation's duals (or ``lam0``),
    then subgradient steps toward ``upper`` (the best schedule's energy; without it, 5 % above L), Polyak's
    step with its factor halved after five steps without progress."""
    import highspy

    t0 = time.perf_counter()
    deadline = t0 + time_limit
    P = inst.pods
    try:
        full = _build(inst, partial=False)  # the LP's model, and whether there is a schedule at all
    except _Infeasible:  # a pod that overloads every node it fits: the MIP has no schedule to bound
        return LagrangianBound(math.nan, math.nan, 0, 0, time.perf_counter() - t0, "infeasible")
    lp = math.nan
    if lam0 is None:
        h = full.model.highs(integral=False, time_limit=max(1.0, time_limit / 3), threads=None, gap=1e-6)
        if _ipm_or_simplex(h) == highspy.HighsModelStatus.kOptimal:
            lp = float(h.getInfo().objective_function_value)
            lam = np.asarray(h.getSolution().row_dual[:P], dtype=np.float64)
        else:
            lam = np.zeros(P)
    else:
        lam = np.asarray(lam0, dtype=np.float64).copy()
    reps: dict[int, list[int]] = {}
    for i, k in enumerate(inst.kinds.tolist()):
        reps.setdefault(k, []).append(i)
    probs = [_NodeProblem(inst, nodes[0], len(nodes)) for nodes in reps.values()]
    best, hist, it, theta, stall = -math.inf, [], 0, 1.0, 0
    status = "time_limit"
    while time.perf_counter() < deadline:
        L, took, ok = float(lam.sum()), np.zeros(P), True
        for pr in probs:
            left = deadline - time.perf_counter()
            if left <= 0:
                ok = False
                break
            v, x = pr.solve(lam, min(node_limit, left))
            if not math.isfinite(v):
                ok = False
                break
            L += pr.count * v
            took += pr.count * x
        if not ok:
            break
        it += 1
        hist.append(L)
        if L > best + 1e-9 * abs(L):
            best, stall = L, 0
        else:
            stall += 1
            if stall >= 5:
                theta, stall = theta / 2, 0
        target = upper if upper is not None else best * 1.05
        if target - best <= 1e-6 * abs(target):
            status = "optimal"
            break
        g = 1.0 - took
        gn = float(g @ g)
        if gn == 0.0 or theta < 1e-4:
            status = "converged"
            break
        lam = lam + theta * (target - L) / gn * g
    return LagrangianBound(best if math.isfinite(best) else math.nan, lp, it, len(probs),
                           time.perf_counter() - t0, status, hist)
