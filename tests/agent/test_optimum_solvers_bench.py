"""The benches' own arithmetic: bench/optimum_solvers.py's row is 'met' only when the gap is closed *and* the twin
replays the schedule to the model's energy (a schedule the twin does not follow is a replay_failed row, not a
crash of the whole bench); bench/optimum_profile.py gives no root gap for an unsolved root; bench/suite_table.py's
bound row is a mean of per-seed ratios like its other cells."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from joulesched.agent.optimum import ReplayError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import optimum_solvers

    fields = ("variables", "binaries", "rows", "bound_joules", "solver", "schedule_solver", "bound_solver",
              "warm_joules", "mip_dual_bound", "cpsat_bound", "cpsat", "mip_nodes")
    proven = SimpleNamespace(status="optimal", energy_joules=100.0, gap=0.0, assignment={0: 0}, wall_s=1.0,
                             **{k: None for k in fields})
    monkeypatch.setattr(optimum_solvers, "solve", lambda *a, **k: proven)
    return optimum_solvers


@pytest.mark.parametrize("replayed, status, met", [(100.0, "optimal", True), (101.0, "optimal", False),
                                                   (None, "replay_failed", False)])
def test_met_needs_the_twins_replay_to_agree(bench, monkeypatch, replayed, status, met):
    def replay(*args, **kwargs):
        if replayed is None:
            raise ReplayError("pod 0 was queued")
        return SimpleNamespace(energy_joules=replayed)

    monkeypatch.setattr(bench, "replay", replay)
    row = bench.run(ROOT / "scenarios" / "small" / "trace-always-on.yaml", 0, "highs", 1.0, 1)
    assert (row["status"], row["met"], row["twin_joules"]) == (status, met, replayed)


def test_the_profile_gives_no_root_gap_for_a_root_lp_the_time_limit_stopped(bench, monkeypatch):
    """bench/optimum_profile.py read the root LP's objective whatever HiGHS's status: on small-trace-sleep, whose
    root takes over a minute, a time-limited root gave a 'root LP gap' of the simplex's objective where it stopped."""
    import optimum_profile

    monkeypatch.setattr(optimum_profile, "solve", bench.solve)  # the fake full solve: only the root LP runs
    row = optimum_profile.profile(ROOT / "scenarios" / "small" / "trace-sleep.yaml", 0, 0.5)
    assert row["root_lp_joules"] is None and row["root_gap"] is None
    assert row["root_lp_status"] == "Time limit reached"


def test_the_suite_tables_bound_row_is_a_mean_of_per_seed_ratios_as_its_other_cells():
    """bench/suite_table.py divided the bounds' mean by default-k8s's mean energy, unlike every other cell of the
    table (per seed, then averaged); it now takes the report's ratio."""
    from joulesched.pipelines.report import bound_ratios
    from tests.pipelines.test_report import _made_up

    res = _made_up([{"default-k8s": 100.0, "most-allocated": 90.0}, {"default-k8s": 300.0, "most-allocated": 250.0}])
    assert bound_ratios(res, "s")["fluid lower bound"] == pytest.approx((80.0 / 100.0 + 80.0 / 300.0) / 2)  # not 80/200
