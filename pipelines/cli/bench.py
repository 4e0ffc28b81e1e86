"""The twin commands: benchmark, optimum, report, explain, policies, validate, trace, sweep and demo.

Each is a thin typer signature over a library function in ``joulesched.pipelines``; bad input prints one red
line naming the problem and exits 2 before anything is written (:func:`~joulesched.pipelines.cli.common.errors`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from joulesched.pipelines.cli.common import command_line, err, errors, fail, float_option, interrupted, out
from joulesched.pipelines.progress import progress_bar
from joulesched.pipelines.suite import SHIPPED_MODEL, display, standard_suite

if TYPE_CHECKING:
    from joulesched.pipelines.results import Results, ScenarioSummary

app = typer.Typer(rich_markup_mode=None)


ScenarioOpt = Annotated[Optional[list[Path]], typer.Option(
    "--scenario", "-s", help="Scenario YAML (repeatable). Default: the standard suite in scenarios/.")]
PolicyOpt = Annotated[Optional[list[str]], typer.Option(
    "--policy", "-p", help="Policy NAME, NAME:key=value,... or dqn=MODEL (repeatable). Default: the default set, every "
    "baseline and variant, the GPU-aware ones too where any scenario of the run has GPUs (policies --long).")]


#: What an interrupted benchmark or sweep keeps: its cells are not recorded one by one, so nothing resumes.
NO_RESUME = ("{out_dir} is as it was: results are written only when the whole run is done. A re-run starts every "
             "cell again (nothing is kept to resume from).")
#: ... and one interrupted while it draws its report: the results are whole.
REPORT_ONLY = ("{out_dir}/results.json is complete; only the report was not drawn: `joulesched report {out_dir}` "
               "draws it.")


@app.command()
def benchmark(
    scenario: ScenarioOpt = None,
    policy: PolicyOpt = None,
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="Seeds per scenario (workload seed = scenario seed + i).")] = 1,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder for results.json and report.html.")] = Path("out/benchmark"),
    jobs: Annotated[int, typer.Option(min=1, max=256, help="Worker processes.")] = 1,
    report: Annotated[bool, typer.Option(help="Write report.html with plots.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    optimum: Annotated[bool, typer.Option(
        "--optimum", help="Also the LP bound and, on small instances, the MIP optimum (docs/optimum.md).")] = False,
    optimum_time_limit: Annotated[float, float_option(
        help="Seconds for the MIP per scenario and seed, with --optimum.")] = 60.0,
    optimum_solver: Annotated[str, typer.Option(
        help="The MIP's solver with --optimum: highs, cpsat or race (both at once).")] = "highs",
    placements: Annotated[bool, typer.Option(
        "--placements", help="Also write placements.csv: per scenario, seed and policy, one row per pod (its trace "
                             "name, node, the node's GPU count and model, bind and end time; empty node: never "
                             "placed).")] = False,
) -> None:
    """Run every policy on the same workloads, side by side, and compare with the offline lower bound."""
    from functools import partial

    from joulesched.agent.registry import default_policies
    from joulesched.pipelines.benchmark import any_gpus, run_benchmark
    from joulesched.pipelines.report import write_report

    scenarios = scenario or standard_suite()
    run = partial(run_benchmark, optimum=optimum, optimum_time_limit=optimum_time_limit, placements=placements,
                  optimum_solver=optimum_solver)
    with errors(), interrupted(out_dir, NO_RESUME.format(out_dir=out_dir)):
        policies = policy or list(default_policies(any_gpus(scenarios)))
        doc = _run_with_progress(run, scenarios, policies, seeds, out_dir, jobs, not as_json)
    with errors(), interrupted(out_dir, REPORT_ONLY.format(out_dir=out_dir)):
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


def print_summary(doc: Results, as_json: bool, out_dir: Path, report: bool = True) -> None:
    if as_json:
        print(json.dumps({"out": str(out_dir), "summary": doc.model_dump(exclude_unset=True)["summary"]}, indent=2))
        return
    def ratio(r, key: str) -> str:
        v = getattr(r, key)
        return f"{v:.3f}" if v is not None else "—"  # no default-k8s / no heuristic in the set

    for name, s in doc.summary.items():
        best = s.best_heuristics or []
        divides = (f"×best heur = / {best[0]}" + (f" (per seed: {', '.join(best)})" if len(best) > 1 else "")
                   if best else "×best heur: no heuristic among the policies")
        t = Table(title=f"{escape(name)} (lower bound {s.lower_bound_joules / 3.6e6:.2f} kWh; {escape(divides)})",
                  title_justify="left")
        for col in ("policy", "kWh", "×default", "×best heur", "×bound", "SLO viol", "pend s", "unplaced", "p99 µs"):
            t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
        for p, r in sorted(s.policies.items(), key=lambda kv: kv[1].energy_joules):
            t.add_row(escape(p), f"{r.energy_joules / 3.6e6:.2f}",
                      ratio(r, "energy_vs_default"), ratio(r, "energy_vs_best_heuristic"),
                      ratio(r, "energy_vs_lower_bound"), f"{100 * r.slo_violation_rate:.2f}%",
                      f"{r.mean_pending_s:.1f}", f"{r.unschedulable_pods:g}", f"{r.decision_us_p99:.0f}")
        out.print(t)
        _print_unplaced(s)
        for w in s.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(name)}: {escape(w)}", soft_wrap=True)
        if s.optimum:
            o = s.optimum
            kwh = lambda j: "—" if j is None else f"{j / 3.6e6:.2f} kWh"  # noqa: E731
            out.print(f"  optimum {kwh(o.optimum_joules)} ({', '.join(o.status)}), its bound "
                      f"{kwh(o.optimum_bound_joules)}, LP bound {kwh(o.lp_bound_joules)}")
    n = len(doc.policies)
    out.print(f"{n} polic{'y' if n == 1 else 'ies'} × {len(doc.summary)} scenario(s) × {doc.seeds} "
              f"seed(s) ran in {doc.wall_s:.1f} s")
    # A folder's name is the user's text, not markup (a `[/x]` in it raised MarkupError after the run).
    out.print(f"results: {escape(str(out_dir / 'results.json'))}"
              + (f"   report: {escape(str(out_dir / 'report.html'))}" if report else ""))


def _print_unplaced(s: ScenarioSummary) -> None:
    """Why each policy's unplaced pods were never placed (placed + unplaced = pods; docs/twin.md, "Counts")."""
    from joulesched.pipelines.benchmark import UNPLACED_REASONS

    lines = []
    for p, r in s.policies.items():
        counts = {k: getattr(r, k) for k in UNPLACED_REASONS}
        if r.unschedulable_pods and all(v is not None for v in counts.values()):
            why = ", ".join(f"{v:g} {UNPLACED_REASONS[k]}" for k, v in counts.items() if v)
            lines.append(f"{escape(p)} {r.unschedulable_pods:g} ({why})")
    if lines:
        out.print(f"  unplaced = pods that never got a node to run on; placed + unplaced = {s.pods:g} pods; "
                  f"not counted as SLO violations: {'; '.join(lines)}", soft_wrap=True)


