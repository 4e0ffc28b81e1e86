"""results.json as a typed model (issue 23, item 3): the shipped JSON Schema is the model's, a real run validates
against it, the schema requires its top-level keys, schema 1 files still render and other versions exit 2."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest
from typer.testing import CliRunner

from joulesched.pipelines import results
from joulesched.pipelines.benchmark import run_benchmark
from joulesched.pipelines.cli import app
from joulesched.pipelines.suite import REPO_ROOT, SCENARIOS_DIR

V1 = REPO_ROOT / "tests" / "pipelines" / "data" / "results-v1"  # written by joulesched before the model
TOP_LEVEL = {"schema_version", "command", "created_unix", "wall_s", "policies", "seeds", "scenarios", "summary"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    res = run_benchmark([SCENARIOS_DIR / "tiny.yaml", SCENARIOS_DIR / "small" / "trace-sleep.yaml"],
                        ["default-k8s", "awake-first"], 2, out)
    return out, res


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(results.SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_the_shipped_schema_is_the_models():
    """docs/results.schema.json is generated from the model: regenerate it and it is the same file."""
    assert results.SCHEMA_PATH.read_text() == results.schema_text(), (
        "docs/results.schema.json is stale: run `.venv/bin/python -m joulesched.pipelines.results`")


def test_a_real_results_json_validates_and_reads_back_through_attributes(run):
    out, res = run
    doc = json.loads((out / "results.json").read_text())
    _validator().validate(doc)
    assert doc["schema_version"] == results.SCHEMA_VERSION == 2 and doc["env"] == "twin"
    back = results.load_results(out / "results.json")
    assert back == res  # what was written is what was returned, bit for bit
    assert [(e.name, e.seed) for e in back.scenarios] == [("tiny", 5), ("tiny", 6),
                                                          ("small-trace-sleep", 3), ("small-trace-sleep", 4)]
    e = back.runs("tiny")[0]
    assert e.policies["awake-first"].energy_joules >= e.lower_bound_joules > 0
    assert back.summary["tiny"].policies["default-k8s"].energy_vs_default == 1.0
    # A twin run carries no kube-only fields: not even as nulls.
    assert "scheduler_name" not in doc["scenarios"][0]["policies"]["default-k8s"]


def test_one_key_per_scenario_its_name(run):
    out, res = run
    import numpy as np

    nodes = json.loads((out / "nodes.json").read_text())
    assert set(nodes) == set(res.summary) == {"tiny", "small-trace-sleep"}
    with np.load(out / "timelines.npz") as tl:
        prefixes = {k.split("/", 1)[0] for k in tl.files}
    assert prefixes == set(res.summary)
    assert {res.timeline_key(n) for n in res.summary} == prefixes


def test_the_schema_requires_every_top_level_key(run):
    out, _ = run
    doc = json.loads((out / "results.json").read_text())
    schema = json.loads(results.SCHEMA_PATH.read_text())
    assert set(schema["required"]) == TOP_LEVEL
    v = _validator()
    for key in sorted(TOP_LEVEL):
        broken = {k: x for k, x in doc.items() if k != key}
        errors = list(v.iter_errors(broken))
        assert errors and any(key in e.message for e in errors), key
        with pytest.raises(results.ResultsError, match=key):
            results.from_dict(broken, "r.json")
    # A policy run without its energy is refused too, naming where.
    broken = json.loads(json.dumps(doc))
    del broken["scenarios"][1]["policies"]["default-k8s"]["energy_joules"]
    assert list(v.iter_errors(broken))
    with pytest.raises(results.ResultsError, match=r"scenarios\.1\.policies\.default-k8s\.energy_joules"):
        results.from_dict(broken, "r.json")


def test_a_schema_1_results_folder_still_renders(tmp_path):
    out = tmp_path / "v1"
    shutil.copytree(V1, out)
    assert json.loads((out / "results.json").read_text())["version"] == 1
    r = CliRunner().invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    html = (out / "report.html").read_text()
    assert 'id="verdict"' in html and "most-allocated" in html
    # Its timelines are keyed by position: the power and utilisation plots still find them.
    for png in ("energy_ratio.png", "power_0.png", "util_0.png"):
        assert (out / "plots" / png).stat().st_size > 5000, png
    res = results.load_results(out / "results.json")
    assert res.read_version == 1 and res.timeline_key("tiny") == "0"


@pytest.mark.parametrize("doc,needle", [
    ({"schema_version": 99, "scenarios": []}, "results schema version 99 is not one this joulesched reads (1, 2)"),
    ({"version": 0}, "results schema version 0 is not one"),
    ({"scenarios": []}, "not a joulesched results file (no schema_version)"),
    ([1, 2], "not a joulesched results file"),
])
def test_other_versions_and_shapes_exit_2_naming_the_problem(tmp_path, doc, needle):
    (tmp_path / "results.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split()), r.output
    assert not (tmp_path / "report.html").exists()


@pytest.fixture(scope="module")
def with_optimum(tmp_path_factory):
    """A benchmark with the optimum's row, which the report renders."""
    from joulesched.pipelines.report import verdict

    out = tmp_path_factory.mktemp("optimum")
    res = run_benchmark([SCENARIOS_DIR / "tiny.yaml"], ["default-k8s", "most-allocated"], 1, out, optimum=True,
                        optimum_time_limit=10)
    assert res.scenarios[0].optimum is not None and verdict(res)
    return out


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["scenarios"][0]["optimum"].update(schedule_joules="abc"), "schedule_joules"),
    (lambda d: d["scenarios"][0]["optimum"].update(window_tail_joules="five"), "window_tail_joules"),
    (lambda d: d["scenarios"][0]["optimum"].update(boa_bound_joules=[1]), "boa_bound_joules"),
    (lambda d: d["scenarios"][0]["optimum"].update(certificate="proven"), "certificate"),
    (lambda d: d.update(policies=[]), "policies"),
])
def test_a_file_the_report_cannot_render_is_refused_by_the_schema_and_the_model(tmp_path, with_optimum, edit, needle):
    """Each of these passed the schema and the model, then `joulesched report` stopped on a traceback (exit 1)."""
    out = tmp_path / "run"
    shutil.copytree(with_optimum, out)
    doc = json.loads((out / "results.json").read_text())
    edit(doc)
    assert list(_validator().iter_errors(doc)), "the shipped schema lets it through"
    (out / "results.json").write_text(json.dumps(doc))
    r = CliRunner().invoke(app, ["report", str(out)])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output
