"""Check the meters on real hardware and record calibration samples. Needs only the standard library, so it
runs on a host with a bare python3 (numpy is not needed until the fit, which can run elsewhere).

    sudo python3 bench/power_rapl_check.py --out /tmp/rapl          # then, anywhere:
    joulesched power calibrate --from-samples /tmp/rapl/samples.csv --out node-profile.yaml

It prints the powercap zones and whether energy_uj is readable, opens the best hardware meter, attributes 2 s
of real activity, times exporter collections on the real /proc, and steps the burner 0..100 % writing
``samples.csv`` (utilization,watts of the primary zones).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path


def _alias_checkout_as_joulesched() -> None:
    """Make ``import joulesched.power...`` find this checkout without the installed package: the package maps the
    repository root itself (pyproject's package-dir), so there is no ``joulesched/`` folder to put on sys.path.
    An empty package whose ``__path__`` is the root stands in; its submodules then import as usual. At module
    level so that the burner's spawned workers, which re-run this file as ``__mp_main__``, get it too."""
    if "joulesched" not in sys.modules:
        pkg = types.ModuleType("joulesched", "This checkout, aliased by bench/power_rapl_check.py.")
        pkg.__path__ = [str(Path(__file__).resolve().parents[1])]
        sys.modules["joulesched"] = pkg


_alias_checkout_as_joulesched()

from joulesched.power.burner import measure  # noqa: E402
from joulesched.power.meter import MeterError  # noqa: E402
from joulesched.power.monitor import PowerMonitor  # noqa: E402
from joulesched.power.msr import MsrMeter  # noqa: E402
from joulesched.power.powercap import PowercapMeter, discover_zones  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--powercap-root", default="/sys/class/powercap")
    ap.add_argument("--proc-root", default="/proc")
    ap.add_argument("--dev-root", default="/dev")
    ap.add_argument("--step-seconds", type=float, default=3.0)
    ap.add_argument("--settle-seconds", type=float, default=1.0)
    ap.add_argument("--sample-seconds", type=float, default=0.5)
    ap.add_argument("--collections", type=int, default=30)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"host": platform.node(), "kernel": platform.release(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "euid": os.geteuid()}
    try:
        vendor = next(line.split(":", 1)[1].strip() for line in open(f"{args.proc_root}/cpuinfo")
                      if line.startswith(("vendor_id", "model name")))
    except (OSError, StopIteration):
        vendor = "?"
    report["cpu"] = vendor
    print(json.dumps(report))

    try:
        zones, notes = discover_zones(args.powercap_root)
        for z in zones:
            ok = os.access(z.path, os.R_OK)
            print(f"zone {z.label:<12} {z.interface:<16} max_range {z.max_range_uj} uJ readable={ok}")
        for n in notes:
            print(f"note: {n}")
    except MeterError as e:
        print(f"powercap: {e}")

    meter = None
    for factory in (lambda: PowercapMeter(args.powercap_root),
                    lambda: MsrMeter(dev_root=args.dev_root, proc_root=args.proc_root)):
        try:
            meter = factory()
            break
        except MeterError as e:
            print(f"meter unavailable: {e}")
    if meter is None:
        print("no hardware meter: nothing more to check")
        return 3
    print(f"meter {meter.source}: zones {meter.zones}, primary {meter.primary_zones}")
    report["meter"] = meter.source

    mon = PowerMonitor(meter, proc_root=args.proc_root, top_n=5)
    mon.refresh()
    time.sleep(2)
    s = mon.refresh()
    print(f"usage ratio {s.usage_ratio:.3f}; " + ", ".join(f"{z} {e.watts:.1f} W" for z, e in s.zones.items()))
    for p in s.processes:
        print(f"  pid {p.pid} {p.comm}: {p.watts:.2f} W")
    report["idle_watts"] = {z: round(e.watts, 2) for z, e in s.zones.items()}

    costs = []
    for _ in range(args.collections):
        time.sleep(0.1)
        t0 = time.process_time()
        mon.refresh()
        costs.append(time.process_time() - t0)
    n = len(mon._prev[3]) if mon._prev else 0
    report["collection_ms_mean"] = round(statistics.mean(costs) * 1e3, 3)
    report["processes"] = n
    print(f"collection on real /proc ({n} processes) and real {meter.source}: "
          f"{statistics.mean(costs) * 1e3:.2f} ms CPU mean = {statistics.mean(costs) * 100:.2f} % of a core at 1 s")

    samples = measure(meter, step_s=args.step_seconds, settle_s=args.settle_seconds, sample_s=args.sample_seconds,
                      proc_root=args.proc_root, progress=print)
    with open(args.out / "samples.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["utilization", "watts"])
        for smp in samples:
            w.writerow([f"{smp.utilization:.5f}", f"{smp.watts:.4f}"])
    report["samples"] = len(samples)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
