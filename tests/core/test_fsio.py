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


def test_a_device_or_fifo_is_not_replaced_and_a_symlink_is_written_through(tmp_path):
    """``-o /dev/full`` exited 0 and left /dev/full a regular file; a FIFO and a symlink were replaced too (a
    review). Now a device or FIFO is refused, and a link keeps pointing at its target, which is written."""
    import os

    from joulesched.core.fsio import check_output_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for dest in (fifo, Path("/dev/null")):
        with pytest.raises(UsageError, match="is not a regular file"):
            atomic_write_text(dest, "x")
        with pytest.raises(UsageError, match="is not a regular file"):
            check_output_file(dest, "--out")
    assert fifo.is_fifo() and Path("/dev/null").is_char_device()
    target = tmp_path / "real.csv"
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "sub" / "made.csv")
    atomic_write_text(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "sub" / "made.csv").read_text() == "made"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.csv", "fifo", "link.csv", "real.csv", "sub"]


def test_no_command_writes_its_output_over_a_file_its_scenario_reads(tmp_path):
    """`trace -o` over the scenario's own trace (it grew at every run), `explain --save-snapshot` over the
    scenario, `train --model` over it: each replaced an input, exit 0 (a review)."""
    trace = tmp_path / "base.csv"
    trace.write_text("submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n0,30,100,10,100\n")
    sc = tmp_path / "sc.yaml"
    sc.write_text("name: sc\nseed: 1\nduration_s: 60\nidle_policy: {mode: always_on}\n"
                  "nodes: [{name_prefix: a, count: 1, cpu_m: 1000, memory_mib: 1024, power_watts: hp-ml110-g5}]\n"
                  "workload: {trace: base.csv}\n")
    before = (sc.read_bytes(), trace.read_bytes())
    for args in (["trace", "-s", str(sc), "-o", str(trace)],
                 ["explain", "-s", str(sc), "--save-snapshot", str(sc)],
                 ["train", "-s", str(sc), "--model", str(trace), "--overwrite", "--steps", "10", "--no-progress"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "is also an input of this command" in r.output, (args, r.output)
    assert (sc.read_bytes(), trace.read_bytes()) == before


def test_a_full_disk_is_one_line_and_exit_1_not_a_traceback(tmp_path, monkeypatch):
    """A write that fails for the machine's reasons (ENOSPC, a read-only or immutable folder) printed a Python
    traceback (a review); it is one line naming the file, exit 1, and the output is left as it was."""
    import errno

    import joulesched.cluster.workload as workload

    def full(wl, out):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(workload, "write_trace", full)
    r = runner.invoke(app, ["trace", "-s", str(ROOT / "scenarios" / "tiny.yaml"), "-o", str(tmp_path / "t.csv")])
    assert r.exit_code == 1, r.output
    assert "t.csv: No space left on device" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "t.csv").exists()

    def bug(wl, out):
        raise FileNotFoundError(errno.ENOENT, "a bug's own error", "x")  # not the machine's state: not hidden

    monkeypatch.setattr(workload, "write_trace", bug)
    r = runner.invoke(app, ["trace", "-s", str(ROOT / "scenarios" / "tiny.yaml"), "-o", str(tmp_path / "t.csv")])
    assert isinstance(r.exception, FileNotFoundError)



def test_a_permission_error_without_a_file_is_not_called_a_storage_failure(monkeypatch):
    """EACCES from a socket bind (a port below 1024) was printed as "Permission denied (nothing half-written is
    left ...)" with no word of what failed (a review): without a file name it is not the machine's storage."""
    import errno

    import joulesched.cluster.workload as workload

    def bind(wl, out):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(workload, "write_trace", bind)
    r = runner.invoke(app, ["trace", "-s", str(ROOT / "scenarios" / "tiny.yaml"), "-o", "-"])
    assert isinstance(r.exception, PermissionError)
