"""The real OpenB GPU trace in the suite (issue 25): `benchmark --placements` on three days of it (all 1,523
nodes) with every GPU policy, every placement checked against the pods' GPU count, share and model from
placements.csv, and the GPU energy split in results.json. The full trace runs where its pods file was made
(scenarios/openb/openb-full.yaml says how); elsewhere that test is skipped."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.agent.registry import GPU_POLICIES
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.cli import app
from joulesched.pipelines.report import fig_gpu_energy, policy_colors
from joulesched.pipelines.results import load_results
from joulesched.pipelines.suite import SCENARIOS_DIR

THREE_DAYS = SCENARIOS_DIR / "openb" / "openb-3days.yaml"
FULL = SCENARIOS_DIR / "openb" / "openb-full.yaml"
POLICIES = ["default-k8s", "awake-first", *GPU_POLICIES]


def check_placements(scenario: Path, placements: Path) -> dict[str, int]:
    """Every row of placements.csv against the pod's request: the node has that many GPUs, of an allowed model,
    and at no instant do its whole-GPU pods plus the GPUs its shares need at least exceed its GPUs. Returns the
    placed GPU pods per policy (seed 0)."""
    sc = load_scenario(scenario)
    wl = build_workload(sc)
    want = {wl.name_of(i): (int(wl.gpu[i]), int(wl.gpu_milli[i]), wl.gpu_spec_table[int(wl.gpu_spec[i])])
            for i in range(len(wl))}
    runs: dict[tuple, list] = defaultdict(list)
    with placements.open() as fh:
        for r in csv.DictReader(fh):
            runs[(r["policy"], r["seed"])].append(r)
    placed = {}
    for (policy, seed), rows in runs.items():
        assert len(rows) == len(wl), (policy, seed)
        events = []
        for r in rows:
            count, milli, spec = want[r["pod"]]
            if not r["node"] or not count:
                continue
            assert int(r["node_gpu_count"]) >= count, (policy, r)
            assert spec is None or r["node_gpu_model"] in spec, (policy, r)
            end = float(r["end_s"]) if r["end_s"] else math.inf
            events += [(float(r["bind_s"]), 1, r["node"], count, milli, int(r["node_gpu_count"])),
                       (end, 0, r["node"], count, milli, 0)]
        whole: dict[str, int] = defaultdict(int)
        shares: dict[str, int] = defaultdict(int)
        for t, kind, node, count, milli, gpus in sorted(events):
            sign = 1 if kind else -1
            if milli < 1000:
                shares[node] += sign * milli
            else:
                whole[node] += sign * count
            if kind:
                assert whole[node] + math.ceil(shares[node] / 1000) <= gpus, (policy, t, node)
        placed[policy] = sum(1 for e in events if e[1] == 1)
    return placed


def _bench(scenario: Path, out: Path, policies: list[str]) -> dict:
    res = CliRunner().invoke(app, ["benchmark", "-s", str(scenario), *sum((["-p", p] for p in policies), []),
                                   "--placements", "--no-report", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads((out / "results.json").read_text())


def test_three_days_of_openb_every_gpu_policy_keeps_every_gpu_constraint(tmp_path):
    doc = _bench(THREE_DAYS, tmp_path, POLICIES)
    placed = check_placements(THREE_DAYS, tmp_path / "placements.csv")
    assert set(placed) == set(POLICIES) and min(placed.values()) > 400  # of the window's 492 GPU pods
    runs = doc["scenarios"][0]["policies"]
    for p in POLICIES:
        r = runs[p]
        assert r["gpu_joules"] > 0 and r["cpu_joules"] > 0
        assert r["gpu_joules"] + r["cpu_joules"] == pytest.approx(r["energy_joules"], rel=1e-12)
        assert sum(r["node_gpu_joules"].values()) == pytest.approx(r["gpu_joules"], rel=1e-9)
        assert len(r["node_joules"]) == 1523
    summary = doc["summary"]["openb-3days"]["policies"]
    assert summary["fgd"]["gpu_joules"] == pytest.approx(runs["fgd"]["gpu_joules"])
    # The report's CPU-vs-GPU plot: one stacked bar pair per policy, their lengths the split in kWh.
    res = load_results(tmp_path / "results.json")
    fig = fig_gpu_energy(res, "openb-3days", policy_colors(res.policies))
    bars = {b.get_gid(): b for b in fig.axes[0].patches}
    for p in POLICIES:
        assert bars[f"{p}/gpu"].get_width() == pytest.approx(runs[p]["gpu_joules"] / 3.6e6)
        assert bars[f"{p}/gpu"].get_x() == pytest.approx(runs[p]["cpu_joules"] / 3.6e6)


@pytest.mark.skipif(not (SCENARIOS_DIR / "traces" / "openb" / "openb.pods.csv").is_file(),
                    reason="the full OpenB pods file is made from ../shared/data (scenarios/openb/openb-full.yaml)")
def test_the_full_openb_trace_every_policy_keeps_every_gpu_constraint(tmp_path):
    _bench(FULL, tmp_path, POLICIES)
    placed = check_placements(FULL, tmp_path / "placements.csv")
    assert min(placed.values()) > 6000  # of its 6,203 GPU pods
