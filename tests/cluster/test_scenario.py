"""Scenario, trace and workload handling: valid files load, malformed ones are refused naming the problem."""

import textwrap

import numpy as np
import pytest

from joulesched.cluster.scenario import ScenarioError, load_scenario
from joulesched.cluster.workload import NO_REQUEST, build_workload, load_trace, synthesize

GOOD = """\
name: t
seed: 1
duration_s: 3600
idle_policy: {mode: sleep, sleep_after_s: 60, sleep_watts: 5, wake_s: 30}
nodes:
  - {name_prefix: a, count: 2, cpu_m: 4000, memory_mib: 8192, power_watts: ibm-x3250-x3470}
  - {name_prefix: b, count: 1, cpu_m: 8000, memory_mib: 8192, power_watts: [1,2,3,4,5,6,7,8,9,10,11]}
workload:
  synthetic: {pods: 200, arrival: diurnal, mean_interarrival_s: 5, burst_mean: 3}
"""

TRACE_HEAD = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n"


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_good_scenario_loads(tmp_path):
    sc = load_scenario(write(tmp_path, GOOD))
    assert sc.node_count == 3 and sc.idle_policy.mode == "sleep" and sc.nodes[0].curve[0] == 41.6


def test_standard_suite_is_valid():
    from pathlib import Path

    files = sorted(Path("scenarios").glob("*.yaml"))
    names = {load_scenario(f).name for f in files}
    assert {"homogeneous", "heterogeneous", "heterogeneous-sleep", "large", "tiny"} <= names
    assert max(load_scenario(f).node_count for f in files) >= 200
    assert min(load_scenario(f).node_count for f in files) == 3


def test_the_scale_scenarios_load_with_sampling_sized_clusters():
    """scenarios/scale/ (issue 28's energy of sampling where it engages): valid, and big enough that kube's
    adaptive sample (680 of 2,000 nodes) is smaller than the cluster."""
    from pathlib import Path

    files = sorted(Path("scenarios/scale").glob("*.yaml"))
    got = {load_scenario(f).name: load_scenario(f) for f in files}
    assert set(got) == {"busy-2000-on", "busy-2000-sleep"}
    assert all(sc.node_count == 2000 for sc in got.values())
    assert got["busy-2000-sleep"].idle_policy.mode == "sleep" and got["busy-2000-on"].idle_policy.mode != "sleep"


