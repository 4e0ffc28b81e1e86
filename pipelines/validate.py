"""`joulesched validate`: a scenario checked without running it, and what it will do that a user should know.

Errors (a malformed file, field or trace) raise :class:`~joulesched.cluster.scenario.ScenarioError` as loading
does. Warnings are facts that hold for every policy, so none of them depends on which scheduler runs:

* trace rows submitted at or after ``duration_s`` are dropped: they are never simulated;
* pods whose requests exceed every node's allocatable can never be placed;
* when the pods present at once (each running from its arrival for its duration) request more CPU or memory
  than the whole cluster has, pods must wait whatever the scheduler does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin, cluster_from_scenario, gpu_runtime_scales
from joulesched.cluster.workload import Workload, build_workload


def _peak_concurrent(wl: Workload, req: np.ndarray) -> tuple[float, float]:
    """The largest total of ``req`` over pods present at once if each ran from arrival for its duration, and
    when it happens."""
    r = np.maximum(req, 0).astype(np.float64)
    t = np.concatenate((wl.submit_s, wl.submit_s + wl.duration_s))
    d = np.concatenate((r, -r))
    order = np.lexsort((d, t))  # departures before arrivals at the same instant
    level = np.cumsum(d[order])
    k = int(np.argmax(level))
    return float(level[k]), float(t[order][k])


def dropped_warning(dropped: int, kept: int, duration_s: float | None) -> str:
    """The words for trace rows the workload leaves out (validate and benchmark say the same)."""
    at = "duration_s" if duration_s is None else f"duration_s={duration_s:g} s"
    return (f"{dropped} trace row(s) dropped: submitted at or after {at}, so never "
            f"simulated ({kept} pod(s) kept); raise duration_s, or import the trace with the window its summary "
            "suggests (docs/twin.md)")


def check_scenario(path: str | Path) -> dict:
    """Load ``path`` (raising on errors) and return ``{file, name, nodes, pods, trace_rows_dropped, warnings}``."""
    sc = load_scenario(path)
    wl = build_workload(sc)
    gpu_runtime_scales(sc, wl)  # its errors, before any run
    cpu = np.array([g.cpu_m for g in sc.nodes for _ in range(g.count)], dtype=np.int64)
    mem = np.array([g.memory_mib for g in sc.nodes for _ in range(g.count)], dtype=np.int64)
    warnings = []
    if wl.dropped:
        warnings.append(dropped_warning(wl.dropped, len(wl), sc.duration_s))
    # The twin's own test (its filter chain on empty nodes: resources, GPUs, selectors, taints, pod slots), not
    # CPU and memory alone: a pod asking 16 GPUs of 8-GPU nodes passed here and was never placed.
    fits = Twin._placeable_mask(cluster_from_scenario(sc), wl)
    if (~fits).any():
        n = int((~fits).sum())
        big_c, big_m = max(int(np.max(wl.cpu_req[~fits])), 0), max(int(np.max(wl.mem_req[~fits])), 0)  # -1: none
        gpus = f", {int(np.max(wl.gpu[~fits]))} GPUs" if wl.has_gpus and wl.gpu[~fits].any() else ""
        warnings.append(f"{n} of {len(wl)} pods fit no node even when it is empty (by resources, GPUs, selectors, "
                        f"taints or pod slots; up to {big_c}m CPU, {big_m} MiB{gpus} requested; the largest node "
                        f"has {int(cpu.max())}m, {int(mem.max())} MiB): they will never be placed")
    for what, req, cap, unit in (("CPU", wl.cpu_req, cpu.sum(), "m"), ("memory", wl.mem_req, mem.sum(), " MiB")):
        peak, at = _peak_concurrent(wl, np.where(fits, req, 0))
        if peak > cap:
            warnings.append(f"at t={at:.0f} s the pods present request {peak:.0f}{unit} {what}, "
                            f"{100 * peak / cap:.0f} % of the cluster's {int(cap)}{unit}: every policy leaves pods "
                            "pending there")
    ip = sc.idle_policy
    if ip.mode == "sleep":  # the twin sleeps an empty node whatever it saves (the optimum refuses such a cluster)
        # idle as the twin prices a node awake and empty: its CPU curve's 0 % plus its GPUs' idle (off asleep)
        idle = {g.name_prefix: g.curve[0] + g.gpu_count * g.gpu_curve[0] for g in sc.nodes if not g.never_sleep}
        costly = [f"{n} ({w:g} W)" for n, w in idle.items() if w <= ip.sleep_watts]
        if costly:
            warnings.append(f"node group(s) {', '.join(costly)} draw no more idle than asleep (sleep_watts "
                            f"{ip.sleep_watts:g} W): each sleep there costs energy and makes the next pod wait "
                            f"wake_s; lower sleep_watts, or check the curve")
    return {"file": str(path), "name": sc.name, "nodes": sc.node_count, "pods": len(wl),
            "trace_rows_dropped": wl.dropped, "warnings": warnings}
