"""`train` and `test` commands end to end on the tiny scenario: create, refuse to overwrite, resume, evaluate."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "scenarios" / "tiny.yaml")
runner = CliRunner()


def test_train_resume_and_test(tmp_path):
    model = tmp_path / "m.pt"
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(model), "--steps", "400", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert model.is_file() and (tmp_path / "m.json").is_file()
    assert (tmp_path / "m.curve.csv").is_file() and (tmp_path / "m.curve.png").is_file()
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["training"]["steps"] == 400 and meta["training"]["scenario_names"] == ["tiny"]

    again = runner.invoke(app, ["train", "-s", TINY, "--model", str(model), "--steps", "10", "--no-progress"])
    assert again.exit_code == 2 and "--resume" in again.output

    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(model), "--steps", "300", "--resume", "--no-progress"])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["training"]["steps"] == 700 and len(meta["training"]["runs"]) == 2
    with (tmp_path / "m.curve.csv").open() as fh:
        steps = [int(row["step"]) for row in csv.DictReader(fh)]
    assert steps == sorted(steps) and steps[-1] == 700

    r = runner.invoke(app, ["test", "--model", str(model), "-s", TINY, "--json", "--no-bound"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    (entry,) = res["scenarios"]
    assert entry["name"] == "tiny" and "dqn" in entry["rows"] and "default-k8s" in entry["rows"]
    assert 0.5 < entry["ratio_vs_default"] < 1.5


def test_bad_arguments_fail_with_one_line(tmp_path):
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(tmp_path / "x.pt"), "--steps", "5", "--minutes", "1"])
    assert r.exit_code == 2 and "not both" in r.output
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(tmp_path / "x.pt"), "--steps", "5", "--resume"])
    assert r.exit_code == 2 and "does not exist" in r.output
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    r = runner.invoke(app, ["test", "--model", str(evil), "-s", TINY])
    assert r.exit_code == 2 and "pickle" in r.output
