"""The FGD paper's experiment on its own trace: GPU pods arrive without departures until they ask for more GPU
than the cluster has; how much GPU stays unallocated, per policy (Weng et al., ATC '23, §6, Fig. 7).

Run: .venv/bin/python bench/openb_fragmentation.py [--pods ../shared/data/alibaba-gpu-2023/openb_pod_list_default.csv]
     [--policies fgd,gpu-best-fit,...] [--seeds 3] [--until 1.3] [--json]

Pods are drawn with replacement from the pod list (every row of it: the paper's workload is the list's
distribution of shapes, Pending pods included) and placed one by one on the OpenB cluster
(scenarios/traces/openb.nodes.yaml, every node awake) by each policy through the filter chain; a pod that fits
nowhere is skipped (it stays unallocated demand), as in the paper's simulator. At each arrived share of the
cluster's GPU capacity the table reports unallocated GPU (capacity minus allocated) and FGD's fragmentation
(the free GPU share the workload's shapes cannot use), in % of capacity.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from joulesched.agent.gpu_policies import cluster_fragmentation, shape_of  # noqa: E402
from joulesched.agent.registry import GPU_POLICIES, make_policy  # noqa: E402
from joulesched.cluster.scenario import Scenario  # noqa: E402
from joulesched.cluster.state import PodRequest  # noqa: E402
from joulesched.cluster.twin import cluster_from_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PODS = ROOT.parent / "shared" / "data" / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
MARKS = (0.5, 0.8, 0.9, 1.0, 1.1, 1.2)


def cluster():
    import yaml

    groups = yaml.safe_load((ROOT / "scenarios/traces/openb.nodes.yaml").read_text())["nodes"]
    sc = Scenario.model_validate({"name": "openb", "seed": 0, "duration_s": 1, "nodes": groups,
                                  "workload": {"trace": "unused.csv"}})
    return sc


def read_pods(path: Path) -> list[PodRequest]:
    out = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            n, milli = int(r["num_gpu"] or 0), int(r["gpu_milli"] or 0)
            spec = frozenset(m for m in (r.get("gpu_spec") or "").split("|") if m) or None
            gpu = dict(gpu=n, gpu_milli=milli if n == 1 and 0 < milli < 1000 else 1000, gpu_models=spec) if n else {}
            out.append(PodRequest(int(r["cpu_milli"]), int(r["memory_mib"]), **gpu))
    return out


def run(sc, pods: list[PodRequest], policy: str, seed: int, until: float) -> dict:
    st = cluster_from_scenario(sc)
    cap = int(st.alloc_gpu.sum()) * 1000
    rng = np.random.default_rng(seed)
    pol = make_policy(policy)
    pol.reset(st, np.random.default_rng(seed))
    shapes = Counter(shape_of(p) for p in pods)  # the workload the fragmentation is measured against
    top = shapes.most_common(32)
    sh, w = [s for s, _ in top], np.array([c for _, c in top], dtype=np.float64)
    w /= w.sum()
    arrived = allocated = failed = 0
    first_fail = None
    marks, out = list(MARKS), {}
    t0 = time.perf_counter()
    k = 0
    while arrived < until * cap:
        pod = pods[int(rng.integers(len(pods)))]
        if not pod.gpu:
            continue  # the paper's arrivals are GPU tasks; CPU-only pods neither help nor fragment GPUs here
        arrived += pod.gpu_share_milli
        mask = st.feasible(pod)
        if mask.any():
            st.bind(pol.choose(st, pod, mask), pod, k)
            allocated += pod.gpu_share_milli
        else:
            failed += 1
            if first_fail is None:
                first_fail = {"arrived_pct": 100.0 * arrived / cap, "unallocated_pct": 100.0 * (cap - allocated) / cap,
                              "frag_pct": 100.0 * cluster_fragmentation(st, sh, w) / cap}
        k += 1
        while marks and arrived >= marks[0] * cap:
            m = marks.pop(0)
            out[f"{m:.0%}"] = {"unallocated_pct": 100.0 * (cap - allocated) / cap,
                               "frag_pct": 100.0 * cluster_fragmentation(st, sh, w) / cap}
    return {"policy": policy, "seed": seed, "gpu_capacity_milli": cap, "marks": out, "first_failure": first_fail,
            "failed_pods": failed, "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=Path, default=DEFAULT_PODS, help="an OpenB pod list (openb_pod_list_*.csv)")
    ap.add_argument("--policies", default=",".join(GPU_POLICIES))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--until", type=float, default=1.2, help="stop at this arrived share of GPU capacity")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not a.pods.is_file():
        sys.exit(f"{a.pods}: no such pod list (the OpenB files are in ../shared/data/alibaba-gpu-2023)")
    sc, pods = cluster(), read_pods(a.pods)
    rows = [run(sc, pods, p, s, a.until) for p in a.policies.split(",") for s in range(a.seeds)]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{len(pods)} pods from {a.pods.name}, {a.seeds} seed(s); unallocated GPU % of capacity at arrived %")
    print("policy            " + "".join(f"{m:>8.0%}" for m in MARKS) + "   frag@100%  first fail at")
    for p in a.policies.split(","):
        rs = [r for r in rows if r["policy"] == p]
        cells = "".join(f"{np.mean([r['marks'][f'{m:.0%}']['unallocated_pct'] for r in rs]):8.1f}"
                        if all(f"{m:.0%}" in r["marks"] for r in rs) else "       -" for m in MARKS)
        frag = np.mean([r["marks"]["100%"]["frag_pct"] for r in rs])
        ff = [r["first_failure"]["arrived_pct"] for r in rs if r["first_failure"]]
        print(f"{p:<18}{cells}   {frag:8.1f}   {np.mean(ff):6.1f} %" if ff else f"{p:<18}{cells}   {frag:8.1f}")


if __name__ == "__main__":
    main()
