"""The optimum's MIP (agent/optimum.py, ``_Model``) solved with OR-Tools' CP-SAT, with a bound that stays valid.

CP-SAT solves integer programs only. Handed a MIP (its MPModel route), it multiplies every continuous variable
by ``mip_var_scaling`` (1 by default) and makes it an integer: that is a *restriction* of the model, whose
optimum and proven bound can be above the true optimum (and on this model, whose demand splits and awake
times are fractional, often infeasible). So the model is converted here into an integer program that is a
**relaxation** of it, up to a known error ``eps``:

* a continuous variable ``x`` becomes ``q X`` with ``X`` an integer and ``q`` a power of two (``BITS`` steps
  across its range); a continuous variable that an equality row with integer data pins to an integer (the
  first-use counts) stays exact, as do the integer variables;
* each row is multiplied by a power of two ``S`` and its coefficients rounded to integers; its bounds are then
  moved outwards by ``sum |A - S a q| max|X| + S sum_continuous |a| q / 2``, which is at least how far rounding
  the coefficients and putting each continuous variable on its nearest grid point can move the row's activity.
  So every feasible point of the model, each continuous variable rounded to its grid, is feasible here;
* the objective is scaled likewise (``S_o``, integer coefficients ``C``) and ``eps`` (joules) is the most its
  value at such a rounded point can fall below the model's objective at the original one.

Hence ``best_objective_bound / S_o + offset - eps`` is a lower bound of the model's optimum (CP-SAT is exact on
integer programs). A schedule CP-SAT returns is only its binary choices: the caller prices them in the exact
model (HiGHS, the pods' placement binaries fixed) and the twin replays them; CP-SAT's own objective value is
never reported.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

BITS = 22  # grid steps across a continuous variable's range: 2**BITS
ROW_BITS = 24  # a row's scale puts its smallest coefficient at least this many bits above 1
ACT = 2.0 ** 56  # the most |activity| a row or the objective may reach (CP-SAT refuses possible overflow at 2**62)


@dataclass
class CpSatRun:
    status: str  # optimal | feasible | infeasible | unknown (CP-SAT's, on the relaxation)
    x: np.ndarray | None  # the model's variables at CP-SAT's best point (integers exact, continuous on the grid)
    bound: float | None  # a valid lower bound of the model's objective (joules), eps already taken off
    eps: float  # the conversion's objective error bound
    wall_s: float
    branches: int


def _pow2_floor(x: np.ndarray) -> np.ndarray:
    """The largest power of two at most ``x`` (> 0), elementwise."""
    return np.ldexp(1.0, np.frexp(x)[1] - 1)


def _frac_bits(x: np.ndarray) -> np.ndarray:
    """Per float, the smallest k with x * 2**k an integer (0 for integers and zeros)."""
    m, e = np.frexp(np.abs(x))  # x = m 2**e, m in [0.5, 1)
    mant = np.ldexp(m, 53).astype(np.int64)  # x = mant 2**(e - 53), mant < 2**53
    low = mant & -mant
    tz = np.where(mant > 0, np.log2(np.maximum(low, 1)).astype(np.int64), 0)
    return np.where(mant > 0, np.maximum(0, 53 - e - tz), 0)


class _Converted:
    """The integer relaxation of a ``_Model`` (module docstring), as arrays ready for a CpModel."""

    def __init__(self, M) -> None:
        lb = np.asarray(M.lb, dtype=np.float64)
        ub = np.asarray(M.ub, dtype=np.float64)
        cost = np.asarray(M.cost, dtype=np.float64)
        isint = np.asarray(M.integer, dtype=bool)
        n, m = len(lb), len(M.rlo)
        if not (np.isfinite(lb).all() and np.isfinite(ub).all()):
            raise ValueError("CP-SAT needs every variable bounded; column "
                             f"{int(np.flatnonzero(~(np.isfinite(lb) & np.isfinite(ub)))[0])} is not")
        rows, cols, vals = M.entries(by_row=True)
        keep = vals != 0.0
        rows, cols, vals = rows[keep], cols[keep], vals[keep]
        rlo = np.asarray(M.rlo, dtype=np.float64)
        rhi = np.asarray(M.rhi, dtype=np.float64)
        start = np.searchsorted(rows, np.arange(m + 1))
        isint = isint | _implied_integers(isint, lb, ub, rows, cols, vals, rlo, rhi, start)
        # Grid: integers exact (q = 1); a continuous variable gets 2**BITS steps across its range.
        span = np.maximum(ub - lb, np.maximum(np.abs(lb), np.abs(ub)) * 2.0 ** -30)
        span = np.where(span > 0, span, 1.0)
        q = np.where(isint, 1.0, _pow2_floor(span) * 2.0 ** -BITS)
        xlo = np.where(isint, np.ceil(lb - 1e-9), np.floor(lb / q))
        xhi = np.where(isint, np.floor(ub + 1e-9), np.ceil(ub / q))
        big = np.maximum(np.abs(xlo), np.abs(xhi))
        self.q, self.xlo, self.xhi, self.isint = q, xlo.astype(np.int64), xhi.astype(np.int64), isint
        self.n = n
        # Rows.
        e = vals * q[cols]  # the coefficient of X
        ae = np.abs(e)
        logmin = np.full(m, 0, dtype=np.int64)
        act = np.zeros(m)
        if e.size:
            np.minimum.at(lmin := np.full(m, np.inf), rows, ae)
            logmin = np.where(np.isfinite(lmin), np.frexp(np.where(np.isfinite(lmin), lmin, 1.0))[1] - 1, 0)
            np.add.at(act, rows, ae * big[cols])
        bnd = np.where(np.isfinite(rlo), np.abs(rlo), 0.0)
        bnd = np.maximum(bnd, np.where(np.isfinite(rhi), np.abs(rhi), 0.0))
        k_prec = ROW_BITS - logmin
        k_cap = np.floor(math.log2(ACT) - np.log2(np.maximum(np.maximum(act, bnd), 2.0 ** -60))).astype(np.int64)
        fb = np.zeros(m, dtype=np.int64)
        if e.size:
            np.maximum.at(fb, rows, _frac_bits(e))
        for b in (rlo, rhi):
            fb = np.maximum(fb, np.where(np.isfinite(b), _frac_bits(np.where(np.isfinite(b), b, 0.0)), 0))
        exact = fb <= k_cap
        k = np.where(exact, fb, np.minimum(k_prec, k_cap))
        S = np.ldexp(1.0, k)
        se = e * S[rows]
        A = np.rint(se)
        err = np.zeros(m)
        np.add.at(err, rows, np.abs(A - se) * big[cols] + np.where(isint[cols], 0.0, 0.5 * np.abs(se)))
        err = np.where(err > 0, np.ceil(err * (1 + 1e-9) + 1e-9), 0.0)
        self.lo = np.where(np.isfinite(rlo), np.floor(rlo * S) - err, -math.inf)
        self.hi = np.where(np.isfinite(rhi), np.ceil(rhi * S) + err, math.inf)
        self.start, self.cols, self.A = start, cols, A.astype(np.int64)
        # Objective: one scale, as fine as the overflow budget allows; eps bounds its error (joules).
        ce = cost * q
        oact = float(np.sum(np.abs(ce) * big))
        ofb = int(_frac_bits(ce).max()) if n else 0
        ko = int(math.floor(math.log2(ACT / oact))) if oact > 0 else 0
        ko = min(ko, ofb)
        self.So = math.ldexp(1.0, ko)
        sc = ce * self.So
        C = np.rint(sc)
        self.C = C.astype(np.int64)
        self.eps = float(np.sum(np.abs(C - sc) * big + np.where(isint, 0.0, 0.5 * np.abs(sc)))) / self.So
        self.eps = self.eps * (1 + 1e-9) + 1e-9 * float(np.sum(np.abs(cost) * np.maximum(np.abs(lb), np.abs(ub))))
        self.offset = float(M.offset)

    def to_grid(self, x: np.ndarray) -> np.ndarray:
        """A point of the model on the grid (the hint): each variable rounded, clipped to its domain."""
        X = np.rint(np.asarray(x, dtype=np.float64) / self.q)
        return np.clip(X, self.xlo, self.xhi).astype(np.int64)

    def cp_model(self):
        from ortools.sat.python import cp_model

        model = cp_model.CpModel()
        p = model.proto
        for lo_, hi_ in zip(self.xlo.tolist(), self.xhi.tolist()):
            p.variables.add().domain.extend([lo_, hi_])
        lim = int(ACT) * 4  # beyond any activity: the same as no bound
        start, cols, A = self.start.tolist(), self.cols.tolist(), self.A.tolist()
        lo = [max(-lim, int(v)) if math.isfinite(v) else -lim for v in self.lo.tolist()]
        hi = [min(lim, int(v)) if math.isfinite(v) else lim for v in self.hi.tolist()]
        for r in range(len(lo)):
            s, t = start[r], start[r + 1]
            if s == t:
                continue
            lin = p.constraints.add().linear
            lin.vars.extend(cols[s:t])
            lin.coeffs.extend(A[s:t])
            lin.domain.extend([lo[r], hi[r]])
        nz = np.flatnonzero(self.C)
        p.objective.vars.extend(nz.tolist())
        p.objective.coeffs.extend(self.C[nz].tolist())
        return model


def _implied_integers(isint, lb, ub, rows, cols, vals, rlo, rhi, start) -> np.ndarray:
    """Continuous variables that an equality row with integer data (integer coefficients on integer variables,
    +-1 on the one continuous variable, an integer right-hand side) makes integer in every feasible point: one
    pass in row order, so a chain (each count defined from the one before) is found."""
    known = isint.copy()
    out = np.zeros_like(isint)
    eq = np.flatnonzero((rlo == rhi) & np.isfinite(rlo) & (rlo == np.round(rlo)))
    for r in eq.tolist():
        s, t = int(start[r]), int(start[r + 1])
        c, v = cols[s:t], vals[s:t]
        cont = ~known[c]
        if cont.sum() != 1 or abs(v[cont][0]) != 1.0 or not np.all(v[~cont] == np.round(v[~cont])):
            continue
        j = int(c[cont][0])
        known[j] = out[j] = True
    return out


def solve_cpsat(M, *, time_limit: float, threads: int, gap: float, hint: np.ndarray | None = None) -> CpSatRun:
    """Solve ``M`` (a ``_Model``) with CP-SAT on its integer relaxation; ``hint``: a full point of the model
    (the warm start, priced) given to CP-SAT as its solution hint.

    CP-SAT runs in a child process: OR-Tools' wheel ships its own ``libhighs.so.1``, and the dynamic loader keeps
    whichever of it and highspy's (another HiGHS version, the same soname) was loaded first, so the two cannot
    live in one process (the second import fails on a missing symbol)."""
    import pickle
    import subprocess
    import sys

    t0 = time.perf_counter()
    cv = _Converted(M)
    X = cv.to_grid(hint) if hint is not None else None
    budget = max(0.5, float(time_limit) - (time.perf_counter() - t0))
    payload = pickle.dumps((cv, X, budget, max(1, int(threads)), float(gap)), protocol=pickle.HIGHEST_PROTOCOL)
    cmd = [sys.executable, "-c", "from joulesched.agent.optimum_cpsat import _child; _child()"]
    got = None
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        try:
            # CP-SAT stops at its own limit; the slack covers the child's imports and model building.
            out, _ = proc.communicate(payload, timeout=budget + 15.0)
        except subprocess.TimeoutExpired:
            out = None
        except BaseException:  # an interrupt or error here: never leave CP-SAT running behind
            proc.kill()
            proc.wait()
            raise
        if out is None:
            proc.kill()
            proc.communicate()
        elif proc.returncode == 0:
            try:
                got = pickle.loads(out)
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError):
                got = None  # something else wrote to the child's stdout: no answer, as if it had failed
    if got is None:
        return CpSatRun("unknown", None, None, cv.eps, time.perf_counter() - t0, 0)
    name, sol, b, branches = got
    x = np.asarray(sol, dtype=np.float64) * cv.q if sol is not None else None
    bound = None
    if b is not None and math.isfinite(b):
        # The bound is an integer of up to 2**56, read back as a double: 1e-15 relative covers that.
        bound = (b - 1e-15 * abs(b)) / cv.So + cv.offset - cv.eps
    return CpSatRun(name, x, bound, cv.eps, time.perf_counter() - t0, branches)


def _child() -> None:
    """The child process: read (relaxation, hint, seconds, threads, gap) pickled on stdin, build the CpModel,
    solve it, write (status, solution, bound, branches) pickled on stdout."""
    import pickle
    import sys

    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    cv, X, budget, threads, gap = pickle.loads(sys.stdin.buffer.read())
    model = cv.cp_model()
    if X is not None:
        model.proto.solution_hint.vars.extend(range(cv.n))
        model.proto.solution_hint.values.extend(X.tolist())
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(0.5, budget - (time.perf_counter() - t0))
    prm.num_workers = threads
    prm.relative_gap_limit = gap
    prm.random_seed = 0
    st = solver.solve(model)
    name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
            cp_model.MODEL_INVALID: "invalid"}.get(st, "unknown")
    sol = list(solver.response_proto.solution) if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    b = float(solver.best_objective_bound) if name in ("optimal", "feasible", "unknown") else None
    sys.stdout.buffer.write(pickle.dumps((name, sol, b, int(solver.num_branches))))
    sys.stdout.buffer.flush()
