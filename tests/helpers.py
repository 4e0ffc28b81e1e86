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
