"""How exactly the blockers produce what they are asked for, measured from /proc.

    .venv/bin/python bench/workload_accuracy.py [--seconds 5]

Starts each blocker with `joulesched workload serve` on loopback and measures, over a window inside the load:
- CPU: utime+stime of the app's process tree from /proc/<pid>/stat, at 500m, 1000m and 1500m (goal ±10%);
- memory: VmRSS from /proc/<pid>/status, at 256 MiB, and after the load ended (goal ±10%, returned);
- disk: /proc/<pid>/io, at 20 MB/s write and 20 MB/s read (goal ±15%). wchar/rchar count the syscalls;
  write_bytes/read_bytes what reached the block layer (read_bytes ~0 means reads came from cache).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

BIN = Path(sys.executable).parent / "joulesched"
TICK = os.sysconf("SC_CLK_TCK")


def serve(kind: str, *extra: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([str(BIN), "workload", "serve", kind, "--listen", "127.0.0.1:0", *extra],
                         stdout=subprocess.PIPE, text=True)
    url = p.stdout.readline().strip().removeprefix("listening on ")  # type: ignore[union-attr]
    for _ in range(100):
        try:
            requests.get(url + "/healthz", timeout=1)
            return p, url
        except requests.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"{kind} app did not come up")


def tree(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            if ppid == pid:
                kids.append(int(d.name))
    return [pid, *kids]


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
    return total / TICK


def busy_s() -> float:
    """CPU seconds all tasks on the machine spent busy (/proc/stat: user nice system irq softirq steal)."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(f[i]) for i in (0, 1, 2, 5, 6, 7)) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def io(pid: int) -> dict[str, int]:
    return {k: int(v) for k, v in (x.split(":") for x in Path(f"/proc/{pid}/io").read_text().splitlines())}


def start(url: str, body: dict) -> None:
    r = requests.post(url + "/start", json=body, timeout=10)
    r.raise_for_status()


def wait_idle(url: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while requests.get(url + "/status", timeout=5).json()["state"] != "idle":
        if time.monotonic() > end:
            raise RuntimeError("load did not end")
        time.sleep(0.1)


def row(what: str, asked: float, got: float, unit: str, tol: float) -> tuple[str, str, str, str, str]:
    err = (got - asked) / asked
    return (what, f"{asked:g} {unit}", f"{got:.1f} {unit}", f"{err:+.1%}", "ok" if abs(err) <= tol else f"OUT (±{tol:.0%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measurement window per load")
    args = ap.parse_args()
    win = args.seconds
    rows = []
    notes: list[str] = []

    p, url = serve("cpu")
    try:
        for m in (500, 1000, 1500):
            start(url, {"duration_s": win + 1.0, "cpu_m": m})
            time.sleep(0.5)
            pids = tree(p.pid)
            c0, b0, t0 = cpu_s(pids), busy_s(), time.monotonic()
            time.sleep(win)
            dt = time.monotonic() - t0
            cores = (cpu_s(pids) - c0) / dt
            others = max(0.0, (busy_s() - b0) / dt - cores)
            rows.append(row(f"cpu {m}m over {win:g} s", m, cores * 1000, "m", 0.10))
            # A result is only meaningful if the machine had the cores to give: show what others took meanwhile.
            notes.append(f"cpu {m}m: other processes used {others * 1000:.0f}m of {len(os.sched_getaffinity(0)) * 1000}m meanwhile")
            wait_idle(url)
    finally:
        p.terminate()
        p.wait()

    p, url = serve("memory")
    try:
        base = rss_mib(p.pid)
        start(url, {"duration_s": 4, "memory_mib": 256})
        time.sleep(2)
        rows.append(row("memory 256 MiB, RSS increase", 256, rss_mib(p.pid) - base, "MiB", 0.10))
        wait_idle(url)
        left = rss_mib(p.pid) - base
        rows.append(("memory after stop", "0 MiB", f"{left:.1f} MiB", "", "ok" if left < 256 * 0.1 else "NOT RETURNED"))
    finally:
        p.terminate()
        p.wait()

    scratch = Path(os.environ.get("BENCH_SCRATCH", tempfile.gettempdir()))
    p, url = serve("disk", "--scratch-dir", str(scratch))
    try:
        for field, kind in (("disk_write_mbps", "write"), ("disk_read_mbps", "read")):
            start(url, {"duration_s": win + 2.0, field: 20, "disk_file_mib": 64})
            time.sleep(1.5 if kind == "read" else 0.5)  # reads start after the 64 MiB prefill
            i0, t0 = io(p.pid), time.monotonic()
            time.sleep(win)
            i1, dt = io(p.pid), time.monotonic() - t0
            sysc = "wchar" if kind == "write" else "rchar"
            dev = "write_bytes" if kind == "write" else "read_bytes"
            rows.append(row(f"disk {kind} 20 MB/s ({sysc})", 20, (i1[sysc] - i0[sysc]) / dt / 1e6, "MB/s", 0.15))
            rows.append(row(f"disk {kind} 20 MB/s ({dev})", 20, (i1[dev] - i0[dev]) / dt / 1e6, "MB/s", 0.15))
            wait_idle(url)
    finally:
        p.terminate()
        p.wait()

    head = ("load", "asked", "measured", "error", "goal")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print()
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
