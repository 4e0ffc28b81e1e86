"""Every output goes through the one atomic-write helper (core/fsio.py): a failed write leaves the old file
whole and no temporary file; overlapping writers of the same file never share a temporary name."""

from __future__ import annotations

import json
import threading

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from joulesched.core.fsio import atomic_savefig  # noqa: E402
from joulesched.pipelines import benchmark, kube_pipeline  # noqa: E402
from joulesched.pipelines.stages import Stage, StageRunner  # noqa: E402
from joulesched.pipelines.results import from_dict  # noqa: E402


def _leftovers(d):
    return sorted(p.name for p in d.rglob("*") if p.name.endswith((".tmp", ".partial")))


def _hammer(fn, n: int = 8, rounds: int = 25) -> list[BaseException]:
    """``fn(i)`` from ``n`` threads at once, ``rounds`` times each; the exceptions raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def worker(i: int) -> None:
        start.wait()
        for _ in range(rounds):
            try:
                fn(i)
            except BaseException as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_overlapping_writers_of_a_kube_run_file_never_collide(tmp_path):
    """Before: one fixed `<name>.tmp` per file, so two writers renamed each other's half-written file."""
    path = tmp_path / "run" / "placements.json"
    docs = {i: {"writer": i, "pad": "x" * 20000} for i in range(8)}
    assert _hammer(lambda i: kube_pipeline._write_json(path, docs[i])) == []
    assert json.loads(path.read_text()) in docs.values()
    assert _leftovers(tmp_path) == []


def test_overlapping_stage_records_never_collide(tmp_path):
    """Before: the record went through a fixed `<stage>.tmp`, so two runs of one stage could collide."""
    out = tmp_path / "o.txt"
    out.write_text("x")
    runner = StageRunner(tmp_path, force=True)
    stages = {i: Stage("s", [], {"i": i, "pad": "p" * 20000}, [out], lambda: None) for i in range(8)}
    assert _hammer(lambda i: runner.run(stages[i])) == []
    rec = json.loads((tmp_path / ".stages" / "s.json").read_text())
    assert rec["params"] in [s.params for s in stages.values()] and rec["outputs"] == [str(out)]
    assert _leftovers(tmp_path) == []


def _results(command: str):
    """The smallest valid results (pipelines/results.py): one policy, no scenario run."""
    return from_dict({"schema_version": 2, "command": command, "created_unix": 0.0, "wall_s": 0.0,
                      "policies": ["default-k8s"],
                      "seeds": 1, "scenarios": [], "summary": {}})


def test_a_failed_benchmark_write_keeps_the_previous_file_set(tmp_path, monkeypatch):
    benchmark.write_outputs(tmp_path, _results("old"), {"a": np.arange(3)}, {"n": 1})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fails(fh, **arrays):
        fh.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(benchmark.np, "savez_compressed", fails)
    with pytest.raises(OSError, match="disk full"):
        benchmark.write_outputs(tmp_path, _results("new"), {"a": np.arange(5)}, {"n": 2})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # results.json still the old run
    assert _leftovers(tmp_path) == []


def test_a_write_that_fails_after_the_first_rename_leaves_no_record(tmp_path, monkeypatch):
    """timelines.npz renamed, then nodes.json's rename fails: the old results.json beside the new timelines was a
    mixed set that `report` drew without a word (a review). Now every file is written before any rename, and the
    old record is gone before the first: no results.json, so `report` refuses the folder."""
    import joulesched.core.fsio as fsio

    benchmark.write_outputs(tmp_path, _results("old"), {"a": np.arange(3)}, {"n": 1})
    real = fsio.os.replace

    def second_fails(src, dst):
        if str(dst).endswith("nodes.json"):
            raise OSError(28, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr(fsio.os, "replace", second_fails)
    with pytest.raises(OSError, match="No space"):
        benchmark.write_outputs(tmp_path, _results("new"), {"a": np.arange(5)}, {"n": 2})
    assert not (tmp_path / "results.json").exists() and _leftovers(tmp_path) == []
    from joulesched.pipelines.cli import app
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "results.json" in r.output, r.output


def test_results_json_is_written_last(tmp_path, monkeypatch):
    """results.json is the set's commit record: written after the files it describes."""
    import joulesched.core.fsio as fsio

    order = []
    real = fsio.os.replace
    monkeypatch.setattr(fsio.os, "replace", lambda src, dst: (order.append(str(dst).rsplit("/", 1)[-1]),
                                                              real(src, dst)))
    benchmark.write_outputs(tmp_path, _results(""), {"a": np.arange(3)}, {"n": 1})
    assert order[-1] == "results.json" and set(order) == {"results.json", "timelines.npz", "nodes.json"}
    assert np.load(tmp_path / "timelines.npz")["a"].tolist() == [0, 1, 2]


def test_a_failed_plot_leaves_the_old_png(tmp_path):
    png = tmp_path / "energy.png"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    atomic_savefig(fig, png, dpi=50)
    old = png.read_bytes()
    assert old.startswith(b"\x89PNG")

    class Broken:
        def savefig(self, fname, **kw):
            with open(fname, "wb") as f:
                f.write(b"\x89PNG half")
            raise RuntimeError("renderer died")

    with pytest.raises(RuntimeError, match="renderer died"):
        atomic_savefig(Broken(), png)
    assert png.read_bytes() == old and _leftovers(tmp_path) == []
    plt.close(fig)


def test_a_symlinked_results_json_stays_a_link_and_a_fifo_in_the_folder_is_refused_before_the_run(tmp_path):
    """The old record was unlinked by its link's name, so a folder whose results.json links to an archive lost it;
    a FIFO named nodes.json passed the folder check and was refused only after the whole run (a review)."""
    import os

    from joulesched.core.errors import UsageError
    from joulesched.core.fsio import check_output_dir

    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "results.json").write_text("old")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").symlink_to(archive / "results.json")
    benchmark.write_outputs(out, _results("new"), {"a": np.arange(3)}, {"n": 1})
    assert (out / "results.json").is_symlink()
    assert json.loads((archive / "results.json").read_text())["command"] == "new"
    os.mkfifo(out / "nodes.json.fifo")
    os.replace(out / "nodes.json.fifo", out / "nodes.json")
    with pytest.raises(UsageError, match="nodes.json there is not a regular file"):
        check_output_dir(out, "--out", benchmark.OUTPUT_FILES)
