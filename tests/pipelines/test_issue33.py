"""Issue 33, the first hour with a real trace: nothing dropped without a word, counts that agree, help that
fits an 80-column screen, plain errors."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_a_failing_command_draws_no_progress_bar(tmp_path):
    r = runner.invoke(app, ["benchmark", "-s", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "scenario file not found" in r.output
    assert "0/?" not in r.output and "benchmark" not in r.output.split("error:")[0], r.output


# ---- item 1: rows dropped are named --------------------------------------------------------------------------
def _short_openb_sample(tmp_path: Path, duration_s: int) -> Path:
    """The OpenB sample scenario cut to ``duration_s``: the sample's pods arrive over six hours."""
    sc = tmp_path / "short.yaml"
    sc.write_text(f"name: short\nseed: 1\nduration_s: {duration_s}\n"
                  "idle_policy: {mode: sleep, sleep_after_s: 300, sleep_watts: 8, wake_s: 60}\n"
                  f"nodes:\n  - {{include: {ROOT}/scenarios/traces/alibaba-gpu-2023.nodes.yaml}}\n"
                  f"workload:\n  trace: {ROOT}/scenarios/traces/alibaba-gpu-2023.pods.csv\n")
    return sc


def _sample_rows() -> list[float]:
    lines = (ROOT / "scenarios/traces/alibaba-gpu-2023.pods.csv").read_text().splitlines()[1:]
    return [float(x.split(",")[0]) for x in lines if x.strip()]


def test_validate_and_benchmark_name_the_rows_they_drop(tmp_path):
    submits = _sample_rows()
    cut = 3600
    dropped = sum(t >= cut for t in submits)
    assert 0 < dropped < len(submits)
    sc = _short_openb_sample(tmp_path, cut)
    r = runner.invoke(app, ["validate", str(sc)])
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and f"{dropped} trace rows dropped" in text
    assert f"warning: {sc}: {dropped} trace row(s) dropped: submitted at or after duration_s=3600 s" in text
    found = json.loads(runner.invoke(app, ["validate", str(sc), "--json"]).stdout)[0]
    assert found["trace_rows_dropped"] == dropped and found["pods"] == len(submits) - dropped
    out = tmp_path / "out"
    r = runner.invoke(app, ["benchmark", "-s", str(sc), "-p", "default-k8s", "--out", str(out), "--no-report"])
    assert r.exit_code == 0, r.output
    assert f"warning: short: {dropped} trace row(s) dropped" in " ".join(r.output.split())
    doc = json.loads((out / "results.json").read_text())
    assert doc["scenarios"][0]["trace_rows_dropped"] == dropped
    assert doc["summary"]["short"]["warnings"][0].startswith(f"{dropped} trace row(s) dropped")
    # Nothing dropped, nothing said.
    (tmp_path / "full").mkdir()
    full = _short_openb_sample(tmp_path / "full", 86400)
    r = runner.invoke(app, ["validate", str(full)])
    assert r.exit_code == 0 and "dropped" not in r.output


# ---- item 2: unplaced adds up --------------------------------------------------------------------------------
TRACE = """submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,kind
0,600,9000,256,250,job
100,30,500,256,250,service
300,3000,4000,256,2000,job
400,100,1000,256,250,service
3500,100,4000,256,2000,job
"""


def test_placed_plus_unplaced_is_the_pods_with_each_reason(tmp_path):
    """One 4-core node, asleep after 60 idle seconds, 120 s to wake: the 9-core job fits no node; the service
    at t=100 is bound to the sleeping node and stops before it is up; the one at t=400 queues behind the job
    that fills the node and stops there; the two jobs run. 2 placed + 3 unplaced = 5 pods."""
    (tmp_path / "pods.csv").write_text(TRACE)
    sc = tmp_path / "s.yaml"
    sc.write_text("name: counts\nseed: 1\nduration_s: 3600\n"
                  "idle_policy: {mode: sleep, sleep_after_s: 60, sleep_watts: 5, wake_s: 120}\n"
                  "nodes:\n  - {name_prefix: n, count: 1, cpu_m: 4000, memory_mib: 8192, power_watts: hp-ml110-g4}\n"
                  "workload:\n  trace: pods.csv\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["benchmark", "-s", str(sc), "-p", "default-k8s", "--out", str(out), "--no-report"])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "results.json").read_text())["scenarios"][0]["policies"]["default-k8s"]
    assert (m["placed_pods"], m["unschedulable_pods"]) == (2, 3), m
    assert (m["unplaced_fits_no_node"], m["unplaced_pending_at_end"], m["unplaced_stopped_before_running"]) == (1, 0, 2)
    assert m["placements"] == 3 and m["slo_violation_rate"] == 0.0  # a bind without a run; unplaced are no SLO
    text = " ".join(r.output.split())
    assert "placed + unplaced = 5 pods" in text and "default-k8s 3 (1 fit no node, 2 stopped before they ran)" in text


# ---- item 7: help fits 80 columns ------------------------------------------------------------------------------
def _commands(cmd, path=()):
    yield path, cmd
    if hasattr(cmd, "list_commands"):  # a group (typer's own copy of click's)
        ctx = cmd.context_class(cmd)
        for name in cmd.list_commands(ctx):
            yield from _commands(cmd.get_command(ctx, name), (*path, name))


def test_every_commands_help_shows_full_option_names_at_80_columns():
    import typer

    root = typer.main.get_command(app)
    seen = 0
    for path, cmd in _commands(root):
        r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
        assert r.exit_code == 0, (path, r.output)
        assert "…" not in r.output, (path, r.output)
        long_lines = [line for line in r.output.splitlines() if len(line) > 80]
        assert not long_lines, (path, long_lines)
        tokens = set(re.findall(r"--?[\w-]+", r.output))
        for p in cmd.params:
            for opt in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())):
                if opt.startswith("-"):
                    assert opt in tokens, (path, opt)
                    seen += 1
    assert seen > 200  # every command was rendered, not just the root


