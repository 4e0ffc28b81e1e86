"""The optimum's MIP solved by CP-SAT (agent/optimum_cpsat.py) beside HiGHS, and both racing.

OR-Tools' CP-SAT and HiGHS are the real solvers (CP-SAT in its child process); nothing is mocked except, in the
one test of how a race combines two answers, the two answers themselves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from joulesched.agent import optimum as opt
from joulesched.agent.optimum_cpsat import _Converted
from joulesched.pipelines.cli import app
from tests.agent.test_optimum import make

IDLE = {"mode": "sleep", "sleep_after_s": 20.0, "sleep_watts": 5.0, "wake_s": 15.0}


def tiny(tmp_path, seed: int):
    """Three nodes (two identical), six pods, sleep with a wake-up: both solvers prove these in seconds."""
    rng = np.random.default_rng(seed)
    pods, t = [], 0.0
    for _ in range(6):
        t += float(rng.choice([0.0, 10.0, 40.0]))
        cpu = int(rng.choice([250, 333, 500]))
        pods.append((t, float(rng.choice([30.0, 80.0, 47.5])), cpu, 128, 0.8 * cpu))
    curve = [60.0 + 8.0 * k + (3.0 if k == 5 else 0.0) for k in range(11)]  # bent: its segment binaries too
    return make(tmp_path, pods, [{"count": 2}, {"cpu_m": 2000, "memory_mib": 2048, "power_watts": curve}], IDLE,
                300.0, name=f"tiny{seed}")


@pytest.mark.parametrize("seed", range(3))
def test_cpsat_proves_the_same_optimum_as_highs_and_its_schedule_replays(tmp_path, seed):
    sc = tiny(tmp_path, seed)
    inst = opt.instance(sc, 0)
    hi = opt.solve(inst, time_limit=60, solver="highs")
    cs = opt.solve(inst, time_limit=60, threads=2, solver="cpsat")
    assert hi.status == "optimal" and cs.status == "optimal", (hi, cs)
    assert cs.schedule_solver == "cpsat" and cs.cpsat["status"] == "optimal" and cs.cpsat["priced"]
    assert abs(cs.energy_joules - hi.energy_joules) <= 1e-9 * hi.energy_joules
    # CP-SAT's own bound is a lower bound of the model (below HiGHS's proven optimum) and within the gap of it:
    # CP-SAT stops at a 1e-6 relative gap (HiGHS's optimum is proven to 1e-6 too), and eps is taken off on top.
    eps = cs.cpsat["eps_joules"]
    assert hi.energy_joules * (1 - 2e-6) - eps <= cs.cpsat_bound <= hi.energy_joules
    assert 0 < cs.cpsat["eps_joules"] < 1e-6 * hi.energy_joules
    rr = opt.replay(sc, 0, cs.assignment)
    assert abs(rr.energy_joules - cs.energy_joules) <= opt.REPLAY_TOL * rr.energy_joules


@pytest.mark.parametrize("seed", range(2))
def test_the_integer_program_is_a_relaxation_up_to_eps(tmp_path, seed):
    """What makes CP-SAT's bound valid: the model's optimum, each continuous variable rounded to its grid,
    satisfies every row of the converted integer program, and its scaled objective is at most the model's
    objective there plus eps."""
    inst = opt.instance(tiny(tmp_path, seed), 0)
    b = opt._build(inst)
    M = b.model
    h = M.highs(integral=True, time_limit=60, threads=None, gap=1e-9)
    h.run()
    x = np.asarray(h.getSolution().col_value)
    energy = float(h.getInfo().objective_function_value)
    cv = _Converted(M)
    assert cv.isint[np.asarray(M.integer)].all() and not cv.isint.all()  # continuous variables were scaled
    X = np.rint(x / cv.q).astype(np.int64)
    assert (X >= cv.xlo).all() and (X <= cv.xhi).all()
    act = np.zeros(len(cv.lo), dtype=object)  # exact integer arithmetic
    rows = np.repeat(np.arange(len(cv.lo)), np.diff(cv.start))
    for r, c, a in zip(rows.tolist(), cv.cols.tolist(), cv.A.tolist()):
        act[r] += a * int(X[c])
    lo = [-math.inf if not math.isfinite(v) else int(v) for v in cv.lo.tolist()]
    hi = [math.inf if not math.isfinite(v) else int(v) for v in cv.hi.tolist()]
    bad = [r for r in range(len(lo)) if not lo[r] <= act[r] <= hi[r]]
    assert not bad, bad[:5]
    scaled = sum(int(c) * int(v) for c, v in zip(cv.C.tolist(), X.tolist())) / cv.So + cv.offset
    assert scaled <= energy + cv.eps


def test_a_bad_solver_exits_2(tmp_path):
    r = CliRunner().invoke(app, ["optimum", "-s", "scenarios/small/sleep-mixed.yaml", "--solver", "gurobi"])
    assert r.exit_code == 2 and "--solver 'gurobi'" in r.output, r.output
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["benchmark", "-s", "scenarios/tiny.yaml", "-p", "default-k8s", "--optimum",
                                 "--optimum-solver", "cplex", "--out", str(out)])
    assert r.exit_code == 2 and "--optimum-solver 'cplex'" in r.output, r.output  # the option given, by name
    assert not out.exists()
    r = CliRunner().invoke(app, ["benchmark", "-s", "scenarios/tiny.yaml", "-p", "default-k8s",
                                 "--optimum-solver", "cplex", "--out", str(out)])  # without --optimum too
    assert r.exit_code == 2 and "--optimum-solver 'cplex'" in r.output, r.output
    assert not out.exists()
    with pytest.raises(opt.OptimumError, match="highs, cpsat, race"):
        opt.solve(opt.instance(tiny(tmp_path, 0), 0), solver="scip")


def test_the_optimum_command_with_cpsat_certifies_and_names_its_solvers(tmp_path):
    import json

    sc = tiny(tmp_path, 1)
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(sc.model_dump(mode="json")))
    r = CliRunner().invoke(app, ["optimum", "-s", str(path), "--time-limit", "30", "--solver", "cpsat", "--json",
                                 "-p", "default-k8s"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    assert row["certificate"] == "optimal" and row["replay_rel_error"] <= opt.REPLAY_TOL
    assert row["schedule_solver"] == "cpsat" and row["solver"].startswith("cpsat")
    assert row["cpsat_bound_joules"] <= row["schedule_joules"]


def test_race_keeps_the_better_schedule_and_the_better_bound(tmp_path, monkeypatch):
    sc = tiny(tmp_path, 2)
    inst = opt.instance(sc, 0)
    real = opt.solve(inst, time_limit=60, solver="race", threads=2)
    assert real.status == "optimal" and real.cpsat is not None and real.mip_dual_bound is not None
    assert abs(opt.replay(sc, 0, real.assignment).energy_joules - real.energy_joules) <= 1e-9 * real.energy_joules
    # The combination itself, with each side's answer made up: one solver has the better schedule, the other
    # the better bound; the race reports both, and names who gave which.
    b = opt._build(inst)
    x = np.zeros(b.model.ncols)
    for p in range(inst.pods):  # any point with one y per pod: the schedule read back from it
        x[next(col for (q, _, _), col in b.y.items() if q == p)] = 1.0
    e = real.energy_joules

    def fake(name, energy, bound):
        return lambda *a, **k: opt._Run(name, x=x.copy(), energy=energy, bound=bound)

    monkeypatch.setattr(opt, "_run_highs", fake("highs", 1.10 * e, 0.98 * e))
    monkeypatch.setattr(opt, "_run_cpsat", fake("cpsat", 1.05 * e, 0.50 * e))
    monkeypatch.setattr(opt, "_relaxation", lambda *a: math.nan)  # the other bounds kept below both
    low = opt.LPBound(joules=0.1 * e, fluid_joules=0.1 * e, wall_s=0.0, variables=0, rows=0, status="optimal")
    res = opt.solve(inst, time_limit=60, solver="race", threads=2, lp=low)
    assert res.energy_joules == 1.05 * e and res.schedule_solver == "cpsat"
    assert res.bound_joules == 0.98 * e and res.bound_solver == "highs"
    assert res.solver == "cpsat (bound: highs)" and res.status == "time_limit"
    assert res.gap == pytest.approx((1.05 - 0.98) / 1.05)
