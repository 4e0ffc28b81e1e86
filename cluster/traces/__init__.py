"""Importers of the public cluster traces into the twin's trace CSV (and scenario node groups).

One module per format; each has ``import_files(paths, options, progress) -> ImportResult`` and ``DEFAULTS``
(what a normalised unit stands for). :func:`import_trace` picks the module and :func:`write_outputs` writes
the pods CSV and the nodes YAML atomically, both or neither. docs/twin.md, "Trace formats", has each
format's schema and unit conversions.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

from joulesched.cluster.traces.common import (
    ImportOptions,
    ImportResult,
    Progress,
    TraceFormatError,
    nodes_yaml,
    total_size,
)
from joulesched.cluster.workload import write_trace
from joulesched.core.fsio import atomic_path

#: format name -> module (lazy: a format's module is imported when it is used).
FORMATS = {
    "alibaba-2018": "joulesched.cluster.traces.alibaba2018",
    "alibaba-gpu-2023": "joulesched.cluster.traces.alibaba_gpu2023",
    "alibaba-2023": "joulesched.cluster.traces.alibaba2023",
    "google-2019": "joulesched.cluster.traces.google2019",
    "azure-packing-2020": "joulesched.cluster.traces.azure2020",
}


def defaults(fmt: str) -> dict[str, float]:
    return dict(_module(fmt).DEFAULTS)


def _module(fmt: str):
    if fmt not in FORMATS:
        raise TraceFormatError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    return importlib.import_module(FORMATS[fmt])


def import_trace(fmt: str, paths: Sequence[str | Path], options: ImportOptions | None = None,
                 progress: Progress | None = None) -> ImportResult:
    """Read ``paths`` in format ``fmt``. Raises :class:`TraceFormatError` (exit 2) naming the file, line and
    column of the first problem; nothing is written here."""
    mod = _module(fmt)
    if options is not None:  # an option the format has no use for was silently ignored (a review)
        for name in ("cpu_unit_m", "memory_unit_mib", "machine_id"):
            if getattr(options, name) is not None and name not in mod.READS:
                raise TraceFormatError(f"--{name.replace('_', '-')} does not apply to {fmt} (docs/twin.md gives "
                                       "each format's units); leave it out")
    files = [Path(p) for p in paths]
    if not files:
        raise TraceFormatError(f"{fmt}: give the trace file(s) to import")
    seen: dict[Path, Path] = {}
    for p in files:
        if not p.is_file():
            raise TraceFormatError(f"{p}: " + ("a directory, not a trace file" if p.is_dir() else "no such file"))
        first = seen.setdefault(p.resolve(), p)
        if first is not p:  # its rows would be read twice: every pod imported twice
            raise TraceFormatError(f"{p}: given twice (also as {first})")
    res = mod.import_files(files, options or ImportOptions(), progress)
    res.summary = {"format": fmt, "pods": len(res.workload), **res.summary, "span": res.span}
    return res


def input_size(fmt: str, paths: Sequence[str | Path]) -> int:
    """What a progress bar counts: bytes of the files (rows of the ``vm`` table for the sqlite format)."""
    files = [Path(p) for p in paths]
    if fmt == "azure-packing-2020":
        import sqlite3

        try:
            con = sqlite3.connect(f"file:{files[0]}?mode=ro", uri=True)
            try:
                return int(con.execute("SELECT COUNT(*) FROM vm").fetchone()[0])
            finally:
                con.close()
        except (sqlite3.Error, IndexError, OSError):
            return 0  # the import itself reports what is wrong
    return total_size(files)


def write_outputs(result: ImportResult, out: str | Path, machines: str | Path | None, source: str) -> None:
    """The pods CSV at ``out`` and, if asked, the nodes YAML at ``machines``: each written atomically, and
    the nodes file first, so that an error leaves neither half-written (and no pods file without its nodes)."""
    if machines is not None:
        if not result.node_groups:
            raise TraceFormatError(f"--machines {machines}: the files hold no machine table to build node groups "
                                   "from (give the format's machine or node file)")
        comment = (f"Node groups converted by `joulesched trace import` from {source}.\n"
                   "Include them in a scenario with  nodes: [{include: THIS_FILE}]. The traces carry no power\n"
                   "data: power_watts is a SPECpower profile chosen with --power-profile.")
        with atomic_path(out) as tmp_pods:
            with atomic_path(machines) as tmp:
                tmp.write_text(nodes_yaml(result.node_groups, comment), encoding="utf-8")
                write_trace(result.workload, tmp_pods)
        return
    write_trace(result.workload, out)


__all__ = ["FORMATS", "ImportOptions", "ImportResult", "TraceFormatError", "defaults", "import_trace",
           "input_size", "write_outputs"]