# ---- items 5, 6: explain ---------------------------------------------------------------------------------------
EXAMPLE = ROOT / "scenarios" / "snapshots" / "example.json"


def _explain(*args):
    r = runner.invoke(app, ["explain", *map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_the_documented_example_snapshot_loads_with_profile_names_and_power_states():
    from joulesched.cluster.state import ASLEEP, ON, WAKING
    from joulesched.pipelines.explain import load_snapshot
    from joulesched.power.curves import SPECPOWER

    st, pod = load_snapshot(EXAMPLE)
    assert st.curves[0].tolist() == list(SPECPOWER["hp-ml110-g4"])
    assert st.power_state.tolist() == [ON, ASLEEP, ON, WAKING]
    assert st.nz_cpu[0] == 2000 + 1500 + 100 and st.pods[0] == 3 and st.now == 3600 and st.sleep_watts[1] == 8
    assert "nodes[].power_state" in (ROOT / "docs" / "pipelines.md").read_text()
    res = _explain("--snapshot", EXAMPLE, "-p", "awake-first")
    assert res["chosen"] != "old-1"  # asleep: an awake node that fits comes first


def test_a_snapshot_from_a_scenario_scores_as_the_twin_does(tmp_path):
    sc = ROOT / "scenarios" / "heterogeneous-sleep.yaml"
    snap = tmp_path / "snap.json"
    for policy in ("default-k8s", "pabfd", "peaks"):
        live = _explain("--scenario", sc, "--at", 3600, "-p", policy, "--save-snapshot", snap)
        again = _explain("--snapshot", snap, "-p", policy)
        assert live["now_s"] >= 3600 and again["now_s"] == live["now_s"]
        assert live["nodes"] == again["nodes"] and live["chosen"] == again["chosen"], policy
        assert any(n["reasons"] for n in live["nodes"]) or any(
            p for n in json.loads(snap.read_text())["nodes"] for p in n["pods"])  # a cluster mid-run, not empty
    states = {n["power_state"] for n in json.loads(snap.read_text())["nodes"]}
    assert "asleep" in states  # the sleeping nodes are part of the snapshot


def test_a_snapshot_keeps_the_wake_time_and_the_nodes_that_never_sleep(tmp_path):
    """What empty=asleep and the DQN's wake-time column read: written from the twin, read back alike."""
    import yaml

    from joulesched.pipelines.explain import load_snapshot

    doc = yaml.safe_load((ROOT / "scenarios" / "heterogeneous-sleep.yaml").read_text())
    doc["nodes"][0]["never_sleep"] = True
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump(doc))
    snap = tmp_path / "snap.json"
    live = _explain("--scenario", sc, "--at", 3600, "-p", "awake-first:empty=asleep", "--save-snapshot", snap)
    st, _ = load_snapshot(snap)
    first = doc["nodes"][0]["count"]
    assert st.wake_s == doc["idle_policy"]["wake_s"] > 0
    assert not st.may_sleep[:first].any() and st.may_sleep[first:].all()
    assert _explain("--snapshot", snap, "-p", "awake-first:empty=asleep")["chosen"] == live["chosen"]


@pytest.mark.parametrize("args,message", [
    ([], "give --snapshot FILE or --scenario FILE"),
    (["--snapshot", EXAMPLE, "--scenario", ROOT / "scenarios/tiny.yaml"], "one of them"),
    (["--snapshot", EXAMPLE, "--at", "10"], "--at and --save-snapshot go with --scenario"),
    (["--scenario", ROOT / "scenarios/tiny.yaml", "--at", "1e9"], "no decision at or after --at 1e+09 s"),
])
def test_explain_refuses_bad_option_combinations(args, message):
    r = runner.invoke(app, ["explain", *map(str, args)])
    assert r.exit_code == 2 and message in " ".join(r.output.split()), r.output


def test_a_snapshot_profile_name_that_does_not_exist_exits_2(tmp_path):
    bad = json.loads(EXAMPLE.read_text())
    bad["nodes"][0]["power_watts"] = "toaster"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    r = runner.invoke(app, ["explain", "--snapshot", str(p)])
    assert r.exit_code == 2 and "unknown power profile 'toaster'" in r.output


def test_explain_totals_follow_the_weights_shown():
    from joulesched.agent.registry import DEFAULT_POLICIES

    model = ROOT / "models" / "v2.pt"
    specs = [*DEFAULT_POLICIES, *([f"dqn={model}"] if model.exists() else [])]
    checked = 0
    for spec in specs:
        res = _explain("--snapshot", EXAMPLE, "-p", spec)
        rows = [n for n in res["nodes"] if "scores" in n]
        if not rows:
            continue  # round-robin, random: no scorer
        checked += 1
        if res["rule"] == "sum":
            for n in rows:
                total = sum(n["weights"][k] * v for k, v in n["scores"].items())
                assert total == pytest.approx(n["total"]), (spec, n)
        else:
            assert res["rule"] == "lexicographic" and {n["total"] for n in rows} <= set(range(0, -len(rows), -1))
            assert all(isinstance(n["total"], int) for n in rows)  # integers: never "-0"
            best = [n["name"] for n in rows if n["total"] == 0]
            assert res["chosen"] in best, spec
    assert checked >= 8
    text = runner.invoke(app, ["explain", "--snapshot", str(EXAMPLE), "-p", f"dqn={model}"]).output
    if model.exists():
        assert "Q (not in total)" in text and "Advantage (w=1)" in text


# ---- item 9: the small ones ------------------------------------------------------------------------------------
def test_a_raw_openb_csv_as_a_trace_names_trace_import(tmp_path):
    sc = tmp_path / "raw.yaml"
    sc.write_text("name: raw\nseed: 1\nduration_s: 86400\n"
                  "nodes:\n  - {name_prefix: n, count: 2, cpu_m: 8000, memory_mib: 32768, power_watts: hp-ml110-g4}\n"
                  f"workload:\n  trace: {ROOT}/scenarios/traces/alibaba-gpu-2023/openb_pod_list_default.csv\n")
    r = runner.invoke(app, ["validate", str(sc)])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "missing column(s) submit_s" in text
    assert "`joulesched trace import`" in text and "-f alibaba-gpu-2023" in text


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="no /proc on this system")
def test_an_output_under_proc_says_why_it_cannot_be_written(tmp_path):
    r = runner.invoke(app, ["benchmark", "-s", str(ROOT / "scenarios/tiny.yaml"), "--out", "/proc/joulesched-out"])
    assert r.exit_code == 2 and "No such file or directory" not in r.output
    assert "cannot create files in /proc: it takes no new files (a virtual file system" in " ".join(r.output.split())


