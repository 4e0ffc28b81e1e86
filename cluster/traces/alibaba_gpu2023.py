"""Alibaba cluster-trace-gpu-v2023 ("openb", github.com/alibaba/clusterdata, cluster-trace-gpu-v2023): CSV
with headers, as the Kubernetes Scheduler Simulator reads it.

* ``openb_pod_list_*.csv``: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
  creation_time, deletion_time, scheduled_time``. Requests are already millicores and MiB; times are seconds.
  A pod still ``Running`` when the trace ends is a service that ends at its ``deletion_time``; a
  ``Succeeded`` or ``Failed`` one is a job that ran from ``scheduled_time`` to ``deletion_time``; a
  ``Pending`` one never ran and is skipped. ``qos`` (LS, BE, Burstable, ...) is kept as the pod's service
  class. The trace records no usage: ``--usage-fraction`` of the request. GPUs are kept: ``num_gpu`` as
  ``gpu_count``, ``gpu_milli`` (the share of one GPU when ``num_gpu`` is 1; 1000 otherwise), ``gpu_spec`` (the
  allowed models, ``A|B``) and the pod's ``name``.
* ``openb_node_list_*.csv``: ``sn, cpu_milli, memory_mib, gpu, model``: each machines group gets its GPU count
  and model. A node with a model but no GPUs, a share above 1000 milli, or (with a node list) a pod whose
  allowed models no node has is an error naming the line; so is a fraction where the trace writes whole
  numbers, and a pod name or node sn listed twice (its load would count twice).

The ``multigpu`` pod lists carry no times and cannot be imported.
"""

from __future__ import annotations

from pathlib import Path

from joulesched.cluster.scenario import MAX_GPUS
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
#: The optional ImportOptions this format reads (import_trace refuses the others when given).
READS: frozenset[str] = frozenset()
DEFAULTS: dict[str, float] = {}


def _whole(p: Path, line: int, column: str, cell: str) -> int:
    """A cell the trace writes as a whole number >= 0 (millicores, MiB, GPUs, milli-GPU): a fraction is an
    error, not truncated (1.5 GPUs is no GPU count; a request must not shrink)."""
    v = number(p, line, column, cell, minimum=0)
    if not v.is_integer():
        raise TraceFormatError(f"{p}: line {line}, column {column}: {cell!r} is not a whole number")
    return int(v)


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
    machines: dict[str, tuple[int, int, int, str]] = {}
    gpu_pods = 0
    gpus_by_model: dict[str, int] = {}
    node_lines: dict[str, str] = {}  # sn -> where it was read, to refuse a node listed twice
    pod_lines: dict[str, str] = {}  # name -> where it was read, to refuse a pod listed twice
    for p in paths:
        if _table(p) != "nodes":
            continue
        for line, r in csv_dicts(p, progress, NODE_COLUMNS, NODE_OPTIONAL):
            gpus = _whole(p, line, "gpu", r.get("gpu") or "0")
            model = (r.get("model") or "").strip()
            if model and not gpus:
                raise TraceFormatError(f"{p}: line {line}, column gpu: node {r['sn']} has GPU model {model!r} "
                                       "but no GPU count")
            if r["sn"] in node_lines:
                raise TraceFormatError(f"{p}: line {line}, column sn: node {r['sn']} is listed again (first at "
                                       f"{node_lines[r['sn']]})")
            node_lines[r["sn"]] = f"{p.name} line {line}"
            machines[r["sn"]] = (_whole(p, line, "cpu_milli", r["cpu_milli"]),
                                 _whole(p, line, "memory_mib", r["memory_mib"]), gpus, model)
            if gpus:
                gpus_by_model[model] = gpus_by_model.get(model, 0) + gpus
    models = {m[3] for m in machines.values() if m[2]}
    for p in paths:
        if _table(p) != "pods":
            continue
        for line, r in csv_dicts(p, progress, POD_COLUMNS, POD_OPTIONAL):
            name = (r.get("name") or "").strip()
            if name:
                if name in pod_lines:  # a repeated row would double the pod's load
                    raise TraceFormatError(f"{p}: line {line}, column name: pod {name} is listed again (first at "
                                           f"{pod_lines[name]})")
                pod_lines[name] = f"{p.name} line {line}"
            cpu = _whole(p, line, "cpu_milli", r["cpu_milli"])
            mem = _whole(p, line, "memory_mib", r["memory_mib"])
            created = number(p, line, "creation_time", r["creation_time"], minimum=0)
            deleted = number(p, line, "deletion_time", r["deletion_time"], minimum=0)
            if deleted < created:
                raise TraceFormatError(f"{p}: line {line}, column deletion_time: {deleted:g} is before the "
                                       f"creation_time {created:g}")
            sched_cell = r.get("scheduled_time", "")
            scheduled = number(p, line, "scheduled_time", sched_cell, minimum=0) if sched_cell else None
            phase = _PHASES.get((r.get("pod_phase") or "").strip().lower())
            if phase is None:  # a phase decides whether the pod ran, and as what: none is guessed
                raise TraceFormatError(f"{p}: line {line}, column pod_phase: {r.get('pod_phase')!r} is not one of "
                                       "Running, Succeeded, Failed, Pending (or empty)")
            if phase == "Pending" or (phase == "" and scheduled is None and "scheduled_time" in r):
                # Counted as the window counts every pod: one outside it is dropped by the window.
                if created >= sink.w1:
                    sink.count("pods submitted after the window (dropped)")
                elif options.window is not None and deleted <= sink.w0:
                    sink.count("pods gone before the window (dropped)")
                else:
                    sink.count("pods never scheduled in the trace (Pending, skipped)")
                continue
            count, milli, spec = _gpus(p, line, r, models if machines else None)
            gpu = count > 0
            qos = (r.get("qos") or "").strip()
            g = dict(gpu=count, gpu_milli=milli, gpu_spec=spec, name=name)
            if phase == "Running":  # still running when the trace was cut: a service until its deletion
                # (a deletion at its creation is a life of 0 s, which the sink stretches to 1 s: not a service
                # that never ends, which would hold its GPUs through every later window)
                kept = sink.add(submit=created, end=deleted, kind=SERVICE,
                                cpu_req=cpu, mem_req=mem, slo=qos, **g)
            else:
                start = created if scheduled is None else max(scheduled, created)
                kept = sink.add(submit=created, start=start, end=max(deleted, start), kind=JOB, cpu_req=cpu,
                                mem_req=mem, slo=qos, **g)
            gpu_pods += gpu and kept  # of the pods kept (in the window), as every other count
    wl = sink.workload(", ".join(str(p) for p in paths))
    return ImportResult(wl, node_groups(machines, "openb", options, sink.counts),
                        {"machines": len(machines), "gpu pods": gpu_pods,
                         **{f"GPUs {m or '(no model)'}": n for m, n in sorted(gpus_by_model.items())},
                         **sink.counts},
                        span=sink.span())