MALFORMED_SCENARIOS = [
    ("name: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "must be a YAML mapping"),
    (GOOD.replace("seed: 1\n", ""), "seed: Field required"),
    (GOOD.replace("duration_s: 3600", "duration_s: -5"), "duration_s: Input should be greater than 0"),
    (GOOD.replace("duration_s: 3600", "duration_s: .nan"), "duration_s"),
    (GOOD.replace("count: 2", "count: two"), "nodes.0.count"),
    (GOOD.replace("[1,2,3,4,5,6,7,8,9,10,11]", "[1,2,3]"), "nodes.1.power_watts: a power curve needs 11 points"),
    (GOOD.replace("[1,2,3,4,5,6,7,8,9,10,11]", "[11,2,3,4,5,6,7,8,9,10,11]"), "non-decreasing"),
    (GOOD.replace("ibm-x3250-x3470", "dell-9000"), "unknown power profile"),
    (GOOD.replace("mode: sleep,", "mode: hibernate,"), "idle_policy"),
    (GOOD.replace("wake_s: 30", "wake_s: -1"), "idle_policy.wake_s"),
    (GOOD.replace("mean_interarrival_s: 5", "mean_interarival_s: 5"), "mean_interarival_s: Extra inputs"),
    (GOOD.replace("  synthetic:", "  trace: pods.csv\n  synthetic:"), "exactly one of 'synthetic' or 'trace'"),
    (GOOD.replace("name_prefix: b", "name_prefix: a"), "used twice"),
    (GOOD.replace("name_prefix: b", "name_prefix: B_1"), "nodes.1.name_prefix: must be a lowercase DNS label"),
    (GOOD.replace("arrival: diurnal", "arrival: lunar"), "workload.synthetic.arrival"),
    (GOOD.replace("workload:\n  synthetic: {pods: 200, arrival: diurnal, mean_interarrival_s: 5, burst_mean: 3}\n",
                  "workload:\n  trace: missing.csv\n"), "file not found"),
    ("", "must be a YAML mapping"),
    # Finite but beyond any machine: float32 timelines overflowed to inf, and benchmark blamed its own output file.
    (GOOD.replace("sleep_watts: 5", "sleep_watts: 1.0e+39"), "idle_policy.sleep_watts: Input should be less"),
    (GOOD.replace("[1,2,3,4,5,6,7,8,9,10,11]", "[1,2,3,4,5,6,7,8,9,10,1.0e+300]"), r"100% is 1e\+300: watts must"),
    (GOOD.replace("count: 1,", "count: 1, gpu_count: 1, gpu_model: T4, gpu_power_watts: [10, 1.0e+300],"),
     "GPU power needs 0 <= idle <= max <= 1e"),
    (GOOD.replace("count: 1,", "count: 1, gpu_count: 1, gpu_model: T4, gpu_power_watts: [9,8,7,6,5,4,3,2,1,1,1],"),
     "non-decreasing"),
    # pydantic's lax mode read true as 1: one node, one pod, without a word
    (GOOD.replace("count: 2", "count: true"), "nodes.0.count: expected a number, got true"),
    (GOOD.replace("pods: 200", "pods: true"), "workload.synthetic.pods: expected a number, got true"),
    (GOOD.replace("[1,2,3,4,5,6,7,8,9,10,11]", "[1,2,3,4,5,6,7,8,9,10,true]"),
     "nodes.1.power_watts: expected a number"),
    (GOOD.replace("duration_s: 3600", "duration_s: false"), "duration_s: expected a number, got false"),
]


@pytest.mark.parametrize("text,message", MALFORMED_SCENARIOS)
def test_malformed_scenarios_are_refused_naming_the_field(tmp_path, text, message):
    with pytest.raises(ScenarioError, match=message) as ei:
        load_scenario(write(tmp_path, text))
    assert "s.yaml" in str(ei.value)


MALFORMED_TRACES = [
    ("", "empty trace"),
    ("submit_s,duration_s,cpu_request_m\n1,2,3\n", "missing column"),
    (TRACE_HEAD, "no pods"),
    (TRACE_HEAD + "0,10,abc,100,50\n", "line 2, column cpu_request_m: 'abc' is not an integer"),
    (TRACE_HEAD + "0,10,100,100,50\n5,-1,100,100,50\n", "line 3, column duration_s: duration must be > 0"),
    (TRACE_HEAD + "0,10,100,-4,50\n", "column memory_request_mib: -4 is negative"),
    (TRACE_HEAD + "0,10,100,100,nan\n", "column cpu_usage_m: 'nan' is not finite"),
    (TRACE_HEAD + "0,10,100\n", "line 2: 3 cells"),
    (TRACE_HEAD + "x,10,100,100,50\n", "column submit_s: 'x' is not a number"),
    (TRACE_HEAD + "99999,10,100,100,50\n", "every pod is submitted at or after"),
    (TRACE_HEAD.strip() + ",cpu_request_m\n0,10,100,100,50,999\n", "line 1: column cpu_request_m appears 2 times"),
]


@pytest.mark.parametrize("text,message", MALFORMED_TRACES)
def test_malformed_traces_are_refused_naming_line_and_column(tmp_path, text, message):
    p = tmp_path / "pods.csv"
    p.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_trace(p, duration_s=3600)


def test_trace_blank_request_means_best_effort_and_rows_sort_by_submit(tmp_path):
    p = tmp_path / "pods.csv"
    p.write_text(TRACE_HEAD + "5,10,,,50\n1,20,100,0,80\n4000,1,1,1,1\n")
    wl = load_trace(p, duration_s=3600)
    assert wl.submit_s.tolist() == [1, 5] and wl.dropped == 1
    assert wl.cpu_req.tolist() == [100, NO_REQUEST] and wl.mem_req.tolist() == [0, NO_REQUEST]


def test_trace_scenario_resolves_relative_to_its_file(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "pods.csv").write_text(TRACE_HEAD + "0,10,100,100,50\n")
    text = GOOD.replace("workload:\n  synthetic: {pods: 200, arrival: diurnal, mean_interarrival_s: 5, burst_mean: 3}\n",
                        "workload:\n  trace: t/pods.csv\n")
    sc = load_scenario(write(tmp_path, text))
    assert len(build_workload(sc)) == 1


def test_node_group_include(tmp_path):
    (tmp_path / "profile.yaml").write_text(
        "name_prefix: calib\ncount: 1\ncpu_m: 2000\nmemory_mib: 4096\nmax_pods: 50\n"
        "power_watts: [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]\n")
    text = GOOD.replace("  - {name_prefix: a,", "  - {include: profile.yaml, count: 4}\n  - {name_prefix: a,")
    sc = load_scenario(write(tmp_path, text))
    assert sc.nodes[0].name_prefix == "calib" and sc.nodes[0].count == 4 and sc.nodes[0].curve[10] == 20


def _spec(**kw):
    from joulesched.cluster.scenario import Synthetic

    return Synthetic(**{"pods": 20000, "mean_interarrival_s": 1.0, **kw})


def test_synthetic_matches_the_trace_statistics():
    wl = synthesize(_spec(best_effort_fraction=0.0), horizon=1e9, seed=3)
    # Durations: lognormal with median 540 s and sigma 1.88 (p90 = 540 e^(1.2816 * 1.88) = 6,019... clipped at 1 s)
    assert np.median(wl.duration_s) == pytest.approx(540, rel=0.06)
    assert np.percentile(np.log(wl.duration_s), 84.13) - np.log(540) == pytest.approx(1.88, rel=0.06)
    # Requests follow the 2023 quantiles scaled by 1/16: median 11.3 cores -> ~700m
    assert np.median(wl.cpu_req) == pytest.approx(11.3 * 1000 / 16, rel=0.08)
    # Usage sits below the request, 50-80 % on average
    frac = wl.usage_m / wl.cpu_req
    assert 0.55 < frac.mean() < 0.75 and np.median(frac) < 1
    # Concentration: a small share of pods carries most CPU-seconds (heavy tail)
    work = np.sort(wl.usage_m * wl.duration_s)[::-1]
    assert work[: len(work) // 100].sum() / work.sum() > 0.2
    assert np.mean(np.diff(wl.submit_s)) == pytest.approx(1.0, rel=0.05)


def test_bursty_arrivals_have_high_cv_and_diurnal_swings():
    gaps = np.diff(synthesize(_spec(burst_mean=8), horizon=1e9, seed=1).submit_s)
    assert gaps.std() / gaps.mean() > 2.5
    wl = synthesize(_spec(arrival="diurnal", diurnal_swing=4, diurnal_period_s=2000), horizon=1e9, seed=1)
    phase = (wl.submit_s % 2000) / 2000
    peak = ((phase > 0.2) & (phase < 0.3)).sum()  # sin peaks at a quarter period
    trough = ((phase > 0.7) & (phase < 0.8)).sum()
    assert 2.5 < peak / trough < 6


def test_best_effort_fraction_and_determinism():
    a = synthesize(_spec(best_effort_fraction=0.2), horizon=1e9, seed=9)
    b = synthesize(_spec(best_effort_fraction=0.2), horizon=1e9, seed=9)
    assert np.array_equal(a.usage_m, b.usage_m)
    be = (a.cpu_req == NO_REQUEST) & (a.mem_req == NO_REQUEST)
    assert 0.17 < be.mean() < 0.23 and (a.usage_m[be] > 0).all()


def test_arrivals_stop_at_the_horizon():
    wl = synthesize(_spec(pods=1000, mean_interarrival_s=10), horizon=500, seed=0)
    assert wl.submit_s.max() < 500 and 30 < len(wl) < 80


def test_exported_trace_reads_back_to_the_same_pods(tmp_path):
    from joulesched.cluster.workload import write_trace

    wl = synthesize(_spec(pods=300, best_effort_fraction=0.3), horizon=1e9, seed=2)
    write_trace(wl, tmp_path / "x.csv")
    back = load_trace(tmp_path / "x.csv")
    for col in ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m"):
        assert np.array_equal(getattr(wl, col), getattr(back, col)), col
