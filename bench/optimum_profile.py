"""Where the optimum's MIP spends its time on the small suite (#26 item 1): model sizes, root gap, nodes, gap.

Run: .venv/bin/python bench/optimum_profile.py [--seeds 3] [--time-limit 60] [--only NAME] [--json OUT]
     [--no-wake-order]

Per scenario of scenarios/small/ and seed: the model's columns, binaries and rows; its LP relaxation (the root
bound before any cut or branching) and the time to solve it; the warm start (the best heuristic run the model
can state); then the full solve (``agent.optimum.solve``) with its status, best energy, the solver's own dual
bound, the reported bound (the best of that, the LP and fluid bounds), the gap and the branch-and-bound nodes.
Gaps are relative to the best schedule's energy. Solver timings depend on the load of the machine (the rows
record the load average). ``--no-wake-order`` drops the orbit rule among identical sleeping nodes (#26), to
measure it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from joulesched.agent.optimum import _build, instance, solve
from joulesched.cluster.scenario import load_scenario
from joulesched.core.fsio import atomic_write_text
from small_suite import parser, paths as suite_paths


def profile(path: Path, seed: int, time_limit: float, wake_order: bool = True) -> dict:
    sc = load_scenario(path)
    inst = instance(sc, seed)
    t0 = time.perf_counter()
    b = _build(inst, wake_order=wake_order)
    build_s = time.perf_counter() - t0
    M = b.model
    h = M.highs(integral=False, time_limit=time_limit, threads=None, gap=1e-6)
    t1 = time.perf_counter()
    h.run()
    import highspy

    # A root the time limit stopped has no value (HiGHS reports the simplex's objective where it stopped).
    solved = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    root = float(h.getInfo().objective_function_value) if solved else None
    root_s = time.perf_counter() - t1
    res = solve(inst, time_limit=time_limit, wake_order=wake_order)
    e = res.energy_joules
    warm = res.warm_joules
    return {"scenario": sc.name, "seed": inst.seed, "nodes": inst.nodes, "pods": inst.pods,
            "columns": M.ncols, "binaries": int(sum(M.integer)), "rows": M.nrows, "build_s": build_s,
            "root_lp_joules": root, "root_lp_s": root_s, "warm_joules": warm, "status": res.status,
            "energy_joules": e, "mip_dual_bound": res.mip_dual_bound, "bound_joules": res.bound_joules,
            "gap": res.gap, "root_gap": (e - root) / e if e and root is not None else None,
            "root_lp_status": h.modelStatusToString(h.getModelStatus()), "mip_nodes": res.mip_nodes,
            "wall_s": res.wall_s, "load_avg": os.getloadavg()[0], "wake_order": wake_order,
            "certificate": "optimal" if res.status == "optimal" else "feasible"}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--no-wake-order", action="store_true", help="without the orbit rule among sleeping twins")
    args = ap.parse_args(argv)
    rows = []
    paths = suite_paths(args)
    print("| scenario | seed | nodes | pods | columns | binaries | rows | root LP gap | warm / best | status | "
          "gap | B&B nodes | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for s in range(args.seeds):
            r = profile(path, s, args.time_limit, wake_order=not args.no_wake_order)
            rows.append(r)
            wr = f"{r['warm_joules'] / r['energy_joules']:.4f}" if r["warm_joules"] and r["energy_joules"] else "—"
            pct = lambda x: "—" if x is None else f"{100 * x:.2f} %"  # noqa: E731
            print(f"| {r['scenario']} | {r['seed']} | {r['nodes']} | {r['pods']} | {r['columns']:,} | "
                  f"{r['binaries']:,} | {r['rows']:,} | {pct(r['root_gap'])} | {wr} | {r['status']} | "
                  f"{pct(r['gap'])} | {r['mip_nodes']} | {r['wall_s']:.0f} |", flush=True)
            if args.json:
                atomic_write_text(args.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
