"""The benchmark meters every policy of a (scenario, seed) over one window (docs/twin.md, "The run's window")."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.pipelines.benchmark import run_benchmark

SCENARIO = """name: window
seed: 1
duration_s: 100
idle_policy: {mode: always_on}
nodes:
  - {name_prefix: n, count: 10, cpu_m: 2000, memory_mib: 4096, power_watts: [100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200]}
workload: {trace: pods.csv}
"""


def test_a_policy_that_delays_its_last_job_is_compared_over_the_same_window(tmp_path):
    # Two 100 s jobs asking 1000m and using 2000m: round-robin spreads them (done at 100), most-allocated stacks
    # them on one node at half speed (done at 200). Over [0, 200] both clusters draw 220 kJ.
    (tmp_path / "pods.csv").write_text("submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n"
                                       "0,100,1000,100,2000\n0,100,1000,100,2000\n")
    (tmp_path / "s.yaml").write_text(SCENARIO)
    res = run_benchmark([tmp_path / "s.yaml"], ["round-robin", "most-allocated"], 1, tmp_path / "out")
    runs = res.scenarios[0].policies
    spread, stacked = runs["round-robin"], runs["most-allocated"]
    assert (spread.end_s, stacked.end_s) == (100, 200)
    assert spread.window_end_s == stacked.window_end_s == 200
    assert spread.energy_joules == pytest.approx(220_000) and stacked.energy_joules == pytest.approx(220_000)
    tl = np.load(tmp_path / "out" / "timelines.npz")
    w_spread, w_stacked = tl["window/round-robin/watts"], tl["window/most-allocated/watts"]
    assert w_spread.shape == w_stacked.shape
    bin_s = float(tl["window/bin_s"][0])
    assert float(w_spread.sum()) * bin_s == pytest.approx(220_000, rel=1e-6)


def test_a_trace_replay_is_marked_so_its_seeds_are_not_read_as_workloads(tmp_path):
    # The same pods on every seed: the report says so beside n, where an interval over seeds would suggest more.
    from joulesched.pipelines.report import write_report

    (tmp_path / "pods.csv").write_text("submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n"
                                       "0,50,500,100,500\n10,80,1500,100,1500\n")
    (tmp_path / "s.yaml").write_text(SCENARIO)
    (tmp_path / "g.yaml").write_text(SCENARIO.replace("name: window", "name: generated").replace(
        "workload: {trace: pods.csv}", "workload: {synthetic: {pods: 5, mean_interarrival_s: 10}}"))
    res = run_benchmark([tmp_path / "s.yaml", tmp_path / "g.yaml"], ["default-k8s", "most-allocated"], 2,
                        tmp_path / "out")
    assert res.summary["window"].replay and not res.summary["generated"].replay
    e = [r.policies["default-k8s"].energy_joules for r in res.scenarios if r.name == "window"]
    assert e[0] == e[1]  # the same pods on both seeds
    page = write_report(tmp_path / "out").read_text()
    assert page.count("(replay)") == 1 and "a trace replayed as it is" in page


def test_the_optimums_schedule_is_metered_over_the_window_and_its_gap_stays_the_mips(tmp_path):
    # The MIP spreads the two jobs (done at 100, 120 kJ, proven); most-allocated stacks them (done at 200). Over
    # the window the schedule draws 220 kJ like every run; its gap is the MIP's own, 0, not against the tail.
    from joulesched.pipelines.benchmark import headroom

    (tmp_path / "pods.csv").write_text("submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n"
                                       "0,100,1000,100,2000\n0,100,1000,100,2000\n")
    (tmp_path / "s.yaml").write_text(SCENARIO)
    res = run_benchmark([tmp_path / "s.yaml"], ["default-k8s", "most-allocated"], 1, tmp_path / "out",
                        optimum=True, optimum_time_limit=20)
    opt = res.scenarios[0].optimum
    assert opt.certificate == "optimal" and opt.best_gap == pytest.approx(0, abs=1e-6)
    assert opt.window_end_s == 200 and opt.window_tail_joules == pytest.approx(100_000)
    assert opt.schedule_energy == pytest.approx(220_000)
    assert headroom(res)["window"]["optimum_gap"] == pytest.approx(0, abs=1e-6)


def test_a_cluster_that_can_draw_nothing_has_no_ratio_not_a_division_by_zero(tmp_path):
    """Curves that start at 0 W (an energy-proportional machine, or a calibration that extrapolated its idle
    down to 0 on a busy host): light load costs nothing, so the lower bound is 0 J and so is every policy's
    energy. The ratios against them are absent; the benchmark used to stop on a ZeroDivisionError."""
    (tmp_path / "pods.csv").write_text("submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n"
                                       "0,50,100,100,100\n")
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("[100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200]",
                                                      "[0, 0, 20, 40, 60, 80, 100, 100, 100, 100, 100]"))
    res = run_benchmark([tmp_path / "s.yaml"], ["default-k8s", "most-allocated", "dqn=models/v2.pt"], 1,
                        tmp_path / "out")
    assert res.scenarios[0].lower_bound_joules == 0 and res.scenarios[0].policies["default-k8s"].energy_joules == 0
    rows = res.summary["window"].policies
    assert rows["most-allocated"].energy_vs_lower_bound is None and rows["most-allocated"].energy_vs_default is None
    assert rows["most-allocated"].energy_vs_best_heuristic is None
    from joulesched.pipelines.report import write_report

    page = write_report(tmp_path / "out").read_text()  # the verdict, headroom and ratio plots: dashes, no NaN
    assert "ZeroDivision" not in page and "nan" not in page.lower().replace("nanosec", "")