#: The pod phases of the trace (matched whatever their case), spelt as the importer tests them.
_PHASES = {"running": "Running", "succeeded": "Succeeded", "failed": "Failed", "pending": "Pending", "": ""}


def _gpus(p: Path, line: int, r: dict, models: set[str] | None) -> tuple[int, int, frozenset[str] | None]:
    """A pod row's GPUs: (count, milli-GPU per GPU, allowed models). ``num_gpu`` 1 with ``gpu_milli`` below
    1000 is a share of one GPU (the gpushare convention); ``models``: the node list's models, to check
    ``gpu_spec`` against (None without a node list)."""
    count = _whole(p, line, "num_gpu", r.get("num_gpu") or "0")
    milli_s = (r.get("gpu_milli") or "").strip()
    milli = _whole(p, line, "gpu_milli", milli_s) if milli_s else 1000
    if milli > 1000:
        raise TraceFormatError(f"{p}: line {line}, column gpu_milli: {milli} milli-GPU is more than one GPU "
                               "(1000); a pod asks for several GPUs with num_gpu")
    if count > MAX_GPUS:  # what a trace CSV may hold (cluster/workload.py parse_gpu): no machine has more
        raise TraceFormatError(f"{p}: line {line}, column num_gpu: {count} is not a GPU count (0..{MAX_GPUS})")
    if not count:
        return 0, 1000, None
    if milli == 0:
        milli = 1000  # a GPU pod with no share given takes its GPUs whole
    if count > 1 and milli != 1000:
        raise TraceFormatError(f"{p}: line {line}, column gpu_milli: a share of {milli} milli-GPU is of one GPU, "
                               f"not {count} (num_gpu)")
    # "nan" is how pandas prints an empty cell: no model constraint, not a model named "nan"
    spec = frozenset(m.strip() for m in (r.get("gpu_spec") or "").split("|")
                     if m.strip() and m.strip().lower() != "nan") or None
    if spec is not None and models is not None and not spec & models:
        raise TraceFormatError(f"{p}: line {line}, column gpu_spec: pod {r.get('name', '')} allows GPU model(s) "
                               f"{', '.join(sorted(spec))}, which no node in the node list has (their models: "
                               f"{', '.join(sorted(models)) or 'none'})")
    return count, milli, spec
