"""CPU cost of the power exporter per collection, as % of one core at a 1 s interval.

One collection = what the exporter does each interval (meter read, /proc/stat, every /proc/PID/stat, Kepler
attribution, a new snapshot) plus one Prometheus scrape rendered from it. The harness advances synthetic
counters between collections outside the timed region.

    .venv/bin/python bench/power_exporter_overhead.py                    # synthetic /proc, 500 processes
    .venv/bin/python bench/power_exporter_overhead.py --real-proc --spawn 500   # real /proc, 500 sleepers
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import generate_latest  # noqa: E402

from joulesched.power.exporter import Exporter  # noqa: E402
from joulesched.power.model import DEFAULT_CURVE, ModelMeter  # noqa: E402
from joulesched.power.monitor import PowerMonitor  # noqa: E402
from joulesched.power.powercap import PowercapMeter  # noqa: E402
from tests.support.sysfs import FakeProcess, SyntheticPowercap, SyntheticProc, pod_cgroup_v2  # noqa: E402


def synthetic_host(root: Path, processes: int, rng: random.Random) -> tuple[SyntheticPowercap, SyntheticProc]:
    pc = SyntheticPowercap(root / "powercap")
    for d, name in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "core"), ("intel-rapl:0:2", "dram"),
                    ("intel-rapl:1", "package-1"), ("intel-rapl:1:0", "core"), ("intel-rapl:1:1", "dram")):
        pc.add(d, name)
    proc = SyntheticProc(root / "proc")
    for i in range(processes):
        pid = 1000 + i
        if i % 3 == 0:  # a third in pods, a few VMs, the rest plain
            uid = f"{i:08x}-0000-4000-8000-{i:012x}"
            p = FakeProcess(pid, f"app-{i}", cgroup=pod_cgroup_v2(uid, f"{i:064x}"))
        elif i % 50 == 1:
            p = FakeProcess(pid, "qemu-system-x86", cmdline=f"qemu-system-x86_64\0-name\0guest=vm{i},debug-threads=on\0".encode())
        else:
            p = FakeProcess(pid, f"proc {i} (x)")
        proc.add(p)
    return pc, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=500, help="synthetic processes")
    ap.add_argument("--collections", type=int, default=60, help="timed collections (one per simulated second)")
    ap.add_argument("--real-proc", action="store_true", help="read the real /proc (model meter) instead")
    ap.add_argument("--spawn", type=int, default=0, help="with --real-proc: sleeping processes to add")
    args = ap.parse_args()
    rng = random.Random(0)
    sleepers: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.real_proc:
            sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(args.spawn)]
            meter, proc_root, pc, proc = ModelMeter(DEFAULT_CURVE), "/proc", None, None
        else:
            pc, proc = synthetic_host(Path(tmp), args.processes, rng)
            meter, proc_root = PowercapMeter(str(pc.root)), str(proc.root)
        try:
            monitor = PowerMonitor(meter, proc_root=proc_root, top_n=20)
            exporter = Exporter(monitor)  # registry only; no server needed to render a scrape
            monitor.refresh()
            costs = []
            for _ in range(args.collections):
                if pc is not None and proc is not None:  # one simulated second of activity, untimed
                    for d in ("intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:2", "intel-rapl:1", "intel-rapl:1:0",
                              "intel-rapl:1:1"):
                        pc.advance(d, rng.randrange(5_000_000, 60_000_000))
                    proc.tick(user=rng.randrange(50, 150), idle=rng.randrange(20, 100))
                    for pid in rng.sample(sorted(proc.processes), k=len(proc.processes) // 5):
                        proc.run(pid, utime=rng.randrange(1, 10))
                else:
                    time.sleep(0.05)
                t0 = time.process_time()
                monitor.refresh()
                body = generate_latest(exporter.registry)
                costs.append(time.process_time() - t0)
        finally:
            for s in sleepers:
                s.kill()
                s.wait()
    n_procs = len(monitor._prev[3]) if monitor._prev else 0
    mean, p95 = statistics.mean(costs), sorted(costs)[int(0.95 * (len(costs) - 1))]
    print(f"processes seen: {n_procs}, collections: {len(costs)}, scrape size: {len(body)} bytes")
    print(f"CPU per collection: mean {mean * 1e3:.2f} ms, median {statistics.median(costs) * 1e3:.2f} ms, "
          f"p95 {p95 * 1e3:.2f} ms")
    print(f"overhead at a 1 s interval: {mean * 100:.2f} % of one core (goal < 1 %)")


if __name__ == "__main__":
    main()
