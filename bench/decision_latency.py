"""Decision latency (filter + score + pick) of the baselines at 1,000 and 5,000 nodes, on the twin.

Run: .venv/bin/python bench/decision_latency.py [--nodes 1000,5000] [--pods 20000]
kube-scheduler's adaptive percentageOfNodesToScore applies to the kube-style policies, as in a real cluster.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from joulesched.agent.registry import make_policy  # noqa: E402
from joulesched.cluster.scenario import Scenario  # noqa: E402
from joulesched.cluster.twin import Twin  # noqa: E402
from joulesched.cluster.workload import build_workload  # noqa: E402


def latencies(twin: Twin, policy, seed: int = 0) -> np.ndarray:
    import time

    twin.reset()
    policy.reset(twin.state, np.random.default_rng(seed))
    out = []
    while twin.next_decision() is not None:
        node = policy.choose(twin.state, twin.request, twin.mask)
        out.append(time.perf_counter_ns() - twin.decision_t0)
        twin.place(node)
    return np.asarray(out) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,5000")
    ap.add_argument("--pods", type=int, default=20_000)
    ap.add_argument("--policies", default="default-k8s,most-allocated,energy-greedy,round-robin")
    a = ap.parse_args()
    print(f"{'nodes':>6} {'policy':<16} {'p50 us':>8} {'p99 us':>8} {'decisions':>10}")
    for n in map(int, a.nodes.split(",")):
        groups = [dict(name_prefix=f"g{k}", count=n // 4, cpu_m=c, memory_mib=4 * c, power_watts=curve)
                  for k, (c, curve) in enumerate([(8000, "hp-ml110-g4"), (8000, "hp-ml110-g5"),
                                                  (8000, "ibm-x3250-x3470"), (24000, "ibm-x3550-m3-x5675")])]
        sc = Scenario.model_validate(dict(
            name=f"lat{n}", seed=1, duration_s=3600, nodes=groups,
            workload=dict(synthetic=dict(pods=a.pods, mean_interarrival_s=3600 / a.pods, max_duration_s=3600))))
        twin = Twin(sc, build_workload(sc))
        for name in a.policies.split(","):
            lat = latencies(twin, make_policy(name))
            print(f"{n:>6} {name:<16} {np.percentile(lat, 50):>8.1f} {np.percentile(lat, 99):>8.1f} {lat.size:>10}")


if __name__ == "__main__":
    main()
