"""`joulesched report` on what a user may hand it: the results.json instead of its folder, another file, a broken
nodes.json or timelines.npz (exit 2 naming the file, nothing rewritten), and a folder without timelines (a note;
no plot of an earlier render is left beside a page that no longer shows it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from joulesched.pipelines.benchmark import run_benchmark
from joulesched.pipelines.cli import app
from joulesched.pipelines.report import write_report
from joulesched.pipelines.suite import SCENARIOS_DIR

runner = CliRunner()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    run_benchmark([SCENARIOS_DIR / "tiny.yaml"], ["default-k8s", "most-allocated"], 1, out)
    write_report(out)
    assert {"power_0.png", "util_0.png"} <= {p.name for p in (out / "plots").iterdir()}
    return out


@pytest.fixture
def out(rendered, tmp_path) -> Path:
    return Path(shutil.copytree(rendered, tmp_path / "out"))


def test_the_results_file_stands_for_its_folder(out):
    (out / "report.html").unlink()
    r = runner.invoke(app, ["report", str(out / "results.json")])
    assert r.exit_code == 0, r.output
    assert (out / "report.html").is_file() and f"report: {out / 'report.html'}" in r.stdout


def test_another_file_exits_2(out):
    r = runner.invoke(app, ["report", str(out / "nodes.json")])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == f"error: {out / 'nodes.json'} is a file; give the folder that holds results.json"


@pytest.mark.parametrize("name, text, message", [
    ("nodes.json", "{not json", "nodes.json: not valid JSON"),
    ("nodes.json", "[1, 2]", "nodes.json: expected a JSON object"),
    ("timelines.npz", "not an archive", "timelines.npz: cannot read the timelines (not an .npz archive)"),
    ("nodes.json", '{"tiny": 5}', "nodes.json: scenario 'tiny': expected an object whose node_names and node_groups"),
    ("nodes.json", '{"tiny": {"node_names": ["a"], "node_groups": "big"}}',
     "nodes.json: scenario 'tiny': expected an object whose node_names and node_groups"),
])
def test_a_broken_input_exits_2_naming_it_and_writes_nothing(out, name, text, message):
    (out / name).write_text(text)
    shutil.rmtree(out / "plots")
    (out / "report.html").unlink()
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {out / message}") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (out / "plots").exists() and not (out / "report.html").exists()


@pytest.mark.parametrize("change, message", [
    ({"tiny/most-allocated/util": np.zeros(5)}, "tiny/most-allocated/util: expected bins x nodes"),  # a traceback
    ({"tiny/default-k8s/awake": np.zeros(2)}, "tiny/default-k8s/awake: expected one count per bin"),
    ({"tiny/default-k8s/watts": np.full(3, np.nan)}, "tiny/default-k8s/watts: expected one finite number"),
    ({"tiny/bin_s": np.array([0.0])}, "tiny/bin_s: expected one positive number of seconds per bin"),
    ({"tiny/bin_s": np.array(["15"])}, "tiny/bin_s: expected real numbers, got <U2"),  # a TypeError traceback
    ({"tiny/default-k8s/util": np.full((3, 3), "x")}, "tiny/default-k8s/util: expected real numbers"),
    ({"tiny/default-k8s/watts": np.ones(3, dtype=complex)}, "tiny/default-k8s/watts: expected real numbers"),
    (None, "holds no timeline of the scenarios in results.json (another run's file?)"),  # the plots went unsaid
])
def test_timelines_that_do_not_fit_the_results_exit_2_naming_the_array(out, change, message):
    path = out / "timelines.npz"
    with np.load(path) as tl:
        arrays = {f"other/{k}": tl[k] for k in tl.files} if change is None else {**dict(tl), **change}
    np.savez(path, **arrays)
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {path}: {message}") and "Traceback" not in r.output, r.stderr


def test_without_timelines_the_plots_are_left_out_and_said_so(out):
    (out / "timelines.npz").unlink()
    (out / "plots" / "training_curve.png").write_bytes(b"")  # not the report's own: it stays
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    assert "no " + str(out / "timelines.npz") + ": the power and utilisation plots are left out" in r.stderr
    left = {p.name for p in (out / "plots").iterdir()}
    assert left == {"energy_ratio.png", "energy_vs_service.png", "training_curve.png"}
    page = (out / "report.html").read_text()
    assert "power_0.png" not in page and "util_0.png" not in page


def test_json_names_the_report_and_the_plots_it_wrote(out):
    (out / "plots" / "training_curve.png").write_bytes(b"")  # the training's: not one this render wrote
    r = runner.invoke(app, ["report", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["report"] == str(out / "report.html") and doc["timelines"] is True
    assert {Path(p).name for p in doc["plots"]} >= {"energy_ratio.png", "power_0.png", "util_0.png"}
    assert "training_curve.png" not in {Path(p).name for p in doc["plots"]}
    assert all(Path(p).is_file() for p in doc["plots"])

    (out / "timelines.npz").unlink()  # the power and utilisation plots are left out, and removed
    r = runner.invoke(app, ["report", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc == {"report": str(out / "report.html"), "timelines": False,
                   "training_curve": str(out / "plots" / "training_curve.png"),
                   "plots": [str(out / "plots" / n) for n in ("energy_ratio.png", "energy_vs_service.png")]}
    assert "the power and utilisation plots are left out" in r.stderr


def test_json_names_the_training_curve_the_page_shows(out):
    r = runner.invoke(app, ["report", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["training_curve"] is None
    assert "training_curve.png" not in (out / "report.html").read_text()

    (out / "plots" / "training_curve.png").write_bytes(b"")
    r = runner.invoke(app, ["report", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["training_curve"] == str(out / "plots" / "training_curve.png")
    assert 'src="plots/training_curve.png"' in (out / "report.html").read_text()


def test_json_says_no_timelines_when_the_archive_holds_no_array(out):
    """A kube run writes an empty timelines.npz: no power or utilisation plot is drawn from it."""
    import numpy as np

    with open(out / "timelines.npz", "wb") as fh:
        np.savez_compressed(fh)
    r = runner.invoke(app, ["report", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["timelines"] is False
    assert not {"power_0.png", "util_0.png"} & {Path(p).name for p in doc["plots"]}


def _drop_run(doc):
    del doc["scenarios"][0]["policies"]["most-allocated"]


def _drop_summary_policy(doc):
    del doc["summary"]["tiny"]["policies"]["most-allocated"]


def _add_policy(doc):
    doc["policies"].append("random")


def _ghost_summary(doc):
    doc["summary"]["ghost"] = doc["summary"]["tiny"]


def _no_summary(doc):
    doc["summary"].clear()


def _no_scenario(doc):
    doc["scenarios"], doc["summary"] = [], {}


@pytest.mark.parametrize("edit, message", [
    (_drop_run, "scenarios.0 ('tiny', seed 5) has no run of policy 'most-allocated', which policies lists"),
    (_drop_summary_policy, "summary.tiny.policies has no entry for policy 'most-allocated'"),
    (_add_policy, "scenarios.0 ('tiny', seed 5) has no run of policy 'random'"),
    (_ghost_summary, "summary has scenario 'ghost', which no entry of scenarios runs"),
    (_no_summary, "summary has no entry for scenario 'tiny'"),
    (_no_scenario, "holds no scenario run; nothing to report"),
])
def test_a_partial_or_inconsistent_results_file_exits_2_naming_what_is_missing(out, edit, message):
    """A results.json that lost a policy's run, a summary row or every scenario (an interrupted hand merge, an
    edit) is refused before anything is drawn, instead of a KeyError or ZeroDivisionError traceback mid-render."""
    doc = json.loads((out / "results.json").read_text())
    edit(doc)
    (out / "results.json").write_text(json.dumps(doc))
    (out / "report.html").unlink()
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {out / 'results.json'}") and message in r.stderr, r.stderr
    assert "Value error" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (out / "report.html").exists()


def test_a_scenario_name_is_text_in_the_page_the_plots_and_the_terminal(tmp_path):
    """A scenario's name is the user's text: HTML in it is escaped on the page, a '$' does not start matplotlib's
    mathtext in the plots (an unbalanced one raised mid-render) and rich markup in it ('[/]') is printed as is
    by benchmark and optimum (it raised MarkupError after the results were written)."""
    name = 'x[/]y <img src=x onerror=alert(1)> $\\frac{a}{$ 50%'
    text = (SCENARIOS_DIR / "tiny.yaml").read_text()
    path = tmp_path / "odd.yaml"
    path.write_text("\n".join(f"name: {json.dumps(name)}" if line.startswith("name:") else line
                              for line in text.splitlines()) + "\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["benchmark", "-s", str(path), "-p", "default-k8s", "-p", "most-allocated", "--seeds", "1",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert name in r.stdout
    page = (out / "report.html").read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert {"energy_ratio.png", "power_0.png", "util_0.png"} <= {p.name for p in (out / "plots").iterdir()}
    r = runner.invoke(app, ["optimum", "-s", str(path), "--max-nodes", "1", "--time-limit", "2", "-p", "default-k8s",
                            "-p", "most-allocated"])
    assert r.exit_code == 0, r.output
    assert f"{name} seed 5: " in " ".join(r.stdout.split())
    # The training curve's legend names the scenarios too.
    from joulesched.pipelines.training import _plot_curve

    curve = tmp_path / "m.curve.csv"
    curve.write_text("step,scenario,episode_return,eval_score\n" + "".join(
        f"{k},{json.dumps(name)},{k}.0,\n" for k in (1, 2)))
    assert _plot_curve(curve, tmp_path / "m.curve.png") == tmp_path / "m.curve.png"  # raised mid-render
    assert (tmp_path / "m.curve.png").stat().st_size > 0


def test_a_render_that_fails_keeps_the_old_page_and_its_plots(out, monkeypatch):
    # The stale plots go only once the new page is written: a failing render (here the template) must not
    # leave the old page pointing at plots it removed.
    import joulesched.pipelines.report as report

    before = (out / "report.html").read_text()
    (out / "timelines.npz").unlink()  # this render would draw no power plots, so they are stale to it

    def broken(*a, **kw):
        raise RuntimeError("render failed")

    monkeypatch.setattr(report, "atomic_write_text", broken)
    with pytest.raises(RuntimeError):
        write_report(out)
    assert (out / "report.html").read_text() == before
    assert "power_0.png" in before and (out / "plots" / "power_0.png").is_file()


def test_timelines_of_a_same_named_scenario_on_another_cluster_exit_2_naming_the_array(out):
    """Another run's timelines.npz and nodes.json of a scenario with the same name but more nodes agree with each
    other; only results.json's node count gives them away (the utilisation plot drew the other cluster)."""
    ran = json.loads((out / "results.json").read_text())["scenarios"][0]["nodes"]
    path = out / "timelines.npz"
    with np.load(path) as tl:
        arrays = dict(tl)
    for k in [k for k in arrays if k.endswith("/util")]:
        arrays[k] = np.zeros((arrays[k].shape[0], ran + 1), dtype=arrays[k].dtype)
    np.savez(path, **arrays)
    nodes = json.loads((out / "nodes.json").read_text())
    nodes["tiny"].update({f: [*nodes["tiny"][f], nodes["tiny"][f][-1]] for f in ("node_names", "node_groups")})
    (out / "nodes.json").write_text(json.dumps(nodes))
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 2, r.output
    want = f"error: {path}: tiny/default-k8s/util: {ran + 1} nodes, but results.json's 'tiny' ran on {ran}"
    assert r.stderr.startswith(want) and "Traceback" not in r.output, r.stderr


