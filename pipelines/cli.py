"""The `joulesched` command line: one typer app, thin commands over library functions.

Bad input (a malformed scenario, trace, snapshot, policy spec or model file) prints one red line naming the
problem and exits with code 2, before anything is written.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(
    name="joulesched",
    help="Energy-aware Kubernetes scheduling: twin, baselines, DQN, power metering, workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
# Piped output (logs, CI) gets a wide console so that tables are not truncated to 80 columns.
out = Console() if sys.stdout.isatty() else Console(width=160)

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDARD_SUITE = REPO_ROOT / "scenarios"


def _input_errors() -> tuple[type[BaseException], ...]:
    from agent.policy import PolicyError
    from cluster.scenario import ScenarioError
    from pipelines.benchmark import BenchmarkInputError
    from pipelines.explain import SnapshotError

    errors: tuple[type[BaseException], ...] = (ScenarioError, PolicyError, SnapshotError, BenchmarkInputError)
    if "pipelines.train" in sys.modules:  # only when training was involved; importing it loads torch
        errors += (sys.modules["pipelines.train"].TrainError,)
    return errors


@contextmanager
def _usage_errors() -> Iterator[None]:
    """Turn input errors into one red line and exit code 2."""
    try:
        yield
    except _input_errors() as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[item]}"), console=err, disable=not enabled, transient=False)


def _suite() -> list[Path]:
    return sorted(STANDARD_SUITE.glob("*.yaml"))


ScenarioOpt = Annotated[Optional[list[Path]], typer.Option(
    "--scenario", "-s", help="Scenario YAML (repeatable). Default: the standard suite in scenarios/.")]
PolicyOpt = Annotated[Optional[list[str]], typer.Option(
    "--policy", "-p", help="Policy NAME, NAME:key=value,... or dqn=MODEL (repeatable). Default: every baseline.")]


@app.command()
def benchmark(
    scenario: ScenarioOpt = None,
    policy: PolicyOpt = None,
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="Seeds per scenario (workload seed = scenario seed + i).")] = 1,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder for results.json and report.html.")] = Path("out/benchmark"),
    jobs: Annotated[int, typer.Option(min=1, max=256, help="Worker processes.")] = 1,
    report: Annotated[bool, typer.Option(help="Write report.html with plots.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Run every policy on the same workloads, side by side, and compare with the offline lower bound."""
    from agent.policy import BASELINES
    from pipelines.benchmark import run_benchmark
    from pipelines.report import write_report

    scenarios = scenario or _suite()
    policies = policy or list(BASELINES)
    with _usage_errors():
        doc = _run_with_progress(run_benchmark, scenarios, policies, seeds, out_dir, jobs, not as_json)
    if report:
        write_report(out_dir)
    _print_summary(doc, as_json, out_dir)


def _run_with_progress(fn, scenarios, policies, seeds, out_dir, jobs, show: bool) -> dict:
    command = "joulesched " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with _progress(show) as prog:
        task = prog.add_task("benchmark", total=None, item="")
        return fn(scenarios, policies, seeds, out_dir, jobs=jobs, command=command,
                  on_start=lambda n: prog.update(task, total=n),
                  on_progress=lambda item: prog.update(task, advance=1, item=item))


def _print_summary(doc: dict, as_json: bool, out_dir: Path) -> None:
    if as_json:
        print(json.dumps({"out": str(out_dir), "summary": doc["summary"]}, indent=2))
        return
    for name, s in doc["summary"].items():
        t = Table(title=f"{name} (lower bound {s['lower_bound_joules'] / 3.6e6:.2f} kWh)", title_justify="left")
        for col in ("policy", "kWh", "×default", "×best heur", "×bound", "SLO viol", "pend s", "unplaced", "p99 µs"):
            t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
        for p, r in sorted(s["policies"].items(), key=lambda kv: kv[1]["energy_joules"]):
            t.add_row(p, f"{r['energy_joules'] / 3.6e6:.2f}", f"{r.get('energy_vs_default', float('nan')):.3f}",
                      f"{r.get('energy_vs_best_heuristic', float('nan')):.3f}", f"{r['energy_vs_lower_bound']:.3f}", f"{100 * r['slo_violation_rate']:.2f}%",
                      f"{r['mean_pending_s']:.1f}", f"{r['unschedulable_pods']:g}", f"{r['decision_us_p99']:.0f}")
        out.print(t)
    out.print(f"results: {out_dir / 'results.json'}   report: {out_dir / 'report.html'}")


