"""Sweeps: grid expansion, aggregation across seeds, and a real local Ray cluster giving the local results."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.pipelines.sweep import load_grid

runner = CliRunner()
GRID = """\
scenarios: [{root}/scenarios/tiny.yaml, {root}/scenarios/heterogeneous-sleep.yaml]
policies: [default-k8s, most-allocated]
seeds: 2
hyperparameters:
  target-load-packing: {{x: [20, 60]}}
"""


@pytest.fixture
def grid(tmp_path, request):
    root = request.config.rootpath
    p = tmp_path / "grid.yaml"
    p.write_text(GRID.format(root=root))
    return p


def sweep(grid, out, *args):
    r = runner.invoke(app, ["sweep", "--grid", str(grid), "--out", str(out), "--json", "--no-report", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["summary"]


def test_grid_expands_hyperparameters(grid):
    scenarios, policies, seeds = load_grid(grid)
    assert [s.name for s in scenarios] == ["tiny.yaml", "heterogeneous-sleep.yaml"] and seeds == 2
    assert policies == ["default-k8s", "most-allocated", "target-load-packing:x=20", "target-load-packing:x=60"]


def test_a_grid_without_policies_runs_the_default_set(tmp_path):
    from joulesched.agent.registry import DEFAULT_POLICIES, HEURISTIC_VARIANTS, family_of

    p = tmp_path / "grid.yaml"
    sc = Path(__file__).resolve().parents[2] / "scenarios" / "heterogeneous-sleep.yaml"
    p.write_text(f"scenarios: [{sc}]\nhyperparameters:\n  target-load-packing: {{x: [20]}}\n")
    _, policies, _ = load_grid(p)
    assert policies == [*DEFAULT_POLICIES, "target-load-packing:x=20"]
    assert {v for v in HEURISTIC_VARIANTS if family_of(v) != "gpu-aware"} <= set(policies)  # GPU ones: GPU scenarios


def test_local_sweep_aggregates_seeds_with_confidence_intervals(grid, tmp_path):
    summ = sweep(grid, tmp_path / "out", "--jobs", "2")
    row = summ["heterogeneous-sleep"]["policies"]["target-load-packing:x=20"]
    assert summ["heterogeneous-sleep"]["seeds"] == 2
    assert row["energy_vs_default_ci95"] > 0 and 0 < row["energy_vs_default"] < 1.2
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(doc["scenarios"]) == 4 and all(len(e["policies"]) == 4 for e in doc["scenarios"])


@pytest.mark.integration
def test_ray_executor_matches_local(grid, tmp_path):
    """Starts a real local Ray instance (ray.init) and runs every cell as a Ray task."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'joulesched[sweep]')")
    local = sweep(grid, tmp_path / "local")
    on_ray = sweep(grid, tmp_path / "ray", "--executor", "ray")
    for sc in local:
        for pol, row in local[sc]["policies"].items():
            other = on_ray[sc]["policies"][pol]
            for key in ("energy_joules", "energy_vs_default", "energy_vs_default_ci95", "slo_violation_rate",
                        "mean_pending_s", "energy_vs_lower_bound"):
                assert other[key] == row[key], (sc, pol, key)


@pytest.mark.parametrize("text,message", [
    ("scenarios: []\n", "scenarios: List should have at least 1 item"),
    ("scenarios: [x.yaml]\nseeds: 0\n", "seeds"),
    ("scenarios: [x.yaml]\nseeds: true\n", "seeds: expected a number, got true"),  # was one seed
    ("scenarios: [x.yaml]\nhyperparameters: {most-allocated: {pct: [true, 50]}}\n",
     "hyperparameters: expected a number or a string"),  # was pct=1
    ("scenarios: [x.yaml]\nhyperparameters: {peaks: {}}\n", "give at least one parameter"),
    ("scenarios: [x.yaml]\npolicies: []\n", "names no policy"),
    ("scenarios: [x.yaml]\npolicy: [a]\n", "policy: Extra inputs"),
    ("[unclosed", "cannot read grid"),
])
def test_malformed_grids_exit_2_and_write_nothing(tmp_path, text, message):
    p = tmp_path / "grid.yaml"
    p.write_text(text)
    out = tmp_path / "out"
    r = runner.invoke(app, ["sweep", "--grid", str(p), "--out", str(out)])
    assert r.exit_code == 2 and message in r.output, r.output
    assert not out.exists()


@pytest.mark.parametrize("hp", [{"awake-first": {"fit": ["efficient,headroom=0.5"]}},
                                {"awake-first": {"fit=tightest,headroom": [1]}},
                                {"awake-first": {"fit": [" "]}}])
def test_a_hyperparameter_cannot_smuggle_in_another_option(tmp_path, hp):
    from joulesched.pipelines.sweep import GridError, load_grid

    import yaml

    tiny = Path(__file__).resolve().parents[2] / "scenarios" / "tiny.yaml"
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"scenarios": [str(tiny)], "hyperparameters": hp}))
    with pytest.raises(GridError, match="may not be empty or hold"):  # a shape value "0:0|100:10" still may
        load_grid(tmp_path / "g.yaml")


def test_a_hyperparameter_key_is_a_spec_as_policies_holds_them(tmp_path):
    """A key with options got a second ':' (awake-first:fit=efficient:headroom=0.8, refused), and a model path in
    a key was read from the caller's folder where `policies` reads it from the grid file's."""
    sc = Path(__file__).resolve().parents[2] / "scenarios" / "tiny.yaml"
    (tmp_path / "g:2").mkdir()  # a ':' in the grid's folder is part of the model's path, not its options
    p = tmp_path / "g:2" / "grid.yaml"
    p.write_text(f"scenarios: [{sc}]\npolicies: [default-k8s]\nhyperparameters:\n"
                 "  'awake-first:fit=efficient': {headroom: [0.8]}\n  'dqn=m.pt': {threads: [1]}\n")
    _, policies, _ = load_grid(p)
    assert policies[1] == "awake-first:fit=efficient,headroom=0.8"
    assert policies[2] == f"dqn={(tmp_path / 'g:2' / 'm.pt').resolve()}:threads=1"
