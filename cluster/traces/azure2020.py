"""Azure Trace for Packing 2020 (github.com/Azure/AzurePublicDataset, AzureTracesForPacking2020.md; Hadary et
al., "Protean: VM Allocation Service at Scale", OSDI '20): one sqlite file, read-only.

* ``vm``: ``vmId, tenantId, vmTypeId, priority, starttime, endtime``. Times are fractional days (negative: alive
  when collection began; ``endtime`` NULL: alive past the 90-day cap). A VM's life does not stretch with
  service, so each VM is a service from ``starttime`` to ``endtime`` (open-ended when NULL). ``priority`` 0 is
  high and 1 low (low may be evicted): priority 1 and 0 here (higher is more important, as in Kubernetes),
  and service class ``high``/``low``. The tenant is the app key. The trace records no usage:
  ``--usage-fraction`` of the request.
* ``vmType``: ``id, vmTypeId, machineId, core, memory, hdd, ssd, nic``; ``core`` and ``memory`` are fractions of
  one machine of type ``machineId``. Requests are read against one machine type, ``--machine-id`` (default: the
  one that hosts the most VM types), whose size is ``--cpu-unit-m`` and ``--memory-unit-mib``; VMs of a type it
  cannot host are skipped. The node group is that machine type, as many as the peak of the VMs' summed
  fractions needs.
"""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path

from joulesched.cluster.traces.common import (
    MAX_CELL,
    SERVICE,
    ImportOptions,
    ImportResult,
    PodSink,
    Progress,
    TraceFormatError,
    check_node_group,
    check_units,
    scaled,
)

VM_COLUMNS = ("vmId", "tenantId", "vmTypeId", "priority", "starttime", "endtime")
TYPE_COLUMNS = ("vmTypeId", "machineId", "core", "memory")
DAY = 86_400.0
#: The optional ImportOptions this format reads (import_trace refuses the others when given).
READS: frozenset[str] = frozenset({"cpu_unit_m", "memory_unit_mib", "machine_id"})
DEFAULTS = {"cpu_unit_m": 96_000.0, "memory_unit_mib": 393_216.0}
SQLITE_MAGIC = b"SQLite format 3\x00"


def _num(path: Path, table: str, row: int, col: str, v: object, *, allow_null: bool = False) -> float | None:
    if v is None:
        if allow_null:
            return None
        raise TraceFormatError(f"{path}: table {table}, row {row}, column {col}: is NULL")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TraceFormatError(f"{path}: table {table}, row {row}, column {col}: {v!r} is not a number") from None
    if not math.isfinite(f):
        raise TraceFormatError(f"{path}: table {table}, row {row}, column {col}: {v!r} is not finite")
    if abs(f) > MAX_CELL:  # as the CSV importers: 1e300 days became an 8.64e304 s submission time
        raise TraceFormatError(f"{path}: table {table}, row {row}, column {col}: {v!r} is too large (more than "
                               "2^53)")
    return f


def import_files(paths: list[Path], options: ImportOptions, progress: Progress | None = None) -> ImportResult:
    if len(paths) != 1:
        raise TraceFormatError(f"azure-packing-2020 reads one sqlite file, got {len(paths)}: "
                               + ", ".join(str(p) for p in paths))
    path = paths[0]
    try:
        with path.open("rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read: {e.strerror or e}") from None
    if magic != SQLITE_MAGIC:
        raise TraceFormatError(f"{path}: line 1, column 1: not a sqlite database (it does not start with "
                               "'SQLite format 3'; is this the right file for the format?)")
    cpu_unit, mem_unit = check_units(options, DEFAULTS)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _read(con, path, options, progress, cpu_unit, mem_unit)
    except sqlite3.DatabaseError as e:
        raise TraceFormatError(f"{path}: unreadable sqlite database ({e}; the file may be truncated)") from None
    finally:
        con.close()


