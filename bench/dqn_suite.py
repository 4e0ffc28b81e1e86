"""Benchmark the DQN on the standard suite and measure its decision latency at 1,000 and 5,000 nodes.

    .venv/bin/python bench/dqn_suite.py [--model models/small.pt] [--seeds 3] [--out models/small.bench.json]

Energy: greedy DQN beside every baseline on the same workloads (seed k of a scenario is workload seed
``scenario.seed + k``, the benchmark's convention; training never uses these seeds). Ratios are printed against
default-k8s, against the best heuristic (most-allocated, requested-to-capacity-ratio, peaks,
target-load-packing, energy-greedy) and against the offline lower bound.

Latency: the ``large`` scenario's four node generations replicated to N nodes, with the arrival rate scaled by
N/240 and a bounded pod count; ``decision_us_p99`` is what run_policy measures (the twin's filter plus the
policy's choose), with torch on one thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from joulesched.agent.registry import make_policy  # noqa: E402
from joulesched.cluster.scenario import load_scenario  # noqa: E402
from joulesched.cluster.twin import Twin  # noqa: E402
from joulesched.cluster.workload import build_workload  # noqa: E402
from joulesched.pipelines.training import evaluate  # noqa: E402

SUITE = ("heterogeneous-sleep", "heterogeneous", "homogeneous", "large", "tiny")


def _decision_times_us(twin: Twin, policy, seed: int) -> np.ndarray:
    """run_policy's measurement (the twin's filter plus choose), keeping every decision's time."""
    twin.reset()
    policy.reset(twin.state, np.random.default_rng(seed))
    out = []
    st, perf = twin.state, time.perf_counter_ns
    while twin.next_decision() is not None:
        node = policy.choose(st, twin.request, twin.mask)
        out.append(perf() - twin.decision_t0)
        twin.place(node)
    return np.asarray(out, dtype=np.float64) / 1000.0


def latency(model: str, nodes: int, pods: int, policies: tuple[str, ...], repeats: int) -> dict:
    """Decision latency on the large scenario's node mix replicated to ``nodes``. Each policy runs ``repeats``
    times; p50/p99 are reported per repeat and the lowest p99 is the headline (other processes on a shared
    machine only ever add time)."""
    base = load_scenario(ROOT / "scenarios" / "large.yaml")
    k = nodes / base.node_count
    groups = [g.model_copy(update={"count": max(1, int(round(g.count * k)))}) for g in base.nodes]
    syn0 = base.workload.synthetic
    syn = syn0.model_copy(update={"pods": pods, "mean_interarrival_s": syn0.mean_interarrival_s / k})
    sc = base.model_copy(update={"nodes": groups, "workload": base.workload.model_copy(update={"synthetic": syn}),
                                 "name": f"large-x{k:.1f}"})
    twin = Twin(sc, build_workload(sc, sc.seed))
    out = {"nodes": sc.node_count, "pods": pods, "repeats": repeats}
    for spec in policies:
        pol = make_policy(spec)
        runs = [_decision_times_us(twin, pol, sc.seed) for _ in range(repeats)]
        p99 = [float(np.percentile(r, 99)) for r in runs]
        p50 = [float(np.percentile(r, 50)) for r in runs]
        out["dqn" if spec.startswith("dqn=") else spec] = {
            "decision_us_p99": round(min(p99), 1), "decision_us_p99_all": [round(v, 1) for v in p99],
            "decision_us_p50": round(min(p50), 1), "decisions": int(runs[0].size)}
    return out