@app.command()
def optimum(
    scenario: Annotated[list[Path], typer.Option("--scenario", "-s", help="Scenario YAML (repeatable).")],
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="Seeds per scenario (workload seed = scenario seed + i).")] = 1,
    time_limit: Annotated[float, float_option(
        "--time-limit", help="Seconds for the MIP per scenario and seed, model building included.")] = 60.0,
    max_nodes: Annotated[int, typer.Option(min=1, help="Larger clusters get the LP and fluid bounds only.")] = 16,
    max_pods: Annotated[int, typer.Option(min=1, help="More pods than this: the LP and fluid bounds only.")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON on stdout.")] = False,
    bound_only: Annotated[bool, typer.Option(
        "--bound-only", help="The bounds alone at any size, services included: fluid, LP (every run), then "
                             "bind-on-arrival, within --time-limit in all per scenario and seed; when it runs "
                             "out, the best bound so far (bound_status: time_limit).")] = False,
    policy: Annotated[Optional[list[str]], typer.Option(
        "--policy", "-p", help="Policy to run beside it (repeatable; default: default-k8s and every "
                               "best-heuristic candidate, the strongest variants included).",
    )] = None,
    solver: Annotated[str, typer.Option(
        help="The MIP's solver: highs, cpsat (OR-Tools CP-SAT) or race (both at once, half the cores each; the "
             "better schedule and bound kept).")] = "highs",
) -> None:
    """The clairvoyant optimum: a MIP over the twin's own semantics (HiGHS, or CP-SAT with --solver), with its
    bound and gap, the LP and fluid bounds, every heuristic's energy beside it, and the optimal schedule replayed
    in the twin.

    Each row's certificate: optimal (status optimal, gap <= 1e-4 and the twin replays the schedule to its energy
    within 1e-9),
    feasible (a schedule, the twin's energy for it, and a bound with the gap), bound-only (no schedule)."""
    from joulesched.agent.optimum import check_solver, check_time_limit, instance, optimum_entry, policy_energies
    from joulesched.agent.registry import BEST_HEURISTIC_CANDIDATES, make_policy
    from joulesched.cluster.scenario import load_scenario

    with errors():
        check_time_limit(time_limit)
        check_solver(solver)
        specs = tuple(policy) if policy else tuple(dict.fromkeys(("default-k8s", *BEST_HEURISTIC_CANDIDATES)))
        for p in specs:
            make_policy(p)  # a bad spec fails before any solving
        loaded = [load_scenario(p) for p in scenario]
        names = [sc.name for sc in loaded]
        if len(set(names)) < len(names):  # the same file twice, or two sharing a name: rows keyed by it
            fail(f"scenario {next(n for n in names if names.count(n) > 1)!r} is given twice")
        for sc in loaded:
            instance(sc, bounds_only=bound_only)  # a bad trace, or a workload the model does not state, fails here
        rows = []
        with progress_bar(not as_json, percent=bound_only) as prog:
            # --bound-only: the bar is the time budget (time limit per row), the item its stage and best bound.
            task = prog.add_task("bound" if bound_only else "optimum", item="",
                                 total=len(loaded) * seeds * (time_limit if bound_only else 1))
            for sc in loaded:
                for s in range(seeds):
                    prog.update(task, item=f"{sc.name} seed {s}")
                    replay: list = []  # the schedule's run in the twin, metered with the policies' window
                    with _ticking(prog, task, time_limit if bound_only else 0.0):
                        row = optimum_entry(sc, s, time_limit=time_limit, max_nodes=max_nodes, max_pods=max_pods,
                                            bound_only=bound_only, on_stage=_stage_item(prog, task, sc.name, s),
                                            solver=solver, on_replay=replay.append)
                    prog.update(task, item=f"{sc.name} seed {s}: {len(specs)} policies")
                    row["policies"] = policy_energies(sc, s, specs, row, replay[0] if replay else None)
                    row["best_heuristic"] = best_heuristic(row["policies"])
                    rows.append(row)
                    prog.update(task, completed=len(rows) * (time_limit if bound_only else 1))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    kwh = lambda j: "—" if j is None else f"{j / 3.6e6:.3f}"  # noqa: E731
    title = "bounds (kWh; ×best = best policy / bound)" if bound_only else "optimum (kWh; ×best = / best heuristic)"
    t = Table(title=title, title_justify="left")
    who = "best policy" if bound_only else "best heuristic"
    for col in ("scenario", "seed", "nodes", "pods", "status", "optimum", "bound", "gap", "LP bound", "fluid",
                who, "×best", "replay err", "s"):
        t.add_column(col, justify="left" if col in ("scenario", "status", who) else "right")
    for r in rows:
        # --bound-only: the best policy of the run over the bound; else the schedule over the best heuristic.
        best = min(r["policies"], key=r["policies"].get) if bound_only else r["best_heuristic"]
        ratio = f"{r['schedule_joules'] / r['policies'][best]:.3f}" if best and r["schedule_joules"] else "—"
        if bound_only and r["best_bound_joules"]:
            ratio = f"{r['policies'][best] / r['best_bound_joules']:.3f}"
        gap = "—" if r["best_gap"] is None else f"{100 * r['best_gap']:.2f}%"
        status = r["certificate"] + (" (time limit)" if r.get("bound_status") == "time_limit" else "")
        t.add_row(escape(r["name"]), str(r["seed"]), str(r["nodes"]), str(r["pods"]), status,
                  kwh(r["schedule_joules"]), kwh(r["best_bound_joules"]), gap,
                  kwh(r["lp_bound_joules"]), kwh(r["fluid_joules"]),
                  f"{escape(best)} {kwh(r['policies'][best])}" if best else "— (no heuristic run)", ratio,
                  "—" if r["replay_rel_error"] is None else f"{r['replay_rel_error']:.1e}",
                  "—" if (secs := r.get("bound_wall_s") or r.get("time_s")) is None else f"{secs:.0f}")
    out.print(t)
    for r in rows:
        if r["message"]:
            out.print(f"{escape(r['name'])} seed {r['seed']}: {escape(r['message'])}")


