"""Alibaba cluster-trace-v2018 (github.com/alibaba/clusterdata, cluster-trace-v2018/schema.txt): headerless CSV.

Tables (files named after them: ``batch_task.csv``, ``batch_instance-1.csv.gz`` ...), in their published
column order:

* ``batch_instance``: one pod per row. Runs from ``start_time`` to ``end_time``; ``cpu_avg`` (100 = one core)
  is its usage. Its requests come from its task's ``batch_task`` row: ``plan_cpu`` (100 = one core) and
  ``plan_mem`` (normalised 0-100). Owner ``Job``, app ``job_name/task_name``.
* ``batch_task`` without ``batch_instance`` files: each task becomes ``instance_num`` pods over its own
  ``start_time``..``end_time``, using ``--usage-fraction`` of the request.
* ``container_meta``: online containers (services, owner ``Deployment``, app ``app_du``) from their first
  row on; ``cpu_request`` and ``cpu_limit`` (100 = one core), ``mem_size`` (normalised 0-100). A container
  whose last status is a stop ends there; the others run until the scenario ends.
* ``container_usage``: ``cpu_util_percent`` per sample, read as percent of the container's CPU request,
  averaged per ``--usage-step`` into the service's step series.
* ``machine_meta``: ``cpu_num`` and ``mem_size`` (normalised 0-100) of each machine's latest row.

Times are seconds from the trace start (0 means before it). Normalised memory of 100 is ``--memory-unit-mib``
(the trace publishes no absolute size).
"""

from __future__ import annotations

from pathlib import Path

from joulesched.cluster.traces.common import (
    JOB,
    MAX_CELL,
    NO_LIMIT,
    NO_REQUEST,
    SERVICE,
    ImportOptions,
    ImportResult,
    PodSink,
    Progress,
    TraceFormatError,
    UsageSeries,
    check_units,
    classify,
    csv_rows,
    fail,
    node_groups,
    number,
    scaled,
)

BATCH_TASK = ("task_name", "instance_num", "job_name", "task_type", "status", "start_time", "end_time", "plan_cpu",
              "plan_mem")
BATCH_INSTANCE = ("instance_name", "task_name", "job_name", "task_type", "status", "start_time", "end_time",
                  "machine_id", "seq_no", "total_seq_no", "cpu_avg", "cpu_max", "mem_avg", "mem_max")
CONTAINER_META = ("container_id", "machine_id", "time_stamp", "app_du", "status", "cpu_request", "cpu_limit",
                  "mem_size")
CONTAINER_USAGE = ("container_id", "machine_id", "time_stamp", "cpu_util_percent", "mem_util_percent", "cpi",
                   "mem_gps", "mpki", "net_in", "net_out", "disk_io_percent")
MACHINE_META = ("machine_id", "time_stamp", "failure_domain_1", "failure_domain_2", "cpu_num", "mem_size",
                "status")
TABLES = {"batch_task": BATCH_TASK, "batch_instance": BATCH_INSTANCE, "container_meta": CONTAINER_META,
          "container_usage": CONTAINER_USAGE, "machine_meta": MACHINE_META}

#: The trace publishes normalised memory only. Default: 100 = 96 cores x 3789 MiB (its machines have 96 cores;
#: 3789 MiB per core is the Alibaba 2023 GPU trace's memory per core).
#: The optional ImportOptions this format reads (import_trace refuses the others when given).
READS: frozenset[str] = frozenset({"memory_unit_mib"})
DEFAULTS = {"memory_unit_mib": 96 * 3789.0}
#: The most instances one task may have (the published trace's largest has tens of thousands): a larger
#: instance_num is a corrupt cell, refused rather than expanded into that many pods.
MAX_INSTANCES = 10_000_000
NEVER_RAN = frozenset({"waiting", "ready", "cancelled"})
STOPPED = frozenset({"stopped", "stopping", "terminated", "deleted", "dead", "offline"})


