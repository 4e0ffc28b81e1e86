"""Issue 33, the first hour with a real trace: nothing dropped without a word, counts that agree, help that
fits an 80-column screen, plain errors."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_a_failing_command_draws_no_progress_bar(tmp_path):
    r = runner.invoke(app, ["benchmark", "-s", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "scenario file not found" in r.output
    assert "0/?" not in r.output and "benchmark" not in r.output.split("error:")[0], r.output