def test_a_scenario_decision_is_explained_as_the_run_broke_its_ties():
    """explain reset the policy with --seed, throwing away the run's random generator: where scores tie (default-k8s
    on tiny's identical nodes) it named another node than the run bound."""
    import numpy as np

    from joulesched.agent.registry import make_policy
    from joulesched.agent.runner import run_policy
    from joulesched.cluster.scenario import load_scenario
    from joulesched.cluster.twin import Twin
    from joulesched.cluster.workload import build_workload
    from joulesched.pipelines.explain import explain, scenario_decision

    path = ROOT / "scenarios" / "tiny.yaml"
    sc = load_scenario(path)
    wl = build_workload(sc, sc.seed)
    twin = Twin(sc, wl)
    run_policy(twin, make_policy("default-k8s"), sc.seed)
    checked = 0
    for at in [0.0] + [float(x) for x in np.sort(wl.submit_s)[5:200:6]]:  # 0: the first decision, before a reset
        pol = make_policy("default-k8s")  # as the command does: one policy, run to the decision, then explained
        d = scenario_decision(path, pol, at)
        res = explain(pol, d.state, d.pod, 0, meta=d.meta, reset=False)
        assert res["chosen"] == twin.state.names[twin.pod_node[d.key]], at
        checked += 1
    assert checked >= 20
    for name in ("round-robin", "random", "energy-greedy"):  # their state is made by reset: it must have run
        pol = make_policy(name)
        d = scenario_decision(path, pol, 0.0)
        assert explain(pol, d.state, d.pod, 0, meta=d.meta, reset=False)["chosen"]


def test_a_snapshot_that_cannot_hold_the_decision_is_refused_not_written(tmp_path):
    """A snapshot holds CPU, memory and power: a 2-GPU pod's saved snapshot made the CPU nodes feasible."""
    from tests.helpers import gpu_trace_scenario

    sc = gpu_trace_scenario(tmp_path, [2], gpu_nodes=1, cpu_nodes=2)
    snap = tmp_path / "snap.json"
    r = runner.invoke(app, ["explain", "--scenario", str(sc), "--at", "0", "-p", "default-k8s",
                            "--save-snapshot", str(snap), "--json"])
    assert r.exit_code == 2 and "cannot hold GPUs" in r.output and not snap.exists()
