"""The CLI end to end through typer's CliRunner: outputs, determinism and clean refusal of bad input."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app

runner = CliRunner()

SNAPSHOT = {
    "nodes": [
        {"name": "a", "allocatable": {"cpu_m": 4000, "memory_mib": 8192, "pods": 110},
         "pods": [{"cpu_m": 2000, "memory_mib": 4096}], "usage_cpu_m": 1500,
         "power_watts": [100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200]},
        {"name": "b", "allocatable": {"cpu_m": 4000, "memory_mib": 8192, "pods": 110},
         "pods": [], "usage_cpu_m": 0, "power_watts": [100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200]},
        {"name": "c", "allocatable": {"cpu_m": 1000, "memory_mib": 8192, "pods": 110},
         "pods": [], "usage_cpu_m": 0, "power_watts": [100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200]},
    ],
    "pod": {"cpu_m": 1500, "memory_mib": 1024},
}


def bench(tmp_path, *args):
    return runner.invoke(app, ["benchmark", "-s", "scenarios/tiny.yaml", "-p", "default-k8s", "-p", "most-allocated",
                               "--out", str(tmp_path), *args])


def test_benchmark_writes_results_report_and_plots(tmp_path):
    r = bench(tmp_path, "--seeds", "2")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [(e["name"], e["seed"]) for e in doc["scenarios"]] == [("tiny", 5), ("tiny", 6)]
    for e in doc["scenarios"]:
        assert e["lower_bound_joules"] > 0
        for name in ("default-k8s", "most-allocated"):
            m = e["policies"][name]
            assert set(m) >= {"energy_joules", "slo_violation_rate", "unschedulable_pods", "mean_pending_s",
                              "placements", "decision_us_p99"}
            assert m["energy_joules"] >= e["lower_bound_joules"] and m["placements"] > 0
    html = (tmp_path / "report.html").read_text()
    assert "tiny" in html and "most-allocated" in html
    for png in ("energy_ratio.png", "energy_vs_service.png", "power_0.png", "util_0.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 5000


def test_benchmark_is_deterministic_and_json_summary(tmp_path):
    a = bench(tmp_path / "a", "--json", "--no-report")
    b = bench(tmp_path / "b", "--json", "--no-report")
    assert a.exit_code == 0 and b.exit_code == 0
    sa, sb = json.loads(a.stdout)["summary"], json.loads(b.stdout)["summary"]
    assert sa["tiny"]["policies"]["default-k8s"]["energy_joules"] == sb["tiny"]["policies"]["default-k8s"]["energy_joules"]
    assert sa["tiny"]["policies"]["default-k8s"]["energy_vs_default"] == 1.0
    assert not (tmp_path / "a" / "report.html").exists()


def test_parallel_jobs_give_the_same_numbers(tmp_path):
    a = bench(tmp_path / "a", "--json", "--no-report")
    b = bench(tmp_path / "b", "--json", "--no-report", "--jobs", "2")
    strip = lambda s: {k: v for k, v in s.items() if k != "decision_us_p99"}  # noqa: E731
    pa = json.loads(a.stdout)["summary"]["tiny"]["policies"]
    pb = json.loads(b.stdout)["summary"]["tiny"]["policies"]
    assert {k: strip(v) for k, v in pa.items()} == {k: strip(v) for k, v in pb.items()}


@pytest.mark.parametrize("args,message", [
    (["-s", "{bad}"], "invalid scenario"),
    (["-s", "scenarios/tiny.yaml", "-p", "nonsense"], "unknown policy"),
    (["-s", "scenarios/tiny.yaml", "-p", "dqn=/nonexistent/model.pt"], "model"),
    (["-s", "scenarios/tiny.yaml", "-s", "scenarios/tiny.yaml"], "share the name"),
])
def test_benchmark_bad_input_exits_2_and_writes_nothing(tmp_path, args, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nseed: 1\nduration_s: 10\nnodes: []\nworkload: {synthetic: {pods: 1, mean_interarrival_s: 1}}\n")
    args = [str(bad) if a == "{bad}" else a for a in args]
    out = tmp_path / "out"
    r = runner.invoke(app, ["benchmark", *args, "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert message in r.output.lower() or message in r.output
    assert not out.exists()


def test_explain_scores_every_node_and_names_the_reason(tmp_path):
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(SNAPSHOT))
    r = runner.invoke(app, ["explain", "--snapshot", str(p), "--policy", "default-k8s", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    nodes = {n["name"]: n for n in res["nodes"]}
    assert nodes["c"]["feasible"] is False and nodes["c"]["reasons"] == ["Insufficient cpu"]
    # a: Fit cpu (4000-3500)*100/4000 = 12, mem (8192-5120)*100/8192 = 37 -> 24; Balanced |0.875-0.625|/2 -> 87
    assert nodes["a"]["scores"] == {"NodeResourcesFit": 24, "NodeResourcesBalancedAllocation": 87}
    # b: Fit cpu 62, mem 87 -> 74; Balanced |0.375-0.125|/2 = 0.125 -> 87
    assert nodes["b"]["scores"] == {"NodeResourcesFit": 74, "NodeResourcesBalancedAllocation": 87}
    assert nodes["b"]["total"] == 161 and res["chosen"] == "b"
    human = runner.invoke(app, ["explain", "--snapshot", str(p), "--policy", "most-allocated"])
    assert human.exit_code == 0 and "chosen: a" in human.stdout


def test_explain_reports_unschedulable_like_kube(tmp_path):
    snap = dict(SNAPSHOT, pod={"cpu_m": 5000, "memory_mib": 1})
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(snap))
    res = json.loads(runner.invoke(app, ["explain", "--snapshot", str(p), "--json"]).stdout)
    assert res["chosen"] is None and res["message"] == "0/3 nodes are available: 3 Insufficient cpu."


@pytest.mark.parametrize("mutate,message", [
    (lambda s: s.pop("pod"), "pod: Field required"),
    (lambda s: s["nodes"][0].update(power_watts=[1, 2]), "nodes.0.power_watts"),
    (lambda s: s["nodes"][1]["allocatable"].update(cpu_m=-1), "nodes.1.allocatable.cpu_m"),
    (lambda s: s.update(nodes=[]), "nodes"),
    (lambda s: s["nodes"][1].update(name="a"), "appears twice"),
    (lambda s: s["pod"].update(gpu=1), "pod.gpu"),
])
def test_malformed_snapshots_exit_2(tmp_path, mutate, message):
    snap = json.loads(json.dumps(SNAPSHOT))
    mutate(snap)
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(snap))
    r = runner.invoke(app, ["explain", "--snapshot", str(p)])
    assert r.exit_code == 2 and message in r.output


def test_snapshot_that_is_not_json_exits_2(tmp_path):
    p = tmp_path / "snap.json"
    p.write_text("{nope")
    r = runner.invoke(app, ["explain", "--snapshot", str(p)])
    assert r.exit_code == 2 and "not valid JSON" in r.output


def test_validate_and_policies_commands():
    r = runner.invoke(app, ["validate", "scenarios/tiny.yaml"])
    assert r.exit_code == 0 and "3 nodes" in r.stdout
    names = runner.invoke(app, ["policies"]).stdout.split()
    assert {"default-k8s", "peaks", "target-load-packing", "energy-greedy"} <= set(names)


def test_report_on_a_folder_without_results_exits_2(tmp_path):
    r = runner.invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "no results.json" in r.output


def test_validate_warns_of_pods_no_node_takes_by_its_gpus_not_only_by_cpu_and_memory(tmp_path):
    """A pod asking 16 GPUs of 8-GPU nodes passed validate's CPU-and-memory check and was never placed."""
    from tests.helpers import gpu_trace_scenario

    r = runner.invoke(app, ["validate", str(gpu_trace_scenario(tmp_path, [16, 2], gpu_nodes=2)), "--json"])
    assert r.exit_code == 0, r.output
    (warning,) = json.loads(r.stdout)[0]["warnings"]
    assert warning.startswith("1 of 2 pods fit no node even when it is empty") and "16 GPUs" in warning


def test_validate_prints_a_path_with_brackets_as_it_is(tmp_path):
    """A folder named `a[` made `a[/x].yaml` a closing markup tag: rich raised MarkupError (exit 1)."""
    (tmp_path / "a[").mkdir()
    bad = tmp_path / "a[" / "x].yaml"
    bad.write_text((Path(__file__).resolve().parents[2] / "scenarios" / "tiny.yaml").read_text())
    r = runner.invoke(app, ["validate", str(bad)])
    assert r.exit_code == 0, r.output
    assert f"{bad}: ok" in r.stdout.replace("\n", "")
