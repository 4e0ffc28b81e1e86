"""What a newcomer hits in the first hour: every bad input refused before any work, with one line and exit 2;
no silent acceptance; the conveniences (--version, policies --long, explain for the DQN, -o -)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.pipelines.stats import t_halfwidth
from tests.pipelines.test_cli import SNAPSHOT

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "scenarios" / "tiny.yaml")
runner = CliRunner()


def _one_line_exit_2(r, needle: str) -> None:
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert needle in text, text
    assert "Traceback" not in r.output


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and re.fullmatch(r"joulesched \d+\.\d+\.\d+\S*\n", r.stdout)


@pytest.mark.parametrize("args,needle", [
    (["trace", "-s", TINY, "-o", "x.csv", "--seed", "-1"], "--seed"),
    (["explain", "--snapshot", "s.json", "--seed", "-3"], "--seed"),
    (["train", "-s", TINY, "--steps", "5", "--seed", "-1"], "--seed"),
    (["benchmark", "-s", TINY, "--seeds", "0"], "--seeds"),
    (["benchmark", "-s", TINY, "-p", "default-k8s:"], "followed by key=value"),
    (["benchmark", "-s", TINY, "-p", "target-load-packing:y=3"], "unknown option 'y'; its options: pct, x"),
    (["demo", "--model", "typo.pt"], "--model typo.pt does not exist"),
    (["workload", "manifest", "cpu", "--cpu-request", "lots"], "is not a Kubernetes quantity"),
    (["workload", "manifest", "cpu", "--namespace", "Bad_NS"], "--namespace 'Bad_NS' is not a valid namespace"),
    (["workload", "manifest", "cpu", "--image", "UPPER CASE:bad"],
     "--image 'UPPER CASE:bad' is not a valid image reference"),
    (["load", "jmeter", "--target", "http://127.0.0.1:9/x", "--jmeter", "/nonexistent"], "--jmeter '/nonexistent'"),
    # 0 used to mean "this host's" (a falsy value taken for no value): a profile with the host's millicores.
    (["power", "calibrate", "--from-samples", "s.csv", "--cpu-m", "0"], "'--cpu-m': 0 is not in the range x>=1"),
    (["power", "calibrate", "--from-samples", "s.csv", "--memory-mib", "0"], "'--memory-mib': 0 is not in the range"),
])
def test_bad_options_exit_2_naming_the_option(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(runner.invoke(app, args), needle)


def test_unwritable_outputs_fail_before_any_work(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    # Each of these used to run (train for minutes, benchmark the suite) and only then fail on the write.
    for args, needle in [
        (["train", "-s", TINY, "--steps", "100000", "--model", str(a_file / "m.pt")], "is not a directory"),
        (["benchmark", "-s", TINY, "--out", str(a_file)], "exists and is not a directory"),
        (["trace", "-s", TINY, "-o", "/proc/x.csv"], "cannot create files in /proc: it takes no new files"),
        (["benchmark", "-s", TINY, "--out", "/proc/out"],
         "cannot create files in /proc: it takes no new files (a virtual file system"),
    ]:
        _one_line_exit_2(runner.invoke(app, args), needle)
    assert a_file.read_text() == "x"


def test_trace_to_stdout_and_into_a_new_folder(tmp_path):
    r = runner.invoke(app, ["trace", "-s", TINY, "-o", "-"])
    assert r.exit_code == 0 and r.stdout.startswith("submit_s,duration_s,")
    assert len(r.stdout.splitlines()) == 1 + 183 and not Path("-").exists()
    deep = tmp_path / "missing" / "dir" / "p.csv"
    r = runner.invoke(app, ["trace", "-s", TINY, "-o", str(deep)])
    assert r.exit_code == 0 and deep.read_text() == runner.invoke(app, ["trace", "-s", TINY, "-o", "-"]).stdout


def test_trace_export_json_summarises_the_file_written(tmp_path):
    import csv

    dest = tmp_path / "p.csv"
    r = runner.invoke(app, ["trace", "-s", TINY, "-o", str(dest), "--seed", "3", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = list(csv.DictReader(dest.open()))
    submits = [float(row["submit_s"]) for row in rows]
    ends = [float(row["submit_s"]) + float(row["duration_s"]) for row in rows]
    assert doc["pods_file"] == str(dest) and doc["scenario"] == TINY and doc["seed"] == 3
    assert doc["pods"] == len(rows) > 0 and doc["services"] == 0
    assert doc["span"] == pytest.approx({"first_submit_s": min(submits), "last_submit_s": max(submits),
                                         "last_end_s": max(ends)}, abs=1e-3)
    _one_line_exit_2(runner.invoke(app, ["trace", "-s", TINY, "-o", "-", "--json"]), "--json needs an --out file")


def test_no_report_prints_no_report_path(tmp_path):
    r = runner.invoke(app, ["benchmark", "-s", TINY, "-p", "default-k8s", "--out", str(tmp_path), "--no-report"])
    assert r.exit_code == 0 and "report:" not in r.stdout and "results:" in r.stdout
    assert not (tmp_path / "report.html").exists()


def test_validate_warns_about_pods_that_fit_no_node_and_inevitable_queueing(tmp_path):
    sc = yaml.safe_load(Path(TINY).read_text())
    sc["nodes"] = [{"name_prefix": "small", "count": 1, "cpu_m": 500, "memory_mib": 2048,
                    "power_watts": "hp-ml110-g4"}]
    p = tmp_path / "small.yaml"
    p.write_text(yaml.safe_dump(sc))
    r = runner.invoke(app, ["validate", str(p), "--json"])
    assert r.exit_code == 0, r.output
    (found,) = json.loads(r.stdout)
    assert any("fit no node" in w for w in found["warnings"])
    assert any("every policy leaves pods pending" in w for w in found["warnings"])
    ok = json.loads(runner.invoke(app, ["validate", TINY, "--json"]).stdout)
    assert ok[0]["warnings"] == []


def test_validate_warns_where_sleeping_a_node_costs_energy(tmp_path):
    """A curve that starts at or below sleep_watts (an energy-proportional 0 W idle): the twin sleeps the node all
    the same, drawing more and making the next pod wait (a review); validate says so."""
    sc = yaml.safe_load(Path(TINY).read_text())
    sc["idle_policy"] = {"mode": "sleep", "sleep_after_s": 60, "sleep_watts": 40, "wake_s": 30}
    sc["nodes"][0]["power_watts"] = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    p = tmp_path / "flat.yaml"
    p.write_text(yaml.safe_dump(sc))
    (found,) = json.loads(runner.invoke(app, ["validate", str(p), "--json"]).stdout)
    assert [w for w in found["warnings"] if "draw no more idle than asleep" in w] == [
        "node group(s) old (0 W) draw no more idle than asleep (sleep_watts 40 W): each sleep there costs energy "
        "and makes the next pod wait wake_s; lower sleep_watts, or check the curve"]
    # A node's GPUs count in its idle (off while it sleeps); a never_sleep group is never slept
    sc["nodes"][0].update(gpu_count=5, gpu_model="T4")  # 5 x 10 W idle: 50 W against 45 asleep
    sc["nodes"][1]["never_sleep"] = True
    sc["idle_policy"]["sleep_watts"] = 45
    p.write_text(yaml.safe_dump(sc))
    (found,) = json.loads(runner.invoke(app, ["validate", str(p), "--json"]).stdout)
    assert not [w for w in found["warnings"] if "draw no more idle than asleep" in w], found["warnings"]


def test_policies_long_and_json():
    rows = json.loads(runner.invoke(app, ["policies", "--json"]).stdout)
    by = {r["name"]: r for r in rows}
    assert by["target-load-packing"]["options"] == {"pct": "0", "x": "40"}
    assert by["default-k8s"]["family"] == "kube-default" and "LeastAllocated" in by["default-k8s"]["description"]
    assert by["dqn"]["takes_model_file"] is True
    human = runner.invoke(app, ["policies", "--long"])
    assert human.exit_code == 0 and "x=40" in human.stdout


def test_explain_shows_a_dqns_q_values_and_top_features(tmp_path):
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(SNAPSHOT))
    model = ROOT / "models" / "small.pt"
    r = runner.invoke(app, ["explain", "--snapshot", str(p), "--policy", f"dqn={model}", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    feasible = [n for n in res["nodes"] if n["feasible"]]
    assert len(feasible) == 2
    for n in feasible:
        assert set(n["scores"]) == {"Q", "Advantage"} and len(n["features"]) == 3
        assert all({"name", "value", "contribution"} <= set(f) for f in n["features"])
    # The chosen node is the one with the highest advantage (and Q: they rank nodes alike).
    best = max(feasible, key=lambda n: n["scores"]["Advantage"])
    assert res["chosen"] == best["name"] == max(feasible, key=lambda n: n["scores"]["Q"])["name"]
    human = runner.invoke(app, ["explain", "--snapshot", str(p), "--policy", f"dqn={model}"])
    assert human.exit_code == 0 and "top features" in human.stdout


def test_intervals_are_student_t_with_n():
    # n = 2: t(0.975, 1) = 12.706, so the half-width is 12.706 * s / sqrt(2), not 1.96 * s / sqrt(2).
    assert t_halfwidth([1.0, 2.0]) == pytest.approx(12.7062 * 0.70711 / 1.41421, rel=1e-4)
    assert t_halfwidth([1.0]) is None


def test_no_help_shows_a_raw_type_tag():
    for args in (["--help"], ["benchmark", "--help"], ["train", "--help"], ["serve", "--help"],
                 ["pipeline", "--help"], ["power", "exporter", "--help"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0
        assert not re.search(r"<(bool|int|str|path|float|list\[[^\]]*\])", r.stdout), (args, r.stdout)


def test_train_help_lists_every_knob_with_its_default():
    from joulesched.agent.config import describe

    text = " ".join(runner.invoke(app, ["train", "--help"]).stdout.replace("│", " ").split())
    for key, default, _ in describe():
        assert f"{key} = {default!r}" in text, key
    assert "Default: 5 when --steps is not given" in text


def test_validate_reports_every_file_an_error_in_one_does_not_hide_the_others(tmp_path):
    sc = yaml.safe_load(Path(TINY).read_text())
    bad1, bad2 = tmp_path / "typo.yaml", tmp_path / "missing.yaml"
    bad1.write_text(yaml.safe_dump({**sc, "nodez": sc["nodes"]}))
    r = runner.invoke(app, ["validate", TINY, str(bad1), str(bad2)])
    assert r.exit_code == 2, r.output
    assert f"{TINY}: ok" in r.stdout
    assert "nodez" in r.output and "missing.yaml" in r.output  # both errors, not only the first
    found = json.loads(runner.invoke(app, ["validate", str(bad1), TINY, "--json"]).stdout)
    assert [("error" in f, f["file"]) for f in found] == [(True, str(bad1)), (False, TINY)]


def test_explain_on_a_gpu_cluster_names_the_gpus_and_shows_the_best_nodes_first():
    mini = str(ROOT / "scenarios" / "openb" / "mini" / "openb-mini-w10000k.yaml")
    args = ["explain", "-s", mini, "-p", "gpu-energy:empty=asleep", "--at", "80000"]
    res = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert res["pod"] == {"cpu_m": 3152, "memory_mib": 5600, "gpu": 1, "gpu_milli": 1000, "gpu_models": None}
    assert len(res["nodes"]) == 164  # --json has every node whatever --top says
    r = runner.invoke(app, [*args, "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "gpu=1 (whole)" in r.stdout and "161 more nodes not shown (37 of all 164 infeasible)" in r.stdout
    chosen = res["chosen"]
    assert f"chosen: {chosen}" in r.stdout
    table = r.stdout.split("more nodes not shown")[0]
    assert sum(line.startswith("│ openb-") for line in table.splitlines()) == 3  # the 3 best; the chosen is one
    every = runner.invoke(app, [*args, "--top", "0"]).stdout
    assert "more nodes not shown" not in every and every.count("│ openb-") >= 164


def test_explain_top_shows_nodes_for_a_policy_without_scores():
    """random scores nothing: --top still shows N feasible nodes (and the chosen one), not the chosen one alone."""
    large = str(ROOT / "scenarios" / "large.yaml")
    r = runner.invoke(app, ["explain", "-s", large, "--at", "100", "-p", "random", "--top", "5"])
    assert r.exit_code == 0, r.output
    rows = sum(line.startswith("│ ") and " yes " in line for line in r.stdout.splitlines())
    assert rows in (5, 6)  # five, and the chosen one if it is not among them
    assert f"{240 - rows} more nodes not shown (0 of all 240 infeasible)" in r.stdout


def _params(*type_names: str):
    """Every parameter of every command whose type is one of these: (command path, parameter)."""
    import typer.main

    def walk(cmd, path):
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, [*path, name])
        for p in getattr(cmd, "params", []):
            if p.type.name in type_names:
                yield path, p
    return list(walk(typer.main.get_command(app), []))


def _float_options():
    """Every float option of every command: (command path, option name)."""
    return [(path, p.opts[0]) for path, p in _params("float", "float range") if p.opts[0].startswith("--")]


def test_every_path_refuses_an_empty_string(tmp_path, monkeypatch):
    """Typer reads '' as Path('.'): `benchmark -o "$OUT"` with OUT unset wrote its files into the current folder."""
    monkeypatch.chdir(tmp_path)
    found = _params("path")
    assert len(found) >= 50 and any(path == ["benchmark"] and "--out" in p.opts for path, p in found)
    for path, p in found:
        args = [*path, ""] if p.param_type_name == "argument" else [*path, p.opts[0], ""]
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "an empty path" in r.output, (args, r.output)
    assert list(tmp_path.iterdir()) == []


def test_every_float_option_refuses_nan_and_inf():
    """nan passes click's range check (every comparison with it is false) and inf a lower bound: a time limit or
    a unit of nan reached the code (a traceback for `trace import --cpu-unit-m nan`). Each option of every
    command, found by walking the CLI, is refused with exit 2 before any work."""
    found = _float_options()
    assert len(found) >= 30 and (["trace", "import"], "--cpu-unit-m") in found
    for path, opt in found:
        for bad in ("nan", "inf", "-inf"):
            r = runner.invoke(app, [*path, opt, bad])
            text = " ".join(r.output.split())
            assert r.exit_code == 2 and f"'{opt}'" in text, (path, opt, bad, r.output)
            # An infinity outside an option's range meets the range check first: refused either way. nan never does.
            assert "is not a finite number" in text or (bad != "nan" and "is not in the range" in text), text


@pytest.mark.parametrize("args,needle", [
    (["explain", "--snapshot", "."], ". is a directory, not a snapshot file"),
    (["report", "."], "results.json is a directory, not a results.json"),  # a folder of that name there
    (["explain", "--snapshot", str(ROOT / "scenarios" / "snapshots" / "example.json"), "-p", "rollout"],
     "reads the run's future in the twin"),
    (["explain", "-s", TINY, "-p", "clairvoyant"], "reads the run's future in the twin"),
    (["sweep", "--grid", "bin.yaml", "-o", "x"], "bin.yaml: not UTF-8 text"),
    (["power", "calibrate", "--from-samples", "bin.yaml"], "bin.yaml: not UTF-8 text"),
    (["trace", "-s", TINY, "-o", TINY], "is also an input of this command"),
    (["train", "-s", TINY, "--steps", "99999999999999999999999", "--model", "m.pt"], "--steps must be at most"),
    (["train", "-s", TINY, "--steps", "50", "--model", "m.pt", "--executor", "ray", "--ray-address", ":abc"],
     "--ray-address ':abc': expected"),
    (["train", "-s", TINY, "--steps", "50", "--model", "m.pt", "--ray-address", "h:1"], "needs --executor ray"),
    (["load", "blocker", "--target", "http://127.0.0.1:99999"], "the port must be a number in 1..65535"),
    (["load", "blocker", "--target", "http://127.0.0.1:9", "--stop", "--cpu-m", "500"],
     "--stop stops the running load; --cpu-m describes a load to start"),  # was silently dropped
    (["load", "locust", "--target", "http://127.0.0.1:9/", "--workdir", "bin.yaml"], "exists and is not a directory"),
    (["infra", "wheelhouse", "-o", "bin.yaml"], "exists and is not a directory"),
    (["pipeline", "-s", TINY, "-o", "p", "-p", "nosuch"], "--policy is for --env kube"),  # was silently ignored
    (["optimum", "-s", TINY, "-s", TINY, "--bound-only"], "scenario 'tiny' is given twice"),
    (["benchmark", "-s", TINY, "-p", "default-k8s", "--optimum-time-limit", "-5", "-o", "x"],
     "--optimum-time-limit must be a positive number"),  # without --optimum too
    (["train", "--show-config", "--set", "dqn.teacher=nosuch"], "dqn.teacher: unknown policy 'nosuch'"),
])
def test_inputs_that_raised_tracebacks_or_were_overwritten_exit_2(args, needle, tmp_path, monkeypatch):
    """Found by walking the CLI with malformed inputs (2026-12-06): a directory or binary file where a file was
    expected raised IsADirectoryError / UnicodeDecodeError; a twin-only policy in explain an AttributeError;
    an empty -o wrote into the current folder; -o naming the input replaced it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.json").mkdir()
    (tmp_path / "bin.yaml").write_bytes(b"\x00\x01\xff\xfe garbage")
    before = Path(TINY).read_bytes()
    _one_line_exit_2(runner.invoke(app, args), needle)
    assert Path(TINY).read_bytes() == before and not (tmp_path / "x").exists()


