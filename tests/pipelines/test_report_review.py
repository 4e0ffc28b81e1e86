"""Review findings on the report, results.json and the benchmark's output folder: what a re-run leaves beside new
results, a ``plots`` that is not a folder, the verdict's pick against the ratio the page shows, results and
nodes files json cannot parse, inconsistent results, a schedule of no energy, a 0 J lower bound, and names
printed through rich markup."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from joulesched.pipelines import benchmark, report
from joulesched.pipelines.benchmark import BenchmarkInputError, headroom, run_benchmark, summarize
from joulesched.pipelines.cli import app
from joulesched.pipelines.results import Results, ResultsError, dump, from_dict
from joulesched.pipelines.suite import SCENARIOS_DIR

runner = CliRunner()
TINY = str(SCENARIOS_DIR / "tiny.yaml")
ALIKE = {"slo_violation_rate": 0.0, "unschedulable_pods": 0, "mean_pending_s": 0.0, "placements": 3,
         "decision_us_p99": 1.0, "mean_throttling": 0.0, "end_s": 100.0, "completed_pods": 3}


def _doc(energies: list[dict[str, float]], lower_bound: float = 80.0, optimum: dict | None = None) -> dict:
    """A results document of scenario ``s``, one seed per dict of ``energies`` (policy -> joules), every other
    metric alike."""
    runs = [{"name": "s", "seed": k, "nodes": 2, "pods": 3, "lower_bound_joules": lower_bound,
             **({"optimum": {"name": "s", "seed": k, "nodes": 2, "pods": 3, **optimum}} if optimum else {}),
             "policies": {p: {"energy_joules": e, **ALIKE} for p, e in seed.items()}}
            for k, seed in enumerate(energies)]
    doc = {"schema_version": 2, "command": "", "created_unix": 0.0, "wall_s": 0.0, "policies": list(energies[0]),
           "seeds": len(energies), "scenarios": runs}
    doc["summary"] = summarize(doc)
    return doc


def _folder(tmp_path: Path, doc: dict | Results | None = None) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    res = doc if isinstance(doc, Results) else from_dict(doc or _doc([{"default-k8s": 200.0, "most-allocated": 100.0}]))
    (out / "results.json").write_text(dump(res))
    return out


def _one_line_exit_2(r) -> str:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1, r.output
    return r.stderr.strip()


# 1. A `plots` that is not a folder, or a folder where a plot goes: refused up front, and the page comes last.

@pytest.mark.parametrize("make, what", [
    (lambda out: (out / "plots").write_text("a note"), "plots is not a directory"),
    (lambda out: (out / "plots").symlink_to(out / "nowhere"), "plots is not a directory"),
    (lambda out: (out / "plots" / "energy_ratio.png").mkdir(parents=True), "energy_ratio.png is a directory"),
    (lambda out: (out / "plots" / "power_7.png").mkdir(parents=True), "power_7.png is a directory"),  # a stale one
])
def test_report_refuses_a_plots_that_is_no_folder_or_a_folder_for_a_plot_and_writes_no_page(tmp_path, make, what):
    """Before: the page was written, then plots/ made or a figure renamed in: FileExistsError or
    IsADirectoryError, exit 1, and a new report.html showing plots that were not there."""
    out = _folder(tmp_path)
    make(out)
    line = _one_line_exit_2(runner.invoke(app, ["report", str(out)]))
    assert what in line and line.startswith(f"error: {out}")
    assert not (out / "report.html").exists()


def test_the_benchmark_refuses_a_plots_file_before_it_runs_its_grid(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "plots").write_text("a note")

    def no_run(*a, **kw):
        raise AssertionError("the grid ran")

    monkeypatch.setattr(benchmark, "_run_task", no_run)
    with pytest.raises(BenchmarkInputError, match=r"--out: .*plots is not a directory"):
        run_benchmark([SCENARIOS_DIR / "tiny.yaml"], ["default-k8s"], 1, out)
    monkeypatch.undo()
    line = _one_line_exit_2(runner.invoke(app, ["benchmark", "-s", TINY, "-p", "default-k8s", "--out", str(out)]))
    assert "plots is not a directory" in line
    assert sorted(p.name for p in out.iterdir()) == ["plots"]  # no results.json: nothing ran


def test_a_figure_that_fails_to_move_in_leaves_the_old_page(tmp_path, monkeypatch):
    """The figures move in before the page is replaced: a render that fails there keeps the old page, which
    still describes the plots beside it."""
    out = _folder(tmp_path)
    report.write_report(out)
    old = (out / "report.html").read_bytes()
    (out / "results.json").write_text(dump(from_dict(_doc([{"default-k8s": 200.0, "most-allocated": 150.0}]))))

    real = report.os.replace

    def fails(src, dst):  # a figure's move only (os.replace is one function: the page's write renames too)
        if Path(dst).parent.name == "plots":
            raise OSError(28, "No space left on device", str(dst))
        real(src, dst)

    monkeypatch.setattr(report.os, "replace", fails)
    with pytest.raises(OSError, match="No space"):
        report.write_report(out)
    assert (out / "report.html").read_bytes() == old


# 2. A re-run leaves nothing of the earlier results beside the new ones.

def test_a_rerun_without_the_report_or_placements_removes_the_earlier_page_plots_and_placements(tmp_path):
    out = tmp_path / "out"
    args = ["benchmark", "-s", TINY, "-p", "default-k8s", "-p", "most-allocated", "--out", str(out)]
    r = runner.invoke(app, [*args, "--placements"])
    assert r.exit_code == 0, r.output
    (out / "plots" / "training_curve.png").write_bytes(b"the model's")
    assert (out / "report.html").is_file() and (out / "placements.csv").is_file() and report.report_plots(out)
    r = runner.invoke(app, [*args, "--no-report"])
    assert r.exit_code == 0, r.output
    assert not (out / "report.html").exists() and not (out / "placements.csv").exists()
    assert report.report_plots(out) == []
    assert (out / "plots" / "training_curve.png").read_bytes() == b"the model's"  # not the report's to remove
    assert "report:" not in r.stdout


def test_an_earlier_figure_that_cannot_be_removed_costs_a_warning_not_the_results(tmp_path, monkeypatch):
    """A read-only plots/ (an earlier run's, as another user): the new results.json was thrown away, after the
    whole grid, because an old figure could not be unlinked."""
    (tmp_path / "plots").mkdir()
    old = tmp_path / "plots" / "power_0.png"
    old.write_bytes(b"earlier")
    real = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name == "power_0.png":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    res = from_dict(_doc([{"default-k8s": 200.0, "most-allocated": 100.0}]))
    with pytest.warns(UserWarning, match="power_0.png describes the earlier results"):
        benchmark.write_outputs(tmp_path, res, {"a": np.arange(3)}, {})
    assert json.loads((tmp_path / "results.json").read_text())["scenarios"]


def test_placements_are_staged_with_results_json_which_is_renamed_last(tmp_path, monkeypatch):
    import joulesched.core.fsio as fsio

    res = from_dict(_doc([{"default-k8s": 200.0, "most-allocated": 100.0}]))
    order = []
    real = fsio.os.replace
    monkeypatch.setattr(fsio.os, "replace", lambda src, dst: (order.append(Path(dst).name), real(src, dst)))
    benchmark.write_outputs(tmp_path, res, {"a": np.arange(3)}, {}, [("s", 0, "default-k8s", "pod-0", "n0", "", "",
                                                                     "0.0", "")])
    assert order[-1] == "results.json" and "placements.csv" in order
    assert (tmp_path / "placements.csv").read_text().splitlines()[1].startswith("s,0,default-k8s,pod-0,n0")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# 3. The verdict's pick is ranked by the ratio the page shows, not by mean joules.

def test_the_pick_is_ranked_by_the_ratio_shown_not_by_mean_joules(tmp_path):
    """The reviewer's example: least-allocated has the lower mean energy (1355 J against 1357.5 J) but the worse
    per-seed ratio to default-k8s (0.905 against 0.9025), which is what the verdict and the table show."""
    doc = from_dict(_doc([{"default-k8s": 1000.0, "most-allocated": 895.0, "least-allocated": 910.0},
                          {"default-k8s": 2000.0, "most-allocated": 1820.0, "least-allocated": 1800.0}]))
    v = report.verdict(doc)[0]
    assert v["best"] == "most-allocated" and v["best_vs_ref"] == pytest.approx(0.9025)
    page = report.write_report(_folder(tmp_path, doc)).read_text()
    highlighted = re.findall(r'<tr class="best"><td class="pol"><span[^>]*></span>([^<]*)</td>', page)
    assert highlighted == ["most-allocated"]


def test_without_a_ratio_the_pick_falls_back_to_mean_joules():
    doc = from_dict(_doc([{"default-k8s": 0.0, "most-allocated": 895.0, "least-allocated": 910.0}]))
    assert report.verdict(doc)[0]["best"] == "default-k8s"  # it drew nothing: no ratio to it, the least joules


# 4. Input json cannot parse: one line, exit 2.

@pytest.mark.parametrize("text, what", [
    ("[" * 200000 + "]" * 200000, "nested too deeply"),
    ('{"schema_version": 2, "wall_s": ' + "1" * 5001 + "}", "5001 digits"),
])
def test_a_results_json_json_cannot_parse_exits_2_in_one_line(tmp_path, text, what):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(text)
    line = _one_line_exit_2(runner.invoke(app, ["report", str(out)]))
    assert what in line and "results.json" in line and "set_int_max_str_digits" not in line


@pytest.mark.parametrize("make, what", [
    (lambda p: p.mkdir(), "nodes.json is a directory"),
    (lambda p: p.write_text("[" * 200000 + "]" * 200000), "nodes.json: cannot read it as JSON: nested too deeply"),
])
def test_a_nodes_json_that_cannot_be_read_exits_2_in_one_line(tmp_path, make, what):
    out = _folder(tmp_path)
    make(out / "nodes.json")
    line = _one_line_exit_2(runner.invoke(app, ["report", str(out)]))
    assert what in line
    assert not (out / "report.html").exists()


# 5. Results that repeat a run or a policy, or whose summary miscounts its runs, are refused, naming it.

def _two_seeds() -> dict:
    return _doc([{"default-k8s": 200.0, "most-allocated": 100.0}, {"default-k8s": 210.0, "most-allocated": 90.0}])


def _repeat_a_run(doc: dict) -> None:
    doc["scenarios"][1]["seed"] = 0


def _list_a_policy_twice(doc: dict) -> None:
    doc["policies"].append("most-allocated")


def _miscount_the_seeds(doc: dict) -> None:
    doc["summary"]["s"]["seeds"] = 3


@pytest.mark.parametrize("spoil, message", [
    (_repeat_a_run, r"scenarios\.1 repeats the run of \('s', seed 0\) of scenarios\.0"),
    (_list_a_policy_twice, "policies lists 'most-allocated' twice"),
    (_miscount_the_seeds, r"summary\.s\.seeds is 3, but scenarios has 2 run\(s\) of 's'"),
])
def test_a_repeated_run_or_policy_or_a_miscounted_summary_is_refused_naming_it(tmp_path, spoil, message):
    """Each was read as valid: a repeat averaged in twice, and the page's n not the number of runs averaged."""
    assert from_dict(_two_seeds()).summary["s"].seeds == 2
    doc = _two_seeds()
    spoil(doc)
    with pytest.raises(ResultsError, match=message):
        from_dict(doc)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(doc))
    assert re.search(message, _one_line_exit_2(runner.invoke(app, ["report", str(out)])))


