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