def test_a_snapshot_with_an_infinite_number_is_refused(tmp_path):
    # `explain --json` printed "now_s": Infinity, which no JSON parser reads.
    snap = json.loads((ROOT / "scenarios" / "snapshots" / "example.json").read_text())
    text = json.dumps({**snap, "now_s": 0.0}).replace('"now_s": 0.0', '"now_s": 1e400')
    (tmp_path / "s.json").write_text(text)
    _one_line_exit_2(runner.invoke(app, ["explain", "--snapshot", str(tmp_path / "s.json"), "--json"]),
                     "now_s: Input should be a finite number")


@pytest.mark.parametrize("edit, words", [
    (lambda s: s["nodes"][0]["allocatable"].update(cpu_m=10**30), "cpu_m: Input should be less than or equal"),
    (lambda s: s["nodes"][0]["allocatable"].update(cpu_m=True), "cpu_m: expected a number, got true"),
    (lambda s: s["nodes"][0].update(never_sleep="yes"), 'never_sleep: expected true or false, got "yes"'),
    (lambda s: s.update(now_s="3600"), "now_s: Input should be a valid number"),
])
def test_a_snapshot_is_read_strictly(tmp_path, edit, words):
    """An OverflowError traceback for 10**30 millicores, and true, "yes" and "3600" read silently (a review)."""
    snap = json.loads((ROOT / "scenarios" / "snapshots" / "example.json").read_text())
    edit(snap)
    (tmp_path / "s.json").write_text(json.dumps(snap))
    _one_line_exit_2(runner.invoke(app, ["explain", "--snapshot", str(tmp_path / "s.json")]), words)


def test_explain_on_a_run_without_any_decision_says_so(tmp_path):
    """Every pod too large for every node: explain said "the last one is earlier" of a run with no decision."""
    sc = tmp_path / "none.yaml"
    sc.write_text(Path(TINY).read_text().replace("cpu_m: 4000", "cpu_m: 10")
                  .replace("cpu_scale: 0.03}", "cpu_scale: 0.03, best_effort_fraction: 0}"))
    _one_line_exit_2(runner.invoke(app, ["explain", "-s", str(sc)]), "the run makes no decision")
