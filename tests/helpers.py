"""Small builders shared by tests: in-memory scenarios and hand-made workloads."""

from __future__ import annotations

import numpy as np

from joulesched.cluster.scenario import Scenario
from joulesched.cluster.workload import Workload

LINEAR_100_200 = [100.0 + 10.0 * k for k in range(11)]  # 100 W idle, 200 W at full load


def scenario(nodes: list[dict], *, duration_s: float = 100.0, idle: dict | None = None, **kw) -> Scenario:
    groups = []
    for k, n in enumerate(nodes):
        g = {"name_prefix": f"g{k}", "count": 1, "cpu_m": 1000, "memory_mib": 1024, "power_watts": LINEAR_100_200}
        g.update(n)
        groups.append(g)
    return Scenario.model_validate({
        "name": kw.pop("name", "t"), "seed": 0, "duration_s": duration_s,
        "idle_policy": idle or {"mode": "always_on"}, "nodes": groups,
        "workload": {"synthetic": {"pods": 1, "mean_interarrival_s": 1.0}}, **kw})


def workload(*pods: tuple) -> Workload:
    """Pods as (submit_s, duration_s, cpu_req or None, mem_req or None, usage_m)."""
    cols = list(zip(*pods))
    return Workload(np.array(cols[0], float), np.array(cols[1], float),
                    np.array([-1 if c is None else c for c in cols[2]], np.int64),
                    np.array([-1 if m is None else m for m in cols[3]], np.int64), np.array(cols[4], float))


GPU_NODE = ("{name_prefix: gpu, count: %d, cpu_m: 96000, memory_mib: 786432, max_pods: 110, "
            "power_watts: ibm-x3550-m3-x5675, gpu_count: 8, gpu_model: V100M32}")
CPU_NODE = "{name_prefix: cpu, count: %d, cpu_m: 32000, memory_mib: 262144, power_watts: ibm-x3550-m3-x5675}"


def gpu_trace_scenario(folder, gpus_per_pod: list[int], *, gpu_nodes: int = 1, cpu_nodes: int = 0):
    """A scenario file in ``folder`` on 8-GPU (V100) nodes and CPU-only ones, replaying a trace of one job per
    entry of ``gpus_per_pod`` (asking that many GPUs, 1 core, 1 GiB); returns its path."""
    rows = "".join(f"{10 * (k + 1)},600,1000,1024,500,job,{g}\n" for k, g in enumerate(gpus_per_pod))
    (folder / "t.csv").write_text("submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,kind,gpu_count\n"
                                  + rows)
    nodes = [GPU_NODE % gpu_nodes] + ([CPU_NODE % cpu_nodes] if cpu_nodes else [])
    path = folder / "s.yaml"
    path.write_text("name: g\nseed: 1\nduration_s: 3600\nidle_policy: {mode: always_on}\nnodes:\n"
                    + "".join(f"  - {n}\n" for n in nodes) + f"workload:\n  trace: {folder / 't.csv'}\n")
    return path
