"""Google cluster-usage traces v3 (ClusterData 2019, github.com/google/cluster-data,
clusterdata_trace_format_v3.proto), as JSON lines exported from BigQuery (one object per line; INT64 values
may be strings). Files named after their tables:

* ``instance_events*``: ``time`` (µs from the trace start; 0 = before it, 2^63-1 = after it), ``type``
  (0 SUBMIT, 1 QUEUE, 2 ENABLE, 3 SCHEDULE, 4 EVICT, 5 FAIL, 6 FINISH, 7 KILL, 8 LOST, 9 UPDATE_PENDING,
  10 UPDATE_RUNNING; the names are accepted too), ``collection_id``, ``instance_index``, ``priority``,
  ``scheduling_class``, ``collection_type``, ``resource_request {cpus, memory}`` (normalised so that the largest
  machine is 1.0: ``--cpu-unit-m`` and ``--memory-unit-mib`` are its size). A pod is an instance: submitted at
  its first SUBMIT, started at its first SCHEDULE, ended by its last EVICT, FAIL, FINISH, KILL or LOST (none
  after its last SCHEDULE: still running). Instances of the production and monitoring tiers (priority >= 120,
  Tirmazi et al., EuroSys '20) are services, the others jobs; the tier is the service class. The latest
  request counts; the collection is the app key.
* ``instance_usage*``: ``start_time``, ``end_time`` (µs), ``collection_id``, ``instance_index``,
  ``average_usage {cpus}``: averaged per ``--usage-step`` into each instance's step series.
* ``machine_events*``: ``machine_id``, ``type`` (1 ADD, 2 REMOVE, 3 UPDATE), ``capacity {cpus, memory}``:
  each machine's latest capacity.
"""

from __future__ import annotations

from pathlib import Path

from joulesched.cluster.traces.common import (
    JOB,
    MAX_CELL,
    NO_REQUEST,
    SERVICE,
    ImportOptions,
    ImportResult,
    PodSink,
    Progress,
    UsageSeries,
    check_units,
    classify,
    fail,
    field_of,
    integer,
    json_lines,
    node_groups,
    scaled,
)

TABLES = ("instance_events", "instance_usage", "machine_events")
EVENT_TYPES = ("SUBMIT", "QUEUE", "ENABLE", "SCHEDULE", "EVICT", "FAIL", "FINISH", "KILL", "LOST", "UPDATE_PENDING",
               "UPDATE_RUNNING")
SUBMIT, SCHEDULE = 0, 3
ENDS = frozenset({4, 5, 6, 7, 8})
AFTER_TRACE = 2**63 - 1
US = 1e-6
#: Size of the largest machine (1.0 in the trace); the trace does not publish it.
#: The optional ImportOptions this format reads (import_trace refuses the others when given).
READS: frozenset[str] = frozenset({"cpu_unit_m", "memory_unit_mib"})
DEFAULTS = {"cpu_unit_m": 96_000.0, "memory_unit_mib": 393_216.0}
PRODUCTION_PRIORITY = 120


def tier(priority: int) -> str:
    """Borg's priority tiers in the 2019 trace (Tirmazi et al., "Borg: the Next Generation", EuroSys '20)."""
    if priority <= 99:
        return "free"
    if priority <= 115:
        return "best-effort-batch"
    if priority <= 119:
        return "mid"
    if priority <= 359:
        return "production"
    return "monitoring"


def _type(p: Path, line: int, value: object, names: tuple[str, ...]) -> int:
    if isinstance(value, str) and value.strip().upper() in names:
        return names.index(value.strip().upper())
    t = integer(p, line, "type", value)
    if not 0 <= t < len(names):
        raise fail(p, line, "type", f"{t} is not an event type (0..{len(names) - 1})")
    return t


def _time(p: Path, line: int, column: str, value: object) -> float | None:
    """Seconds, or None for "after the trace"."""
    t = integer(p, line, column, value)
    if t < 0:
        raise fail(p, line, column, f"{t} is negative")
    return None if t >= AFTER_TRACE else t * US


def _resource(p: Path, line: int, obj: dict, name: str, unit: float = 1.0) -> float | None:
    """A normalised resource cell, refused where it is no finite number >= 0 or ``unit`` times it overflows the
    twin's columns (checked here, where the file and line are known: a request is converted only later)."""
    v = field_of(p, line, obj, name, required=False)
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise fail(p, line, name, f"{v!r} is not a number") from None
    if not f >= 0 or f != f or f == float("inf"):
        raise fail(p, line, name, f"{v!r} is not a finite number >= 0")
    if f * unit > MAX_CELL:  # normalised to the largest machine: a corrupt value, which would overflow once scaled
        raise fail(p, line, name, f"{v!r} is too large ({f * unit:.3g} in units of {unit:g}, more than 2^53; is "
                                  "--cpu-unit-m / --memory-unit-mib right?)")
    return f


