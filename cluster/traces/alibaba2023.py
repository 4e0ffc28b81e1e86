"""Alibaba cluster-trace-v2023, the unified-scheduler Kubernetes trace (EuroSys '23, "Understanding and
Optimizing Workloads for Unified Resource Management in Large Cloud Platforms"; schema in
github.com/alibaba/clusterdata pull request 195, cluster-trace-v2023/README.md). CSV, with or without the
header line; files named after their folders:

* ``pod_meta_info*.csv``: ``create_timestamp, pod, cpu, memory, disk, cpu_limit, memory_limit, disk_limit,
  qos``. Requests and limits are max-min normalised: ``--cpu-unit-m`` and ``--memory-unit-mib`` are what 1.0
  stands for (a 0 means none). ``qos`` (LS, BE, ..., empty when the pod has no SLO) is kept as the service
  class: BE and empty are jobs, the others services.
* ``pod_resource_usage*.csv``: ``collect_timestamp, node_name, pod, app_group, pod_cpu_limit_usage,
  pod_cpu_request_util, ...`` (21 columns). ``pod_cpu_request_util`` is read as the fraction of the CPU
  request in use (the release normalises it too: treat absolute usage with care). A pod lives from its
  creation to its last sample; one sampled in the trace's last step is still running. ``app_group`` is its
  app key.
* ``node_resource_usage*.csv``: ``collect_timestamp, node_name, node_cpu_usage, node_memory_util,
  node_memory_total_bytes, node_network_bandwidth, node_network_receive_bps, node_network_transmit_bps,
  node_cpu_cores, node_disk_io_usage``: each node's size from its latest sample.

Timestamps are seconds from the trace start; negative ones are before it.
"""

from __future__ import annotations

from pathlib import Path

from joulesched.cluster.traces.common import (
    JOB,
    NO_LIMIT,
    NO_REQUEST,
    SERVICE,
    ImportOptions,
    ImportResult,
    PodSink,
    Progress,
    UsageSeries,
    check_units,
    classify,
    csv_rows,
    node_groups,
    number,
    scaled,
)

POD_META = ("create_timestamp", "pod", "cpu", "memory", "disk", "cpu_limit", "memory_limit", "disk_limit", "qos")
POD_USAGE = ("collect_timestamp", "node_name", "pod", "app_group", "pod_cpu_limit_usage", "pod_cpu_request_util",
             "pod_memory_util", "pod_memory_usage_bytes", "pod_disk_read_bps_total", "pod_disk_write_bps_total",
             "pod_disk_read_iops_total", "pod_disk_write_iops_total", "pod_network_transmit_bytes_ps_total",
             "pod_network_receive_bytes_ps_total", "cpu_psi", "mem_psi", "disk_psi", "web_qps", "qps", "rt")
NODE_USAGE = ("collect_timestamp", "node_name", "node_cpu_usage", "node_memory_util", "node_memory_total_bytes",
              "node_network_bandwidth", "node_network_receive_bps", "node_network_transmit_bps", "node_cpu_cores",
              "node_disk_io_usage")
TABLES = {"pod_meta_info": POD_META, "pod_resource_usage": POD_USAGE, "node_resource_usage": NODE_USAGE}

#: What a normalised 1.0 stands for (the release does not say). CPU: 128 cores, since the schema's examples
#: (a request of 0.0390625, a limit of 0.046875) are 5 and 6 cores of 128. Memory: 1 TiB.
#: The optional ImportOptions this format reads (import_trace refuses the others when given).
READS: frozenset[str] = frozenset({"cpu_unit_m", "memory_unit_mib"})
DEFAULTS = {"cpu_unit_m": 128_000.0, "memory_unit_mib": 1_048_576.0}
JOB_CLASSES = frozenset({"BE", ""})


def import_files(paths: list[Path], options: ImportOptions, progress: Progress | None = None) -> ImportResult:
    files = classify(paths, list(TABLES), "alibaba-2023")
    cpu_unit, mem_unit = check_units(options, DEFAULTS)
    sink = PodSink(options)

    def norm(p: Path, line: int, col: str, cell: str, unit: float) -> int:
        v = number(p, line, col, cell, empty=0.0, minimum=0)
        return scaled(v, unit, (p, line, col)) if v > 0 else NO_REQUEST

    machines: dict[str, tuple[float, int, int]] = {}
    for p in files["node_resource_usage"]:
        for line, r in csv_rows(p, progress, NODE_USAGE, header=None):
            t = number(p, line, "collect_timestamp", r[0])
            if r[1] not in machines or t >= machines[r[1]][0]:
                machines[r[1]] = (t, max(norm(p, line, "node_cpu_cores", r[8], cpu_unit), 0),
                                  max(norm(p, line, "node_memory_total_bytes", r[4], mem_unit), 0))
    meta: dict[str, tuple] = {}
    for p in files["pod_meta_info"]:
        for line, r in csv_rows(p, progress, POD_META, header=None):
            created = number(p, line, "create_timestamp", r[0])
            if r[1] in meta:
                sink.count("pod_meta_info rows of a pod listed before (the later row kept)")
            meta[r[1]] = (created, norm(p, line, "cpu", r[2], cpu_unit), norm(p, line, "memory", r[3], mem_unit),
                          norm(p, line, "cpu_limit", r[5], cpu_unit), norm(p, line, "memory_limit", r[6], mem_unit),
                          r[8].strip().strip('"'))
    util = UsageSeries(options.usage_step_s)
    apps: dict[str, str] = {}
    last_t = None
    for p in files["pod_resource_usage"]:
        for line, r in csv_rows(p, progress, POD_USAGE, header=None):
            t = number(p, line, "collect_timestamp", r[0])
            u = number(p, line, "pod_cpu_request_util", r[5])
            if u < 0:
                continue  # -1: not available at that time (the schema's convention)
            last_t = t if last_t is None else max(last_t, t)
            if r[2] in meta or not files["pod_meta_info"]:
                util.add(r[2], t, u)
                apps.setdefault(r[2], r[3])
    trace_last_step = None if last_t is None else (last_t // util.step) * util.step
    for pod, (created, cpu, mem, clim, mlim, qos) in meta.items():
        kind = JOB if qos in JOB_CLASSES else SERVICE
        span = util.span(pod)
        req = max(cpu, 0)
        series = util.series(pod, scale=req) if req > 0 else None
        submit = max(created, 0.0) if created >= 0 else created
        if span is None:
            if kind == JOB:
                sink.count("jobs without usage samples (no run time known, skipped)")
                continue
            end = None
        else:
            still = trace_last_step is not None and span[1] >= trace_last_step
            end = None if still else span[1] + util.step
        sink.add(submit=submit, start=None if span is None else max(span[0], submit), end=end,
                 trace_end=None if last_t is None else last_t + util.step, kind=kind, cpu_req=cpu, mem_req=mem,
                 cpu_lim=NO_LIMIT if clim < 0 else clim, mem_lim=NO_LIMIT if mlim < 0 else mlim, series=series,
                 slo=qos, app=apps.get(pod, ""))
    wl = sink.workload(", ".join(str(p) for p in paths))
    mach = {k: (c, m) for k, (_, c, m) in machines.items()}
    return ImportResult(wl, node_groups(mach, "ali2023", options, sink.counts),
                        {"machines": len(machines), "pods in pod_meta_info": len(meta), **sink.counts},
                        span=sink.span())
