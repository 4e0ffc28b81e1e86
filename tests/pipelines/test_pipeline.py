"""The sim pipeline: stages run once, re-runs skip unchanged stages, calibration reaches the twin."""

import json

import pytest
from typer.testing import CliRunner

from joulesched.cluster.scenario import load_scenario
from joulesched.pipelines.cli import app
from joulesched.pipelines.sim_pipeline import calibrated, profile_curve
from joulesched.pipelines.stages import Stage, StageRunner
from joulesched.pipelines.suite import SCENARIOS_DIR

runner = CliRunner()
SUITE = SCENARIOS_DIR
PROFILE = ("name_prefix: calib\ncount: 1\ncpu_m: 4000\nmemory_mib: 8192\nmax_pods: 110\n"
           "power_watts: [20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]\n")


def test_stage_runs_once_and_reruns_when_inputs_change(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a")
    out = tmp_path / "o.txt"
    calls = []

    def make(params):
        return Stage("s", [src], params, [out], lambda: (calls.append(1), out.write_text(src.read_text())))

    r = StageRunner(tmp_path)
    assert r.run(make({"k": 1})) is True
    assert r.run(make({"k": 1})) is False  # unchanged: skipped
    src.write_text("b")
    assert r.run(make({"k": 1})) is True  # input bytes changed
    assert r.run(make({"k": 2})) is True  # parameters changed
    out.unlink()
    assert r.run(make({"k": 2})) is True  # output missing
    out.write_text("another command's")
    assert r.run(make({"k": 2})) is True  # output overwritten since (a benchmark --out into the folder)
    assert r.run(make({"k": 2})) is False
    assert len(calls) == 5


def test_interrupted_stage_is_not_recorded(tmp_path):
    out = tmp_path / "o.txt"

    def boom():
        out.write_text("half")
        raise KeyboardInterrupt

    r = StageRunner(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        r.run(Stage("s", [], {}, [out], boom))
    assert not (tmp_path / ".stages" / "s.json").exists()
    assert not r.is_fresh(Stage("s", [], {}, [out], boom))


def test_calibrated_scenarios_take_the_profile_curve_in_memory(tmp_path):
    prof = tmp_path / "node-profile.yaml"
    prof.write_text(PROFILE)
    curve = profile_curve(prof)
    before = {p: p.read_bytes() for p in (SUITE / "heterogeneous-sleep.yaml", SUITE / "trace-sample.yaml")}
    out = [calibrated(load_scenario(p), curve) for p in before]
    for sc in out:
        assert all(g.curve[10] == 120 and g.curve[0] == 20 for g in sc.nodes)
    # The copies keep their source, so a trace still resolves, and nothing on disk changed.
    assert out[1].trace_path.name == "sample.csv" and out[1].trace_path.is_file()
    assert all(p.read_bytes() == b for p, b in before.items())
    assert not list(tmp_path.glob("*.yaml"))[1:]  # only the profile itself


def test_pipeline_trains_benchmarks_reports_and_resumes(tmp_path):
    out = tmp_path / "run"
    args = ["pipeline", "-s", "scenarios/tiny.yaml", "--steps", "150", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "results.json").read_text())
    names = set(doc["scenarios"][0]["policies"])
    assert any(n.startswith("dqn=") and n.endswith("model.pt") for n in names) and {"default-k8s", "most-allocated", "peaks"} <= names
    assert (out / "report.html").is_file() and (out / "plots" / "energy_ratio.png").is_file()
    mtime = (out / "results.json").stat().st_mtime_ns
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and again.output.count("skipped") == 3
    assert (out / "results.json").stat().st_mtime_ns == mtime
    # The benchmark's timelines are its output too: deleted, the stage runs again (it was "fresh" without them,
    # and the report left its plots out).
    (out / "timelines.npz").unlink()
    third = runner.invoke(app, args)
    assert third.exit_code == 0 and third.output.count("skipped") == 1 and (out / "timelines.npz").is_file()


def test_a_bad_budget_on_a_finished_folder_keeps_its_model(tmp_path):
    """A review: the train stage deleted the folder's model before train() refused a bad --minutes or --steps, so a
    typo cost a finished run its model (and a fresh --out was left behind, empty)."""
    out = tmp_path / "run"
    out.mkdir()
    model = out / "model.pt"
    model.write_bytes(b"trained")
    for bad in (["--minutes", "-1"], ["--minutes", "5000"], ["--steps", "0"]):
        r = runner.invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--out", str(out), *bad])
        assert r.exit_code == 2 and "must be" in r.output, r.output
        assert model.read_bytes() == b"trained"
    fresh = tmp_path / "fresh"
    r = runner.invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--out", str(fresh), "--steps", "0"])
    assert r.exit_code == 2
    assert not fresh.exists()


def test_every_file_a_scenario_reads_keys_its_stages(tmp_path):
    """A review: only the first trace of a list was in the stage key, and no fit file, so editing one left the
    benchmark "unchanged"."""
    from joulesched.pipelines.sim_pipeline import _stage_key

    sc = load_scenario(SUITE / "openb" / "openb-cpu-fitted-sleep.yaml")
    files, _ = _stage_key([sc])
    assert sc.fit_paths and set(sc.fit_paths) <= set(files)
    head = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n"
    (tmp_path / "a.csv").write_text(head + "0,10,100,10,50\n")
    (tmp_path / "b.csv").write_text(head + "5,10,100,10,50\n")
    (tmp_path / "two.yaml").write_text(
        "name: two\nseed: 1\nduration_s: 100\nidle_policy: {mode: always_on}\n"
        "nodes: [{name_prefix: n, count: 1, cpu_m: 1000, memory_mib: 1000, power_watts: hp-ml110-g5}]\n"
        "workload: {trace: [a.csv, b.csv]}\n")
    files, _ = _stage_key([load_scenario(tmp_path / "two.yaml")])
    assert {tmp_path / "a.csv", tmp_path / "b.csv"} <= {p.resolve() for p in files}


@pytest.mark.parametrize("args,message", [
    (["--node-profile", "{bad}"], "not a node profile"),
    ([], "no model to load"),
    (["--model", "/nonexistent/m.pt"], "no model to load"),
])
def test_pipeline_bad_input_exits_2_and_writes_nothing(tmp_path, args, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("just: text\n")
    args = [str(bad) if a == "{bad}" else a for a in args]
    if "--node-profile" in args:
        args += ["--steps", "10"]
    out = tmp_path / "run"
    r = runner.invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--pods", "8", "--load-seconds", "5"], "--load-seconds, --pods are for --env kube"),
    (["--energy-source", "kepler"], "--energy-source is for --env kube"),
    (["--env", "kube", "--seeds", "3"], "--seeds is for --env sim"),
    (["--env", "kube", "--jobs", "2"], "--jobs is for --env sim"),
    (["--env", "kube", "--sleep-after", "30"], "--sleep-after is for --sleep"),
    (["--env", "kube", "--node-profile", "p.yaml"], "--node-profile on a cluster is what the DQN trains on"),
])
def test_an_option_the_chosen_env_does_not_read_is_refused_not_ignored(tmp_path, args, message):
    """A review: `pipeline` accepted the other environment's options and did nothing with them (a kube run's
    --node-profile was dropped, so the DQN trained on the scenario's curves, not the measured ones)."""
    out = tmp_path / "run"
    r = runner.invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())
    assert not out.exists()