def import_files(paths: list[Path], options: ImportOptions, progress: Progress | None = None) -> ImportResult:
    files = classify(paths, list(TABLES), "google-2019")
    cpu_unit, mem_unit = check_units(options, DEFAULTS)
    sink = PodSink(options)
    # instance -> [submit, first schedule, last schedule, last end, req time, cpus, memory, priority, collection type]
    inst: dict[tuple[int, int], list] = {}
    trace_end = 0.0
    for p in files["instance_events"]:
        for line, ev in json_lines(p, progress):
            t = _time(p, line, "time", field_of(p, line, ev, "time"))
            kind = _type(p, line, field_of(p, line, ev, "type"), EVENT_TYPES)
            key = (integer(p, line, "collection_id", field_of(p, line, ev, "collection_id")),
                   integer(p, line, "instance_index", field_of(p, line, ev, "instance_index")))
            prio = ev.get("priority")
            cpus = _resource(p, line, ev, "resource_request.cpus", cpu_unit)
            mem = _resource(p, line, ev, "resource_request.memory", mem_unit)
            s = inst.get(key)
            if s is None:
                s = inst[key] = [None, None, None, None, -1.0, None, None, 0, 0]
            if t is None:
                continue  # after the trace: not observed
            trace_end = max(trace_end, t)
            if kind == SUBMIT:
                s[0] = t if s[0] is None else min(s[0], t)
            elif kind == SCHEDULE:
                s[1] = t if s[1] is None else min(s[1], t)
                s[2] = t if s[2] is None else max(s[2], t)
            elif kind in ENDS:
                s[3] = t if s[3] is None else max(s[3], t)
            if (cpus is not None or mem is not None) and t >= s[4]:
                s[4], s[5], s[6] = t, cpus, mem
            if prio is not None:
                s[7] = integer(p, line, "priority", prio)
            if ev.get("collection_type") is not None:
                s[8] = integer(p, line, "collection_type", ev["collection_type"])
    usage = UsageSeries(options.usage_step_s)
    for p in files["instance_usage"]:
        for line, u in json_lines(p, progress):
            t0 = _time(p, line, "start_time", field_of(p, line, u, "start_time"))
            t1 = _time(p, line, "end_time", field_of(p, line, u, "end_time"))
            key = (integer(p, line, "collection_id", field_of(p, line, u, "collection_id")),
                   integer(p, line, "instance_index", field_of(p, line, u, "instance_index")))
            cpus = _resource(p, line, u, "average_usage.cpus", cpu_unit)  # scaled by it in the usage series
            if t0 is None or t1 is None or cpus is None:
                continue
            if t1 < t0:
                raise fail(p, line, "end_time", f"the window ends ({t1:g} s) before it starts ({t0:g} s)")
            trace_end = max(trace_end, t1)
            if key in inst or not files["instance_events"]:
                usage.add(key, t0, cpus, weight=max(t1 - t0, 1e-6))
    machines: dict[int, tuple[float, int, int]] = {}
    for p in files["machine_events"]:
        for line, ev in json_lines(p, progress):
            t = _time(p, line, "time", field_of(p, line, ev, "time"))
            mid = integer(p, line, "machine_id", field_of(p, line, ev, "machine_id"))
            cpus = _resource(p, line, ev, "capacity.cpus", cpu_unit)
            mem = _resource(p, line, ev, "capacity.memory", mem_unit)
            if cpus is None or mem is None or t is None:
                continue
            if mid not in machines or t >= machines[mid][0]:
                machines[mid] = (t, scaled(cpus, cpu_unit), scaled(mem, mem_unit))
    for (coll, idx), (sub, first, last, end, _, cpus, mem, prio, ctype) in inst.items():
        if first is None:
            sink.count("instances never scheduled in the trace (skipped)")
            continue
        kind = SERVICE if prio >= PRODUCTION_PRIORITY else JOB
        running = end is None or (last is not None and last > end)
        cpu_req = scaled(cpus, cpu_unit) if cpus else NO_REQUEST
        mem_req = scaled(mem, mem_unit) if mem else NO_REQUEST
        sink.add(submit=first if sub is None else min(sub, first), start=first, end=None if running else end,
                 trace_end=trace_end, kind=kind, cpu_req=cpu_req, mem_req=mem_req,
                 series=usage.series((coll, idx), scale=cpu_unit), priority=prio,
                 owner="AllocSet" if ctype == 1 else "BorgJob", app=str(coll), slo=tier(prio))
    wl = sink.workload(", ".join(str(p) for p in paths))
    mach = {k: (c, m) for k, (_, c, m) in machines.items()}
    return ImportResult(wl, node_groups(mach, "borg", options, sink.counts),
                        {"machines": len(machines), "instances": len(inst), "trace_end_s": trace_end, **sink.counts},
                        span=sink.span())
