"""Consolidation settings side by side in the twin: evictions per saved kWh (#29 item 4).

Run: .venv/bin/python bench/consolidation_knobs.py [--seeds 3] [--policy default-k8s] [--checkpoint F] [--json]

Every setting runs the same workloads (scenario x seed) with the same placement policy; "saved" is the energy
below the same run without consolidation (the idle nodes still sleep there). Settings:

- ``joulesched``: the decision core's own test (the predicted saving over ``horizon_s`` must beat the cost of
  restarting the pods, ``restart_s`` 30), no budget;
- ``karpenter-like``: Karpenter's WhenEmptyOrUnderutilized as users run it: a node is emptied whenever its pods
  fit elsewhere (no cost test: ``restart_s`` 0), at most 10 % of the nodes at once, no eviction cap;
- ``karpenter-balanced``: the same with Karpenter 1.14's Balanced rule (savings fraction / disruption fraction
  >= 0.5);
- ``joulesched+balanced``: the core's test and the Balanced rule together.

A setting that evicts a lot for a small saving shows a large evictions/kWh; a negative saving means consolidating
cost energy (evicted jobs redo their work unless they checkpoint: ``--checkpoint 1`` makes every pod restart
where it stopped, Karpenter's assumption of stateless pods).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin, common_window
from joulesched.cluster.workload import build_workload

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ["scenarios/heterogeneous-sleep.yaml", "scenarios/services-diurnal-sleep.yaml", "scenarios/large.yaml"]
BASE = {"interval_s": 300.0, "horizon_s": 3600.0}
SETTINGS = {
    "joulesched": {**BASE, "restart_s": 30.0, "max_evictions_per_hour": 60},
    "karpenter-like": {**BASE, "restart_s": 0.0, "max_evictions_per_hour": 1_000_000, "budgets": [{"nodes": "10%"}]},
    "karpenter-balanced": {**BASE, "restart_s": 0.0, "max_evictions_per_hour": 1_000_000,
                           "budgets": [{"nodes": "10%"}], "balanced_k": 0.5},
    "joulesched+balanced": {**BASE, "restart_s": 30.0, "max_evictions_per_hour": 60, "balanced_k": 0.5},
}


def with_consolidation(sc, cons: dict | None):
    ip = sc.idle_policy
    if ip.mode != "sleep":
        raise SystemExit(f"{sc.name}: consolidation needs idle_policy mode sleep")
    raw = ip.model_dump()
    raw["consolidation"] = cons
    return sc.model_copy(update={"idle_policy": type(ip).model_validate(raw)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--policy", default="default-k8s")
    ap.add_argument("--scenario", action="append", help="scenario YAML (repeatable; default: three sleeping ones)")
    ap.add_argument("--checkpoint", type=float, default=0.0, help="fraction of pods that keep their progress "
                    "when evicted (0: jobs redo their work; 1: every pod restarts where it stopped)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    rows = []
    for path in a.scenario or SCENARIOS:
        base_sc = load_scenario(ROOT / path if not Path(path).is_absolute() else path)
        for k in range(a.seeds):
            seed = base_sc.seed + k
            wl = build_workload(base_sc, seed)
            off_run = run_policy(Twin(with_consolidation(base_sc, None), wl), make_policy(a.policy), seed)
            for name, cons in SETTINGS.items():
                cons = {**cons, "checkpoint_fraction": a.checkpoint}
                r = run_policy(Twin(with_consolidation(base_sc, cons), wl), make_policy(a.policy), seed)
                # One window for both (docs/twin.md): evicted jobs that restart may end the "on" run later.
                w = common_window({"off": off_run, "on": r})
                off, r = w["off"], w["on"]
                saved_kwh = (off.energy_joules - r.energy_joules) / 3.6e6
                rows.append({"scenario": base_sc.name, "seed": seed, "setting": name, "evictions": r.evictions,
                             "saved_kwh": saved_kwh, "saved_pct": 100 * saved_kwh * 3.6e6 / off.energy_joules,
                             "evictions_per_kwh": r.evictions / saved_kwh if saved_kwh > 0 else None,
                             "slo_violation_rate": r.slo_violation_rate, "slo_off": off.slo_violation_rate,
                             "mean_pending_s": r.mean_pending_s})
                print(f"{base_sc.name:24s} seed {seed} {name:20s} evictions {r.evictions:6d} saved "
                      f"{saved_kwh:8.2f} kWh ({rows[-1]['saved_pct']:5.2f} %) SLO {r.slo_violation_rate:.4f}"
                      f" (off {off.slo_violation_rate:.4f})", file=sys.stderr)
    if a.json:
        print(json.dumps(rows, indent=1))
    print("\nsetting               evictions  saved kWh  evictions/kWh  SLO viol (vs off)")
    for name in SETTINGS:
        rs = [r for r in rows if r["setting"] == name]
        ev, kwh = sum(r["evictions"] for r in rs), sum(r["saved_kwh"] for r in rs)
        slo = sum(r["slo_violation_rate"] - r["slo_off"] for r in rs) / len(rs)
        per = f"{ev / kwh:14.2f}" if kwh > 0 else f"{'(no saving)':>14s}"
        print(f"{name:20s} {ev:10d} {kwh:10.2f} {per} {slo:+.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
