"""`joulesched infra kvm up|down --config FILE` with a stack file that is not YAML or not a mapping: one line
naming the file and exit 2, never a traceback (typer's CliRunner)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli.infra import app

runner = CliRunner()


@pytest.mark.parametrize("command", [["kvm", "up"], ["kvm", "down"]])
@pytest.mark.parametrize("text, message", [
    ("config:\n  joulesched:workers: [1,\n", "not a readable YAML stack file: while parsing"),
    ("- joulesched:workers: 1\n", "the top level must be a mapping with a config: block, not a list"),
    ("config: [joulesched:workers]\n", "config: must be a mapping of settings, not a list"),
])
def test_a_bad_stack_file_exits_2_naming_it(tmp_path, command, text, message):
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text(text)
    r = runner.invoke(app, [*command, "--config", str(cfg)])
    assert r.exit_code == 2, (r.output, r.exception)
    assert f"--config {cfg}: {message}" in " ".join(r.output.split())
    assert r.exception is None or isinstance(r.exception, SystemExit)