# 6. A schedule of no energy of its own has no relative gap, and the page renders.

@pytest.mark.parametrize("schedule, tail", [(0.0, None), (50.0, 60.0), (50.0, 50.0)])
def test_the_gap_of_a_schedule_without_energy_of_its_own_is_none_and_the_page_renders(tmp_path, schedule, tail):
    opt = {"status": "optimal", "optimum_joules": schedule, "bound_joules": 0.0, "lp_bound_joules": 0.0,
           "schedule_joules": schedule, "certificate": "optimal", "window_tail_joules": tail}
    doc = from_dict(_doc([{"default-k8s": 200.0, "most-allocated": 100.0}], lower_bound=0.0, optimum=opt))
    row = headroom(doc)["s"]
    assert row["optimum_gap"] is None and row["optimum"] == pytest.approx(schedule / 200.0)
    report.write_report(_folder(tmp_path, doc))


# 7. A 0 J lower bound is a bound, not a measured run.

def test_a_zero_joule_lower_bound_is_shown_not_called_a_measured_run(tmp_path):
    page = report.write_report(_folder(tmp_path, _doc([{"default-k8s": 200.0, "most-allocated": 100.0}],
                                                      lower_bound=0.0))).read_text()
    assert "lower bound 0 J." in page and "measured run" not in page


