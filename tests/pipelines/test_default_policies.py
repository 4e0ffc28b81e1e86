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

    assert inspect.signature(evaluate).parameters["baselines"].default == DEFAULT_POLICIES
    assert inspect.signature(run_kube).parameters["policies"].default is None  # None: DEFAULT_POLICIES
    import joulesched.pipelines.sim_pipeline as sim
    assert "DEFAULT_POLICIES" in inspect.getsource(sim.run_sim)


def test_policies_long_marks_the_sets():
    r = runner.invoke(app, ["policies", "--json"])
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert rows["default-k8s"]["in_default_set"] and not rows["default-k8s"]["best_heuristic_candidate"]
    assert rows["pabfd"]["in_default_set"] and rows["pabfd"]["best_heuristic_candidate"]
    assert not rows["dqn"]["in_default_set"]
    assert rows["awake-first"]["variants"] == [{"spec": "awake-first:fit=efficient", "in_default_set": True,
                                                "best_heuristic_candidate": True}]
    assert rows["gpu-energy"]["variants"] == [{"spec": "gpu-energy:empty=asleep", "in_default_set": False,
                                               "best_heuristic_candidate": True}]
    long = runner.invoke(app, ["policies", "--long"]).output
    assert "awake-first:fit=efficient: default," in long and "best heur = a candidate for the best heuristic" in long
