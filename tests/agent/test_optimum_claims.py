"""What the optimum's row claims, and for which runs (a review): the MIP's class is the schedules that bind each pod
on arrival *and* overload no node, so its schedule is the optimum of every run only where a bound every run obeys
meets it; and a row the model cannot state is 'unsupported', not a crash."""

from __future__ import annotations

import pytest

from joulesched.agent import optimum as opt
from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.results import OptimumRun, ScenarioRun

from .test_optimum import make


def _throttled(tmp_path):
    """Two 1-core nodes, two pods that request 500m and use 1000m: binding both on one node (both on arrival)
    throttles them, and a sleeping second node makes that cheaper than the MIP's no-overload optimum."""
    return make(tmp_path, [(0.0, 100.0, 500, 100, 1000.0)] * 2, [{"count": 2, "memory_mib": 1000}],
                {"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 0, "wake_s": 0}, duration_s=200.0)


def test_a_throttled_run_that_binds_on_arrival_beats_the_mips_class_and_the_row_says_so(tmp_path):
    sc = _throttled(tmp_path)
    row = opt.optimum_entry(sc, 0, time_limit=10)
    assert row["overload_free"] is False and row["certificate"] == "optimal"
    # most-allocated binds both pods on arrival on one node, which they overload: less than the MIP's optimum
    res = run_policy(Twin(sc, build_workload(sc, sc.seed)), make_policy("most-allocated"), seed=sc.seed)
    assert res.mean_pending_s == 0 and res.mean_throttling > 0
    packed = res.energy_joules
    assert packed < row["schedule_joules"] * (1 - 1e-6)
    # the MIP's own bound is the best here, and it holds only for runs that overload no node
    assert row["best_bound_joules"] == pytest.approx(row["bound_joules"])
    assert row["bound_assumes"] == "bind-on-arrival, no overload"
    o = OptimumRun(**row)
    assert o.bounds[1] != o.bound_joules and (o.bounds[1] is None or o.bounds[1] <= packed)
    run = ScenarioRun(name=sc.name, seed=0, nodes=2, pods=2, lower_bound_joules=row["fluid_joules"], optimum=o,
                      policies={})
    # nothing ran beside it, and still it is no more than the optimum of its class
    assert run.optimum_label() == "optimum, bind-on-arrival"


def test_an_idle_free_cluster_meters_zero_joules_without_a_division_by_zero(tmp_path):
    zero = [0.0 + 10.0 * k for k in range(11)]
    sc = make(tmp_path, [(0.0, 100.0, 500, 100, 0.0)], [{"power_watts": zero}], duration_s=200.0)
    row = opt.optimum_entry(sc, 0, time_limit=10)
    assert row["replay_joules"] == 0.0 and row["replay_rel_error"] == 0.0 and row["certificate"] == "optimal"


def test_a_node_that_draws_more_asleep_than_idle_gets_an_unsupported_row_naming_it(tmp_path):
    sc = make(tmp_path, [(0.0, 100.0, 500, 100, 400.0)], [{"count": 2, "memory_mib": 1000}],
              {"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 150, "wake_s": 0}, duration_s=200.0)
    with pytest.raises(opt.SleepModelUnsupported, match=r"t: node \S+ draws 150 W asleep, more than its 100 W"):
        opt.instance(sc, 0)
    row = opt.optimum_entry(sc, 0, time_limit=10)
    assert row["status"] == "unsupported" and "draws 150 W asleep" in row["message"]
    # the bounds do not assume that sleeping saves power: they are still given
    assert opt.instance(sc, 0, bounds_only=True).nodes == 2
    assert opt.bounds_entry(sc, 0, time_limit=10)["best_bound_joules"] > 0


def test_a_replay_that_meters_the_schedule_differently_drops_the_mips_bound(tmp_path, monkeypatch):
    sc = make(tmp_path, [(0.0, 100.0, 500, 100, 400.0)], [{}], duration_s=200.0)
    real = opt.replay

    def off_by_a_joule(*args, **kwargs):
        rr = real(*args, **kwargs)
        rr.energy_joules += 1.0
        return rr

    monkeypatch.setattr(opt, "replay", off_by_a_joule)
    row = opt.optimum_entry(sc, 0, time_limit=10)
    assert row["certificate"] == "feasible" and row["bound_joules"] is None and row["unproven_bound_joules"] > 0
    assert "the MIP's bound is dropped" in row["message"]
    # what is left is proven for every run
    assert row["best_bound_joules"] == row["bound_every_run_joules"] and row["bound_assumes"] == "every-run"