@app.command("report")
def report_cmd(
    out_dir: Annotated[Path, typer.Argument(help="A folder written by `joulesched benchmark` or `demo`.")],
) -> None:
    """Re-render report.html and its plots from a results folder."""
    from pipelines.report import write_report

    with _usage_errors():
        path = write_report(out_dir)
    out.print(f"report: {path}")


@app.command()
def explain(
    snapshot: Annotated[Path, typer.Option(help="Snapshot JSON: nodes (allocatable, pods, usage, power curve) and a pod.")],
    policy: Annotated[str, typer.Option("--policy", "-p", help="Policy spec.")] = "default-k8s",
    seed: Annotated[int, typer.Option(help="Seed for tie-breaking.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show each node's feasibility, per-plugin scores, total and the chosen node for one pod."""
    from agent.policy import make_policy
    from pipelines.explain import explain as do_explain
    from pipelines.explain import load_snapshot

    with _usage_errors():
        pol = make_policy(policy)
        st, pod = load_snapshot(snapshot)
        res = do_explain(pol, st, pod, seed)
    if as_json:
        print(json.dumps(res, indent=2))
        return
    plugins = sorted({k for n in res["nodes"] for k in n.get("scores", {})})
    t = Table(title=f"{res['policy']}: pod cpu={res['pod']['cpu_m']}m memory={res['pod']['memory_mib']}Mi",
              title_justify="left")
    t.add_column("node")
    t.add_column("feasible")
    for pl in plugins:
        w = next((n["weights"][pl] for n in res["nodes"] if "weights" in n), 1)
        t.add_column(f"{pl} (w={w})", justify="right")
    t.add_column("total", justify="right")
    for n in res["nodes"]:
        mark = "yes" if n["feasible"] else "no: " + ", ".join(n["reasons"])
        cells = [f"{n['scores'][pl]:.4g}" if isinstance(n["scores"][pl], float) else str(n["scores"][pl])
                 for pl in plugins] if "scores" in n else [""] * len(plugins)
        total = n.get("total", "")
        name = f"[bold green]{n['name']} ←[/]" if n["name"] == res["chosen"] else n["name"]
        t.add_row(name, mark, *cells, f"{total:.4g}" if isinstance(total, float) else str(total))
    out.print(t)
    out.print(f"chosen: {res['chosen']}" + (f" ({res['message']})" if "message" in res else ""))


@app.command()
def policies() -> None:
    """List the policy names --policy accepts."""
    from agent.policy import policy_names

    for name in policy_names():
        print(name)


@app.command()
def validate(
    scenario: Annotated[list[Path], typer.Argument(help="Scenario files to check.")],
) -> None:
    """Check scenario files (and their traces) without running anything."""
    from cluster.scenario import load_scenario
    from cluster.workload import build_workload

    with _usage_errors():
        for p in scenario:
            sc = load_scenario(p)
            wl = build_workload(sc)
            out.print(f"{p}: ok ({sc.node_count} nodes, {len(wl)} pods)")


@app.command()
def trace(
    scenario: Annotated[Path, typer.Option("--scenario", "-s", help="Scenario whose workload to export.")],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Trace CSV to write.")],
    seed: Annotated[Optional[int], typer.Option(help="Workload seed (default: the scenario's).")] = None,
) -> None:
    """Export a scenario's workload (synthetic or trace) as a trace CSV."""
    from cluster.scenario import load_scenario
    from cluster.workload import build_workload, write_trace

    with _usage_errors():
        wl = build_workload(load_scenario(scenario), seed)
    write_trace(wl, out_file)
    out.print(f"{out_file}: {len(wl)} pods")


class Executor(str, Enum):
    local = "local"
    ray = "ray"


@app.command()
def sweep(
    grid: Annotated[Path, typer.Option(help="Sweep grid YAML: scenarios, policies, seeds, hyperparameters.")],
    executor: Annotated[Executor, typer.Option(help="local: a process pool; ray: Ray tasks.")] = Executor.local,
    ray_address: Annotated[Optional[str], typer.Option(
        help="Ray cluster address (e.g. ray://head:10001); default: start a local Ray instance.")] = None,
    jobs: Annotated[int, typer.Option(min=1, max=256, help="Processes for the local executor.")] = 1,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")] = Path("out/sweep"),
    report: Annotated[bool, typer.Option(help="Write report.html with plots.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Fan out (scenario, policy, seed, hyperparameter) cells and aggregate them with confidence intervals."""
    from pipelines.report import write_report
    from pipelines.sweep import run_sweep

    if ray_address is not None and executor != Executor.ray:
        err.print("[red]error:[/red] --ray-address needs --executor ray")
        raise typer.Exit(2)
    command = "joulesched " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with _usage_errors(), _progress(not as_json) as prog:
        task = prog.add_task("sweep", total=None, item="")
        doc = run_sweep(grid, out_dir, executor=executor.value, jobs=jobs, ray_address=ray_address, command=command,
                        on_start=lambda n: prog.update(task, total=n),
                        on_progress=lambda item: prog.update(task, advance=1, item=item))
    if report:
        write_report(out_dir)
    _print_summary(doc, as_json, out_dir)


SHIPPED_MODEL = REPO_ROOT / "models" / "small.pt"


@app.command()
def demo(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")] = Path("out/demo"),
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per scenario.")] = 2,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes (default: all cores).")] = max(1, os.cpu_count() or 1),
    model: Annotated[Path, typer.Option(help="DQN model to benchmark (trained here for 3 minutes if missing).")] = SHIPPED_MODEL,
) -> None:
    """The main job on the embedded twin: the DQN and every baseline on the standard suite, then the report."""
    from pipelines.pipeline import run_sim

    from pipelines.pipeline_cli import StageDisplay, interrupted

    minutes = None if model.exists() else 3.0
    with _usage_errors(), interrupted(out_dir), StageDisplay() as show:
        doc = run_sim(_suite(), out_dir, model=model, minutes=minutes, seeds=seeds, jobs=jobs, **show.callbacks())
    _print_summary(doc, False, out_dir)


def _register_subapps() -> None:
    # Sub-apps live with the code they drive; importing them here keeps one entry point.
    from power.cli import app as power_app
    from workloads.cli import load_app, workload_app

    app.add_typer(power_app, name="power", help="RAPL meters, attribution, the Prometheus exporter, calibration.")
    app.add_typer(workload_app, name="workload", help="Resource-blocker apps and the test app.")
    app.add_typer(load_app, name="load", help="Drive load with JMeter or Locust and read results back.")
    from pipelines.infra_cli import app as infra_app

    app.add_typer(infra_app, name="infra", help="Provision environments: Pulumi stacks, KVM guests, Ansible.")
    from pipelines.pipeline_cli import pipeline as pipeline_cmd
    from pipelines.train_cli import test_cmd, train_cmd

    app.command("pipeline")(pipeline_cmd)

    app.command("train")(train_cmd)
    app.command("test")(test_cmd)
    from pipelines.serve_cli import extender as extender_cmd
    from pipelines.serve_cli import serve as serve_cmd

    app.command("serve")(serve_cmd)
    app.command("extender")(extender_cmd)


_register_subapps()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
