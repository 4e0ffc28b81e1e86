"""The shipped trace samples and the pod-model scenarios of the standard suite: each format's hand-made sample
(scenarios/traces/<format>/) converts through `joulesched trace import` to exactly the shipped pods and
nodes files, and every pod-model scenario (services, the traces' scenarios) is in the standard suite, loads and
builds its pod-model workload."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.workload import SERVICE, build_workload
from joulesched.pipelines.cli import app
from joulesched.pipelines.suite import standard_suite

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "scenarios" / "traces"
sys.path.insert(0, str(TRACES))
import make_samples  # noqa: E402

sys.path.pop(0)


@pytest.mark.parametrize("fmt", list(make_samples.SAMPLES))
def test_sample_converts_to_the_shipped_files(fmt, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = make_samples.convert(fmt)
    args[args.index("-o") + 1] = str(tmp_path / "pods.csv")
    args[args.index("-m") + 1] = str(tmp_path / "nodes.yaml")
    r = CliRunner().invoke(app, ["trace", "import", *args])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "pods.csv").read_bytes() == (TRACES / f"{fmt}.pods.csv").read_bytes()
    assert (tmp_path / "nodes.yaml").read_bytes() == (TRACES / f"{fmt}.nodes.yaml").read_bytes()
    raw = sum(p.stat().st_size for p in make_samples.raw_files(fmt))
    assert raw < 64 * 1024, "samples are shipped small"


POD_MODEL_NAMES = ["services-diurnal-sleep", "mixed-always-on"] + [f"trace-{f}" for f in make_samples.SAMPLES]
POD_MODEL_FILES = [ROOT / "scenarios" / f"{n}.yaml" for n in POD_MODEL_NAMES]


def test_pod_model_scenarios_cover_the_issue_and_are_in_the_standard_suite():
    suite = {p.name for p in standard_suite()}
    assert {p.name for p in POD_MODEL_FILES} <= suite
    assert not (ROOT / "scenarios" / "pending").exists()


@pytest.mark.parametrize("path", POD_MODEL_FILES, ids=POD_MODEL_NAMES)
def test_pod_model_scenario_builds_its_workload(path):
    sc = load_scenario(path)
    wl = build_workload(sc)
    assert len(wl) > 20 and (wl.is_service.any() or (wl.profile >= 0).any())
    assert (np.diff(wl.submit_s) >= 0).all() and (wl.submit_s < sc.duration_s).all()
    # Every pod fits some node when the cluster is empty (the samples' machines hold their pods).
    cpu = max(g.cpu_m for g in sc.nodes)
    mem = max(g.memory_mib for g in sc.nodes)
    assert (wl.cpu_req <= cpu).all() and (wl.mem_req <= mem).all()
    if sc.name == "services-diurnal-sleep":
        svc = wl.is_service
        assert svc.sum() > 100 and {wl.owner_names[o] for o in wl.owner[svc]} == {"Deployment"}
        assert any(wl.service_end_s(i) is not None for i in np.flatnonzero(svc))  # the HPAs scale down
        assert (wl.kind[~svc] != SERVICE).all() and wl.app_names[wl.app[~svc][0]] == "batch"