def test_a_kube_run_trains_the_dqn_on_the_node_profile_given(tmp_path, monkeypatch):
    """A review: `--env kube --node-profile P --steps N` dropped P, and the DQN trained on the scenario's curves."""
    from joulesched.pipelines import kube_pipeline
    from joulesched.pipelines.cli import pipeline as cli_pipeline
    from joulesched.workloads.load.results import DriverError

    seen = {}

    def train(out_dir, model, minutes, steps, scenario, train_scenario, node_profile, force, show):
        seen["profile"] = node_profile
        return tmp_path / "model.pt"

    def run_kube(*a, **kw):
        raise DriverError("the cluster run is not under test here")

    monkeypatch.setattr(cli_pipeline, "_train_for_cluster", train)
    monkeypatch.setattr(kube_pipeline, "run_kube", run_kube)
    prof = tmp_path / "p.yaml"
    prof.write_text("anything: 1\n")
    r = runner.invoke(app, ["pipeline", "--env", "kube", "--kubeconfig", str(tmp_path / "kc"), "--prometheus",
                            "http://127.0.0.1:1", "--target", "http://127.0.0.1:2", "--node-profile", str(prof),
                            "--steps", "10", "--out", str(tmp_path / "run")])
    assert "the cluster run is not under test here" in r.output and r.exit_code == 1, r.output
    assert seen["profile"] == prof


def test_pipeline_json_prints_the_summary_on_stdout(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--out", str(out), "--steps", "150", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["out"] == str(out)
    rows = doc["summary"]["tiny"]["policies"]
    dqn = next(p for p in rows if p.startswith("dqn="))
    assert rows["default-k8s"]["energy_joules"] > 0 and rows[dqn]["energy_joules"] > 0


def test_ctrl_c_during_training_leaves_dir_consistent_then_resumes(tmp_path):
    """SIGINT to the real CLI process mid-training: exit 130, the train stage unrecorded, no model, results or
    temp files; the same command again runs every stage."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    log = tmp_path / "log.txt"
    args = [sys.executable, "-m", "joulesched.pipelines.cli", "pipeline", "-s", "scenarios/tiny.yaml", "--out", str(out)]
    with open(log, "w") as f:
        proc = subprocess.Popen([*args, "--steps", "1000000"], stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "train: running" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # well inside the million steps
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "interrupted" in text and "Traceback" not in text, text
    assert not (out / ".stages" / "train.json").exists() and not (out / "results.json").exists()
    assert not [p for p in out.rglob("*") if p.suffix == ".tmp" or p.name.endswith(".tmp")]
    r = runner.invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--out", str(out), "--steps", "150"])
    assert r.exit_code == 0, r.output
    assert (out / "results.json").is_file() and (out / ".stages" / "train.json").is_file()
