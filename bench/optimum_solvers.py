"""The optimum's MIP solved by HiGHS, CP-SAT and both racing, on the small suite (#26 item 1).

Run: nice .venv/bin/python bench/optimum_solvers.py [--seeds 3] [--time-limit 60] [--threads 2]
     [--solver highs --solver cpsat ...] [--only NAME] [--json OUT]

Per scenario of scenarios/small/ and seed, the solvers one after the other on the same instance (so a run cut
short still compares them on the same rows): ``agent.optimum.solve(..., solver=...)`` with its status, the
schedule's energy as the model prices it and as the twin replays it, the best bound and who proved it, the gap,
CP-SAT's own (valid) bound and its scaling error, the wall time and the model's size. "met" is the issue's
goal, proven within the time limit, by the certificate `joulesched optimum` gives (agent.optimum.certify):
status optimal (the solver proved it, or its gap is within solve()'s 1e-6), gap <= 1e-4, and the twin replays
the schedule at the model's energy. Timings depend on the machine's load (the load average is
recorded per row).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from joulesched.agent.optimum import SOLVERS, ReplayError, certify, instance, replay, solve
from joulesched.cluster.scenario import load_scenario
from joulesched.core.fsio import atomic_write_text
from small_suite import parser, paths as suite_paths


def run(path: Path, seed: int, solver: str, time_limit: float, threads: int) -> dict:
    sc = load_scenario(path)
    inst = instance(sc, seed)
    r = solve(inst, time_limit=time_limit, threads=threads, solver=solver)
    status, twin = r.status, None
    try:
        twin = replay(sc, seed, r.assignment).energy_joules if r.assignment else None
    except ReplayError:  # the twin does not follow the schedule: as optimum_entry, its figures are no evidence
        status = "replay_failed"
    # Proven: optimum_entry's certificate (the gap closed *and* the twin meters the schedule at the model's energy).
    cert = certify({"status": status, "optimum_joules": r.energy_joules if r.assignment else None,
                    "replay_joules": twin, "gap": r.gap, "bound_joules": r.bound_joules,
                    "replay_rel_error": None if not twin else abs(twin - r.energy_joules) / twin}, True)
    return {"scenario": sc.name, "seed": inst.seed, "solver": solver, "nodes": inst.nodes, "pods": inst.pods,
            "variables": r.variables, "binaries": r.binaries, "rows": r.rows, "status": status,
            "energy_joules": r.energy_joules, "twin_joules": twin, "bound_joules": r.bound_joules, "gap": r.gap,
            "met": cert["certificate"] == "optimal", "result_solver": r.solver,
            "schedule_solver": r.schedule_solver, "bound_solver": r.bound_solver, "warm_joules": r.warm_joules,
            "mip_dual_bound": r.mip_dual_bound, "cpsat_bound": r.cpsat_bound, "cpsat": r.cpsat,
            "mip_nodes": r.mip_nodes, "wall_s": r.wall_s, "load_avg": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--threads", type=int, default=2, help="threads per solve (a race gives each solver half)")
    ap.add_argument("--solver", action="append", choices=SOLVERS, help="repeatable; default: highs and cpsat")
    args = ap.parse_args(argv)
    solvers = args.solver or ["highs", "cpsat"]
    paths = suite_paths(args)
    rows = []
    pct = lambda x: "—" if x is None else f"{100 * x:.2f} %"  # noqa: E731
    kwh = lambda j: "—" if j is None else f"{j / 3.6e6:.4f}"  # noqa: E731
    print("| scenario | seed | solver | variables | binaries | rows | status | kWh | bound kWh | bound by | gap | "
          "CP-SAT bound kWh | met | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for s in range(args.seeds):
            for solver in solvers:
                r = run(path, s, solver, args.time_limit, args.threads)
                rows.append(r)
                print(f"| {r['scenario']} | {r['seed']} | {solver} | {r['variables']:,} | {r['binaries']:,} | "
                      f"{r['rows']:,} | {r['status']} | {kwh(r['twin_joules'])} | {kwh(r['bound_joules'])} | "
                      f"{r['bound_solver']} | {pct(r['gap'])} | {kwh(r['cpsat_bound'])} | "
                      f"{'met' if r['met'] else 'not met'} | {r['wall_s']:.0f} |", flush=True)
                if args.json:
                    atomic_write_text(args.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
