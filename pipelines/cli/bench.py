"""The twin commands: benchmark, report, explain, policies, validate, trace, sweep and demo.

Each is a thin typer signature over a library function in ``joulesched.pipelines``; bad input prints one red
line naming the problem and exits 2 before anything is written (:func:`~joulesched.pipelines.cli.common.errors`).
"""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from joulesched.pipelines.cli.common import command_line, err, errors, fail, interrupted, out
from joulesched.pipelines.progress import progress_bar
from joulesched.pipelines.suite import SHIPPED_MODEL, display, standard_suite

app = typer.Typer()


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
    from joulesched.agent.registry import BASELINES
    from joulesched.pipelines.benchmark import run_benchmark
    from joulesched.pipelines.report import write_report

    scenarios = scenario or standard_suite()
    policies = policy or list(BASELINES)
    with errors(), interrupted(out_dir):
        doc = _run_with_progress(run_benchmark, scenarios, policies, seeds, out_dir, jobs, not as_json)
        if report:
            write_report(out_dir)
    print_summary(doc, as_json, out_dir, report)


def _run_with_progress(fn, scenarios, policies, seeds, out_dir, jobs, show: bool) -> dict:
    command = command_line()
    with progress_bar(show) as prog:
        task = prog.add_task("benchmark", total=None, item="")
        return fn(scenarios, policies, seeds, out_dir, jobs=jobs, command=command,
                  on_start=lambda n: prog.update(task, total=n),
                  on_progress=lambda item: prog.update(task, advance=1, item=item))


def print_summary(doc: dict, as_json: bool, out_dir: Path, report: bool = True) -> None:
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
    out.print(f"results: {out_dir / 'results.json'}" + (f"   report: {out_dir / 'report.html'}" if report else ""))


@app.command("report")
def report_cmd(
    out_dir: Annotated[Path, typer.Argument(help="A folder written by `joulesched benchmark` or `demo`.")],
) -> None:
    """Re-render report.html and its plots from a results folder."""
    from joulesched.pipelines.report import write_report

    with errors():
        path = write_report(out_dir)
    out.print(f"report: {path}")


