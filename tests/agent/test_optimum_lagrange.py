"""The Lagrangian bound (agent/optimum_lagrange.py): a valid lower bound on the MIP's optimum for any prices,
built from the nodes' own integer problems. HiGHS is the real solver; nothing is mocked."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.agent import optimum as opt
from joulesched.agent.optimum_lagrange import _NodeProblem, lagrangian_bound, node_instance

from .test_optimum import LINEAR, make, sleeping_twins


@pytest.mark.parametrize("seed", range(3))
def test_the_bound_never_exceeds_the_proven_optimum(tmp_path, seed):
    inst = opt.instance(sleeping_twins(tmp_path, seed), 0)
    res = opt.solve(inst, time_limit=60)
    assert res.status == "optimal", res
    lb = lagrangian_bound(inst, time_limit=20, upper=res.energy_joules)
    assert lb.iterations >= 1 and lb.kinds == 2  # two identical nodes share one problem
    assert lb.joules <= res.energy_joules * (1 + 1e-6)
    assert all(h <= res.energy_joules * (1 + 1e-6) for h in lb.history)  # every price vector's L is a bound
    assert lb.joules >= opt.fluid(inst) * (1 - 1e-6)  # and the prices of the LP make it a useful one here


def test_at_zero_prices_each_node_takes_nothing_and_costs_its_empty_energy(tmp_path):
    # Always on, 1,000 s: an empty node draws its 100 W idle throughout; pods priced at zero only add watts.
    sc = make(tmp_path, [(0.0, 300.0, 500, 10, 400.0), (100.0, 200.0, 500, 10, 300.0)], [{"count": 2}])
    inst = opt.instance(sc, 0)
    pr = _NodeProblem(inst, 0, 2)
    v, took = pr.solve(np.zeros(inst.pods), 10)
    assert took.sum() == 0
    assert v == pytest.approx(100 * 1000, rel=1e-6)
    # Priced far above their watts, the node takes both (they fit together on one 1,000 m node).
    v2, took2 = pr.solve(np.full(inst.pods, 1e6), 10)
    assert took2.tolist() == [1.0, 1.0]
    assert v2 == pytest.approx(100 * 1000 + 40 * 300 + 30 * 200 - 2e6, rel=1e-6)
    # Both identical nodes then take both pods (the coupling is priced out, not enforced): L is far below the
    # optimum, and still a bound.
    L = 2e6 + 2 * v2
    assert L <= opt.solve(inst, time_limit=30).energy_joules


def test_a_node_instance_keeps_every_pod_and_only_its_node(tmp_path):
    sc = make(tmp_path, [(0.0, 300.0, 500, 10, 400.0)], [{}, {"cpu_m": 2000, "power_watts": LINEAR}])
    inst = opt.instance(sc, 0)
    one = node_instance(inst, 1)
    assert one.nodes == 1 and one.pods == inst.pods and one.cap.tolist() == [2000.0]
    assert one.horizon == inst.horizon


def test_an_instance_without_any_schedule_is_reported_not_bounded(tmp_path):
    # The pod's 1,500 m of demand overloads the only (1,000 m) node it fits: the MIP has no schedule.
    sc = make(tmp_path, [(0.0, 300.0, 500, 10, 1500.0)], [{}])
    lb = lagrangian_bound(opt.instance(sc, 0), time_limit=5)
    assert lb.status == "infeasible" and np.isnan(lb.joules) and lb.iterations == 0