def _read(con: sqlite3.Connection, path: Path, options: ImportOptions, progress: Progress | None, cpu_unit: float,
          mem_unit: float) -> ImportResult:
    for table, cols in (("vm", VM_COLUMNS), ("vmType", TYPE_COLUMNS)):
        have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}  # table names are ours, not input
        if not have:
            raise TraceFormatError(f"{path}: no table {table}; the packing trace has tables vm and vmType "
                                   "(is this the right file for the format?)")
        missing = [c for c in cols if c not in have]
        if missing:
            raise TraceFormatError(f"{path}: table {table} lacks column(s) {', '.join(missing)}")
    machine = options.machine_id
    if machine is None:
        row = con.execute("SELECT machineId FROM vmType GROUP BY machineId ORDER BY COUNT(*) DESC, machineId "
                          "LIMIT 1").fetchone()
        if row is None:
            raise TraceFormatError(f"{path}: table vmType is empty")
        machine = str(row[0])
    types: dict[str, tuple[float, float]] = {}
    for k, (tid, mid, core, mem) in enumerate(con.execute("SELECT vmTypeId, machineId, core, memory FROM vmType"),
                                             start=1):
        if str(mid) != str(machine):
            continue
        c = _num(path, "vmType", k, "core", core)
        m = _num(path, "vmType", k, "memory", mem)
        if not (0 <= c <= 1 and 0 <= m <= 1):
            raise TraceFormatError(f"{path}: table vmType, row {k}: core {c:g} and memory {m:g} must be fractions "
                                   "of a machine (0..1)")
        types[str(tid)] = (c, m)
    if not types:
        raise TraceFormatError(f"{path}: --machine-id {machine}: no VM type in vmType is offered on that machine")
    total = con.execute("SELECT COUNT(*) FROM vm").fetchone()[0]
    sink = PodSink(options)
    events: list[tuple[float, float, float]] = []  # (time, +-core, +-memory) of the kept VMs
    done = 0
    rows = con.execute("SELECT vmId, tenantId, vmTypeId, priority, starttime, endtime FROM vm ORDER BY rowid")
    for k, (vid, tenant, tid, prio, start, end) in enumerate(rows, start=1):
        done += 1
        if progress is not None and done % 10_000 == 0:
            progress(10_000)
        s = _num(path, "vm", k, "starttime", start)
        e = _num(path, "vm", k, "endtime", end, allow_null=True)
        if e is not None and e < s:
            raise TraceFormatError(f"{path}: table vm, row {k} (vmId {vid}), column endtime: {e:g} is before the "
                                   f"starttime {s:g}")
        p = _num(path, "vm", k, "priority", prio)
        if p not in (0.0, 1.0):
            raise TraceFormatError(f"{path}: table vm, row {k} (vmId {vid}), column priority: {p:g} is neither 0 "
                                   "(high) nor 1 (low)")
        size = types.get(str(tid))
        if size is None:
            sink.count(f"VMs of a type machine {machine} does not offer (skipped)")
            continue
        cpu, mem = scaled(size[0], cpu_unit), scaled(size[1], mem_unit)
        kept = sink.add(submit=s * DAY, end=None if e is None else e * DAY, kind=SERVICE, cpu_req=cpu, mem_req=mem,
                        priority=1 if p == 0 else 0, slo="high" if p == 0 else "low", owner="VirtualMachine",
                        app=f"tenant-{tenant}")
        if kept:
            lo = max(s * DAY, sink.w0)
            events.append((lo, size[0], size[1]))
            if e is not None:
                events.append((e * DAY, -size[0], -size[1]))
    if progress is not None:
        progress(done % 10_000)
    wl = sink.workload(str(path))
    events.sort(key=lambda x: (x[0], x[1]))
    peak = cur_c = cur_m = 0.0
    for _, dc, dm in events:
        cur_c += dc
        cur_m += dm
        peak = max(peak, cur_c, cur_m)
    prefix = re.sub(r"[^a-z0-9-]", "-", f"azure-m{machine}".lower())[:50].rstrip("-")
    groups = [{"name_prefix": prefix, "count": max(1, math.ceil(peak - 1e-9)),
               "cpu_m": int(cpu_unit), "memory_mib": int(mem_unit), "max_pods": options.max_pods_per_node,
               "power_watts": options.power_profile}]
    check_node_group(groups[0], f"machine type {machine} ({int(cpu_unit)} m CPU, {int(mem_unit)} MiB, "
                                f"{groups[0]['count']} of them)")
    return ImportResult(wl, groups, {"machine type": machine, "vm types on it": len(types), "vm rows": total,
                                     "peak machines by the summed fractions": groups[0]["count"], **sink.counts},
                        span=sink.span())