@pytest.mark.parametrize("where, error", [("fig_util", RuntimeError), ("fig_util", KeyboardInterrupt),
                                          ("atomic_write_text", RuntimeError)])
def test_a_render_that_fails_or_is_interrupted_leaves_every_plot_and_no_temporary_folder(out, monkeypatch, where,
                                                                                         error):
    """The figures are drawn beside plots/ and moved in with the page: before, each replaced its old file as it was
    drawn, so a render that stopped halfway left new plots under the old page."""
    import joulesched.pipelines.report as report

    def files():
        return {p.relative_to(out): (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*")}

    before = files()

    def broken(*a, **kw):
        raise error("render failed")

    monkeypatch.setattr(report, where, broken)
    with pytest.raises(error):
        write_report(out)
    assert files() == before  # the same files, none rewritten, no temporary folder left
    monkeypatch.undo()
    write_report(out)
    after = files()
    assert set(after) == set(before) and after[Path("plots/power_0.png")] != before[Path("plots/power_0.png")]


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["scenarios"][0]["policies"]["default-k8s"].update(energy_joules=-1e300), "energy_joules"),
    (lambda d: d["summary"]["tiny"]["policies"]["default-k8s"].update(energy_joules=-5.0), "energy_joules"),
    (lambda d: d.update(seeds=-3), "seeds"),
    (lambda d: d["scenarios"][0]["policies"]["default-k8s"].update(slo_violation_rate=1.5), "slo_violation_rate"),
    (lambda d: d["scenarios"][0]["policies"]["default-k8s"].update(placements=-1), "placements"),
])
def test_impossible_values_in_results_exit_2_naming_the_field(out, edit, field):
    """Rendered before, with exit 0: a negative energy, negative seeds, a rate above 1."""
    doc = json.loads((out / "results.json").read_text())
    edit(doc)
    (out / "results.json").write_text(json.dumps(doc))
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 2 and field in r.stderr and "Traceback" not in r.output, r.output
