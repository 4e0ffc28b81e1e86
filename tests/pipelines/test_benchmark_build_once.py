"""Build once (#23 item 4): a benchmark builds each (scenario, seed)'s workload once and shares it with the
bound, the optimum and every policy; each policy spec is parsed once; with --optimum the fluid bound is
computed once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import joulesched.agent.optimum as optimum
import joulesched.pipelines.benchmark as bench

ROOT = Path(__file__).resolve().parents[2]


def test_each_workload_is_built_once_and_shared(tmp_path, monkeypatch):
    calls: Counter = Counter()
    real_build, real_make, real_fluid = bench.build_workload, bench.make_policy, optimum.fluid

    def build(sc, seed=None, **kw):
        calls["build", sc.name, sc.seed if seed is None else seed] += 1
        return real_build(sc, seed, **kw)

    def make(spec):
        calls["make", spec] += 1
        return real_make(spec)

    def fluid(inst):
        calls["fluid"] += 1
        return real_fluid(inst)

    monkeypatch.setattr(bench, "build_workload", build)
    monkeypatch.setattr(optimum, "build_workload", build)
    monkeypatch.setattr(bench, "make_policy", make)
    monkeypatch.setattr(optimum, "fluid", fluid)
    sc = ROOT / "scenarios" / "small" / "sleep-mixed.yaml"
    policies = ["round-robin", "most-allocated", "awake-first:fit=efficient"]
    doc = bench.run_benchmark([sc], policies, 2, tmp_path / "out", optimum=True, optimum_time_limit=5)
    builds = {k: v for k, v in calls.items() if k[0] == "build"}
    assert len(builds) == 2 and set(builds.values()) == {1}, builds  # one per seed, for bound, optimum, policies
    assert {k[1]: v for k, v in calls.items() if k[0] == "make"} == dict.fromkeys(policies, 1)
    assert calls["fluid"] == 0  # the benchmark's lower bound is the LP's fluid bound: not computed again
    entries = doc["scenarios"] if isinstance(doc, dict) else doc.model_dump()["scenarios"]
    for e in entries:
        assert e["optimum"]["fluid_joules"] == e["lower_bound_joules"]
        assert set(e["policies"]) == set(policies)


def test_shared_workloads_are_read_only():
    sc = bench.load_scenario(ROOT / "scenarios" / "tiny.yaml")
    wl = bench._read_only(bench.build_workload(sc))
    with pytest.raises(ValueError):
        wl.cpu_req[0] = 1
    assert isinstance(wl.submit_s, np.ndarray) and not wl.submit_s.flags.writeable


def test_a_task_alone_still_builds_what_it_needs():
    """Outside a benchmark (nothing shared) a task builds its workload and policy itself, with the same result."""
    sc = bench.load_scenario(ROOT / "scenarios" / "tiny.yaml")
    task = bench.Task(sc, 0, 0, "most-allocated", record=False)
    bench._share({}, {})
    _, alone, _ = bench._run_task(task)
    wl = bench._read_only(bench.build_workload(sc))
    _, shared, _ = bench._run_task(task, wl, bench.make_policy("most-allocated"))
    alone, shared = bench._metrics(alone, [])[0], bench._metrics(shared, [])[0]
    timing = "decision_us_p99"  # wall-clock latency: the one metric that differs run to run
    assert {k: v for k, v in alone.items() if k != timing} == {k: v for k, v in shared.items() if k != timing}
