"""Trace import memory: the importer streams, so its peak memory follows what it keeps (pods x usage steps),
not the size of the input.

Run: .venv/bin/python bench/trace_import_memory.py [--containers 200] [--hours 8] [--samples 1,10,40]
It writes an Alibaba 2018 container_meta and a container_usage with the same containers and the same 300 s
steps but ``k`` samples per step (so the file grows k-fold while the output does not), imports each with
tracemalloc on, and prints the input size, the peak of Python allocations and the import rate.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

from joulesched.cluster.traces import ImportOptions, import_trace


def write(folder: Path, containers: int, hours: int, k: int) -> list[Path]:
    meta = folder / "container_meta.csv"
    meta.write_text("".join(f"c_{c},m_{c % 50},0,app_{c % 20},started,400,800,1.5\n" for c in range(containers)))
    usage = folder / "container_usage.csv"
    with usage.open("w") as fh:
        for t in range(0, hours * 3600, 300 // k if k <= 300 else 1):
            for c in range(containers):
                fh.write(f"c_{c},m_{c % 50},{t},{(t // 300 + c) % 90 + 5},40,1.2,3.1,2,10.5,9.8,4\n")
    return [meta, usage]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--containers", type=int, default=200)
    ap.add_argument("--hours", type=int, default=8)
    ap.add_argument("--samples", default="1,10,40", help="samples per 300 s step, comma-separated")
    a = ap.parse_args()
    print(f"{'samples/step':>12} {'input MB':>9} {'peak MB':>8} {'rows/s':>10} {'pods':>5} {'steps':>6}")
    for k in (int(x) for x in a.samples.split(",")):
        with tempfile.TemporaryDirectory() as d:
            files = write(Path(d), a.containers, a.hours, k)
            size = sum(f.stat().st_size for f in files)
            rows = sum(1 for _ in files[1].open())
            tracemalloc.start()
            t0 = time.perf_counter()
            res = import_trace("alibaba-2018", files, ImportOptions())
            dt = time.perf_counter() - t0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            print(f"{k:>12} {size / 1e6:>9.1f} {peak / 1e6:>8.1f} {rows / dt:>10,.0f} {len(res.workload):>5} "
                  f"{len(res.workload.prof_t):>6}")


if __name__ == "__main__":
    main()
