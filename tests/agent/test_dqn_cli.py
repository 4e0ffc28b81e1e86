"""`train` and `test` commands end to end on the tiny scenario: create, refuse to overwrite, resume, evaluate."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "scenarios" / "tiny.yaml")
SMALL_SLEEP = str(ROOT / "scenarios" / "small" / "sleep-mixed.yaml")
SERVICES = str(ROOT / "scenarios" / "services-diurnal-sleep.yaml")
runner = CliRunner()


# Tiny budgets: a demonstration of one episode, a few gradient steps, no randomised clusters.
SMALL = ["--set", "dqn.pretrain_episodes=1", "--set", "dqn.pretrain_updates=30", "--set", "dqn.randomize=0",
         "--set", "dqn.validation_random=0", "--set", "dqn.validation_load_scales=[1.0]"]


def test_train_resume_and_test(tmp_path):
    model = tmp_path / "m.pt"
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(model), "--steps", "400", "--no-progress", *SMALL])
    assert r.exit_code == 0, r.output
    assert model.is_file() and (tmp_path / "m.json").is_file()
    assert (tmp_path / "m.curve.csv").is_file() and (tmp_path / "m.curve.png").is_file()
    meta = json.loads((tmp_path / "m.json").read_text())
    first = meta["training"]["steps"]
    assert first >= 400 and meta["training"]["scenario_names"] == ["tiny"]  # whole rounds of episodes
    assert meta["feature_schema"] == 2 and meta["config"]["pretrain_updates"] == 30

    again = runner.invoke(app, ["train", "-s", TINY, "--model", str(model), "--steps", "10", "--no-progress"])
    assert again.exit_code == 2 and "--resume" in again.output

    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(model), "--steps", "300", "--resume", "--no-progress"])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "m.json").read_text())
    total = meta["training"]["steps"]
    assert total >= first + 300 and len(meta["training"]["runs"]) == 2
    assert [run["scenarios"] for run in meta["training"]["runs"]][-1] == ["tiny"]
    with (tmp_path / "m.curve.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    steps, walls = [int(row["step"]) for row in rows], [float(row["wall_s"]) for row in rows]
    assert steps == sorted(steps) and steps[-1] == total
    assert walls == sorted(walls)  # the resumed run's seconds count on from the first's
    # A curve file that is no curve (edited, truncated by a crash) is replaced, the model still saved and
    # plotted; the steps still count on from the model's.
    (tmp_path / "m.curve.csv").write_text("step,episode\n1,\n")
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(model), "--steps", "100", "--resume", "--no-progress"])
    assert r.exit_code == 0, r.output
    total2 = json.loads((tmp_path / "m.json").read_text())["training"]["steps"]
    with (tmp_path / "m.curve.csv").open() as fh:
        steps = [int(row["step"]) for row in csv.DictReader(fh)]
    assert steps and steps[0] >= total and steps[-1] == total2

    r = runner.invoke(app, ["test", "--model", str(model), "-s", TINY, "-s", SMALL_SLEEP, "--json", "--no-bound",
                            "--optimum-time-limit", "5"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    tiny, small = res["scenarios"]
    assert tiny["name"] == "tiny" and "dqn" in tiny["rows"] and "default-k8s" in tiny["rows"]
    assert 0.5 < tiny["ratio_vs_default"] < 1.5
    # The ratios to the best sleep-aware heuristic and to the optimum or bound (the MIP runs on small-sleep-mixed).
    for e in (tiny, small):
        assert e["best_sleep_aware"] in e["rows"] and e["ratio_vs_best_sleep_aware"] > 0.5
        assert e["optimum"]["status"] != "unsupported" and e["ratio_vs_bound"] >= 1.0
    assert small["optimum"]["optimum_joules"] and small["ratio_vs_optimum"] > 0.9
    text = runner.invoke(app, ["test", "--model", str(model), "-s", SERVICES, "--no-bound"])
    assert text.exit_code == 0 and "best sleep-aware" in text.output and "optimum: unsupported" in text.output


def test_bad_arguments_fail_with_one_line(tmp_path):
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(tmp_path / "x.pt"), "--steps", "5", "--minutes", "1"])
    assert r.exit_code == 2 and "not both" in r.output
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(tmp_path / "x.pt"), "--steps", "5", "--resume"])
    assert r.exit_code == 2 and "does not exist" in r.output
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    r = runner.invoke(app, ["test", "--model", str(evil), "-s", TINY])
    assert r.exit_code == 2 and "pickle" in r.output
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(tmp_path / "x.pt"), "--steps", "5", "--executor", "k8s"])
    assert r.exit_code == 2 and "executor" in r.output
    r = runner.invoke(app, ["train", "-s", TINY, "--model", str(tmp_path / "x.pt"), "--steps", "5",
                            "--set", "dqn.teacher=no-such-policy"])
    assert r.exit_code == 2 and "teacher" in r.output and not (tmp_path / "x.pt").exists()
    r = runner.invoke(app, ["train", "--help"])
    assert r.exit_code == 0 and "--workers" in r.output and "dqn.randomize" in r.output