# 8. Names are printed as text, not rich markup.

def test_the_kube_pipelines_table_prints_names_with_brackets(tmp_path, monkeypatch):
    """Before: `dqn=/m/[/x].pt` went into the table as markup: MarkupError after the whole cluster run."""
    from joulesched.pipelines import kube_pipeline

    pol = "dqn=/m/[/x].pt"
    name = "web[/b] [red]x[/red]"
    metrics = {**ALIKE, "energy_joules": 100.0, "latency_p99_ms": 12.0}
    doc = {"schema_version": 2, "env": "kube", "command": "", "created_unix": 0.0, "wall_s": 0.0,
           "policies": ["default-k8s", pol], "seeds": 1,
           "scenarios": [{"name": name, "seed": 0, "nodes": 2, "pods": 3, "lower_bound_joules": None,
                          "policies": {"default-k8s": metrics, pol: metrics}}]}
    doc["summary"] = kube_pipeline.summarize_kube(doc)
    monkeypatch.setattr(kube_pipeline, "run_kube", lambda *a, **kw: from_dict(doc))
    out = tmp_path / "run[/x]"
    r = runner.invoke(app, ["pipeline", "--env", "kube", "--kubeconfig", str(tmp_path / "kc"), "--prometheus",
                            "http://127.0.0.1:1", "--target", "http://127.0.0.1:2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    flat = "".join(r.stdout.split())
    for text in (pol, name, str(out / "results.json")):
        assert "".join(text.split()) in flat, r.stdout
