"""The Lagrangian bound beside the LP relaxation on the small suite (#26 item 1, docs/optimum.md).

Run: nice .venv/bin/python bench/optimum_lagrange.py [--seeds 3] [--time-limit 60] [--only NAME] [--json OUT]

Per scenario of scenarios/small/ and seed: the MIP's LP relaxation (the prices' start), L at its duals, the best
L the subgradient reaches within the time limit (iterations, node problems per iteration), the best warm-start
schedule (the step's target) and the gap left. Compare with the HiGHS bounds of bench/optimum_solvers.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from joulesched.agent.optimum import instance, twin_schedule, warm_specs
from joulesched.agent.optimum_lagrange import lagrangian_bound
from joulesched.cluster.scenario import load_scenario
from joulesched.core.fsio import atomic_write_text
from small_suite import parser, paths as suite_paths


def run(path: Path, seed: int, time_limit: float) -> dict:
    sc = load_scenario(path)
    inst = instance(sc, seed)
    scheds = [s for s in (twin_schedule(inst, w) for w in warm_specs()) if s is not None]
    upper = min((s.twin_joules for s in scheds), default=None)
    lb = lagrangian_bound(inst, time_limit=time_limit, upper=upper)
    return {"scenario": sc.name, "seed": inst.seed, "nodes": inst.nodes, "pods": inst.pods, "kinds": lb.kinds,
            "lp_joules": lb.lp_joules, "at_lp_duals_joules": lb.history[0] if lb.history else None,
            "lagrangian_joules": lb.joules, "iterations": lb.iterations, "status": lb.status,
            "upper_joules": upper, "gap": (upper - lb.joules) / upper if upper else None, "wall_s": lb.wall_s,
            "load_avg": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__).parse_args(argv)
    paths = suite_paths(args)
    kwh = lambda j: "—" if j is None else f"{j / 3.6e6:.4f}"  # noqa: E731
    print("| scenario | seed | nodes / pods / kinds | LP kWh | L at LP duals kWh | best L kWh | iterations | "
          "best warm schedule kWh | gap | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for path in paths:
        for seed in range(args.seeds):
            r = run(path, seed, args.time_limit)
            rows.append(r)
            gap = "—" if r["gap"] is None else f"{100 * r['gap']:.2f} %"
            print(f"| {r['scenario']} | {r['seed']} | {r['nodes']} / {r['pods']} / {r['kinds']} | "
                  f"{kwh(r['lp_joules'])} | {kwh(r['at_lp_duals_joules'])} | {kwh(r['lagrangian_joules'])} | "
                  f"{r['iterations']} | {kwh(r['upper_joules'])} | {gap} | {r['wall_s']:.0f} |", flush=True)
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