def best_heuristic(energies: dict[str, float]) -> str | None:
    """The least-energy heuristic among ``energies`` (policy spec -> joules): default-k8s, the references
    (round-robin, random), learned and clairvoyant policies are not heuristics (agent/registry.py,
    ``HEURISTIC_FAMILIES``); None when none ran."""
    from joulesched.agent.registry import heuristics_among

    heur = heuristics_among(energies)
    return min(heur, key=energies.get) if heur else None


@contextmanager
def _ticking(prog, task, seconds: float):
    """Advance ``task`` with the clock for up to ``seconds`` while the block runs (HiGHS releases the GIL)."""
    if seconds <= 0:
        yield
        return
    base, t0, stop = prog.tasks[task].completed, time.monotonic(), threading.Event()

    def tick() -> None:
        while not stop.wait(0.5):
            prog.update(task, completed=base + min(seconds, time.monotonic() - t0))

    th = threading.Thread(target=tick, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def _stage_item(prog, task, name: str, seed: int):
    """An ``on_stage`` callback showing the bound's stage and its best bound so far as the bar's item."""
    def tell(what: str, best: float | None) -> None:
        bound = "" if best is None else f", bound {best / 3.6e6:,.1f} kWh"
        prog.update(task, item=f"{name} seed {seed}: {what}{bound}")
    return tell



@app.command("report")
def report_cmd(
    out_dir: Annotated[Path, typer.Argument(
        help="A folder written by `joulesched benchmark` or `demo` (or its results.json).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report's path and the plots written as JSON on "
                                                         "stdout.")] = False,
) -> None:
    """Re-render report.html and its plots from a results folder."""
    from joulesched.pipelines.report import has_timelines, report_summary, write_report

    if out_dir.name == "results.json" and out_dir.is_file():  # the file named instead of its folder
        out_dir = out_dir.parent
    with errors():
        path = write_report(out_dir)
    if not has_timelines(out_dir):  # also a kube run's empty archive
        err.print(f"[yellow]note:[/yellow] no {out_dir / 'timelines.npz'}: the power and utilisation plots are "
                  "left out", soft_wrap=True)
    if as_json:
        print(json.dumps(report_summary(out_dir), indent=2))
        return
    out.print(f"report: {path}")


@app.command()
def explain(
    snapshot: Annotated[Optional[Path], typer.Option(
        help="Snapshot JSON: nodes (allocatable, pods, usage, power curve or profile, power state) and a pod; "
             "docs/pipelines.md has the format, scenarios/snapshots/example.json is one.")] = None,
    scenario: Annotated[Optional[Path], typer.Option(
        "--scenario", "-s", help="Instead of a snapshot: run the policy on this scenario in the twin and explain "
                                 "its first decision at or after --at.")] = None,
    at: Annotated[float, float_option(min=0.0, help="With --scenario: seconds from the scenario's start.")] = 0.0,
    save_snapshot: Annotated[Optional[Path], typer.Option(
        help="With --scenario: also write that decision as a snapshot file (for --snapshot).")] = None,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Policy spec.")] = "default-k8s",
    seed: Annotated[int, typer.Option(min=0, help="Seed for tie-breaking in a --snapshot (a --scenario decision "
                                                  "breaks ties as its run did).")] = 0,
    top: Annotated[int, typer.Option(min=0, help="Show the N best-scored nodes (and the chosen one), then a count "
                                               "of the rest; 0 shows every node. --json always has every node.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show each node's feasibility, per-plugin scores, total and the chosen node for one pod (for a DQN: each
    node's Q-value, advantage and the features that moved it most)."""
    from joulesched.agent.registry import family_of, make_policy
    from joulesched.core.fsio import atomic_write_text, check_output_file
    from joulesched.pipelines.explain import explain as do_explain
    from joulesched.pipelines.explain import load_snapshot, scenario_decision, snapshot_of

    if (snapshot is None) == (scenario is None):
        fail("give --snapshot FILE or --scenario FILE (one of them)")
    if scenario is None and (save_snapshot is not None or at):
        fail("--at and --save-snapshot go with --scenario")
    if family_of(policy) in ("clairvoyant", "planner"):
        fail(f"policy {policy!r} reads the run's future in the twin, which explain does not replay; compare it with "
             "`joulesched benchmark`")
    with errors():
        if save_snapshot is not None:  # never over the scenario or a file it reads (it was replaced by JSON)
            from joulesched.cluster.scenario import load_scenario
            check_output_file(save_snapshot, "--save-snapshot", inputs=load_scenario(scenario).input_files)
        pol = make_policy(policy)
        meta = None
        if scenario is not None:
            d = scenario_decision(scenario, pol, at)
            st, pod, meta = d.state, d.pod, d.meta
            if save_snapshot is not None:
                atomic_write_text(save_snapshot, json.dumps(snapshot_of(st, pod), indent=1) + "\n")
        else:
            st, pod = load_snapshot(snapshot)
        res = do_explain(pol, st, pod, seed, meta=meta, reset=scenario is None)
    if as_json:
        print(json.dumps(res, indent=2))
        return
    plugins = list(dict.fromkeys(k for n in res["nodes"] for k in n.get("scores", {})))  # the scorer's order
    lexicographic = res.get("rule") == "lexicographic"
    when = f" at t={res['now_s']:g} s" if scenario is not None else ""
    want = res["pod"]
    gpus = ""
    if want.get("gpu"):
        share = "whole" if want["gpu_milli"] >= 1000 else f"{want['gpu_milli']} milli"
        models = f", models {'|'.join(want['gpu_models'])}" if want.get("gpu_models") else ""
        gpus = f" gpu={want['gpu']} ({share}{models})"
    t = Table(title=escape(f"{res['policy']}: pod cpu={want['cpu_m']}m memory={want['memory_mib']}Mi{gpus}{when}"),
              title_justify="left")
    t.add_column("node", overflow="fold")  # a long name wraps whole rather than being cut short
    t.add_column("feasible")
    for k, pl in enumerate(plugins, 1):
        w = next((n["weights"][pl] for n in res["nodes"] if "weights" in n), 1)
        if lexicographic:
            t.add_column(f"{pl} (#{k}, {'high' if w > 0 else 'low'} first)", justify="right")
        else:
            t.add_column(f"{pl} ({f'w={w:g}' if w else 'not in total'})", justify="right")
    t.add_column("rank" if lexicographic else "total = Σ w × score", justify="right")
    features = any("features" in n for n in res["nodes"])
    if features:
        t.add_column("top features (value: contribution)")
    shown = res["nodes"]
    if top and len(shown) > top:
        # The best-scored first (total: higher is better under both rules), then feasible nodes a scorer-less
        # policy (random, round-robin) gives no total, then infeasible ones with their reasons; and the chosen one.
        ranked = sorted(shown, key=lambda n: ("total" not in n, -n.get("total", 0.0), not n["feasible"]))
        keep = {id(n) for n in ranked[:top]} | {id(n) for n in shown if n["name"] == res["chosen"]}
        shown = [n for n in shown if id(n) in keep]
    for n in shown:
        mark = "yes" if n["feasible"] else escape("no: " + ", ".join(n["reasons"]))
        cells = [f"{n['scores'][pl]:.4g}" if isinstance(n["scores"][pl], float) else str(n["scores"][pl])
                 for pl in plugins] if "scores" in n else [""] * len(plugins)
        total = n.get("total", "")
        if lexicographic and total != "":
            total = -total  # rank: 0 for the best
        name = f"[bold green]{escape(n['name'])} ←[/]" if n["name"] == res["chosen"] else escape(n["name"])
        row = [name, mark, *cells, f"{total:.4g}" if isinstance(total, float) else str(total)]
        if features:
            row.append(", ".join(f"{f['name']}={f['value']:.3g}: {f['contribution']:+.3g}"
                                 for f in n.get("features", [])))
        t.add_row(*row)
    out.print(t)
    if len(shown) < len(res["nodes"]):
        infeasible = sum(not n["feasible"] for n in res["nodes"])
        out.print(f"{len(res['nodes']) - len(shown)} more nodes not shown ({infeasible} of all {len(res['nodes'])} "
                  "infeasible); --top 0 shows every node, --json has them all", soft_wrap=True)
    if lexicographic:
        out.print("rank: nodes compared column by column, left to right (0 = best). " + res.get("note", ""),
                  soft_wrap=True)
    out.print(escape(f"chosen: {res['chosen']}" + (f" ({res['message']})" if "message" in res else "")))
    if save_snapshot is not None:
        out.print(escape(f"snapshot: {save_snapshot}"))


@app.command()
def policies(
    long: Annotated[bool, typer.Option("--long", "-l", help="Also each policy's family, description and options "
                                       "with their defaults.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the same as JSON.")] = False,
) -> None:
    """List the policy names --policy accepts (NAME, NAME:key=value,..., dqn=MODEL).

    With --long: which are in the default set (what benchmark, sweep, test and the pipelines run without
    --policy; where a scenario has GPUs, the GPU-aware ones too) and which are candidates for "the best
    heuristic" that ×best heur divides by."""
    from joulesched.agent.policy import parse_spec
    from joulesched.agent.registry import BEST_HEURISTIC_CANDIDATES, DEFAULT_POLICIES, default_policies, entries

    with_gpus = default_policies(gpus=True)

    table = entries()
    if not (long or as_json):
        for name in sorted(table):
            print(name)
        return
    with errors():
        rows = [{"name": e.name, "family": e.family, "summary": e.summary, "description": e.description(),
                 "options": e.options(), "takes_model_file": e.takes_path,
                 "in_default_set": e.name in DEFAULT_POLICIES,
                 "in_default_set_with_gpus": e.name in with_gpus,
                 "best_heuristic_candidate": e.name in BEST_HEURISTIC_CANDIDATES,
                 # Option variants of this policy that are themselves in the sets (awake-first:fit=efficient).
                 "variants": [{"spec": v, "in_default_set": v in DEFAULT_POLICIES,
                               "in_default_set_with_gpus": v in with_gpus,
                               "best_heuristic_candidate": v in BEST_HEURISTIC_CANDIDATES}
                              for v in dict.fromkeys((*DEFAULT_POLICIES, *BEST_HEURISTIC_CANDIDATES))
                              if v != e.name and parse_spec(v)[0] == e.name]}
                for e in table.values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return

    def sets(r: dict) -> str:
        gpu_only = r["in_default_set_with_gpus"] and not r["in_default_set"]
        return ", ".join(k for k, on in (("default", r["in_default_set"]), ("default with GPUs", gpu_only),
                                         ("best heur", r["best_heuristic_candidate"])) if on) or "-"

    t = Table(show_lines=True, caption="in: default = run when no --policy is given (default with GPUs: where a "
                                       "scenario has GPUs); best heur = a candidate for the best heuristic (×best "
                                       "heur)", caption_justify="left")
    t.add_column("policy", overflow="fold", ratio=2)
    t.add_column("family", overflow="fold", ratio=1)
    t.add_column("in", overflow="fold", ratio=2)
    t.add_column("description", overflow="fold", ratio=5)
    t.add_column("options (defaults)", overflow="fold", ratio=2)
    for r in rows:
        opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        if r["takes_model_file"]:
            opts = f"{r['name']}=MODEL; " + opts
        in_sets = sets(r) + "".join(f"\n{v['spec']}: {sets(v)}" for v in r["variants"])
        t.add_row(r["name"], r["family"], in_sets, r["description"], opts)
    out.print(t)


@app.command()
def validate(
    scenario: Annotated[list[Path], typer.Argument(help="Scenario files to check.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
) -> None:
    """Check scenario files (and their traces) without running anything: every error at once, each file's (exit 2
    if any file has one), and warnings about pods no node can ever hold and about clusters on which every policy
    leaves pods waiting long. With --json, a file with an error is ``{"file", "error"}``."""
    from joulesched.core.errors import JouleschedError
    from joulesched.pipelines.validate import check_scenario

    found, code = [], 0
    for p in scenario:
        try:
            found.append(check_scenario(p))
        except JouleschedError as e:  # the next file is checked too: every error at once
            found.append({"file": str(p), "error": str(e)})
            code = max(code, e.exit_code)
    if as_json:
        print(json.dumps(found, indent=2))
    else:
        for f in found:
            if "error" in f:
                err.print(f"[red]error:[/red] {escape(f['error'])}", soft_wrap=True)
                continue
            dropped = f"; {f['trace_rows_dropped']} trace rows dropped" if f["trace_rows_dropped"] else ""
            out.print(f"{escape(f['file'])}: ok ({f['nodes']} nodes, {f['pods']} pods{dropped})", soft_wrap=True)
            for w in f["warnings"]:
                err.print(f"[yellow]warning:[/yellow] {escape(f['file'])}: {escape(w)}", soft_wrap=True)
    if code:
        raise typer.Exit(code)


trace_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
app.add_typer(trace_app, name="trace")


@trace_app.callback(invoke_without_command=True)
def trace(
    ctx: typer.Context,
    scenario: Annotated[Optional[Path], typer.Option("--scenario", "-s",
                                                     help="Scenario whose workload to export.")] = None,
    out_file: Annotated[Optional[Path], typer.Option("--out", "-o", help="Trace CSV to write; - for stdout.")] = None,
    seed: Annotated[Optional[int], typer.Option(min=0, help="Workload seed (default: the scenario's).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print a summary (pods written, the file, their span) as JSON on stdout; needs an --out "
                       "file.")] = False,
) -> None:
    """Export a scenario's workload (synthetic or trace) as a trace CSV: trace -s SCENARIO -o OUT.

    `trace import` converts a public cluster trace (Alibaba, Google, Azure) into one."""
    import sys

    if ctx.invoked_subcommand is not None:
        given = [o for o, v in (("--scenario", scenario), ("--out", out_file), ("--seed", seed),
                                ("--json", as_json or None)) if v is not None]
        if given:
            ctx.fail(f"{', '.join(given)}: an option of the export (trace -s ... -o ...), not of "
                     f"`trace {ctx.invoked_subcommand}`; put the subcommand's options after its name")
        return
    for opt, value in (("'--scenario' / '-s'", scenario), ("'--out' / '-o'", out_file)):
        if value is None:
            ctx.fail(f"Missing option {opt}.")  # what click says for a required option

    from joulesched.cluster.scenario import load_scenario
    from joulesched.cluster.workload import build_workload, write_trace
    from joulesched.core.fsio import check_output_file

    to_stdout = str(out_file) == "-"
    if to_stdout and as_json:
        fail("--json needs an --out file: with -o - the trace CSV itself is stdout")
    with errors():
        sc = load_scenario(scenario)
        if not to_stdout:  # the scenario's own trace among the inputs: a mix written over it grew at every run
            check_output_file(out_file, "--out", inputs=[scenario, *sc.input_files])
        wl = build_workload(sc, seed, pod_model=True)
        write_trace(wl, sys.stdout if to_stdout else out_file)
    if as_json:
        print(json.dumps({"pods_file": str(out_file), "scenario": str(scenario), "seed": sc.seed if seed is None
                          else seed, "pods": len(wl), "services": int(wl.is_service.sum()),
                          "span": _workload_span(wl)}, indent=2))
    elif not to_stdout:
        out.print(f"{out_file}: {len(wl)} pods")


def _workload_span(wl) -> dict | None:
    """When the exported pods are submitted and end, in the twin's seconds, with the keys `trace import` uses;
    ``last_end_s`` is None when no pod ends (services only), and the span None for a workload without pods."""
    import numpy as np

    if not len(wl):
        return None
    ends = wl.submit_s + wl.duration_s
    ends = ends[np.isfinite(ends)]
    return {"first_submit_s": float(wl.submit_s.min()), "last_submit_s": float(wl.submit_s.max()),
            "last_end_s": float(ends.max()) if len(ends) else None}


def _trace_formats() -> type[Enum]:
    from joulesched.cluster.traces import FORMATS

    return Enum("TraceFormat", {f: f for f in FORMATS}, type=str)


TraceFormat = _trace_formats()


@trace_app.command("import")
def trace_import(
    files: Annotated[list[Path], typer.Argument(help="The trace's files, named after their tables (.gz is read as "
                                                     "it streams).")],
    fmt: Annotated[TraceFormat, typer.Option(
        "--format", "-f", metavar="FORMAT", help=f"The trace's format: {', '.join(t.value for t in TraceFormat)} "
                                                 "(docs/twin.md has each schema and its unit conversions).")],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Pods CSV to write (the twin's trace format).")],
    machines: Annotated[Optional[Path], typer.Option(
        "--machines", "-m", help="Also write the machine table as scenario node groups: a YAML file a scenario "
                                 "includes with nodes: [{include: FILE}].")] = None,
    window: Annotated[Optional[str], typer.Option(
        help="START:END trace seconds to keep (START becomes the twin's 0; END may be empty). Default: all.")] = None,
    usage_step: Annotated[float, float_option(min=1.0, help="Seconds per step of a usage series.")] = 300.0,
    cpu_unit_m: Annotated[Optional[float], float_option(
        min=1.0, help="Millicores a normalised CPU of 1.0 stands for (default: the format's, in docs/twin.md).")] \
        = None,
    memory_unit_mib: Annotated[Optional[float], float_option(
        min=1.0, help="MiB a normalised memory of 1.0 (Alibaba 2018: of 100) stands for (default: the format's).")]
        = None,
    usage_fraction: Annotated[float, float_option(
        min=0.0, max=4.0, help="Demand of a pod whose trace records no usage, as a fraction of its request.")] = 0.5,
    power_profile: Annotated[str, typer.Option(help="SPECpower profile of the node groups (the traces carry no "
                                                    "power data).")] = "ibm-x3550-m3-x5675",
    max_pods: Annotated[int, typer.Option(min=1, help="max_pods of the node groups.")] = 110,
    machine_id: Annotated[Optional[str], typer.Option(
        help="azure-packing-2020: the machine type whose fractions size the VMs (default: the one hosting the "
             "most VM types).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Convert a public cluster trace into the twin's pods CSV (and its machines into node groups).

    Streams the files (memory bounded by what is kept, not by the input) with a progress bar.
    A malformed, truncated or wrong-format file exits 2 naming the file, line and column; nothing is written."""
    from joulesched.cluster.traces import ImportOptions, import_trace, input_size, write_outputs
    from joulesched.core.errors import UsageError
    from joulesched.core.fsio import check_output_file
    from joulesched.power.curves import SPECPOWER

    fmt_name = fmt.value
    with errors():
        win = _parse_window(window)
        if power_profile not in SPECPOWER:
            raise UsageError(f"--power-profile {power_profile!r}: unknown; known: {', '.join(sorted(SPECPOWER))}")
        check_output_file(out_file, "--out", inputs=files)
        if machines is not None:
            check_output_file(machines, "--machines", inputs=files)
            if machines.resolve() == out_file.resolve():
                raise UsageError("--machines and --out name the same file")
        opts = ImportOptions(window=win, usage_step_s=usage_step, cpu_unit_m=cpu_unit_m,
                             memory_unit_mib=memory_unit_mib, usage_fraction=usage_fraction,
                             power_profile=power_profile, max_pods_per_node=max_pods, machine_id=machine_id)
        with progress_bar(not as_json) as prog:
            task = prog.add_task(f"import {fmt_name}", total=input_size(fmt_name, files) or None,
                                 item=", ".join(p.name for p in files)[:60])
            res = import_trace(fmt_name, files, opts, progress=lambda n: prog.update(task, advance=n))
        write_outputs(res, out_file, machines, f"{fmt_name}: {' '.join(p.name for p in files)}")
    summary = {**res.summary, "pods_file": str(out_file), "nodes_file": None if machines is None else str(machines),
               "node_groups": res.node_groups}
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
        return
    t = Table(title=f"{out_file}: {len(res.workload)} pods from {fmt_name}" + (f" (window {window})" if window else ""),
              title_justify="left")
    t.add_column("what", no_wrap=True)
    t.add_column("value", justify="right")
    for k, v in res.summary.items():
        if k not in ("format", "span"):
            t.add_row(escape(str(k)), escape(str(v)))
    span = res.summary.get("span")
    if span:
        t.add_row("submissions in the file (trace days)",
                  f"{_day(span['first_submit_s'])} – {_day(span['last_submit_s'])}")
        if span["last_end_s"] is not None:
            t.add_row("last end in the file (trace day)", _day(span["last_end_s"]))
    out.print(t)
    if machines is not None:
        out.print(f"{machines}: {len(res.node_groups)} node group(s), "
                  f"{sum(g['count'] for g in res.node_groups)} nodes", soft_wrap=True)
    if span:
        out.print(_window_hint(span, win), soft_wrap=True)


@trace_app.command("fit")
def trace_fit(
    pods_csv: Annotated[Path, typer.Argument(help="A pods CSV in the twin's trace format (what trace import writes).")],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Fit file to write (YAML), for a scenario's "
                                                               "workload.fitted.")],
    until: Annotated[Optional[float], float_option(
        min=0.0, help="Fit only the pods created before this many seconds of the CSV, their lifetimes censored "
                      "there (keep evaluation days out of a training fit).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit's summary as JSON on stdout.")] = False,
) -> None:
    """Fit applications to a pods CSV: each pod template's share, requests, usage and lifetime quantiles, and the
    arrival rate with its hour-of-day profile (cluster/fitted.py). A scenario then draws fresh workloads from the
    fit with ``workload: {fitted: {fit: FILE}}``, one per seed. A malformed CSV exits 2; nothing is written."""
    from joulesched.cluster.fitted import fit_apps, write_fit
    from joulesched.cluster.workload import load_trace
    from joulesched.core.fsio import check_output_file

    with errors():
        check_output_file(out_file, "--out", inputs=[pods_csv])
        wl = load_trace(pods_csv)
        fit = fit_apps(wl, until_s=until, source=f"{pods_csv.name}"
                       + (f" (created before {until:g} s)" if until is not None else ""))
        write_fit(fit, out_file)
    apps = fit["apps"]
    # What fit_apps leaves out, counted: the pods alive when the import window opened, and those after --until.
    left_out = {"submitted at time 0": int((wl.submit_s <= 0.0).sum()),
                "submitted at or after --until": 0 if until is None else int((wl.submit_s >= until).sum())}
    summary = {"fit_file": str(out_file), "pods": fit["pods"], "pods_in_csv": len(wl), "pods_left_out": left_out,
               "apps": len(apps), "apps_with_own_lifetimes": sum(a["own_lifetimes"] for a in apps),
               "rate_per_s": fit["rate_per_s"]}
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    skipped = "; ".join(f"{n} {what}" for what, n in left_out.items() if n)
    out.print(f"{out_file}: {len(apps)} applications from {fit['pods']} of the CSV's {len(wl)} pods "
              f"({summary['apps_with_own_lifetimes']} with their own lifetimes), {fit['rate_per_s'] * 3600:.1f} "
              f"pods/hour" + (f"; left out: {skipped}" if skipped else ""), soft_wrap=True)


def _day(seconds: float) -> str:
    return f"{seconds / 86400:.1f}"


def _window_hint(span: dict, window: tuple[float, float] | None = None) -> str:
    """Where the trace's activity is, and the window and duration_s that simulate it (cluster/traces PodSink.span)."""
    start, end = (float(x) for x in span["suggested_window"].split(":"))
    where = (f"activity: trace days {_day(start)}–{_day(end)} ({span['submitted_before_suggested_window']} of "
             f"{span['pods_read']} pods submitted before)")
    duration = f"duration_s: {span['suggested_duration_s']:.0f}"
    if window is not None and window[0] <= start and window[1] >= end:  # the window's start is the twin's 0
        return f"{where}; this window holds it: in the scenario duration_s: {end - window[0]:.0f}"
    return f"{where}; to simulate it: trace import --window {span['suggested_window']} ... and in the scenario {duration}"


def _parse_window(text: str | None) -> tuple[float, float] | None:
    import math

    from joulesched.core.errors import UsageError

    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        lo = float(a) if a.strip() else 0.0
        hi = float(b) if b.strip() else math.inf
    except ValueError:
        raise UsageError(f"--window {text!r}: expected START:END in trace seconds, e.g. 0:86400") from None
    if not sep or not math.isfinite(lo) or hi <= lo or math.isnan(hi):
        raise UsageError(f"--window {text!r}: expected START:END with END > START, e.g. 0:86400")
    if lo < 0:  # a pod created before 0 is alive when a window from 0 opens, so nothing needs a negative start
        raise UsageError(f"--window {text!r}: START must be at least 0 (trace seconds; the import's summary shows "
                         "the span of the trace and a window for it)")
    return lo, hi


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
    from joulesched.core.names import check_ray_address
    from joulesched.pipelines.sweep import run_sweep

    if ray_address is not None and executor != Executor.ray:
        fail("--ray-address needs --executor ray")
    with errors():
        check_ray_address(ray_address)
    command = command_line()
    with errors(), interrupted(out_dir, NO_RESUME.format(out_dir=out_dir)), progress_bar(not as_json) as prog:
        task = prog.add_task("sweep", total=None, item="")
        doc = run_sweep(grid, out_dir, executor=executor.value, jobs=jobs, ray_address=ray_address, command=command,
                        on_start=lambda n: prog.update(task, total=n),
                        on_progress=lambda item: prog.update(task, advance=1, item=item))
    # A report that fails or is interrupted says so in one line, as benchmark's.
    with errors(), interrupted(out_dir, REPORT_ONLY.format(out_dir=out_dir)):
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
    """The main job on the embedded twin: the DQN and the default policy set on the standard suite, then the
    report."""
    from joulesched.pipelines.progress import StageDisplay
    from joulesched.pipelines.sim_pipeline import run_sim

    if model is not None and model.is_dir():
        fail(f"--model {model} is a directory; give a model file")
    if model is not None and not model.is_file():
        fail(f"--model {model} does not exist; train it with `joulesched train --model {model}`, or drop --model "
             "to use the shipped one")
    model = model or SHIPPED_MODEL
    minutes = None if model.exists() else 3.0
    with errors(), interrupted(out_dir), StageDisplay() as show:
        doc = run_sim(standard_suite(), out_dir, model=model, minutes=minutes, seeds=seeds, jobs=jobs,
                      command=command_line(), **show.callbacks())
    print_summary(doc, False, out_dir)
