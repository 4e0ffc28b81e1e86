"""Output paths (core/fsio.py): a file name that is already a directory there is refused before any work, by
name and with exit 2, and leaves nothing half-written; the atomic write refuses it too rather than failing in
os.replace after the work."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.core.errors import UsageError
from joulesched.core.fsio import atomic_write_text, check_output_dir
from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_an_atomic_write_onto_a_directory_is_a_usage_error_and_leaves_no_temp_file(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(UsageError, match="out.json is a directory"):
        atomic_write_text(tmp_path / "out.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_an_output_folder_whose_file_is_a_directory_is_refused_naming_it(tmp_path):
    (tmp_path / "results.json").mkdir()
    with pytest.raises(UsageError, match="--out .*: results.json there is a directory"):
        check_output_dir(tmp_path, "--out", ("nodes.json", "results.json"))
    assert check_output_dir(tmp_path, "--out", ("nodes.json",)) == tmp_path


@pytest.mark.parametrize("name", ["results.json", "timelines.npz", "report.html"])
def test_benchmark_refuses_before_running_and_writes_nothing(tmp_path, name):
    """Before: minutes of runs, then IsADirectoryError, with nodes.json and timelines.npz left without results.json."""
    (tmp_path / name).mkdir()
    r = runner.invoke(app, ["benchmark", "-s", str(ROOT / "scenarios" / "tiny.yaml"), "-p", "default-k8s",
                            "-o", str(tmp_path)])
    assert r.exit_code == 2 and f"{name} there is a directory" in r.output and "Traceback" not in r.output, r.output
    assert [p.name for p in tmp_path.iterdir()] == [name]
