"""Twin throughput: placements per second with heuristic policies at 100 nodes, on one core.

Run: .venv/bin/python bench/twin_throughput.py [--nodes 100] [--pods 50000] [--repeat 3] [--against OLD.py]
Every policy runs on the same workload in the same process, best of --repeat, so the ratios are comparable.
``--against`` loads another version of cluster/twin.py (e.g. ``git show HEAD:cluster/twin.py > /tmp/old.py``)
and alternates the two, run by run, so that an A/B holds on a loaded machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the goal states

from joulesched.agent.registry import make_policy  # noqa: E402
from joulesched.agent.runner import run_policy  # noqa: E402
from joulesched.cluster.scenario import Scenario  # noqa: E402
from joulesched.cluster.twin import Twin  # noqa: E402
from joulesched.cluster.workload import build_workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", default="round-robin,random,most-allocated,energy-greedy,default-k8s,peaks")
    ap.add_argument("--against", help="another cluster/twin.py to compare with, alternating runs")
    a = ap.parse_args()
    sc = Scenario.model_validate(dict(
        name="throughput", seed=1, duration_s=a.pods * 0.5,
        nodes=[dict(name_prefix="n", count=a.nodes, cpu_m=32000, memory_mib=131072, power_watts="ibm-x3250-x3470")],
        workload=dict(synthetic=dict(pods=a.pods, mean_interarrival_s=0.5, duration_median_s=300, duration_sigma=1.0,
                                     max_duration_s=3600))))
    wl = build_workload(sc)
    twins = {"this": Twin(sc, wl)}
    if a.against:
        spec = importlib.util.spec_from_file_location("twin_against", a.against)
        mod = sys.modules["twin_against"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(mod)
        twins["against"] = mod.Twin(sc, wl)
    print(f"{a.nodes} nodes, {len(wl)} pods, best of {a.repeat}" + (f"; against {a.against}" if a.against else ""))
    print(f"{'policy':<16} {'twin':<8} {'placements/s':>13} {'us/placement':>13}")
    for name in a.policies.split(","):
        best = dict.fromkeys(twins, 0.0)
        for _ in range(a.repeat):
            for label, twin in twins.items():
                t0 = time.perf_counter()
                r = run_policy(twin, make_policy(name), 0)
                best[label] = max(best[label], r.placements / (time.perf_counter() - t0))
        for label, b in best.items():
            print(f"{name:<16} {label:<8} {b:>13,.0f} {1e6 / b:>13.1f}")
        if a.against:
            print(f"{name:<16} {'ratio':<8} {best['this'] / best['against']:>13.3f}")


if __name__ == "__main__":
    main()
