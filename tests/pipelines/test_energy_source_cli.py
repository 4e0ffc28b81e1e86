"""`pipeline --env kube --energy-source`: a bad preset name, or a preset together with --energy-selector, exits 2
before anything is contacted or written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app


@pytest.mark.parametrize("args,needle", [
    (["--energy-source", "scaphandre"], "--energy-source 'scaphandre': expected one of joulesched, kepler"),
    (["--energy-source", "kepler", "--energy-selector", "my_joules_total"], "give one"),
])
def test_energy_source_bad_input_exits_2(tmp_path, args, needle):
    kc = tmp_path / "kc"
    kc.write_text("{}")
    r = CliRunner().invoke(app, ["pipeline", "--env", "kube", "--out", str(tmp_path / "out"), "--kubeconfig", str(kc),
                                 "--prometheus", "http://127.0.0.1:1", "--target", "http://127.0.0.1:1/", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()
