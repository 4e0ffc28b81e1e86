"""The twin's physics, checked against values worked out by hand."""

import math

import numpy as np
import pytest

from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import Workload
from tests.helpers import scenario, workload


class First:
    """Always the lowest-index feasible node, so tests control placement."""

    name = "first"

    def reset(self, state, rng):
        pass

    def choose(self, state, pod, mask):
        return int(np.flatnonzero(mask)[0])


def run(sc, wl, policy=None, record=False):
    return run_policy(Twin(sc, wl, record=record), policy or First(), 0)


def test_energy_integrates_the_curve_between_events():
    # 500m on a 1000m node is u = 0.5: 150 W for 100 s, then idle 100 W until the 200 s horizon.
    sc = scenario([{}], duration_s=200)
    r = run(sc, workload((0, 100, 500, 100, 500)))
    assert r.energy_joules == pytest.approx(150 * 100 + 100 * 100)
    assert r.end_s == 200
    assert r.completed_pods == 1 and r.slo_violations == 0 and r.mean_pending_s == 0


def test_interpolation_between_ten_percent_points():
    # u = 0.25 on a curve with a kink at 20 %: halfway between the 20 % and 30 % points.
    curve = [0, 10, 20, 60, 60, 60, 60, 60, 60, 60, 60]
    sc = scenario([{"power_watts": curve}], duration_s=10)
    r = run(sc, workload((0, 10, 250, 10, 250)))
    assert r.energy_joules == pytest.approx(40 * 10)


def test_run_lasts_until_the_last_pod_finishes():
    sc = scenario([{}], duration_s=50)
    r = run(sc, workload((40, 100, 100, 10, 1000)))
    assert r.end_s == pytest.approx(140)
    assert r.energy_joules == pytest.approx(100 * 40 + 200 * 100)


def test_overload_throttles_pro_rata_and_is_work_conserving():
    # Two best-effort pods demand 800m each on 1000m: each gets 0.625 of its demand, so 100 s of work takes
    # 160 s, both violate the 0.9 SLO, and mean throttling is 0.375.
    sc = scenario([{}], duration_s=10)
    r = run(sc, workload((0, 100, None, None, 800), (0, 100, None, None, 800)))
    assert r.end_s == pytest.approx(160)
    assert r.slo_violations == 2 and r.slo_violation_rate == 1.0
    assert r.mean_throttling == pytest.approx(0.375)
    assert r.energy_joules == pytest.approx(200 * 160)


def test_short_overload_within_tolerance_is_no_violation():
    # Pod A (900m, 1000 s) overlaps with B (900m) for B's 10 s; A is below 90 % for ~10 s of ~1010 s (< 5 %).
    sc = scenario([{}], duration_s=10)
    r = run(sc, workload((0, 1000, None, None, 900), (100, 10, None, None, 900)))
    assert r.slo_violations == 1  # B spent its whole life throttled; A did not


def test_pod_that_fits_nowhere_waits_then_runs():
    sc = scenario([{}], duration_s=10)
    r = run(sc, workload((0, 100, 800, 10, 100), (10, 50, 800, 10, 100)))
    assert r.placements == 2 and r.unschedulable_pods == 0
    assert r.mean_pending_s == pytest.approx((0 + 90) / 2)
    assert r.end_s == pytest.approx(150)


def test_pod_too_big_for_every_node_is_never_placed():
    sc = scenario([{}, {"cpu_m": 2000}], duration_s=10)
    r = run(sc, workload((0, 10, 3000, 10, 100), (0, 10, 1500, 10, 100)))
    assert r.unschedulable_pods == 1 and r.placements == 1


def test_a_pod_whose_cpu_and_gpus_fit_only_on_different_nodes_is_never_placed():
    """A 1500m one-GPU pod: the 2000m node has no GPU, the GPU node only 1000m. Each filter alone passes some
    node; no node passes both. It is unplaceable from the start, and the run ends (it used to wait for ever,
    min_awake's sleep rechecks running the clock)."""
    sc = scenario([{"cpu_m": 2000}, {"gpu_count": 2, "gpu_model": "T4"}], duration_s=100,
                  idle={"mode": "sleep", "sleep_after_s": 10, "min_awake": 1, "recheck_s": 30})
    wl = Workload(np.array([0.0, 0.0]), np.array([50.0, 50.0]), np.array([1500, 500]), np.array([10, 10]),
                  np.array([100.0, 100.0]), gpu=np.array([1, 1], np.int16))
    tw = Twin(sc, wl)
    assert tw.placeable.tolist() == [False, True]
    r = run_policy(tw, First(), 0)
    assert (r.unplaced_fits_no_node, r.placed_pods, r.completed_pods) == (1, 1, 1) and r.end_s == 100


