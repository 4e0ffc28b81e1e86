"""Side-by-side benchmark: every policy on the same workload, per (scenario, seed), against the lower bound.

Run seed ``s`` of a scenario uses workload seed ``scenario.seed + s`` and the same number seeds each policy's
tie-breaking generator, so results are deterministic for given seeds. All inputs (scenarios, traces, policy
specs, model files) are validated before anything is written.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pickle
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from joulesched.agent.lower_bound import lower_bound
from joulesched.agent.optimum import check_solver, check_time_limit, optimum_entry, window_with_schedule
from joulesched.agent.registry import family_of, heuristics_among, make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import Scenario, load_scenario
from joulesched.cluster.twin import RunResult, Twin
from joulesched.cluster.workload import Workload, build_workload
from joulesched.core.errors import UsageError
from joulesched.core.fsio import atomic_path, check_output_dir
from joulesched.core.names import check_ray_address
from joulesched.pipelines.pool import imap as pool_imap
from joulesched.pipelines.pool import process_pool
from joulesched.pipelines.results import (SCHEMA_VERSION, OptimumRun, Results, dump, from_dict, load_results,  # noqa: F401
                                          weakest_optimum_label)
from joulesched.pipelines.stats import ratios, t_halfwidth


class BenchmarkInputError(UsageError):
    """Inconsistent benchmark arguments or an unreadable results file."""
METRICS = ("energy_joules", "slo_violation_rate", "unschedulable_pods", "mean_pending_s", "placements",
           "decision_us_p99", "mean_throttling", "end_s", "completed_pods", "placed_pods", "unplaced_fits_no_node",
           "unplaced_pending_at_end", "unplaced_stopped_before_running", "window_end_s")
#: Why a pod was never placed (their sum is unschedulable_pods; placed_pods + unschedulable_pods = pods).
UNPLACED_REASONS = {"unplaced_fits_no_node": "fit no node", "unplaced_pending_at_end": "pending at the end",
                    "unplaced_stopped_before_running": "stopped before they ran"}


@dataclass(frozen=True)
class Task:
    scenario: Scenario
    scenario_index: int
    seed_offset: int
    policy: str
    record: bool
    placements: bool = False  # return one row per pod (benchmark --placements)


#: What every task of a benchmark shares, built once in the parent: the workload of each (scenario index, seed
#: offset), read-only, and each policy built once from its spec (a task runs a copy). A worker gets them once
#: (:func:`_share`, the pool's initializer; Ray: the object store), never per task.
_WORKLOADS: dict[tuple[int, int], Workload] = {}
_POLICIES: dict[str, object] = {}


def _picklable(policies: dict[str, object]) -> dict[str, object]:
    """The policies a worker process can be sent (a plugin's may not pickle: its tasks build it from the spec)."""
    out = {}
    for k, p in policies.items():
        try:
            pickle.dumps(p)
        except Exception:  # noqa: BLE001 - any reason a policy does not pickle means: rebuild it there
            continue
        out[k] = p
    return out


def _share(workloads: dict[tuple[int, int], Workload], policies: dict[str, object]) -> None:
    _WORKLOADS.clear()
    _WORKLOADS.update({k: _read_only(wl) for k, wl in workloads.items()})
    _POLICIES.clear()
    _POLICIES.update(policies)


def _read_only(wl: Workload) -> Workload:
    """``wl`` with its arrays read-only: one workload serves every policy, so none may change it."""
    for v in vars(wl).values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return wl


def _run_task(task: Task, wl: Workload | None = None, policy: object | None = None) -> tuple[Task, RunResult, list]:
    """Worker: one policy on one (scenario, seed). Returns its result (timeline and idle tail included) and, if
    asked for, its placement rows. The workload and the policy come from what the benchmark shares (built here
    only for a task run on its own)."""
    sc = task.scenario
    seed = sc.seed + task.seed_offset
    if wl is None:
        wl = _WORKLOADS.get((task.scenario_index, task.seed_offset))
        if wl is None:
            wl = build_workload(sc, seed)
    proto = policy if policy is not None else _POLICIES.get(task.policy)
    pol = copy.deepcopy(proto) if proto is not None else make_policy(task.policy)
    twin = Twin(sc, wl, record=task.record)
    res = run_policy(twin, pol, seed)
    rows = []
    if task.placements:
        from joulesched.pipelines.placements import placement_rows

        rows = placement_rows(twin, sc.name, seed, task.policy)
    return task, res, rows


def _metrics(res: RunResult, names: Sequence[str]) -> tuple[dict, dict | None]:
    """A run's row of results.json (energies over the window it was metered to) and, if recorded, its
    timeline's arrays."""
    metrics = {k: getattr(res, k) for k in METRICS}
    metrics = {k: (float(v) if isinstance(v, (float, np.floating)) else int(v)) for k, v in metrics.items()}
    if res.node_gpu_joules is not None:  # a GPU cluster: the energy split, per run and per node, and FGD's measure
        metrics |= {"gpu_joules": float(res.gpu_energy_joules), "cpu_joules": float(res.cpu_energy_joules),
                    "node_joules": dict(zip(names, map(float, res.node_energy_joules))),
                    "node_gpu_joules": dict(zip(names, map(float, res.node_gpu_joules))),
                    "gpu_blocked": int(res.gpu_blocked),
                    "gpu_unallocated_when_blocked": res.gpu_unallocated_when_blocked}
    tl = None
    if res.timeline is not None:
        tl = {"bin_s": res.timeline.bin_s, "watts": res.timeline.watts().astype(np.float32),
              "util": np.vstack(res.timeline.util).astype(np.float16) if res.timeline.util else np.zeros((0, 0)),
              "awake": np.asarray(res.timeline.awake, dtype=np.int32)}
    return metrics, tl


def _bound(sc: Scenario, seed_offset: int, wl: Workload) -> dict:
    seed = sc.seed + seed_offset
    twin = Twin(sc, wl)
    lb = lower_bound(twin.state, twin.fastest_workload(), sc.duration_s, twin.placeable)
    return {"name": sc.name, "seed": seed, "nodes": sc.node_count, "pods": len(wl), "trace_rows_dropped": wl.dropped,
            "duration_s": sc.duration_s,
            "lower_bound_joules": lb.joules, "lower_bound_end_s": lb.end_s,
            "node_names": twin.state.names, "node_groups": [sc.nodes[g].name_prefix for g in twin.state.group],
            "group_curves": {g.name_prefix: list(g.curve) for g in sc.nodes}}


def any_gpus(scenarios: Sequence[Path | Scenario]) -> bool:
    """Some scenario has GPUs: the default policy set then takes the GPU-aware heuristics too
    (:func:`~joulesched.agent.registry.default_policies`). Loading a scenario reads no trace."""
    return any((s if isinstance(s, Scenario) else load_scenario(s)).has_gpus for s in scenarios)


def validate_inputs(scenarios: Sequence[Path | Scenario], policies: Sequence[str]) -> list[Scenario]:
    """Load every scenario (and its trace) and build every policy once, so errors surface before any work."""
    return _validated(scenarios, policies)[0]


def _validated(scenarios: Sequence[Path | Scenario],
               policies: Sequence[str]) -> tuple[list[Scenario], list[Workload], dict[str, object]]:
    """:func:`validate_inputs`, keeping what it built: each scenario's first workload and each policy."""
    loaded = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
    first = [build_workload(sc) for sc in loaded]  # a bad trace fails here, not in a worker
    names = [s.name for s in loaded]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise BenchmarkInputError(f"two scenarios share the name {sorted(dup)[0]!r}; names key the results")
    built = {p: make_policy(p) for p in policies}
    twice = [p for i, p in enumerate(policies) if p in policies[:i]]
    if twice:
        raise BenchmarkInputError(f"policy {twice[0]!r} is listed twice")
    return loaded, first, built


def _ray_map(tasks: list[Task], address: str | None):
    """Run the tasks as Ray tasks (on ``address``, or a local Ray instance) and yield results as they finish."""
    try:
        import ray
    except ModuleNotFoundError:
        raise BenchmarkInputError("the ray executor needs Ray: pip install 'joulesched[sweep]' (or ray)") from None
    check_ray_address(address)
    started = not ray.is_initialized()
    if started:
        # Workers import joulesched from this checkout's environment; no dashboard, nothing listens off-host.
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = ray.remote(num_cpus=1)(_run_task)
        # Each workload and policy goes into the object store once; a task gets a read-only view of it.
        wls = {k: ray.put(wl) for k, wl in _WORKLOADS.items()}
        pols = {k: ray.put(p) for k, p in _picklable(_POLICIES).items()}
        pending = [remote.remote(t, wls[(t.scenario_index, t.seed_offset)], pols.get(t.policy)) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()


def run_benchmark(scenarios: Sequence[Path | Scenario], policies: Sequence[str], seeds: int, out: Path, *,
                  jobs: int = 1,
                  on_progress: Callable[[str], None] | None = None, on_start: Callable[[int], None] | None = None,
                  command: str = "", executor: str = "local", ray_address: str | None = None,
                  optimum: bool = False, optimum_time_limit: float = 60.0, placements: bool = False,
                  optimum_solver: str = "highs") -> Results:
    """Run the grid, write ``out/results.json`` and ``out/timelines.npz`` atomically, return the results.

    ``executor`` is ``local`` (``jobs`` processes) or ``ray`` (Ray tasks on ``ray_address`` or a local Ray).
    ``optimum`` adds, per scenario and seed, the LP bound and (on small instances) the MIP's optimum of
    agent/optimum.py, ``optimum_time_limit`` seconds each (``optimum_solver``: highs, cpsat or race), beside the
    fluid lower bound. ``placements`` also
    writes ``out/placements.csv``, one row per pod per scenario, seed and policy (pipelines/placements.py).
    """
    # Bad values are errors with or without --optimum (a typo there is not silently kept for the next run).
    check_solver(optimum_solver, "--optimum-solver")
    optimum_time_limit = check_time_limit(optimum_time_limit, "--optimum-time-limit")
    if seeds < 1:
        raise BenchmarkInputError("--seeds must be at least 1")
    if executor not in ("local", "ray"):
        raise BenchmarkInputError(f"unknown executor {executor!r}; use local or ray")
    out = check_outputs(out)
    loaded, first, built = _validated(scenarios, policies)
    # Each (scenario, seed)'s workload is built once, here, and shared by the bound, the optimum and every policy.
    workloads = {(i, s): first[i] if s == 0 else build_workload(sc, sc.seed + s)
                 for i, sc in enumerate(loaded) for s in range(seeds)}
    _share(workloads, built)
    paths = [str(sc.source) if sc.source else sc.name for sc in loaded]
    tasks = [Task(sc, i, s, pol, record=(s == 0), placements=placements) for i, sc in enumerate(loaded)
             for s in range(seeds) for pol in policies]
    placed_rows: list[tuple] = []
    if on_start:
        on_start(len(tasks) + len(loaded) * seeds * (2 if optimum else 1))
    t0 = time.perf_counter()
    bounds: dict[tuple[int, int], dict] = {}
    replays: dict[tuple[int, int], RunResult] = {}  # the optimum's schedule, replayed in the twin
    runs: dict[tuple[int, int], dict[str, RunResult]] = {}
    timelines: dict[str, np.ndarray] = {}

    def collect(task: Task, res: RunResult, rows: list) -> None:
        placed_rows.extend(rows)
        runs.setdefault((task.scenario_index, task.seed_offset), {})[task.policy] = res
        if on_progress:
            on_progress(f"{_label(task.scenario)} seed {task.seed_offset} {task.policy}")

    for i, sc in enumerate(loaded):
        for s in range(seeds):
            bounds[(i, s)] = _bound(sc, s, workloads[(i, s)])
            if on_progress:
                on_progress(f"{_label(sc)} seed {s} lower bound")
            if optimum:
                bounds[(i, s)]["optimum"] = optimum_entry(sc, s, time_limit=optimum_time_limit, solver=optimum_solver,
                                                          workload=workloads[(i, s)],
                                                          fluid_joules=bounds[(i, s)]["lower_bound_joules"],
                                                          on_replay=functools.partial(replays.__setitem__, (i, s)))
                if on_progress:
                    on_progress(f"{_label(sc)} seed {s} optimum")
    if executor == "ray":
        for task, res, rows in _ray_map(tasks, ray_address):
            collect(task, res, rows)
    elif jobs > 1:
        with process_pool(jobs, _share, (workloads, _picklable(built))) as pool:  # in task order: the same for any --jobs
            for task, res, rows in pool_imap(pool, _run_task, tasks):
                collect(task, res, rows)
    else:
        for task in tasks:
            collect(*_run_task(task))
    _share({}, {})  # what the tasks shared is not kept past the run
    # Every policy of a (scenario, seed) is metered over one window, to the latest end among them (the optimum's
    # schedule included): a run that finishes early pays for the idle cluster while the others finish theirs.
    results: dict[tuple[int, int], dict] = {}
    for (i, s), by_policy in runs.items():
        windowed = window_with_schedule(by_policy, bounds[(i, s)].get("optimum"), replays.get((i, s)))
        results[(i, s)] = {}
        for pol in policies:  # in the run's policy order, whatever order the tasks finished in
            metrics, tl = _metrics(windowed[pol], bounds[(i, s)]["node_names"])
            results[(i, s)][pol] = metrics
            if tl is not None:  # keyed by the scenario's name, its one key (pipelines/results.py)
                key = f"{loaded[i].name}/{pol}"
                timelines[f"{key}/watts"] = tl["watts"]
                timelines[f"{key}/util"] = tl["util"]
                timelines[f"{key}/awake"] = tl["awake"]
                timelines[f"{loaded[i].name}/bin_s"] = np.array([tl["bin_s"]])
    doc = {
        "schema_version": SCHEMA_VERSION,
        "env": "twin",
        "command": command,
        "created_unix": time.time(),
        "wall_s": time.perf_counter() - t0,
        "policies": list(policies),
        "seeds": seeds,
        "scenarios": [],
    }
    for (i, s), b in sorted(bounds.items()):
        entry = {k: v for k, v in b.items() if k not in ("node_names", "node_groups", "group_curves")}
        entry["scenario_file"] = paths[i]
        entry["policies"] = results[(i, s)]
        doc["scenarios"].append(entry)
    doc["summary"] = summarize(doc)
    for sc in loaded:
        doc["summary"][sc.name]["replay"] = sc.workload.replay
    # nodes.json: what the report draws per node, and the power curve each group ran with (a calibrated
    # scenario exists only in memory, so this is the record of what the twin used).
    meta = {sc.name: {"node_names": bounds[(i, 0)]["node_names"], "node_groups": bounds[(i, 0)]["node_groups"],
                      "group_curves": bounds[(i, 0)]["group_curves"], "name": sc.name}
            for i, sc in enumerate(loaded)}
    res = from_dict(doc)
    write_outputs(out, res, timelines, meta, placed_rows if placements else None)
    return res


def _label(sc: Scenario) -> str:
    return sc.source.stem if sc.source else sc.name


def summarize(doc: dict) -> dict:
    """Per scenario and policy: means across seeds, energy ratios against default-k8s and the lower bound."""
    by_name: dict[str, list[dict]] = {}
    for e in doc["scenarios"]:
        by_name.setdefault(e["name"], []).append(e)
    out: dict[str, dict] = {}
    for name, entries in by_name.items():
        rows = {}
        for pol in doc["policies"]:
            vals = [e["policies"][pol] for e in entries]
            energy = [v["energy_joules"] for v in vals]
            vs_lb = ratios(energy, [e["lower_bound_joules"] for e in entries])
            row = {
                "energy_joules": float(np.mean(energy)),
                "energy_vs_lower_bound": None if vs_lb is None else float(np.mean(vs_lb)),
                "slo_violation_rate": float(np.mean([v["slo_violation_rate"] for v in vals])),
                "mean_throttling": float(np.mean([v["mean_throttling"] for v in vals])),
                "mean_pending_s": float(np.mean([v["mean_pending_s"] for v in vals])),
                "unschedulable_pods": float(np.mean([v["unschedulable_pods"] for v in vals])),
                # Older results files (and measured runs) have no breakdown: then it is absent, not zero.
                **{k: float(np.mean([v[k] for v in vals])) for k in ("placed_pods", *UNPLACED_REASONS)
                   if all(k in v for v in vals)},
                # Median across seeds: one seed's p99 can catch a burst of noise from other processes.
                "decision_us_p99": float(np.median([v["decision_us_p99"] for v in vals])),
                # Student-t 95 % half-widths over the seeds (None with one), as the energy ratios have
                **{f"{k}_ci95": t_halfwidth([v[k] for v in vals])
                   for k in ("energy_joules", "slo_violation_rate", "mean_pending_s")},
            }
            if "default-k8s" in doc["policies"] and \
                    (vs_def := ratios(energy, [e["policies"]["default-k8s"]["energy_joules"] for e in entries])):
                row["energy_vs_default"] = float(np.mean(vs_def))
                row["energy_vs_default_ci95"] = t_halfwidth(vs_def)
            for k in ("gpu_joules", "cpu_joules", "gpu_unallocated_when_blocked"):  # GPU clusters only
                got = [v[k] for v in vals if v.get(k) is not None]
                if got:
                    row[k] = float(np.mean(got))
            rows[pol] = row
        heur = heuristics_among(rows)
        out[name] = {"seeds": len(entries), "lower_bound_joules": float(np.mean([e["lower_bound_joules"] for e in entries])),
                     "pods": float(np.mean([e["pods"] for e in entries])), "policies": rows,
                     "warnings": dropped_warnings(entries)}
        if heur:
            # Best heuristic per seed (the one with least energy on that workload), then the ratio averaged.
            best = [min(heur, key=lambda h, e=e: e["policies"][h]["energy_joules"]) for e in entries]
            for pol in doc["policies"]:
                r = ratios([e["policies"][pol]["energy_joules"] for e in entries],
                            [e["policies"][b]["energy_joules"] for e, b in zip(entries, best)])
                if r:
                    rows[pol]["energy_vs_best_heuristic"] = float(np.mean(r))
                    rows[pol]["energy_vs_best_heuristic_ci95"] = t_halfwidth(r)
            # What ×best heur divides by: the heuristic best on each seed, most often first.
            out[name]["best_heuristics"] = sorted(set(best), key=lambda h: (-best.count(h), best.index(h)))
        if all("optimum" in e for e in entries):
            out[name]["optimum"] = _optimum_summary([e["optimum"] for e in entries])
    return out


def dropped_warnings(entries: list[dict]) -> list[str]:
    """What the twin left out of a scenario's workload, in words (the count is ``trace_rows_dropped``)."""
    from joulesched.pipelines.validate import dropped_warning

    return [dropped_warning(e["trace_rows_dropped"], e["pods"], e.get("duration_s"))
            for e in entries[:1] if e.get("trace_rows_dropped")]  # a trace's rows are the same for every seed


def _optimum_summary(opts: list[dict]) -> dict:
    """Means across seeds of the LP bound, the optimum (when every seed has one: its schedule as the twin meters
    it, as the report and headroom take it) and its bound; per seed, its certificate (``optimal`` only when
    proven and replayed to the MIP's energy), else the solver's status."""
    runs = [OptimumRun.model_validate(o) for o in opts]

    def mean(vals):
        return float(np.mean(vals)) if vals and all(v is not None for v in vals) else None

    return {"lp_bound_joules": mean([r.lp_bound_joules for r in runs]),
            "optimum_joules": mean([r.schedule_energy for r in runs]),
            "optimum_bound_joules": mean([r.bound_joules for r in runs]),
            "status": [o.get("certificate") or o["status"] for o in opts]}


def headroom(res: Results) -> dict[str, dict]:
    """The headroom table per scenario (docs/PERFORMANCE.md): energy / default-k8s (per seed, then averaged) of
    the best upstream, best sleep-aware and best heuristic, the learned policy and every policy (``policies``);
    the optimum (``optimal``: proven on every seed, else the best schedule) and the bounds: ``boa_bound``, the
    best bound for the runs that bind each pod on arrival (the bind-on-arrival LP's, the MIP's own where no run
    can overload a node: ``OptimumRun.bounds``, or one of the every-run bounds), ``every_run_bound`` (LP or
    fluid: queued and throttled runs too), ``bound_assumes`` (``bind-on-arrival`` where the first is higher on
    some seed), ``optimum_gap`` (per seed, (optimum − bound) /
    optimum). ``share_of_gap``: per policy, the share of the best heuristic's distance to the target (the
    optimum, or where it is not solved the best bound: ``target_kind``) that it closes; ``learned_share_of_gap``
    the learned policy's."""
    from joulesched.agent.registry import UPSTREAM_FAMILIES

    out: dict[str, dict] = {}
    pols = res.policies
    if "default-k8s" not in pols:
        return out
    up = [p for p in pols if family_of(p) in UPSTREAM_FAMILIES]
    sa = [p for p in pols if family_of(p) == "sleep-aware"]
    heur = heuristics_among(pols)
    learned = [p for p in pols if family_of(p) == "learned"]
    for name in res.summary:
        entries = res.runs(name)
        base = [e.policies["default-k8s"].energy_joules for e in entries]
        if not all(b > 0 for b in base):  # default-k8s drew nothing (curves that start at 0 W): no ratio to it
            continue

        def ratio(vals, base=base):
            return float(np.mean([v / b for v, b in zip(vals, base)])) if all(v is not None for v in vals) else None

        def best(names, entries=entries, base=base):
            if not names:
                return None, None
            per = [min(e.policies[p].energy_joules for p in names) / b for e, b in zip(entries, base)]
            top = min(names, key=lambda p: np.mean([e.policies[p].energy_joules / b for e, b in zip(entries, base)]))
            return float(np.mean(per)), top

        row: dict = {"seeds": len(entries)}
        row["best_upstream"], row["best_upstream_policy"] = best(up)
        row["best_sleep_aware"], row["best_sleep_aware_policy"] = best(sa)
        row["best_heuristic"], row["best_heuristic_policy"] = best(heur)
        row["learned"], row["learned_policy"] = best(learned)
        row["policies"] = {p: ratio([e.policies[p].energy_joules for e in entries]) for p in pols}
        # A measured run (the kube path) has no lower bound: lower_bound_joules is null there.
        row["fluid_bound"] = ratio([e.lower_bound_joules for e in entries])
        opt = [e.optimum for e in entries]
        if all(o is not None for o in opt):
            row["lp_bound"] = ratio([o.lp_bound_joules for o in opt])
            # The optimum: the MIP's schedule as the twin replays it, proven only where the row's certificate is.
            sched = [o.schedule_energy for o in opt]
            solved = all(v is not None for v in sched)
            row["optimum"] = ratio(sched) if solved else None
            # What the schedules are over the window (ScenarioRun.optimum_label): optimal only if proven so on
            # every seed, with no idle tail the MIP did not minimise, and a bound every run obeys meeting it.
            kind = weakest_optimum_label({e.optimum_label() for e in entries})
            row["optimal"] = kind == "optimum"
            row["optimum_kind"] = "best schedule" if kind == "optimum*" else kind
            # Per seed: the best bound for every run (LP, fluid), and for the runs that bind on arrival (those, the
            # bind-on-arrival LP's, and the MIP's own where no run can overload a node: OptimumRun.bounds).
            every = [max((v for v in (o.lp_bound_joules, e.lower_bound_joules) if v is not None), default=0.0)
                     for o, e in zip(opt, entries)]
            boa = [max([v for v in o.bounds[1:] if v is not None] + [ev]) for o, ev in zip(opt, every)]
            row["every_run_bound"], row["boa_bound"] = ratio(every), ratio(boa)
            row["best_bound"] = row["boa_bound"]
            row["bound_assumes"] = "bind-on-arrival" if any(b > ev for b, ev in zip(boa, every)) else "every-run"
            # The MIP's gap, over its schedule's own end: the bounds were proven for that window, and the idle tail
            # the schedule was charged to meet its policies' window (window_tail_joules) is no part of it. A row
            # certify() gave no gap (a bound above the schedule: one of them is wrong) has none here either.
            conflict = solved and any(o.certificate is not None and o.best_gap is None
                                      and o.best_bound_joules is not None for o in opt)
            own = [v - (o.window_tail_joules or 0.0) for v, o in zip(sched, opt)] if solved else []
            # No relative gap to a schedule of no energy of its own (0 J, or a tail as large as the schedule: a
            # schema-valid file, which must render): none rather than a ZeroDivisionError or a sign flipped.
            row["optimum_gap"] = float(np.mean([(v - b) / v for v, b in zip(own, boa)])) \
                if solved and not conflict and all(v > 0 for v in own) else None
            row["gap_conflict"] = conflict
            if solved:
                row["target"], row["target_kind"] = row["optimum"], row["optimum_kind"]
            else:
                row["target"], row["target_kind"] = row["best_bound"], f"bound, {row['bound_assumes']}"
            gap = row["best_heuristic"] - row["target"] if row["best_heuristic"] is not None else 0.0
            # Negative: the policy uses more than the best heuristic; above 1 only a policy below the best schedule.
            row["share_of_gap"] = {p: (row["best_heuristic"] - v) / gap if gap > 1e-12 else None
                                   for p, v in row["policies"].items()}
            if row["learned"] is not None:
                row["learned_share_of_gap"] = row["share_of_gap"][row["learned_policy"]]
        out[name] = row
    return out


#: The files a benchmark (and its report) write in the output folder: none may be a directory there. The one
#: folder they write, plots/, must be one: :func:`check_outputs` checks it (report_files.py ``check_report_outputs``).
OUTPUT_FILES = ("results.json", "nodes.json", "timelines.npz", "placements.csv", "report.html")


def check_outputs(out: Path, option: str = "--out") -> Path:
    """Fail now, before the grid runs, if the benchmark or its report could not write ``out``'s files: the folder
    itself, a directory (or device) in place of one of :data:`OUTPUT_FILES`, and a ``plots`` that is not a folder
    or holds a folder in place of a figure (refused by the report only after the whole run otherwise)."""
    from joulesched.pipelines.report_files import check_report_outputs

    out = check_output_dir(out, option, OUTPUT_FILES)
    check_report_outputs(out, lambda why: BenchmarkInputError(f"{option}: {why}"))
    return out


def write_outputs(out: Path, res: Results, timelines: dict[str, np.ndarray], meta: dict,
                  placements: Sequence[tuple] | None = None) -> None:
    """Write timelines.npz, nodes.json, placements.csv (``placements``' rows, where given) and, last,
    results.json, each atomically (core/fsio.py): results.json is the set's commit record, so a reader that
    finds a new one finds the files it describes beside it. All are written in full before any is renamed into
    place (a full disk leaves the earlier set whole), and the earlier results.json goes just before the renames:
    one that fails then leaves no record, never the old one beside new timelines (a review: `report` drew such a
    folder without a word).

    What described the earlier results goes with them (a review: a re-run with ``--no-report`` or without
    ``--placements`` left the old page, its figures or placements.csv beside the new results.json): report.html
    and the figures its render drew (report_files.py ``report_plots``; the training curve stays: it is the model's),
    which a report of these results writes anew, and placements.csv where no ``placements`` are given."""
    from joulesched.pipelines.placements import write_placements
    from joulesched.pipelines.report_files import report_plots

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # Renamed in reverse order of entry as the blocks close: placements, timelines, nodes, then results.
    with atomic_path(out / "results.json") as res_tmp, atomic_path(out / "nodes.json") as nodes_tmp, \
            atomic_path(out / "timelines.npz") as tl_tmp, \
            (atomic_path(out / "placements.csv") if placements is not None else nullcontext()) as pl_tmp:
        with open(tl_tmp, "wb") as fh:
            np.savez_compressed(fh, **timelines)
        nodes_tmp.write_bytes((json.dumps(meta) + "\n").encode("utf-8"))
        if pl_tmp is not None:  # its own atomic write onto the staged name: one CSV writer (placements.py)
            write_placements(pl_tmp, placements)
        res_tmp.write_bytes(dump(res).encode("utf-8"))
        # Everything is written: what described the earlier results goes, the page first, the record last. A
        # file written through a link (core/fsio.py) goes as its target, the link staying for the next write; a
        # figure is renamed over its link (report.py), so the link itself goes. A folder in a file's place is
        # left to be named by the write that needs it (check_outputs refuses it before a benchmark runs).
        # One that cannot be removed (a read-only plots/) costs a warning, not the run's results: only the old
        # results.json must go for the new set to be committed.
        linked = ["report.html", *(["placements.csv"] if placements is None else [])]
        for path in [*(Path(os.path.realpath(out / n)) for n in linked), *report_plots(out)]:
            if path.is_symlink() or not path.is_dir():
                try:
                    path.unlink(missing_ok=True)
                except OSError as e:
                    warnings.warn(f"{path} describes the earlier results and could not be removed "
                                  f"({e.strerror or e}): delete it by hand", stacklevel=2)
        old = Path(os.path.realpath(out / "results.json"))
        if old.is_symlink() or not old.is_dir():
            old.unlink(missing_ok=True)
