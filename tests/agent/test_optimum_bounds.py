"""The bounds at scale (agent/optimum.py:bounds_entry, `joulesched optimum --bound-only`): a time limit that
stops them keeps the best bound proven so far and says so, services are stated, and every bound stays at or
below what the policies' twin runs use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.agent import optimum as opt
from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "scenarios" / "small" / "trace-sleep.yaml"
POLICIES = ("default-k8s", "most-allocated", "awake-first", "awake-first:fit=efficient")


def _services_scenario(tmp_path: Path) -> Path:
    """Four sleeping nodes of two kinds; jobs and services (one stopped by the scenario's end), bursty."""
    rows = ["submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,kind"]
    for i in range(14):
        kind = "service" if i % 3 == 0 else "job"
        dur = 5000 if kind == "service" else 200 + 90 * (i % 5)
        rows.append(f"{40 * (i // 2) + (i % 2)},{dur},{1000 + 500 * (i % 4)},{2048 * (1 + i % 3)},"
                    f"{800 + 300 * (i % 4)},{kind}")
    (tmp_path / "pods.csv").write_text("\n".join(rows) + "\n")
    path = tmp_path / "svc.yaml"
    path.write_text("name: svc\nseed: 1\nduration_s: 1800\n"
                    "idle_policy: {mode: sleep, sleep_after_s: 120, sleep_watts: 8, wake_s: 0}\nnodes:\n"
                    "  - {name_prefix: a, count: 2, cpu_m: 4000, memory_mib: 16384, power_watts: hp-ml110-g5}\n"
                    "  - {name_prefix: b, count: 2, cpu_m: 8000, memory_mib: 32768, power_watts: ibm-x3250-x3470}\n"
                    "workload:\n  trace: pods.csv\n")
    return path


def test_the_time_limit_keeps_the_best_bound_so_far_and_says_so(monkeypatch):
    sc = load_scenario(SMALL)
    runs = opt.policy_energies(sc, 0, POLICIES)
    full = opt.bounds_entry(sc, 0, time_limit=60)
    assert full["bound_status"] == "optimal" and full["lp_status"] == full["boa_status"] == "optimal"
    assert full["fluid_joules"] <= full["lp_bound_joules"] * (1 + 1e-9) <= full["boa_bound_joules"] * (1 + 1e-9)
    assert full["best_bound_joules"] == full["boa_bound_joules"] and full["bound_assumes"] == "bind-on-arrival"
    # Out of time before the LP: the fluid bound, flagged.
    cut = opt.bounds_entry(sc, 0, time_limit=1e-3)
    assert cut["bound_status"] == "time_limit" and cut["lp_status"] == "skipped"
    assert cut["best_bound_joules"] == cut["fluid_joules"] > 0 and cut["bound_assumes"] == "every-run"
    assert cut["certificate"] == "bound-only" and "limit stopped them" in cut["message"]
    # Out of time in the bind-on-arrival stage (its model takes longer than what is left): the LP bound, flagged.
    real = opt.lp_bound

    def short(inst, **kw):
        return real(inst, **{**kw, "time_limit": 1e-9}) if kw.get("bind_on_arrival") else real(inst, **kw)

    monkeypatch.setattr(opt, "lp_bound", short)
    mid = opt.bounds_entry(sc, 0, time_limit=60)
    assert mid["bound_status"] == "time_limit" and mid["lp_status"] == "optimal" and mid["boa_status"] == "time_limit"
    assert mid["best_bound_joules"] == pytest.approx(full["lp_bound_joules"], rel=1e-9)
    for row in (full, cut, mid):
        assert row["best_bound_joules"] <= min(runs.values())
    assert cut["best_bound_joules"] < mid["best_bound_joules"] < full["best_bound_joules"]


def test_services_are_stated_by_the_bounds_and_refused_by_the_mip(tmp_path):
    path = _services_scenario(tmp_path)
    sc = load_scenario(path)
    with pytest.raises(opt.PodModelUnsupported, match="--bound-only"):
        opt.instance(sc)
    inst = opt.instance(sc, bounds_only=True)
    assert inst.service.sum() == 5 and inst.pods == 14
    row = opt.bounds_entry(sc, 0, time_limit=60)
    assert row["services"] == 5 and row["bound_status"] == "optimal"
    assert row["fluid_joules"] <= row["lp_bound_joules"] * (1 + 1e-9) <= row["boa_bound_joules"] * (1 + 1e-9)
    twin = Twin(sc, build_workload(sc, sc.seed))
    runs = {p: run_policy(twin, make_policy(p), sc.seed) for p in POLICIES}
    assert row["bound_every_run_joules"] <= min(r.energy_joules for r in runs.values())
    # With wake_s 0 the runs in which no pod waited bound each on arrival: the bind-on-arrival bound, which holds
    # the services' requests from arrival to stop, holds for them.
    on_arrival = [r.energy_joules for r in runs.values() if r.mean_pending_s == 0]
    assert on_arrival and row["boa_bound_joules"] <= min(on_arrival)


def test_the_cli_bound_only_is_quiet_with_json_and_refuses_services_without_it(tmp_path):
    path = _services_scenario(tmp_path)
    r = CliRunner().invoke(app, ["optimum", "-s", str(path), "--time-limit", "5"])
    assert r.exit_code == 2 and "--bound-only" in r.output
    r = CliRunner().invoke(app, ["optimum", "--bound-only", "-s", str(path), "-p", "awake-first", "--time-limit", "30",
                                 "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)  # nothing but the JSON on stdout: no bar
    assert rows[0]["certificate"] == "bound-only" and rows[0]["bound_status"] == "optimal"
    assert list(rows[0]["policies"]) == ["awake-first"]
    assert rows[0]["best_bound_joules"] <= rows[0]["policies"]["awake-first"]
    r = CliRunner().invoke(app, ["optimum", "--bound-only", "-s", str(path), "-p", "no-such-policy"])
    assert r.exit_code == 2 and "no-such-policy" in r.output


def test_the_mip_in_a_child_process_gives_the_same_bound_and_stops_at_its_deadline():
    """bounds_entry's bind-on-arrival MIP runs in a child killed at the deadline (HiGHS's own limit can be overrun
    in its root LP): on a small instance it proves the same bound as in this process; given a deadline it cannot
    meet, it comes back by then with its LP relaxation, flagged time_limit."""
    import time

    import highspy

    M = opt._Model()
    xs = [M.var(0.0, 10.0, 1.0 + 0.1 * k, True) for k in range(6)]
    for k in range(5):
        M.row([xs[k], xs[k + 1]], [1.0, 1.0], 1.5 + k, opt.math.inf)
    status, relax = opt._lp_solve(M, 10.0)
    # Generous deadlines: a spawned child imports numpy and highspy first, slow on loaded cores; both end early.
    here = opt._mip_until(M, time.perf_counter() + 120, relax, status, here=True)
    child = opt._mip_until(M, time.perf_counter() + 120, relax, status)
    assert here[1] == child[1] == highspy.HighsModelStatus.kOptimal
    assert child[0] == pytest.approx(here[0], rel=1e-9) and here[0] >= relax - 1e-9
    t0 = time.perf_counter()
    cut = opt._mip_until(M, t0 + 1.0, relax, status)  # too short for a child's start-up: the relaxation
    assert cut == (relax, highspy.HighsModelStatus.kTimeLimit) and time.perf_counter() - t0 < 1.0


def test_a_child_that_cannot_start_leaves_the_relaxation(monkeypatch):
    """Where no process can be spawned (a sandbox, a pickling failure), the bind-on-arrival MIP falls back to its
    LP relaxation, flagged as stopped by time, instead of failing the bounds row."""
    import multiprocessing.context as mpc
    import time

    import highspy

    M = opt._Model()
    xs = [M.var(0.0, 10.0, 1.0 + 0.1 * k, True) for k in range(6)]
    for k in range(5):
        M.row([xs[k], xs[k + 1]], [1.0, 1.0], 1.5 + k, opt.math.inf)
    status, relax = opt._lp_solve(M, 10.0)

    def refuse(self):
        raise OSError("no processes here")

    monkeypatch.setattr(mpc.SpawnProcess, "start", refuse)
    assert opt._mip_until(M, time.perf_counter() + 60, relax, status) == (relax, highspy.HighsModelStatus.kTimeLimit)


def _twins(tmp_path: Path):
    from tests.agent.test_optimum import sleeping_twins

    return opt.instance(sleeping_twins(tmp_path, 3), 0)


def test_a_bound_above_the_schedule_is_a_conflict_never_a_proof_of_optimality(tmp_path):
    """A bound can never exceed a schedule of the model's class: if one does, a bound or the model is wrong. The
    schedule is then not called optimal with a gap of 0 (as a bound clamped to it made it before)."""
    inst = _twins(tmp_path)
    good = opt.lp_bound(inst, time_limit=10)
    bogus = opt.LPBound(3 * good.fluid_joules + 1e6, good.fluid_joules, 0.0, 0, 0, "optimal")
    res = opt.solve(inst, time_limit=10, lp=bogus, warm=("awake-first:fit=efficient",))
    assert res.status == "bound_conflict" and res.gap is None and res.bound_joules is None, res
    assert res.energy_joules is not None and "is above the schedule's" in res.message
    # The row's certificate: a bound above the (replayed) schedule gives no gap and no optimality.
    row = opt.certify({"status": "optimal", "optimum_joules": 100.0, "gap": 0.0, "bound_joules": 100.0,
                        "lp_bound_joules": 90.0, "fluid_joules": 80.0, "boa_bound_joules": 120.0,
                        "replay_joules": 100.0, "replay_rel_error": 0.0, "message": ""}, True)
    assert row["certificate"] == "feasible" and row["best_gap"] is None and "above the schedule" in row["message"]
    # Within the solvers' tolerances a bound meets the schedule: optimal, gap 0.
    row = opt.certify({"status": "optimal", "optimum_joules": 100.0, "gap": 0.0, "bound_joules": 100.0,
                        "lp_bound_joules": 100.0 * (1 + 1e-9), "fluid_joules": 80.0, "replay_joules": 100.0,
                        "replay_rel_error": 0.0, "message": ""}, True)
    assert row["certificate"] == "optimal" and row["best_gap"] == 0.0


def test_without_any_bound_a_schedule_is_not_called_optimal(tmp_path, monkeypatch):
    """``with_bounds=False`` (the optimum teacher's labels) and a solver stopped before it proved any bound: the
    schedule has no gap and the status says time_limit, not optimal (on small-trace-sleep at 1 s it said optimal)."""
    inst = _twins(tmp_path)
    real = opt._run_highs

    def unproven(*args, **kwargs):
        run = real(*args, **kwargs)
        run.bound, run.optimal = None, False  # as when the time limit stops HiGHS before its root
        return run

    monkeypatch.setattr(opt, "_run_highs", unproven)
    res = opt.solve(inst, time_limit=10, with_bounds=False, warm=("awake-first:fit=efficient",))
    assert res.energy_joules is not None and res.assignment
    assert res.status == "time_limit" and res.gap is None and res.bound_joules is None, res


def test_a_row_says_why_its_lp_bound_is_missing(tmp_path, monkeypatch):
    """An LP bound the time limit stopped is null (an interrupted interior point proves nothing): the MIP's row
    says so in lp_status, as the --bound-only rows do, instead of a bare null."""
    from tests.agent.test_optimum import sleeping_twins

    real = opt.lp_bound

    def stopped(inst, **kw):
        b = real(inst, **kw)
        return b if kw.get("bind_on_arrival") else opt.LPBound(float("nan"), b.fluid_joules, b.wall_s, b.variables,
                                                                b.rows, "time_limit", b.coarse)

    monkeypatch.setattr(opt, "lp_bound", stopped)
    row = opt.optimum_entry(sleeping_twins(tmp_path, 3), 0, time_limit=5)
    assert row["lp_bound_joules"] is None and row["lp_status"] == "time_limit"
    assert row["boa_status"] == "optimal" and row["certificate"] in ("optimal", "feasible")


def test_the_lp_bound_is_at_most_the_lps_optimum(monkeypatch):
    """The LP bound is solved by the interior point without crossover, whose objective can sit above the LP's
    optimum within its tolerance (2.6e-9 relative on small-sleep-mixed seed 1): what is reported must be at most
    the optimum the simplex proves."""
    import highspy

    real, seen = opt._lp_solve, []

    def both(M, left):
        status, val = real(M, left)
        h = M.highs(integral=False, time_limit=60.0, threads=None, gap=1e-6)
        h.setOptionValue("solver", "simplex")
        h.run()
        assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        seen.append((val, h.getInfo().objective_function_value))
        return status, val

    monkeypatch.setattr(opt, "_lp_solve", both)
    inst = opt.instance(load_scenario(ROOT / "scenarios" / "small" / "sleep-mixed.yaml"), 1)
    lp = opt.lp_bound(inst, time_limit=30)
    assert lp.status == "optimal" and lp.joules == seen[-1][0]
    assert all(ipm <= simplex for ipm, simplex in seen), seen
