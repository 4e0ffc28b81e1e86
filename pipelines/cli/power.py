"""`joulesched power ...` commands: thin wrappers that resolve options, then call the library.

Bad input prints one red line and exits 2; nothing is written on failure.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from joulesched.pipelines.cli.common import err, errors, float_option, out
from joulesched.pipelines.cli.common import fail as _fail

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


class MeterKind(str, Enum):
    auto = "auto"
    powercap = "powercap"
    msr = "msr"
    model = "model"


class GpuMode(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


PowercapRoot = Annotated[Path, typer.Option(help="Root of the powercap tree (a synthetic tree in tests).")]
ProcRoot = Annotated[Path, typer.Option(help="Root of procfs.")]
DevRoot = Annotated[Path, typer.Option(help="Root of /dev (for /dev/cpu/N/msr).")]
MeterOpt = Annotated[MeterKind, typer.Option(help="Energy source; auto tries powercap, msr, then model.")]
ProfileOpt = Annotated[Optional[Path], typer.Option(
    help="Node profile YAML from `power calibrate`: its power_watts drive the model meter.")]
CurveOpt = Annotated[Optional[str], typer.Option(
    help="A SPECpower curve name for the model meter (see power.curves.SPECPOWER).")]


def _model_curve(profile: Optional[Path], curve: Optional[str]) -> Optional[tuple[float, ...]]:
    from joulesched.power.calibrate import read_profile_curve
    from joulesched.power.curves import SPECPOWER

    if profile is not None and curve is not None:
        _fail("give --profile or --curve, not both")
    if curve is not None:
        if curve not in SPECPOWER:
            _fail(f"--curve {curve!r} is unknown; known: {', '.join(sorted(SPECPOWER))}")
        return SPECPOWER[curve]
    if profile is None:
        return None
    with errors():
        return read_profile_curve(profile)


def _open(meter: MeterKind, powercap_root: Path, proc_root: Path, dev_root: Path,
          curve: Optional[tuple[float, ...]], order: Optional[tuple[str, ...]] = None):
    from joulesched.power.meter import MeterError, MeterUnavailable
    from joulesched.power.meters import open_meter
    from joulesched.power.model import DEFAULT_CURVE_NAME

    kinds = order if (meter is MeterKind.auto and order) else (meter.value,)
    # A file given as the tree is a typo to report, not an absent driver for auto to skip quietly.
    if {"auto", "powercap"} & set(kinds) and powercap_root.exists() and not powercap_root.is_dir():
        _fail(f"--powercap-root {powercap_root} is not a directory (give the powercap tree, /sys/class/powercap)")
    skipped: list[str] = []
    for kind in kinds:
        try:
            choice = open_meter(kind, powercap_root=str(powercap_root), proc_root=str(proc_root),
                                dev_root=str(dev_root), curve=curve)
        except MeterError as e:
            # Walking an explicit order, an absent meter is skipped; anything else (permissions) is the answer.
            if isinstance(e, MeterUnavailable) and len(kinds) > 1:
                skipped.append(f"{kind}: {e}")
                continue
            _fail(str(e))
        for note in (*skipped, *choice.skipped):
            err.print(f"[yellow]note:[/yellow] meter {note}", soft_wrap=True)
        for note in _meter_notes(choice.meter):
            err.print(f"[yellow]note:[/yellow] {choice.meter.source}: {note}", soft_wrap=True)
        if choice.meter.source == "model" and curve is None:
            err.print(f"[yellow]note:[/yellow] model meter uses the uncalibrated {DEFAULT_CURVE_NAME} curve; "
                      "pass --profile from `joulesched power calibrate`", soft_wrap=True)
        return choice.meter
    _fail("no hardware meter works here (" + "; ".join(skipped) + "); use --from-samples with wall-meter "
          "data, or --meter model for a smoke test")


def _meter_notes(m) -> list[str]:
    """What the meter dropped while opening (a powercap zone without a usable counter range, an MMIO duplicate)."""
    return list(getattr(m, "notes", ()))


def _max_interval(m) -> Optional[float]:
    """The longest safe time between two readings of ``m`` (its counters' wrap at a high power), None: no wrap."""
    fn = getattr(m, "max_read_interval_s", None)
    return fn() if fn is not None else None


def _gpu_meter(mode: GpuMode, proc_root: Path = Path("/proc")):
    """The NVML meter for --gpu: None when off, or (auto) when no GPU works here; on: required (exit 2).

    auto on a host whose NVIDIA driver is loaded (``/proc/driver/nvidia``) but whose NVML does not open warns:
    the GPUs go unmetered, most often because the hardened unit's PrivateDevices=yes hides /dev/nvidia*."""
    if mode is GpuMode.off:
        return None
    from joulesched.power.meter import MeterError
    from joulesched.power.nvml import NvmlMeter

    try:
        return NvmlMeter()
    except MeterError as e:
        if mode is GpuMode.on:
            _fail(f"--gpu on: {e}")
        log = logging.getLogger(__name__)
        if (proc_root / "driver" / "nvidia").is_dir():
            log.warning("an NVIDIA driver is loaded (%s) but NVML cannot open, so no GPU energy is exported: %s. "
                        "Under the hardened systemd unit install its GPU drop-in (deploy/systemd/"
                        "joulesched-power-exporter.service.d/gpu.conf): PrivateDevices=yes hides /dev/nvidia*",
                        proc_root / "driver" / "nvidia", e)
        else:
            log.info("no GPU energy: %s", e)
        return None


@app.command()
def exporter(
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve /metrics on. Loopback by default.")]
    = "127.0.0.1:9102",
    interval: Annotated[float, float_option(
        help="Seconds between readings; at most the time a 500 W zone takes to go round half its counter's range "
             "(RAPL: about 260 s).", min=0.05, max=3600.0)] = 1.0,
    powercap_root: PowercapRoot = Path("/sys/class/powercap"),
    proc_root: ProcRoot = Path("/proc"),
    dev_root: DevRoot = Path("/dev"),
    meter: MeterOpt = MeterKind.auto,
    top_n: Annotated[int, typer.Option(
        help="Processes exported, by energy (0: none). Each process is a series of its own (pid, comm), so over time "
             "their number grows without bound: for a look at one host, not for a Prometheus that keeps them.",
        min=0)] = 0,
    profile: ProfileOpt = None,
    curve: CurveOpt = None,
    gpu: Annotated[GpuMode, typer.Option(
        help="GPU energy through NVML (joulesched_node_gpu_joules_total per GPU): auto (when a GPU and its driver "
             "are there), on (required) or off.")] = GpuMode.auto,
) -> None:
    """Serve joulesched_* power metrics to Prometheus (GPUs too, through NVML, where there are any)."""
    from joulesched.core.net import parse_listen
    from joulesched.power.exporter import Exporter
    from joulesched.power.meter import MeterError
    from joulesched.power.monitor import PowerMonitor
    from joulesched.power.units import PEAK_ZONE_WATTS

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        _fail(str(e))
    m = _open(meter, powercap_root, proc_root, dev_root, _model_curve(profile, curve))
    limit = _max_interval(m)
    if limit is not None and interval > limit:
        _fail(f"--interval {interval:g} s is too long for the {m.source} meter: its counters wrap every "
              f"{m.wrap_joules:.0f} J, which {PEAK_ZONE_WATTS:.0f} W goes round in {2 * limit:.0f} s, and two wraps "
              f"between readings look like one; give at most {limit:.0f} s")
    exp = Exporter(PowerMonitor(m, proc_root=str(proc_root), top_n=top_n, gpu_meter=_gpu_meter(gpu, proc_root)),
                   host=host, port=port, interval_s=interval)
    # SIGTERM is a clean stop (exit 0, as systemd expects) from before the first request can be answered: with the
    # handler set after start(), a SIGTERM in between met the CLI's default handler and exited 130.
    signal.signal(signal.SIGTERM, lambda *_: exp.stop())
    try:
        exp.start()  # the baseline reading first, then the socket
    except MeterError as e:
        _fail(f"the first reading failed: {e}")
    except OSError as e:
        _fail(f"cannot listen on {listen}: {e.strerror or e}")
    shown = f"[{host}]" if ":" in host else host  # the bound port: --listen HOST:0 asked for any free one
    err.print(f"serving {m.source} meter zones {', '.join(m.zones)} on http://{shown}:{exp.port}/metrics "
              f"every {interval} s", soft_wrap=True)
    try:
        exp.wait()
    except KeyboardInterrupt:
        pass
    finally:
        exp.stop()  # again after a SIGTERM that came before start(): the server it started is stopped too


@app.command()
def read(
    duration: Annotated[float, float_option(help="Seconds to measure over.", min=0.05, max=86_400.0)] = 10.0,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    powercap_root: PowercapRoot = Path("/sys/class/powercap"),
    proc_root: ProcRoot = Path("/proc"),
    dev_root: DevRoot = Path("/dev"),
    meter: MeterOpt = MeterKind.auto,
    top_n: Annotated[int, typer.Option(help="Processes shown, by energy.", min=0)] = 10,
    profile: ProfileOpt = None,
    curve: CurveOpt = None,
) -> None:
    """Measure for --duration seconds and print watts per zone, VM, pod and top process."""
    from joulesched.power.meter import MeterError
    from joulesched.power.monitor import PowerMonitor

    m = _open(meter, powercap_root, proc_root, dev_root, _model_curve(profile, curve))
    mon = PowerMonitor(m, proc_root=str(proc_root), top_n=top_n)
    try:
        mon.refresh()
    except MeterError as e:  # the first reading: a --proc-root or tree that is not what it should be
        _fail(str(e))
    with errors():  # a counter that fails later: exit 1, one line
        # A long --duration is read in steps inside the counters' wrap period, so every wrap is caught.
        step, slept = _max_interval(m) or duration, 0.0
        while duration - slept > step:
            time.sleep(step)
            slept += step
            m.read()
        time.sleep(duration - slept)
        s = mon.refresh()
    result = {
        "source": s.source,
        "duration_s": round(s.interval_s, 3),
        "cpu_usage_ratio": round(s.usage_ratio, 4),
        "zones": {z: {"watts": round(e.watts, 3), "joules": round(e.joules_total, 3),
                      "active_joules": round(e.active_joules_total, 3)} for z, e in s.zones.items()},
        "primary_zones": list(s.primary_zones),
        "vms": {n: round(e.watts, 3) for n, e in sorted(s.vms.items())},
        "pods": [{"pod_uid": r.pod_uid, "container_id": r.container_id, "watts": round(e.watts, 3)}
                 for r, e in sorted(s.pods.items())],
        "processes": [{"pid": p.pid, "comm": p.comm, "watts": round(p.watts, 3)} for p in s.processes],
        "notes": _meter_notes(m),
    }
    if json_:
        print(json.dumps(result, indent=2))
        return
    out.print(f"source {s.source}, {s.interval_s:.2f} s, CPU usage ratio {s.usage_ratio:.3f}")
    for z, e in s.zones.items():
        primary = " (attributed)" if z in s.primary_zones else ""
        out.print(f"  zone {z:<14} {e.watts:9.2f} W{primary}")
    for n, e in sorted(s.vms.items()):
        out.print(f"  vm   {n:<14} {e.watts:9.2f} W")
    for r, e in sorted(s.pods.items()):
        out.print(f"  pod  {r.pod_uid} {r.container_id[:12] or '-'} {e.watts:9.2f} W")
    for p in s.processes:
        out.print(f"  pid  {p.pid:<7} {p.comm:<15} {p.watts:9.3f} W")


@app.command()
def calibrate(
    out_path: Annotated[Path, typer.Option("--out", help="Node profile YAML to write (atomically).")]
    = Path("node-profile.yaml"),
    from_samples: Annotated[Optional[Path], typer.Option(
        help="Fit recorded samples instead of measuring: CSV with columns utilization (0..1),watts.")] = None,
    step_seconds: Annotated[float, float_option(help="Seconds measured at each 10 % load step.", min=0.05,
                                                    max=3600.0)] = 10.0,
    settle_seconds: Annotated[float, float_option(help="Seconds to wait after each step change.", min=0,
                                                       max=3600.0)] = 2.0,
    sample_seconds: Annotated[float, float_option(help="Seconds per sample within a step.", min=0.05,
                                                      max=3600.0)] = 1.0,
    workers: Annotated[Optional[int], typer.Option(help="Burner processes (default: one per CPU).", min=1)] = None,
    meter: Annotated[MeterKind, typer.Option(
        help="Energy source. auto uses powercap or msr only: calibrating the model against itself is circular."
    )] = MeterKind.auto,
    powercap_root: PowercapRoot = Path("/sys/class/powercap"),
    proc_root: ProcRoot = Path("/proc"),
    dev_root: DevRoot = Path("/dev"),
    name_prefix: Annotated[Optional[str], typer.Option(help="Node group name prefix (default: hostname).")] = None,
    count: Annotated[int, typer.Option(help="Nodes in the group.")] = 1,
    cpu_m: Annotated[Optional[int], typer.Option(min=1, help="Allocatable millicores (default: this host's).")] = None,
    memory_mib: Annotated[Optional[int], typer.Option(min=1, help="Allocatable MiB (default: this host's).")] = None,
    max_pods: Annotated[int, typer.Option(help="Pod limit per node.")] = 110,
    profile: ProfileOpt = None,
    curve: CurveOpt = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the fit (RMSE, MAPE, each knot's watts) and the profile written as JSON on stdout.")]
    = False,
    allow_extrapolation: Annotated[bool, typer.Option(
        help="With --from-samples: fit samples that span under 50 % utilisation or leave more than 2 load steps "
             "unmeasured (refused with exit 2 otherwise); those steps continue the fitted line and are flagged.")]
    = False,
) -> None:
    """Fit an 11-point power curve (0..100 % CPU) and write it as a node group scenarios can include."""
    import socket

    from joulesched.core.fsio import check_output_file
    from joulesched.power.calibrate import (
        CalibrationError,
        fit_curve,
        host_facts,
        measure,
        node_group,
        read_samples_csv,
        write_profile,
    )

    with errors():
        check_output_file(out_path, "--out", inputs=[from_samples] if from_samples else [])  # before measuring
    if from_samples is not None and (profile is not None or curve is not None):
        _fail("--profile and --curve choose the model meter's curve for a measurement; --from-samples measures "
              "nothing (they were silently ignored)")
    facts = host_facts(str(proc_root))
    # The group as a scenario will read it, checked before minutes of measuring (a profile of 10,000,000 nodes
    # was written, exit 0, and refused by every scenario that included it).
    from pydantic import ValidationError

    from joulesched.cluster.scenario import NodeGroup
    from joulesched.core.errors import validation_summary
    try:
        NodeGroup.model_validate({"name_prefix": name_prefix or str(facts["name_prefix"]), "count": count,
                                  "max_pods": max_pods,
                                  "cpu_m": int(facts["cpu_m"]) if cpu_m is None else cpu_m,
                                  "memory_mib": int(facts["memory_mib"]) if memory_mib is None else memory_mib,
                                  "power_watts": "hp-ml110-g5"})
    except ValidationError as e:
        _fail(f"the node group would be refused by a scenario: {validation_summary(e)}")
    try:
        if from_samples is not None:
            samples = read_samples_csv(from_samples)
            origin = f"samples from {from_samples}"
        else:
            m = _open(meter, powercap_root, proc_root, dev_root, _model_curve(profile, curve),
                      order=("powercap", "msr"))
            if m.source == "model":
                err.print("[yellow]note:[/yellow] calibrating the model meter against itself only reproduces "
                          "its curve; use it as a smoke test", soft_wrap=True)
            samples = measure(m, step_s=step_seconds, settle_s=settle_seconds, sample_s=sample_seconds,
                              workers=workers, proc_root=str(proc_root), progress=lambda s: err.print(s))
            origin = f"{m.source} meter on {socket.gethostname()}, {step_seconds:g} s per step"
        # A live run steps the burner through 0..100 % itself: what other load keeps it from reaching is flagged
        # (the note below), not refused after minutes of measuring.
        fit = fit_curve(samples, allow_extrapolation=allow_extrapolation or from_samples is None)
        group = node_group(fit, name_prefix=name_prefix or str(facts["name_prefix"]), count=count,
                           cpu_m=int(facts["cpu_m"]) if cpu_m is None else cpu_m,
                           memory_mib=int(facts["memory_mib"]) if memory_mib is None else memory_mib,
                           max_pods=max_pods)
        header = (f"Node profile written by `joulesched power calibrate` at "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}.\nSource: {origin}.\n{fit.summary()}.\n"
                  f"Include it in a scenario as: nodes: [{{include: {out_path.name}, count: N}}]")
        write_profile(out_path, group, header)
    except CalibrationError as e:
        _fail(str(e))
    if not as_json:
        out.print(fit.summary())
    if fit.unsupported_knots and from_samples is None:
        err.print("[yellow]note:[/yellow] no sample reached some load steps, so their watts are extrapolated; "
                  "other load on the host moves utilisation: calibrate on an otherwise idle host", soft_wrap=True)
    if as_json:
        print(json.dumps({
            "profile": str(out_path), "source": origin, "samples": fit.samples, "rmse_w": round(fit.rmse_w, 4),
            "mape_pct": round(fit.mape_pct, 4), "max_abs_w": round(fit.max_abs_w, 4),
            # Knot k is at k * 10 % utilisation; extrapolated: no sample came within 5 % of it.
            "knots": [{"utilization_pct": k * 10, "watts": w, "extrapolated": k in fit.unsupported_knots}
                      for k, w in enumerate(group["power_watts"])],
            "node_group": group}, indent=2))
        return
    out.print(f"wrote {out_path}: power_watts {group['power_watts']}")