def import_files(paths: list[Path], options: ImportOptions, progress: Progress | None = None) -> ImportResult:
    files = classify(paths, list(TABLES), "alibaba-2018")
    _, mem_unit = check_units(options, DEFAULTS)
    if files["batch_instance"] and not files["batch_task"]:
        raise TraceFormatError(f"{files['batch_instance'][0]}: batch_instance rows take their requests from "
                               "batch_task: give the batch_task file(s) too")
    sink = PodSink(options)
    trace_end = 0.0

    def mem_mib(p: Path, line: int, col: str, cell: str) -> int:
        v = number(p, line, col, cell, empty=-1.0)
        if v < 0:
            return NO_REQUEST
        if v > 100:
            raise TraceFormatError(f"{p}: line {line}, column {col}: {v:g} is above 100 (memory is normalised "
                                   "to 0-100)")
        return scaled(v / 100.0, mem_unit, (p, line, col))

    def cpu_m(p: Path, line: int, col: str, cell: str) -> int:
        v = number(p, line, col, cell, empty=-1.0)
        if v > MAX_CELL / 10.0:
            raise fail(p, line, col, f"{v:g} is {v * 10:.3g} m CPU, more than 2^53")
        return NO_REQUEST if v < 0 else int(round(v * 10.0))  # 100 = one core = 1000 m

    # Machines.
    machines: dict[str, tuple[float, int, int]] = {}
    for p in files["machine_meta"]:
        for line, r in csv_rows(p, progress, MACHINE_META):
            t = number(p, line, "time_stamp", r[1], minimum=0)
            cores = number(p, line, "cpu_num", r[4], minimum=0)
            mem = mem_mib(p, line, "mem_size", r[5])
            if r[0] not in machines or t >= machines[r[0]][0]:
                machines[r[0]] = (t, int(round(cores * 1000)), max(mem, 0))
    # Batch tasks: requests for the instances, or pods themselves.
    tasks: dict[tuple[str, str], tuple[int, int]] = {}
    w0, w1 = sink.w0, sink.w1
    running: list[dict] = []  # jobs with no end yet, added with the trace's end once every file is read
    for p in files["batch_task"]:
        for line, r in csv_rows(p, progress, BATCH_TASK):
            start = number(p, line, "start_time", r[5], minimum=0)
            end = number(p, line, "end_time", r[6], minimum=0)
            cpu, mem = cpu_m(p, line, "plan_cpu", r[7]), mem_mib(p, line, "plan_mem", r[8])
            trace_end = max(trace_end, start, end)
            if files["batch_instance"]:
                if (end == 0 or end > w0) and start < w1:
                    tasks[(r[2], r[0])] = (cpu, mem)
                continue
            if r[4].strip().lower() in NEVER_RAN or (start == 0 and end == 0):
                sink.count("tasks that never ran (skipped)")
                continue
            # Without batch_instance each instance becomes a pod: only then is the count read.
            n = number(p, line, "instance_num", r[1], minimum=0)
            if not n.is_integer() or n > MAX_INSTANCES:
                raise TraceFormatError(f"{p}: line {line}, column instance_num: {r[1].strip()!r} is not a whole "
                                       f"number of instances (0..{MAX_INSTANCES:,})")
            pod = dict(submit=start, start=start, kind=JOB, cpu_req=cpu, mem_req=mem, owner="Job",
                       app=f"{r[2]}/{r[0]}")
            if end == 0:  # still running: it runs until the trace ends, known once everything is read
                running.extend([pod] * int(n))
                continue
            if end <= start:  # ended as it started, or before: no life to replay
                sink.count("tasks that ended when they started, or before (skipped)")
                continue
            for _ in range(int(n)):
                sink.add(end=end, trace_end=None, **pod)
    for p in files["batch_instance"]:
        for line, r in csv_rows(p, progress, BATCH_INSTANCE):
            start = number(p, line, "start_time", r[5], minimum=0)
            end = number(p, line, "end_time", r[6], minimum=0)
            trace_end = max(trace_end, start, end)
            usage = number(p, line, "cpu_avg", r[10], empty=-1.0)
            if usage != -1.0 and usage < 0:
                raise TraceFormatError(f"{p}: line {line}, column cpu_avg: {usage:g} is negative")
            if r[4].strip().lower() in NEVER_RAN or (start == 0 and end == 0):
                sink.count("instances that never ran (skipped)")
                continue
            req = tasks.get((r[2], r[1]))
            if req is None:
                sink.count("instances whose task is not in batch_task or the window (skipped)")
                continue
            pod = dict(submit=start, start=start, kind=JOB, cpu_req=req[0], mem_req=req[1],
                       usage_m=None if usage < 0 else usage * 10.0, owner="Job", app=f"{r[2]}/{r[1]}")
            if end == 0:
                running.append(pod)  # no end yet: it ran until the trace ends, known once everything is read
            elif end > start:
                sink.add(end=end, **pod)
            else:  # (a review: these ran "until the trace ends", a day, where they had ended at once)
                sink.count("instances that ended when they started, or before (skipped)")
    # Containers.
    conts: dict[str, list] = {}
    for p in files["container_meta"]:
        for line, r in csv_rows(p, progress, CONTAINER_META):
            t = number(p, line, "time_stamp", r[2], minimum=0)
            cpu, lim = cpu_m(p, line, "cpu_request", r[5]), cpu_m(p, line, "cpu_limit", r[6])
            mem = mem_mib(p, line, "mem_size", r[7])
            trace_end = max(trace_end, t)
            c = conts.get(r[0])
            if c is None:
                conts[r[0]] = [t, t, r[4], cpu, lim, mem, r[3]]
            else:
                c[0] = min(c[0], t)
                if t >= c[1]:
                    c[1:] = [t, r[4], cpu, lim, mem, r[3]]
    util = UsageSeries(options.usage_step_s)
    for p in files["container_usage"]:
        for line, r in csv_rows(p, progress, CONTAINER_USAGE):
            t = number(p, line, "time_stamp", r[2], minimum=0)
            u = number(p, line, "cpu_util_percent", r[3], minimum=0)
            trace_end = max(trace_end, t)
            if r[0] in conts or not files["container_meta"]:
                util.add(r[0], t, u)
    for pod in running:
        sink.add(trace_end=trace_end, **pod)
    for cid, (first, last, status, cpu, lim, mem, app) in conts.items():
        stopped = status.strip().lower() in STOPPED
        if stopped and last <= first:  # seen once, already stopped: it would have run for ever
            sink.count("containers seen only stopped (skipped)")
            continue
        req = max(cpu, 0)
        series = util.series(cid, scale=req / 100.0) if req > 0 else None  # percent of the request
        sink.add(submit=first, end=last if stopped and last > first else None, kind=SERVICE, cpu_req=cpu,
                 mem_req=mem, cpu_lim=NO_LIMIT if lim < 0 else lim, series=series, owner="Deployment", app=app)
    wl = sink.workload(", ".join(str(p) for p in paths))
    mach = {k: (c, m) for k, (_, c, m) in machines.items()}
    return ImportResult(wl, node_groups(mach, "ali2018", options, sink.counts),
                        {"machines": len(machines), "tasks": len(tasks), "containers": len(conts),
                         "trace_end_s": trace_end, **sink.counts}, span=sink.span())