@app.command()
def explain(
    snapshot: Annotated[Path, typer.Option(help="Snapshot JSON: nodes (allocatable, pods, usage, power curve) and a pod.")],
    policy: Annotated[str, typer.Option("--policy", "-p", help="Policy spec.")] = "default-k8s",
    seed: Annotated[int, typer.Option(min=0, help="Seed for tie-breaking.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show each node's feasibility, per-plugin scores, total and the chosen node for one pod (for a DQN: each
    node's Q-value, advantage and the features that moved it most)."""
    from joulesched.agent.registry import make_policy
    from joulesched.pipelines.explain import explain as do_explain
    from joulesched.pipelines.explain import load_snapshot

    with errors():
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
    features = any("features" in n for n in res["nodes"])
    if features:
        t.add_column("top features (value: contribution)")
    for n in res["nodes"]:
        mark = "yes" if n["feasible"] else "no: " + ", ".join(n["reasons"])
        cells = [f"{n['scores'][pl]:.4g}" if isinstance(n["scores"][pl], float) else str(n["scores"][pl])
                 for pl in plugins] if "scores" in n else [""] * len(plugins)
        total = n.get("total", "")
        name = f"[bold green]{n['name']} ←[/]" if n["name"] == res["chosen"] else n["name"]
        row = [name, mark, *cells, f"{total:.4g}" if isinstance(total, float) else str(total)]
        if features:
            row.append(", ".join(f"{f['name']}={f['value']:.3g}: {f['contribution']:+.3g}"
                                 for f in n.get("features", [])))
        t.add_row(*row)
    out.print(t)
    out.print(f"chosen: {res['chosen']}" + (f" ({res['message']})" if "message" in res else ""))


@app.command()
def policies(
    long: Annotated[bool, typer.Option("--long", "-l", help="Also each policy's family, description and options "
                                       "with their defaults.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the same as JSON.")] = False,
) -> None:
    """List the policy names --policy accepts (``NAME``, ``NAME:key=value,...``, ``dqn=MODEL``)."""
    from joulesched.agent.registry import entries

    table = entries()
    if not (long or as_json):
        for name in sorted(table):
            print(name)
        return
    with errors():
        rows = [{"name": e.name, "family": e.family, "summary": e.summary, "description": e.description(),
                 "options": e.options(), "takes_model_file": e.takes_path} for e in table.values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    t = Table(show_lines=True)
    for col in ("policy", "family", "description", "options (defaults)"):
        t.add_column(col, overflow="fold")
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        if r["takes_model_file"]:
            opts = f"{r['name']}=MODEL; " + opts
        t.add_row(r["name"], r["family"], r["description"], opts)
    out.print(t)


@app.command()
def validate(
    scenario: Annotated[list[Path], typer.Argument(help="Scenario files to check.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
) -> None:
    """Check scenario files (and their traces) without running anything: every error at once, and warnings
    about pods no node can ever hold and about clusters on which every policy leaves pods waiting long."""
    from joulesched.pipelines.validate import check_scenario

    with errors():
        found = [check_scenario(p) for p in scenario]
    if as_json:
        print(json.dumps(found, indent=2))
        return
    for f in found:
        out.print(f"{f['file']}: ok ({f['nodes']} nodes, {f['pods']} pods)", soft_wrap=True)
        for w in f["warnings"]:
            err.print(f"[yellow]warning:[/yellow] {f['file']}: {escape(w)}", soft_wrap=True)


@app.command()
def trace(
    scenario: Annotated[Path, typer.Option("--scenario", "-s", help="Scenario whose workload to export.")],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Trace CSV to write; - for stdout.")],
    seed: Annotated[Optional[int], typer.Option(min=0, help="Workload seed (default: the scenario's).")] = None,
) -> None:
    """Export a scenario's workload (synthetic or trace) as a trace CSV."""
    import sys

    from joulesched.cluster.scenario import load_scenario
    from joulesched.cluster.workload import build_workload, write_trace
    from joulesched.core.fsio import check_output_file

    to_stdout = str(out_file) == "-"
    with errors():
        if not to_stdout:
            check_output_file(out_file, "--out")
        wl = build_workload(load_scenario(scenario), seed)
        write_trace(wl, sys.stdout if to_stdout else out_file)
    if not to_stdout:
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
    from joulesched.pipelines.report import write_report
    from joulesched.pipelines.sweep import run_sweep

    if ray_address is not None and executor != Executor.ray:
        fail("--ray-address needs --executor ray")
    command = command_line()
    with errors(), interrupted(out_dir), progress_bar(not as_json) as prog:
        task = prog.add_task("sweep", total=None, item="")
        doc = run_sweep(grid, out_dir, executor=executor.value, jobs=jobs, ray_address=ray_address, command=command,
                        on_start=lambda n: prog.update(task, total=n),
                        on_progress=lambda item: prog.update(task, advance=1, item=item))
    if report:
        write_report(out_dir)
    print_summary(doc, as_json, out_dir, report)


@app.command()
def demo(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")] = Path("out/demo"),
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per scenario.")] = 2,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes (default: all cores).")] = max(1, os.cpu_count() or 1),
    model: Annotated[Optional[Path], typer.Option(
        help="DQN model to benchmark. Default: the shipped model (trained here for 3 minutes if it is missing).",
        show_default=display(SHIPPED_MODEL))] = None,
) -> None:
    """The main job on the embedded twin: the DQN and every baseline on the standard suite, then the report."""
    from joulesched.pipelines.progress import StageDisplay
    from joulesched.pipelines.sim_pipeline import run_sim

    if model is not None and not model.is_file():
        fail(f"--model {model} does not exist; train it with `joulesched train --model {model}`, or drop --model "
             "to use the shipped one")
    model = model or SHIPPED_MODEL
    minutes = None if model.exists() else 3.0
    with errors(), interrupted(out_dir), StageDisplay() as show:
        doc = run_sim(standard_suite(), out_dir, model=model, minutes=minutes, seeds=seeds, jobs=jobs,
                      command=command_line(), **show.callbacks())
    print_summary(doc, False, out_dir)
