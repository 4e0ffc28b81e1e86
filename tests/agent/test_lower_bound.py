"""The offline lower bound: tight where it should be, and never above any policy's energy (property test)."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as stg

from joulesched.agent.lower_bound import cluster_cost, lower_bound, node_envelope
from joulesched.agent.registry import BASELINES, make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.twin import Twin
from tests.helpers import scenario, workload


def test_envelope_of_a_concave_curve_is_its_chord():
    widths, slopes = node_envelope(np.array([0, 50, 60, 70, 80, 90, 100, 100, 100, 100, 100.0]), 1000, 0)
    assert widths.tolist() == [1000.0] and slopes.tolist() == [0.1]


def test_cluster_cost_fills_the_cheapest_watts_per_millicore_first():
    from joulesched.cluster.state import ClusterState

    cheap = [10 + 1 * k for k in range(11)]  # 10 W per 1000m
    dear = [10 + 3 * k for k in range(11)]  # 30 W per 1000m
    st = ClusterState(["a", "b"], [1000, 1000], [1, 1], [1, 1], [dear, cheap])
    b, x, g = cluster_cost(st)
    assert b == 20
    assert np.interp(1000, x, g) == pytest.approx(20 + 10)
    assert np.interp(2000, x, g) == pytest.approx(20 + 10 + 30)


def test_bound_is_exact_for_one_pod_on_a_linear_node():
    sc = scenario([{}], duration_s=200)
    wl = workload((0, 100, 500, 10, 500))
    tw = Twin(sc, wl)
    lb = lower_bound(tw.state, wl, sc.duration_s, tw.placeable)
    r = run_policy(tw, make_policy("default-k8s"), 0)
    assert lb.joules == pytest.approx(r.energy_joules)


def test_bound_ignores_pods_that_can_never_be_placed():
    sc = scenario([{}], duration_s=100)
    wl = workload((0, 100, 500, 10, 500), (0, 100, 5000, 10, 5000))
    tw = Twin(sc, wl)
    lb = lower_bound(tw.state, wl, sc.duration_s, tw.placeable)
    assert lb.joules == pytest.approx(150 * 100)


curves = stg.lists(stg.floats(0, 40), min_size=10, max_size=10).flatmap(
    lambda inc: stg.floats(0, 120).map(lambda idle: [idle + sum(inc[:k]) for k in range(11)])).filter(
    lambda c: c[-1] > 0)  # a node draws something busy (power/curves.py validate_curve)


@stg.composite
def cases(draw):
    n_groups = draw(stg.integers(1, 3))
    nodes = [{"count": draw(stg.integers(1, 3)), "cpu_m": draw(stg.sampled_from([1000, 2000, 4000])),
              "memory_mib": 4096, "max_pods": draw(stg.integers(1, 6)), "power_watts": draw(curves)}
             for _ in range(n_groups)]
    sleep = draw(stg.booleans())
    idle = ({"mode": "sleep", "sleep_after_s": draw(stg.floats(0, 50)), "sleep_watts": draw(stg.floats(0, 20)),
             "wake_s": draw(stg.floats(0, 40))} if sleep else None)
    n = draw(stg.integers(1, 25))
    pods = []
    for _ in range(n):
        req = draw(stg.one_of(stg.none(), stg.integers(0, 4500)))
        pods.append((draw(stg.floats(0, 200)), draw(stg.floats(0.5, 150)), req,
                     None if req is None else draw(stg.integers(0, 4096)),
                     draw(stg.floats(0, 3000))))  # usage may exceed the request: overload happens
    horizon = draw(stg.floats(1, 300))
    return scenario(nodes, duration_s=horizon, idle=idle), workload(*sorted(pods, key=lambda p: p[0]))


@settings(max_examples=int(os.environ.get("LB_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_policy_ever_beats_the_bound(case):
    sc, wl = case
    tw = Twin(sc, wl)
    lb = lower_bound(tw.state, wl, sc.duration_s, tw.placeable)
    for name in BASELINES:
        r = run_policy(tw, make_policy(name), 1)
        assert r.energy_joules >= lb.joules * (1 - 1e-9) - 1e-6, (name, r.energy_joules, lb.joules)


@pytest.mark.parametrize("name", ["tiny", "heterogeneous-sleep"])
def test_bound_holds_on_the_standard_suite(name):
    from joulesched.cluster.scenario import load_scenario
    from joulesched.cluster.workload import build_workload

    sc = load_scenario(f"scenarios/{name}.yaml")
    wl = build_workload(sc)
    tw = Twin(sc, wl)
    lb = lower_bound(tw.state, wl, sc.duration_s, tw.placeable)
    energies = [run_policy(tw, make_policy(p), 0).energy_joules for p in BASELINES]
    assert lb.joules <= min(energies)
    assert lb.joules > 0.25 * min(energies)  # and it is not trivially loose
