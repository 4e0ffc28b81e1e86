"""Alibaba cluster-trace-gpu-v2023 ("openb", github.com/alibaba/clusterdata, cluster-trace-gpu-v2023): CSV
with headers, as the Kubernetes Scheduler Simulator reads it.

* ``openb_pod_list_*.csv``: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
  creation_time, deletion_time, scheduled_time``. Requests are already millicores and MiB; times are seconds.
  A pod still ``Running`` when the trace ends is a service that ends at its ``deletion_time``; a
  ``Succeeded`` or ``Failed`` one is a job that ran from ``scheduled_time`` to ``deletion_time``; a
  ``Pending`` one never ran and is skipped. ``qos`` (LS, BE, Burstable, ...) is kept as the pod's service
  class. The trace records no usage: ``--usage-fraction`` of the request. GPUs are not modelled by the twin;
  they are counted in the summary.
* ``openb_node_list_*.csv``: ``sn, cpu_milli, memory_mib, gpu, model``.

The ``multigpu`` pod lists carry no times and cannot be imported.
"""

from __future__ import annotations

from pathlib import Path

from joulesched.cluster.traces.common import (
    JOB,
    SERVICE,
    ImportOptions,
    ImportResult,
    PodSink,
    Progress,
    TraceFormatError,
    csv_dicts,
    node_groups,
    number,
)

POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "creation_time", "deletion_time")
POD_OPTIONAL = ("num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "scheduled_time")
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib")
NODE_OPTIONAL = ("gpu", "model")
DEFAULTS: dict[str, float] = {}


def _table(p: Path) -> str:
    name = p.name.lower()
    if "pod_list" in name or name.startswith("pod"):
        return "pods"
    if "node_list" in name or name.startswith("node"):
        return "nodes"
    raise TraceFormatError(f"{p}: cannot tell whether this is an openb pod list or node list: its name must "
                           "contain pod_list or node_list (openb_pod_list_default.csv, openb_node_list_all_node.csv)")


def import_files(paths: list[Path], options: ImportOptions, progress: Progress | None = None) -> ImportResult:
    sink = PodSink(options)
    machines: dict[str, tuple[int, int]] = {}
    gpu_pods = 0
    for p in paths:
        if _table(p) != "nodes":
            continue
        for line, r in csv_dicts(p, progress, NODE_COLUMNS, NODE_OPTIONAL):
            machines[r["sn"]] = (int(number(p, line, "cpu_milli", r["cpu_milli"], minimum=0)),
                                 int(number(p, line, "memory_mib", r["memory_mib"], minimum=0)))
    for p in paths:
        if _table(p) != "pods":
            continue
        for line, r in csv_dicts(p, progress, POD_COLUMNS, POD_OPTIONAL):
            cpu = int(number(p, line, "cpu_milli", r["cpu_milli"], minimum=0))
            mem = int(number(p, line, "memory_mib", r["memory_mib"], minimum=0))
            created = number(p, line, "creation_time", r["creation_time"], minimum=0)
            deleted = number(p, line, "deletion_time", r["deletion_time"], minimum=0)
            if deleted < created:
                raise TraceFormatError(f"{p}: line {line}, column deletion_time: {deleted:g} is before the "
                                       f"creation_time {created:g}")
            sched_cell = r.get("scheduled_time", "")
            scheduled = number(p, line, "scheduled_time", sched_cell, minimum=0) if sched_cell else None
            phase = (r.get("pod_phase") or "").strip()
            if phase == "Pending" or (phase == "" and scheduled is None and "scheduled_time" in r):
                # Counted as the window counts every pod: one outside it is dropped by the window.
                if created >= sink.w1:
                    sink.count("pods submitted after the window (dropped)")
                elif options.window is not None and deleted <= sink.w0:
                    sink.count("pods gone before the window (dropped)")
                else:
                    sink.count("pods never scheduled in the trace (Pending, skipped)")
                continue
            gpu = bool(r.get("num_gpu")) and number(p, line, "num_gpu", r["num_gpu"], minimum=0) > 0
            qos = (r.get("qos") or "").strip()
            if phase == "Running":  # still running when the trace was cut: a service until its deletion
                kept = sink.add(submit=created, end=deleted if deleted > created else None, kind=SERVICE,
                                cpu_req=cpu, mem_req=mem, slo=qos)
            else:
                start = created if scheduled is None else max(scheduled, created)
                kept = sink.add(submit=created, start=start, end=max(deleted, start), kind=JOB, cpu_req=cpu,
                                mem_req=mem, slo=qos)
            gpu_pods += gpu and kept  # of the pods kept (in the window), as every other count
    wl = sink.workload(", ".join(str(p) for p in paths))
    return ImportResult(wl, node_groups(machines, "openb", options),
                        {"machines": len(machines), "gpu pods (GPUs not modelled)": gpu_pods, **sink.counts},
                        span=sink.span())
