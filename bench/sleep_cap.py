"""What the live controller's sleep cap costs in energy, measured in the twin.

    .venv/bin/python bench/sleep_cap.py [-s SCENARIO.yaml ...] [-p POLICY ...] [--cap 60 ...] [--json FILE]

``node-power --max-sleeps-per-hour`` (60 by default) bounds how many machines a misconfiguration can switch off
in an hour; the twin counts it as the controller does where a scenario sets ``idle_policy.max_sleeps_per_hour``
(docs/twin.md). Each sleeping scenario runs once per cap (0: none) and policy on its own workload (seed
``scenario.seed``); the table gives the energy over the uncapped run's, the sleeps started, and the most started
in any hour (an hour opening at a sleep).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import Sleep, load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.core.fsio import atomic_write_text

DEFAULT = ("scenarios/heterogeneous-sleep.yaml", "scenarios/services-diurnal-sleep.yaml", "scenarios/large.yaml")


def busiest_hour(starts: list[float]) -> int:
    """The most sleeps started within any hour that opens at one of them (``starts`` in order)."""
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] >= 3600.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def measure(path: str, policy: str, caps: list[int]) -> list[dict]:
    sc = load_scenario(path)
    if not isinstance(sc.idle_policy, Sleep):
        raise SystemExit(f"{path}: its nodes never sleep (idle_policy mode always_on): no cap to measure")
    rows = []
    for cap in [0, *caps]:
        capped = sc.model_copy(update={"idle_policy": sc.idle_policy.model_copy(update={"max_sleeps_per_hour": cap})})
        twin = Twin(capped, build_workload(capped, capped.seed), record=True)
        r = run_policy(twin, make_policy(policy), capped.seed)
        starts = [t for t, action, _ in twin.power_log if action == "sleep"]
        rows.append({"scenario": sc.name, "policy": policy, "cap": cap, "energy_j": float(r.energy_joules),
                     "sleeps": len(starts), "busiest_hour": busiest_hour(starts),
                     "mean_pending_s": float(r.mean_pending_s)})
    for row in rows:
        row["energy_over_uncapped"] = row["energy_j"] / rows[0]["energy_j"]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-s", "--scenario", action="append", help="a sleeping scenario (repeatable)")
    ap.add_argument("-p", "--policy", action="append", help="a policy spec (repeatable; awake-first:fit=efficient)")
    ap.add_argument("--cap", action="append", type=int, help="sleeps per hour (repeatable; 60, the live default)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    if any(c < 1 for c in args.cap or ()):
        ap.error("--cap must be >= 1 (the uncapped run is always measured)")
    rows = [row for path in args.scenario or DEFAULT for policy in args.policy or ["awake-first:fit=efficient"]
            for row in measure(path, policy, args.cap or [60])]
    print(f"{'scenario':28} {'policy':28} {'cap':>4} {'energy/uncapped':>15} {'sleeps':>6} {'busiest hour':>12} "
          f"{'pending s':>9}")
    for r in rows:
        print(f"{r['scenario']:28} {r['policy']:28} {r['cap'] or '-':>4} {r['energy_over_uncapped']:15.3f} "
              f"{r['sleeps']:6d} {r['busiest_hour']:12d} {r['mean_pending_s']:9.1f}")
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
