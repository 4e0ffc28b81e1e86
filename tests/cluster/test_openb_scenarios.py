"""The OpenB scenarios (issue 25): the shipped three-day window validates on the real cluster's 1,523 nodes
and 6,212 GPUs, and its GPU pods keep their shares."""

from __future__ import annotations

from collections import Counter

from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.suite import SCENARIOS_DIR


def test_openb_three_days_is_the_real_cluster():
    sc = load_scenario(SCENARIOS_DIR / "openb" / "openb-3days.yaml")
    assert sc.node_count == 1523
    gpus = Counter()
    for g in sc.nodes:
        gpus[g.gpu_model] += g.count * g.gpu_count
    assert sum(gpus.values()) == 6212 and gpus["G2"] == 4392 and gpus["T4"] == 842
    wl = build_workload(sc)
    shared = (wl.gpu == 1) & (wl.gpu_milli < 1000)
    assert len(wl) == 571 and shared.sum() > 100 and (wl.gpu > 1).any()
