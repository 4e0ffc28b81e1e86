"""Policies compared over one window (docs/twin.md, "The run's window"): a run's idle tail, worked out by hand,
and a run metered past its end against the same run with a later horizon."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin, common_window, extend_run
from joulesched.cluster.workload import build_workload
from tests.cluster.test_gpus import _random_gpu_pods, _scenario
from tests.cluster.test_twin import First
from tests.helpers import scenario, workload


class Spread(First):
    """The feasible node holding fewest pods."""

    name = "spread"

    def choose(self, state, pod, mask):
        return int(np.argmin(np.where(mask, state.pods, np.iinfo(np.int64).max)))


def test_a_run_that_ends_early_pays_for_the_idle_cluster_until_the_other_ends():
    # Ten always-on 2000m nodes (100 W idle, 200 W full), two 100 s jobs using 2000m each. Spread, they end at
    # 100 (2 x 200 W + 8 x 100 W); stacked on one node, at half speed, at 200 (200 W + 9 x 100 W). Each metered
    # to its own end the stacked run looks 1.83 times as costly; over [0, 200] both clusters draw 220 kJ.
    sc = scenario([{"count": 10, "cpu_m": 2000}], duration_s=100)
    wl = workload((0, 100, 1000, 10, 2000), (0, 100, 1000, 10, 2000))
    spread = run_policy(Twin(sc, wl, record=True), Spread(), 0)
    stacked = run_policy(Twin(sc, wl, record=True), First(), 0)
    assert (spread.energy_joules, spread.end_s) == (120_000, 100)
    assert (stacked.energy_joules, stacked.end_s) == (220_000, 200)
    w = common_window({"spread": spread, "stacked": stacked})
    assert w["spread"].energy_joules == pytest.approx(220_000) and w["stacked"].energy_joules == 220_000
    assert w["spread"].window_end_s == w["stacked"].window_end_s == 200 and w["spread"].end_s == 100
    assert spread.energy_joules == 120_000  # the original is not changed
    tl = w["spread"].timeline
    assert len(tl.energy_j) == len(stacked.timeline.energy_j) == len(tl.util) == len(tl.awake)
    assert sum(tl.energy_j) == pytest.approx(220_000) and tl.awake[-1] == 10


@pytest.mark.parametrize(("min_awake", "tail"), [(0, 100 * 10 + 5 * 140 + 5 * 150), (1, (100 + 5) * 150)])
def test_the_idle_tail_sleeps_nodes_when_their_timers_fire_and_the_core_lets_them(min_awake, tail):
    # Two nodes; a job on n0 until 50, the horizon. n1 sleeps at 10 (n0 is awake). n0 empties at 50 and its
    # timer fires at 60: it sleeps, unless min_awake keeps one node awake. Metered to 200.
    idle = {"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 5, "wake_s": 20, "min_awake": min_awake}
    sc = scenario([{}, {}], duration_s=50, idle=idle)
    r = run_policy(Twin(sc, workload((0, 50, 500, 10, 500))), First(), 0)
    assert r.end_s == 50 and r.energy_joules == pytest.approx(150 * 50 + 100 * 10 + 5 * 40)
    assert extend_run(r, 200).energy_joules == pytest.approx(r.energy_joules + tail)
    assert r.idle_tail.awake_at(1e9) == min_awake


def _jobs(seed: int, n: int = 40) -> list[tuple]:
    rng = np.random.default_rng(seed)
    return [(float(rng.uniform(0, 600)), float(rng.uniform(20, 900)), int(c), 10, float(c) * rng.uniform(0.3, 1.5))
            for c in rng.integers(100, 1000, n)]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("extra", [{}, {"min_awake": 2}, {"spare_cpu_m": 1500}, {"max_sleeps_per_hour": 1}],
                         ids=["plain", "min-awake", "spare", "sleep-cap"])
@pytest.mark.parametrize("policy", ["awake-first", "round-robin"])
def test_a_run_metered_past_its_end_is_the_same_run_with_a_later_horizon(seed, extra, policy):
    # Jobs only: the horizon changes no decision, only where the run stops being metered.
    idle = {"mode": "sleep", "sleep_after_s": 30, "sleep_watts": 7, "wake_s": 15, "recheck_s": 20, **extra}
    nodes = [{"count": 3}, {"count": 2, "cpu_m": 2000, "power_watts": [60, 80, 95, 110, 125, 140, 155, 170, 185,
                                                                       200, 215]}]
    wl = workload(*_jobs(seed))
    short = run_policy(Twin(scenario(nodes, duration_s=600, idle=idle), wl), make_policy(policy), seed)
    until = short.end_s + (5000 if extra.get("max_sleeps_per_hour") else 1000)  # sleeps held up to an hour
    long = run_policy(Twin(scenario(nodes, duration_s=until, idle=idle), wl), make_policy(policy), seed)
    assert long.end_s == until and long.placements == short.placements
    assert extend_run(short, until).energy_joules == pytest.approx(long.energy_joules, rel=1e-12)


def test_gpu_energies_per_node_are_metered_over_the_window(tmp_path):
    path = _scenario(tmp_path, _random_gpu_pods(60, 4))
    sc = load_scenario(path)
    wl = build_workload(sc)
    short = run_policy(Twin(sc, wl), make_policy("gpu-packing"), 0)
    until = short.end_s + 5000
    long = run_policy(Twin(sc.model_copy(update={"duration_s": until}), wl), make_policy("gpu-packing"), 0)
    w = extend_run(short, until)
    assert w.energy_joules == pytest.approx(long.energy_joules, rel=1e-12)
    assert w.gpu_energy_joules == pytest.approx(long.gpu_energy_joules, rel=1e-12)
    assert w.node_energy_joules == pytest.approx(long.node_energy_joules, rel=1e-12)
    assert w.node_gpu_joules == pytest.approx(long.node_gpu_joules, rel=1e-12)
    assert sum(w.node_energy_joules) == pytest.approx(w.energy_joules, rel=1e-9)


def test_a_run_without_a_tail_cannot_be_extended():
    sc = scenario([{}], duration_s=100)
    r = run_policy(Twin(sc, workload((0, 50, 500, 10, 500))), First(), 0)
    with pytest.raises(ValueError, match="idle tail"):
        extend_run(dataclasses.replace(r, idle_tail=None), 200)


def test_a_run_already_metered_past_its_end_is_not_extended_again():
    # Its tail runs from its own end: extending the extended run would count [end, first window] twice.
    sc = scenario([{}], duration_s=50)
    r = run_policy(Twin(sc, workload((0, 50, 500, 10, 500))), First(), 0)
    assert extend_run(r, 200).energy_joules == pytest.approx(r.energy_joules + 100 * 150)
    with pytest.raises(ValueError, match="already metered"):
        extend_run(extend_run(r, 100), 200)


def test_padded_bins_count_the_nodes_awake_before_a_change_on_their_boundary():
    # The twin records a bin's awake count at its opening, before that instant's events: n0 sleeps at 60, a bin
    # boundary (bin_s 5), so the bin opening at 60 still counts it, as the same run with a later horizon does.
    idle = {"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 5, "wake_s": 20}
    wl = workload((0, 50, 500, 10, 500))
    short = run_policy(Twin(scenario([{}, {}], duration_s=50, idle=idle), wl, record=True, timeline_bins=10),
                       First(), 0)
    long = run_policy(Twin(scenario([{}, {}], duration_s=200, idle=idle), wl, record=True, timeline_bins=40),
                      First(), 0)
    assert short.timeline.bin_s == long.timeline.bin_s == 5
    w = extend_run(short, 200).timeline
    assert w.awake == long.timeline.awake and w.awake[12] == 1
    assert w.energy_j == pytest.approx(long.timeline.energy_j)


@pytest.mark.parametrize("job_s", [1030.0, 1000.0, 300.0])
def test_the_timelines_last_bin_is_the_mean_power_of_what_it_covers(job_s):
    """One node idling at 100 W all along: every bin reads 100 W, the last one too. It was divided by a whole
    bin: a run ending 30 s into one plotted a tenth of its power there, one ending on a boundary a bin of 0 W (a
    review); and metered past its end, the window's last bin likewise."""
    sc = scenario([{}], duration_s=1000)
    r = run_policy(Twin(sc, workload((0, job_s, 100, 10, 0)), record=True), First(), 0)
    tl = r.timeline
    assert len(tl.energy_j) == len(tl.util) == len(tl.awake) == int(np.ceil(r.end_s / tl.bin_s - 1e-9))
    assert tl.watts() == pytest.approx(np.full(len(tl.energy_j), 100.0))
    assert sum(tl.energy_j) == pytest.approx(r.energy_joules)
    for until in (r.end_s + 10.0, r.end_s + 5 * tl.bin_s):
        w = extend_run(r, until).timeline
        assert len(w.energy_j) == len(w.awake) == int(np.ceil(until / tl.bin_s - 1e-9))
        assert w.watts() == pytest.approx(np.full(len(w.energy_j), 100.0))
        assert sum(w.energy_j) == pytest.approx(100.0 * until)



def test_a_horizon_whose_bins_do_not_add_up_exactly_has_no_sliver_bin():
    """240 * (245 / 240) < 245: a 241st bin opened a float's width before the end read about 0 W (a review)."""
    sc = scenario([{}], duration_s=245)
    r = run_policy(Twin(sc, workload((0, 10, 100, 10, 0)), record=True), First(), 0)
    tl = r.timeline
    assert len(tl.energy_j) == 240 and tl.watts() == pytest.approx(np.full(240, 100.0))
    assert sum(tl.energy_j) == pytest.approx(r.energy_joules)
    w = extend_run(r, 490.0).timeline  # the window's end on a float's width too: extend_run counted a sliver bin
    assert len(w.energy_j) == 480 and w.watts() == pytest.approx(np.full(480, 100.0))
