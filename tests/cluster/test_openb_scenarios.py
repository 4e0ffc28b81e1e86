"""The OpenB scenarios (issue 25): the shipped three-day window validates on the real cluster's 1,523 nodes
and 6,212 GPUs, and its GPU pods keep their shares."""

from __future__ import annotations

from collections import Counter

import numpy as np

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


def test_the_evaluation_window_is_the_real_tail_and_no_training_window_touches_an_evaluating_one():
    """Issue 27: pods from trace second 12,000,000 on evaluate and are never trained on; the OpenB training
    windows (scenarios/openb/mini, and at full size scenarios/openb/full) also stay clear of openb-3days and the
    schema-3 held-out window."""
    import importlib.util

    sc = load_scenario(SCENARIOS_DIR / "openb" / "openb-eval.yaml")
    wl = build_workload(sc)
    assert sc.node_count == 1523 and len(wl) == 2677 and float(wl.submit_s.max()) < sc.duration_s
    spec = importlib.util.spec_from_file_location("make_mini", SCENARIOS_DIR / "openb" / "mini" / "make_mini.py")
    mini = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mini)
    evaluating = [(11_000_000, 11_259_200), (11_600_000, 11_859_200), (12_000_000, float("inf"))]
    for name, start in mini.WINDOWS.items():
        end = start + mini.DAYS3
        assert all(end <= a or start >= b for a, b in evaluating), name
        assert (SCENARIOS_DIR / "openb" / "mini" / f"openb-mini-{name}.yaml").exists(), name
        full = load_scenario(SCENARIOS_DIR / "openb" / "full" / f"openb-full-{name}.yaml")  # the same days at full size
        assert full.node_count == 1523 and full.duration_s == mini.DAYS3
        rows = {r.split(",")[7]: r for r in (SCENARIOS_DIR / "openb" / "full" / f"{name}.pods.csv").read_text().split()}
        mini_rows = (SCENARIOS_DIR / "openb" / "mini" / f"{name}.pods.csv").read_text().split()
        assert len(rows) > 2 * len(mini_rows) and all(rows[r.split(",")[7]] == r for r in mini_rows), name


def test_the_fitted_openb_scenarios_draw_from_the_training_days_only():
    """scenarios/fits/openb-train.yaml was fitted with --until 2,064,000 on an import window from trace second
    9,936,000: nothing created from 12,000,000 s on (issue 27's evaluation window) is in it."""
    from joulesched.cluster.fitted import load_fit

    fit = load_fit(SCENARIOS_DIR / "fits" / "openb-train.yaml")
    assert fit["until_s"] + 9_936_000 <= 12_000_000
    names = {a["name"] for a in fit["apps"]}
    for path in (SCENARIOS_DIR / "openb" / "openb-fitted.yaml", SCENARIOS_DIR / "openb" / "mini" / "openb-mini-fitted.yaml"):
        wl = build_workload(load_scenario(path))
        assert len(wl) > 100 and set(wl.app_names) - {""} <= names and (wl.gpu > 0).any()
    # The CPU side on a CPU cluster: the same fit, its GPU-free applications only.
    sc = load_scenario(SCENARIOS_DIR / "openb" / "openb-cpu-fitted-sleep.yaml")
    wl = build_workload(sc)
    cpu_apps = {a["name"] for a in fit["apps"] if not a["gpu_count"]}
    assert len(wl) > 1000 and set(wl.app_names[int(a)] for a in np.unique(wl.app)) <= cpu_apps
    assert not (wl.gpu > 0).any() and not any(g.gpu_count for g in sc.nodes)
