"""Live scheduling against the Kubernetes API emulator: decision + binding latency, throughput, and whether any
pod is lost or bound twice with faults injected.

The emulator runs in its own process (so it does not share the scheduler's GIL), with N nodes and P pending
pods created before the scheduler starts; the scheduler (`live.scheduler.Scheduler`, leader election on)
talks to it over loopback HTTP through the real `kubernetes` client. Latency is measured per pod from the
start of its scheduling attempt (cache read, filter, policy) to the binding's HTTP answer; throughput is
pods bound divided by the time from the first to the last accepted binding.

    .venv/bin/python bench/live_latency.py                       # 1,000 nodes, 2,000 pods, every baseline
    .venv/bin/python bench/live_latency.py --policy default-k8s --pods 500
    .venv/bin/python bench/live_latency.py --faults-only         # the 1,000+ pod fault run only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from joulesched.agent.registry import make_policy  # noqa: E402
from joulesched.cluster.kube.cache import KubeCache  # noqa: E402
from joulesched.cluster.kube.client import api_client_for  # noqa: E402
from joulesched.live.scheduler import Scheduler, ServeConfig  # noqa: E402
from tests.support.procs import emulator_process  # noqa: E402

FAULTS = ["500:bind:0.02", "lost-response:bind:0.01", "409:bind:0.01", "slow:bind:0.01", "500:get:pods:0.05",
          "500:create:events:0.02", "500:patch-status:pods:0.02", "cut:watch:pods:0.5", "500:update:leases:0.02"]


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/emulator/stats", timeout=10) as r:
        return json.loads(r.read())


def run(policy: str, nodes: int, pods: int, faults: list[str], timeout_s: float, workers: int) -> dict:
    args = ["--nodes", str(nodes), "--pods", str(pods), "--node-cpu", "16", "--node-memory", "64Gi", "--pod-cpu",
            "250m", "--pod-memory", "256Mi", "--quiet"] + [a for f in faults for a in ("--fault", f)]
    with emulator_process(*args) as (url, _):
        cfg = ServeConfig(leader_elect=True, lease_namespace="default", bind_workers=workers,
                          backoff_initial_s=0.05, backoff_max_s=0.5, latency_reservoir=max(pods, 1))
        sched = Scheduler(KubeCache(api_client_for(url)), make_policy(policy), cfg)
        t0 = time.monotonic()
        sched.start()
        try:
            deadline = t0 + timeout_s
            while time.monotonic() < deadline:
                st = _stats(url)
                if st["pending"] == 0:
                    break
                time.sleep(0.2)
            wall = time.monotonic() - t0
            st = _stats(url)
            lat = sched.latency.values() * 1000  # a uniform sample of every successful attempt
        finally:
            sched.stop()
        span = (st["last_binding"] - st["first_binding"]) if st["bindings"] > 1 else float("nan")
        return {"policy": policy, "nodes": nodes, "pods": pods, "faults": bool(faults), "bound": st["bound"],
                "pending": st["pending"], "bound_twice": st["pods_bound_twice"], "conflicts": st["conflicts"],
                "lost": pods - st["bound"], "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
                "pods_per_s": st["bindings"] / span if span == span and span > 0 else None, "wall_s": wall,
                "fault_counts": st["faults"]}


def _num(v: float | None, digits: int) -> str:
    """A table cell: a run that bound nothing (``--fault-pods 0``, or a timeout) has no latency or rate."""
    return "–" if v is None else f"{v:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", action="append", help="repeatable; default: the baselines below")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--fault-pods", type=int, default=1500)
    ap.add_argument("--workers", type=int, default=1, help="binding requests in flight (serve defaults to 4)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--faults-only", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    policies = a.policy or ["default-k8s", "most-allocated", "peaks", "energy-greedy"]
    results = []
    if not a.faults_only:
        for p in policies:
            results.append(run(p, a.nodes, a.pods, [], a.timeout, a.workers))
            print(json.dumps(results[-1]), flush=True)
    if a.fault_pods > 0:  # --fault-pods 0: no fault run
        results.append(run(policies[0], a.nodes, a.fault_pods, FAULTS, a.timeout, a.workers))
        print(json.dumps(results[-1]), flush=True)
    print()
    print("| policy | nodes | pods | faults | p50 ms | p99 ms | pods/s | lost | bound twice |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['policy']} | {r['nodes']} | {r['pods']} | {'yes' if r['faults'] else 'no'} | "
              f"{_num(r['p50_ms'], 2)} | {_num(r['p99_ms'], 2)} | {_num(r['pods_per_s'], 0)} | {r['lost']} | "
              f"{r['bound_twice']} |")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