def busy_latency(model: str, nodes: int, decisions: int = 2000, repeats: int = 3) -> dict:
    """The worst case for the DQN: every node busy (no two rows alike), so every feasible node is scored.
    Measures choose() plus the filter on a fixed random state of the large scenario's node mix."""
    from joulesched.cluster.state import ClusterState, PodRequest
    from joulesched.power.curves import SPECPOWER

    kinds = [("hp-ml110-g4", 8000, 32768), ("hp-ml110-g5", 8000, 32768), ("ibm-x3250-x3470", 8000, 32768),
             ("ibm-x3550-m3-x5675", 24000, 98304)]
    spec = [kinds[i % 4] for i in range(nodes)]
    st = ClusterState([f"n{i}" for i in range(nodes)], [c for _, c, _ in spec], [m for _, _, m in spec],
                      [110] * nodes, [SPECPOWER[k] for k, _, _ in spec], sleep_watts=[10.0] * nodes, can_sleep=True)
    rng = np.random.default_rng(0)
    for i in range(nodes):
        cpu, mem = st.alloc_cpu[i] * rng.uniform(0.05, 0.9), st.alloc_mem[i] * rng.uniform(0.05, 0.9)
        st.bind(i, PodRequest(int(cpu), int(mem)))
        st.usage_cpu[i] = st.req_cpu[i] * rng.uniform(0.5, 0.9)
        st.next_departure_at[i] = rng.uniform(1, 3600)
    pol = make_policy(f"dqn={model}")
    pol.reset(st, rng)
    pods = [PodRequest(int(c), int(c) * 4) for c in rng.choice([100, 250, 700, 1500, 4000], size=decisions)]
    p99, p50 = [], []
    for _ in range(repeats):
        ts = np.empty(decisions)
        for k, pod in enumerate(pods):
            t0 = time.perf_counter_ns()
            pol.choose(st, pod, st.feasible(pod))
            ts[k] = (time.perf_counter_ns() - t0) / 1000.0
        p99.append(float(np.percentile(ts, 99)))
        p50.append(float(np.percentile(ts, 50)))
    return {"nodes": nodes, "decision_us_p99": round(min(p99), 1), "decision_us_p99_all": [round(v, 1) for v in p99],
            "decision_us_p50": round(min(p50), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/small.pt")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--scenarios", nargs="*", default=list(SUITE))
    ap.add_argument("--latency-nodes", nargs="*", type=int, default=[1000, 5000])
    ap.add_argument("--latency-pods", type=int, default=3000)
    ap.add_argument("--latency-repeats", type=int, default=3)
    ap.add_argument("--skip-suite", action="store_true", help="Only measure latency.")
    ap.add_argument("--out", default=None, help="Results JSON (default: next to the model, NAME.bench.json).")
    args = ap.parse_args()
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    scen = [] if args.skip_suite else [ROOT / "scenarios" / f"{s}.yaml" for s in args.scenarios]
    res = evaluate(Path(args.model), scen, args.seeds) if scen else {"scenarios": []}
    print(f"{'scenario':20s} {'nodes':>5s} {'seed':>4s} {'dqn/default':>11s} {'dqn/best heur':>13s} {'best heur':>28s} "
          f"{'dqn/LB':>7s} {'SLO dqn %':>9s} {'SLO def %':>9s} {'p99 us':>7s}")
    for s in res["scenarios"]:
        d = s["rows"]["dqn"]
        print(f"{s['name']:20s} {s['nodes']:5d} {s['seed']:4d} {s['ratio_vs_default']:11.3f} "
              f"{s['ratio_vs_best_heuristic']:13.3f} {s['best_heuristic']:>28s} {s['ratio_vs_lower_bound']:7.3f} "
              f"{100 * d['slo_violation_rate']:9.2f} {100 * s['rows']['default-k8s']['slo_violation_rate']:9.2f} "
              f"{d['decision_us_p99']:7.0f}")
    lat = []
    for n in args.latency_nodes:
        row = latency(args.model, n, args.latency_pods, (f"dqn={args.model}", "most-allocated", "energy-greedy"),
                      args.latency_repeats)
        lat.append(row)
        print(f"latency at {row['nodes']} nodes: " + ", ".join(
            f"{k} p50 {v['decision_us_p50']:.0f} us p99 {v['decision_us_p99']:.0f} us "
            f"(repeats {v['decision_us_p99_all']})"
            for k, v in row.items() if isinstance(v, dict)))
    busy = []
    for n in args.latency_nodes:
        row = busy_latency(args.model, n, repeats=args.latency_repeats)
        busy.append(row)
        print(f"busy-cluster latency at {n} nodes (every node scored): dqn p50 {row['decision_us_p50']:.0f} us "
              f"p99 {row['decision_us_p99']:.0f} us (repeats {row['decision_us_p99_all']})")
    doc = {"command": " ".join(["python", *sys.argv]), "model": args.model, "suite": res,
           "latency": lat, "latency_busy": busy,
           "host": {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
                    "processor": platform.processor(), "threads": torch.get_num_threads()},
           "wall_s": round(time.perf_counter() - t0, 1)}
    out = Path(args.out) if args.out else Path(str(Path(args.model).with_suffix("")) + ".bench.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=float) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
