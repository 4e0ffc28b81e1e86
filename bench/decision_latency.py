"""Decision latency (filter + score + pick) of the baselines at 1,000 and 5,000 nodes, on the twin.

Run: .venv/bin/python bench/decision_latency.py [--nodes 1000,5000] [--pods 20000]
kube-scheduler's adaptive percentageOfNodesToScore applies to the kube-style policies, as in a real cluster.
p50/p99 are wall time from the twin's decision start (the filter included); ``cpu`` is the thread CPU time of the
policy's ``choose`` alone, which other processes on shared cores inflate less.

A policy with ``attach`` (the DQN's lifetime predictor) is attached to the twin, so it follows the running pods
as it would in a run. ``--fill K`` places the first K pods with ``--fill-policy`` (untimed; the attached
predictor still sees every bind and end) and times the rest: with ``--duration-median`` long enough that few
pods end, the timed decisions see about K running pods, e.g. the issue-28 case, 5,000 busy nodes and 50,000
running pods::

    .venv/bin/python bench/decision_latency.py --nodes 5000 --pods 55000 --fill 50000 --duration-median 360000 \\
        --policies dqn=models/v2.pt,dqn=models/v2.pt:sample=auto
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


def latencies(twin: Twin, policy, seed: int = 0, fill: int = 0, fill_policy=None,
              cpu: list | None = None) -> tuple[np.ndarray, int]:
    """Per timed decision, microseconds; and the running pods at the first timed decision. ``cpu``: a list that
    receives each timed ``choose``'s thread CPU time, microseconds (what other processes on the cores do not
    inflate as much as the wall time)."""
    import time

    attach = getattr(policy, "attach", None)
    if attach is not None:
        attach(twin)
    try:
        twin.reset()
        rng = np.random.default_rng(seed)
        policy.reset(twin.state, rng)
        if fill_policy is not None:
            fill_policy.reset(twin.state, rng)
        with_meta = bool(getattr(policy, "uses_meta", False))
        out = []
        k, running = 0, 0
        while (d := twin.next_decision()) is not None:
            if k < fill and fill_policy is not None:
                node = fill_policy.choose(d.state, d.pod, d.mask)
            else:
                if not out:
                    running = int(d.state.pods.sum())
                c0 = time.thread_time_ns()
                node = policy.choose(d.state, d.pod, d.mask, meta=d.meta) if with_meta else \
                    policy.choose(d.state, d.pod, d.mask)
                out.append(time.perf_counter_ns() - twin.decision_t0)
                if cpu is not None:
                    cpu.append((time.thread_time_ns() - c0) / 1000.0)
            twin.place(node)
            k += 1
        return np.asarray(out) / 1000.0, running
    finally:
        detach = getattr(policy, "detach", None)
        if detach is not None:
            detach(twin)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,5000")
    ap.add_argument("--pods", type=int, default=20_000)
    ap.add_argument("--policies", default="default-k8s,most-allocated,energy-greedy,round-robin")
    ap.add_argument("--fill", type=int, default=0, help="place this many pods first with --fill-policy, untimed")
    ap.add_argument("--fill-policy", default="default-k8s")
    ap.add_argument("--duration-median", type=float, default=None,
                    help="the pods' median duration, seconds (default: the synthetic workload's)")
    a = ap.parse_args()
    print(f"{'nodes':>6} {'policy':<32} {'p50 us':>8} {'p99 us':>8} {'decisions':>10} {'running':>8} "
          f"{'cpu p50':>8} {'cpu p99':>8}")
    for n in map(int, a.nodes.split(",")):
        groups = [dict(name_prefix=f"g{k}", count=n // 4, cpu_m=c, memory_mib=4 * c, power_watts=curve)
                  for k, (c, curve) in enumerate([(8000, "hp-ml110-g4"), (8000, "hp-ml110-g5"),
                                                  (8000, "ibm-x3250-x3470"), (24000, "ibm-x3550-m3-x5675")])]
        synth = dict(pods=a.pods, mean_interarrival_s=3600 / a.pods, max_duration_s=3600)
        if a.duration_median is not None:
            synth.update(duration_median_s=a.duration_median, max_duration_s=max(3600.0, 10 * a.duration_median))
        sc = Scenario.model_validate(dict(name=f"lat{n}", seed=1, duration_s=3600, nodes=groups,
                                          workload=dict(synthetic=synth)))
        twin = Twin(sc, build_workload(sc))
        for name in a.policies.split(","):
            fill_policy = make_policy(a.fill_policy) if a.fill else None
            cpu: list[float] = []
            lat, running = latencies(twin, make_policy(name), fill=a.fill, fill_policy=fill_policy, cpu=cpu)
            print(f"{n:>6} {name:<32} {np.percentile(lat, 50):>8.1f} {np.percentile(lat, 99):>8.1f} "
                  f"{lat.size:>10} {running:>8} {np.percentile(cpu, 50):>8.1f} {np.percentile(cpu, 99):>8.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