def test_pod_count_limit_filters_best_effort_pods():
    sc = scenario([{"max_pods": 1}, {}], duration_s=10)
    tw = Twin(sc, workload((0, 50, None, None, 10), (0, 50, None, None, 10)))
    nodes = []
    while tw.next_decision() is not None:
        nodes.append(int(np.flatnonzero(tw.mask)[0]))
        tw.place(nodes[-1])
    assert nodes == [0, 1]


def test_sleep_wake_and_wake_delay():
    # Node sleeps at 10 s (5 W); a pod bound at 100 s waits 20 s while the node wakes at idle power,
    # runs 50 s at u = 0.5, then the node idles 10 s and sleeps again until the 300 s horizon.
    sc = scenario([{}], duration_s=300,
                  idle={"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 5, "wake_s": 20})
    r = run(sc, workload((100, 50, 500, 10, 500)))
    expect = 100 * 10 + 5 * 90 + 100 * 20 + 150 * 50 + 100 * 10 + 5 * (300 - 180)
    assert r.energy_joules == pytest.approx(expect)
    assert r.mean_pending_s == pytest.approx(20)


def test_pod_bound_to_a_waking_node_starts_with_it():
    sc = scenario([{}], duration_s=10,
                  idle={"mode": "sleep", "sleep_after_s": 0, "sleep_watts": 0, "wake_s": 30})
    r = run(sc, workload((5, 10, 100, 10, 100), (15, 10, 100, 10, 100)))
    assert r.mean_pending_s == pytest.approx(((35 - 5) + (35 - 15)) / 2)


def test_place_rejects_an_infeasible_node():
    sc = scenario([{"cpu_m": 100}, {}], duration_s=10)
    tw = Twin(sc, workload((0, 10, 500, 10, 100)))
    assert tw.next_decision().key == 0
    assert tw.mask.tolist() == [False, True]
    with pytest.raises(ValueError, match="not feasible"):
        tw.place(0)


@pytest.mark.parametrize("name", ["heterogeneous-sleep", "tiny"])
def test_runs_are_deterministic_for_a_seed(name):
    from joulesched.cluster.scenario import load_scenario
    from joulesched.cluster.workload import build_workload

    sc = load_scenario(f"scenarios/{name}.yaml")
    a = run_policy(Twin(sc, build_workload(sc, 3)), make_policy("default-k8s"), 3)
    b = run_policy(Twin(sc, build_workload(sc, 3)), make_policy("default-k8s"), 3)
    assert a.energy_joules == b.energy_joules and a.mean_pending_s == b.mean_pending_s
    c = run_policy(Twin(sc, build_workload(sc, 4)), make_policy("default-k8s"), 4)
    assert c.energy_joules != a.energy_joules


def test_timeline_energy_adds_up_to_the_total():
    from joulesched.cluster.scenario import load_scenario
    from joulesched.cluster.workload import build_workload

    sc = load_scenario("scenarios/tiny.yaml")
    r = run_policy(Twin(sc, build_workload(sc), record=True), make_policy("most-allocated"), 0)
    tl = r.timeline
    assert math.isclose(sum(tl.energy_j), r.energy_joules, rel_tol=1e-9)
    assert len(tl.util) == len(tl.energy_j) and tl.util[0].shape == (3,)
    assert all(0 <= u.min() and u.max() <= 1 for u in tl.util)


def test_filter_tracks_full_nodes_through_bind_and_unbind():
    from joulesched.cluster.state import ClusterState, PodRequest

    st = ClusterState(["a", "b"], [1000, 1000], [1000, 1000], [1, 2], [[1] * 11, [1] * 11])
    pod = PodRequest(10, 10)
    st.bind(0, pod)
    assert st.full_nodes == 1 and st.feasible(pod).tolist() == [False, True]
    assert st.feasible(PodRequest()).tolist() == [False, True]
    st.bind(1, pod)
    st.bind(1, pod)
    assert st.full_nodes == 2 and not st.feasible(pod).any()
    st.unbind(0, pod)
    assert st.full_nodes == 1 and st.feasible(PodRequest(None, 5)).tolist() == [True, False]


def test_live_lives_start_a_waiting_pod_when_its_node_is_up():
    """A pod waiting on a waking node begins when the node is up, not wake_s after the moment asked (a review:
    asked at 120 of a wake begun at 50, it said 220 for a pod that ran 150..170)."""
    sc = scenario([{}], duration_s=300, idle={"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 5, "wake_s": 100})
    tw = Twin(sc, workload((50, 20, 200, 100, 200), (120, 20, 200, 100, 200)))
    tw.begin()
    seen = []
    while (d := tw.next_decision()) is not None:
        if tw.now == 120:
            seen.append(tw.live_lives())
        tw.place(int(np.flatnonzero(d.mask)[0]))
    (live, _, began, end), = seen
    assert live.tolist() == [0] and began.tolist() == [150.0] and end.tolist() == [170.0]
    assert tw.pod_start[0] == 150.0 and tw.pod_end[0] == 170.0
