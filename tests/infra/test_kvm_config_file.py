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
    ("config:\n  joulesched:workers: 1\n  joulesched:workers: 2\n",
     "not a readable YAML stack file: key 'joulesched:workers' is given twice (lines 2 and 3)"),
])
def test_a_bad_stack_file_exits_2_naming_it(tmp_path, command, text, message):
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text(text)
    r = runner.invoke(app, [*command, "--config", str(cfg)])
    assert r.exit_code == 2, (r.output, r.exception)
    assert f"--config {cfg}: {message}" in " ".join(r.output.split())
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_a_missing_setting_is_named_with_how_to_give_it_here_not_with_pulumi(tmp_path):
    # `infra kvm up` runs without Pulumi: the fix for a missing key is an option or the stack file.
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text("config:\n  joulesched:target: kvm\n")
    r = runner.invoke(app, ["kvm", "up", "--config", str(cfg)])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "pulumi config set" not in text, text
    assert "sshPublicKey is required: pass --ssh-public-key" in text
    assert f"baseImage is required: set joulesched:baseImage in {cfg}" in text
