"""Issue 31: one default policy set (every baseline and every registered variant) behind every command that runs
policies when none is named, and a "×best heur" that names what it divides by."""

import inspect
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from joulesched.agent.registry import DEFAULT_POLICIES, HEURISTIC_VARIANTS
from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "tests" / "support" / "scenarios" / "heldout-hetero-sleep-12.yaml"
runner = CliRunner()


def test_plain_benchmark_runs_the_variants_and_divides_by_the_best_of_them(tmp_path):
    r = runner.invoke(app, ["benchmark", "-s", str(HELDOUT), "--out", str(tmp_path), "--no-report"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["policies"] == list(DEFAULT_POLICIES)
    s = doc["summary"]["heldout-hetero-sleep-12"]
    rows = s["policies"]
    # The best is one of the two efficiency-first sleep-aware packers: the registered variant, or the
    # lifetime-aware packer (a baseline since issue 27), which orders awake nodes by watts per core too, each
    # also with empty awake nodes ranked as sleeping ones (the same choices here).
    efficient = ("awake-first:fit=efficient", "lifetime-aware", "lifetime-aware:empty=asleep")
    best = s["best_heuristics"][0]
    assert best in efficient and rows[best]["energy_vs_best_heuristic"] == 1.0
    assert rows["awake-first:fit=efficient"]["energy_vs_best_heuristic"] < 1.05
    # Without them the best would be a plain baseline that is more than 10 % worse: no flattering 1.00.
    plain_best = min((p for p in rows if p not in efficient and p not in HEURISTIC_VARIANTS and p != "default-k8s"),
                     key=lambda p: rows[p]["energy_joules"])
    assert rows[plain_best]["energy_vs_best_heuristic"] > 1.10, plain_best
    assert f"×best heur = / {best}" in r.output
    assert f"{len(DEFAULT_POLICIES)} policies × 1 scenario(s) × 1 seed(s) ran in" in r.output


def test_one_policy_shows_no_nan_ratio(tmp_path):
    r = runner.invoke(app, ["benchmark", "-s", str(HELDOUT), "-p", "round-robin", "--out", str(tmp_path),
                            "--no-report"])
    assert r.exit_code == 0, r.output
    assert not re.search(r"\bnan\b", r.output) and "no heuristic among the policies" in r.output


def test_test_and_the_pipelines_default_to_the_same_set():
    from joulesched.pipelines.kube_pipeline import run_kube
    from joulesched.pipelines.training import evaluate

    assert inspect.signature(evaluate).parameters["baselines"].default is None  # None: default_policies(GPUs)
    assert "default_policies(sc.has_gpus)" in inspect.getsource(evaluate)
    assert inspect.signature(run_kube).parameters["policies"].default is None  # None: DEFAULT_POLICIES
    import joulesched.pipelines.sim_pipeline as sim
    assert "default_policies(" in inspect.getsource(sim.run_sim)


def test_policies_long_marks_the_sets():
    r = runner.invoke(app, ["policies", "--json"])
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert rows["default-k8s"]["in_default_set"] and not rows["default-k8s"]["best_heuristic_candidate"]
    assert rows["pabfd"]["in_default_set"] and rows["pabfd"]["best_heuristic_candidate"]
    assert not rows["dqn"]["in_default_set"]
    assert rows["awake-first"]["variants"] == [{"spec": "awake-first:fit=efficient", "in_default_set": True,
                                                "in_default_set_with_gpus": True, "best_heuristic_candidate": True}]
    assert rows["gpu-energy"]["variants"] == [{"spec": "gpu-energy:empty=asleep", "in_default_set": False,
                                               "in_default_set_with_gpus": True, "best_heuristic_candidate": True}]
    assert not rows["fgd"]["in_default_set"] and rows["fgd"]["in_default_set_with_gpus"]
    long = runner.invoke(app, ["policies", "--long"]).output
    assert "awake-first:fit=efficient: default," in long and "best heur = a candidate for the best heuristic" in long


def test_on_a_gpu_cluster_the_default_set_takes_the_gpu_aware_heuristics(tmp_path):
    """Without --policy, a run with a GPU scenario compares with the heuristics that know GPUs: "×best heur" there
    divides by the best of them, not by a CPU packer."""
    from joulesched.agent.registry import GPU_DEFAULTS, GPU_POLICIES, default_policies, family_of

    assert default_policies() == DEFAULT_POLICIES and not set(GPU_POLICIES) & set(DEFAULT_POLICIES)
    assert set(GPU_POLICIES) | {v for v in HEURISTIC_VARIANTS if family_of(v) == "gpu-aware"} == set(GPU_DEFAULTS)
    gpu = ROOT / "scenarios" / "openb" / "mini" / "openb-mini-w10000k.yaml"
    r = runner.invoke(app, ["benchmark", "-s", str(gpu), "--out", str(tmp_path), "--no-report"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["policies"] == list(default_policies(gpus=True))
    best = doc["summary"]["openb-mini-w10000k"]["best_heuristics"][0]
    assert family_of(best) == "gpu-aware", best
    # A run with a CPU scenario beside the GPU one takes them too (the policy set is the run's).
    r = runner.invoke(app, ["benchmark", "-s", str(HELDOUT), "-s", str(gpu), "--out", str(tmp_path / "b"),
                            "--no-report", "--seeds", "1"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "results.json").read_text())["policies"] == list(default_policies(True))


def test_a_sweep_grid_without_policies_takes_them_where_a_scenario_has_gpus(tmp_path):
    from joulesched.agent.registry import default_policies
    from joulesched.pipelines.sweep import load_grid

    gpu = ROOT / "scenarios" / "openb" / "mini" / "openb-mini-w10000k.yaml"
    for scenarios, gpus in (([HELDOUT], False), ([HELDOUT, gpu], True)):
        grid = tmp_path / f"grid-{gpus}.yaml"
        grid.write_text("scenarios: [" + ", ".join(str(s) for s in scenarios) + "]\n")
        assert load_grid(grid)[1] == list(default_policies(gpus))
    grid.write_text(f"scenarios: [{gpu}]\npolicies: [gpu-energy]\n")
    assert load_grid(grid)[1] == ["gpu-energy"]  # named policies are the grid's own
    # A hyperparameter combination that the GPU default set already runs is run once.
    grid.write_text(f"scenarios: [{gpu}]\nhyperparameters:\n  gpu-energy: {{empty: [awake, asleep]}}\n")
    specs = load_grid(grid)[1]
    assert specs.count("gpu-energy:empty=asleep") == 1 and "gpu-energy:empty=awake" in specs
