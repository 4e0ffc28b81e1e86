"""`joulesched workload ...` (serve the apps, render manifests) and `joulesched load ...` (drive load).

Bad input prints one line on stderr and exits 2; a driver that cannot run exits 1.
"""

from __future__ import annotations

import json
import shutil
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from joulesched.pipelines.cli.common import fail as _fail
from joulesched.pipelines.cli.common import float_option
from joulesched.workloads.load.jmeter import DEFAULT_PLAN as JMETER_PLAN
from joulesched.workloads.manifests import APPS as MANIFEST_APPS

workload_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                           rich_markup_mode=None)
load_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                       rich_markup_mode=None)


class App(str, Enum):
    cpu = "cpu"
    memory = "memory"
    disk = "disk"
    network = "network"
    combined = "combined"
    testapp = "testapp"
    shop = "shop"


# The manifests also cover the shop's three services (shop-catalogue, shop-cart, shop-orders).
ManifestApp = Enum("ManifestApp", {a: a for a in MANIFEST_APPS}, type=str)


@workload_app.command()
def serve(
    app: Annotated[App, typer.Argument(help="Which app: a blocker kind, the test app or the shop.")],
    listen: Annotated[str, typer.Option(help="HOST:PORT to bind; port 0 picks a free one (printed on start).")] = "127.0.0.1:8080",
    scratch_dir: Annotated[Optional[Path], typer.Option(help="Where the disk blocker creates its scratch files (default: the temp dir).")] = None,
    db: Annotated[Optional[Path], typer.Option(help="Shop SQLite file (default: a fresh file in the temp dir).")] = None,
    part: Annotated[str, typer.Option(help="Shop service: all (one process), catalogue, cart or orders.")] = "all",
    catalogue_url: Annotated[Optional[str], typer.Option(help="Shop: the catalogue service's URL (cart, orders).")] = None,
    cart_url: Annotated[Optional[str], typer.Option(help="Shop: the cart service's URL (orders).")] = None,
    default_ms: Annotated[float, float_option(help="CPU ms of work the test app's /test does.")] = 10.0,
    access_log: Annotated[bool, typer.Option(help="Log every request to stderr.")] = False,
    net_allow: Annotated[Optional[list[str]], typer.Option(
        "--net-allow", envvar="JOULESCHED_NET_ALLOW",
        help="Blockers: where net_target may point (repeat; IP network, host name or *.suffix). Replaces the "
             "default: 127.0.0.0/8, ::1/128, localhost, *.svc, *.svc.cluster.local. Link-local and metadata "
             "addresses are always refused.")] = None,
) -> None:
    """Serve one app on HOST:PORT until SIGINT/SIGTERM; every running load is stopped on the way out."""
    from joulesched.core.net import parse_listen
    from joulesched.workloads.server import serve as run_server

    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        _fail(str(exc))
    host = _check_can_listen(host, port, listen)  # before any app is built: nothing to undo
    if scratch_dir is not None and not scratch_dir.is_dir():
        _fail(f"--scratch-dir {scratch_dir} is not a directory")
    on_exit: Any = lambda: None
    if app.value == "testapp":
        from joulesched.workloads.testapp import MAX_WORK_MS
        from joulesched.workloads.testapp import create_app as create_testapp

        if not 0 <= default_ms <= MAX_WORK_MS:
            _fail(f"--default-ms must be between 0 and {MAX_WORK_MS}")
        flask_app = create_testapp(default_ms)
    elif app.value == "shop":
        from joulesched.workloads.shop import create_app as create_shop

        for option, url in (("--catalogue-url", catalogue_url), ("--cart-url", cart_url)):
            if url is not None:
                _check_target(url, option)
        try:
            flask_app = create_shop(db, part, catalogue_url, cart_url)
        except ValueError as exc:
            _fail(str(exc))
    else:
        from joulesched.workloads.egress import DEFAULT_ALLOW, EgressError, NetAllow
        from joulesched.workloads.service import BlockerService, create_app

        try:
            allow = NetAllow(net_allow if net_allow else DEFAULT_ALLOW, what="--net-allow")
        except EgressError as exc:
            _fail(str(exc))
        service = BlockerService(app.value, scratch_dir, net_allow=allow)
        flask_app = create_app(service)
        on_exit = service.shutdown
    try:
        run_server(flask_app, host, port, on_exit=on_exit, access_log=access_log)
    except OSError as exc:
        _fail(f"cannot listen on {listen}: {exc.strerror or exc}")


def _check_can_listen(host: str, port: int, listen: str) -> str:
    """Exit 2 when HOST:PORT cannot be bound (in use, an address not on this host, a name that does not
    resolve), as `power exporter` does; return the host to serve on.

    Tried here because werkzeug's server prints its own text and exits 1 when its bind fails. Bound with
    SO_REUSEADDR as werkzeug binds, so a port left in TIME_WAIT passes and one that a listener holds does not.
    A name is bound as werkzeug binds it, IPv4 where it resolves to IPv4 (``localhost`` stays 127.0.0.1 where
    /etc/hosts also gives it ::1); a name that resolves to IPv6 only is served on the IPv6 address it resolved to
    (werkzeug would take it for IPv4)."""
    import socket

    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, address = next((a for a in found if a[0] == socket.AF_INET or ":" in host), found[0])
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as exc:  # socket.gaierror too: a name that does not resolve
        _fail(f"cannot listen on {listen}: {exc.strerror or exc}")
    return str(address[0]) if family == socket.AF_INET6 and ":" not in host else host


def _check_workdir(workdir: Path | None) -> None:
    from joulesched.core.errors import UsageError
    from joulesched.core.fsio import check_output_dir

    if workdir is not None:
        try:
            check_output_dir(workdir, "--workdir")
        except UsageError as exc:
            _fail(str(exc))


def _check_target(url: str, option: str = "--target") -> None:
    from joulesched.workloads.load.results import DriverError, check_target

    try:
        check_target(url, option)
    except DriverError as exc:
        _fail(str(exc))


MaxErrorOpt = Annotated[float, float_option(
    "--max-error-rate", min=0.0, max=1.0,
    help="Exit 1 when more than this share of requests failed (the target is down or overloaded).")]


def _emit(result: Any, as_json: bool, max_error_rate: float = 1.0) -> None:
    from joulesched.workloads.load.results import format_table

    typer.echo(result.model_dump_json(indent=2) if as_json else format_table(result))
    if result.error_rate > max_error_rate:
        _fail(f"{result.error_rate:.0%} of {result.requests} requests failed (more than --max-error-rate "
              f"{max_error_rate:.0%}): is {result.target} up?", code=1)


@load_app.command()
def jmeter(
    target: Annotated[str, typer.Option(help="URL to load, path included, e.g. http://127.0.0.1:8080/work?ms=5.")],
    plan: Annotated[Path, typer.Option(help="JMeter plan taking host/port/protocol/path/threads/rampup/duration properties.")] = JMETER_PLAN,
    threads: Annotated[int, typer.Option(min=1, max=10_000, help="Concurrent JMeter threads.")] = 10,
    rampup: Annotated[int, typer.Option(min=0, max=3600, help="Seconds to start all threads, within --duration.")] = 1,
    duration: Annotated[int, typer.Option(min=1, max=86_400, help="Seconds the thread group runs (then JMeter stops).")] = 10,
    jmeter_bin: Annotated[str, typer.Option("--jmeter", help="JMeter executable (a name on PATH or a path).")] = "jmeter",
    launcher: Annotated[str, typer.Option(help="auto | jmeter | debian-2.13 (see workloads/jmeter/xstream-allow.bsh).")] = "auto",
    workdir: Annotated[Optional[Path], typer.Option(help="Keep results.jtl and jmeter.log here (default: a temp dir, removed).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    max_error_rate: MaxErrorOpt = 0.01,
) -> None:
    """Run JMeter headless against TARGET and report p50/p95/p99 latency, throughput and error rate."""
    from joulesched.workloads.load import jmeter as driver
    from joulesched.workloads.load.results import DriverError

    if launcher not in ("auto", "jmeter", "debian-2.13"):
        _fail(f"--launcher {launcher!r}: expected auto, jmeter or debian-2.13")
    if not plan.is_file():
        _fail(f"--plan {plan} not found")
    if rampup > duration:
        _fail(f"--rampup {rampup} is longer than --duration {duration}: the ramp-up is part of the duration "
              "(threads due after it never start)")
    if shutil.which(jmeter_bin) is None:
        _fail(f"--jmeter {jmeter_bin!r} is not an executable (not found on PATH or not executable); install JMeter "
              "(Debian: apt-get install jmeter jmeter-http) or give its path")
    _check_target(target)
    _check_workdir(workdir)
    try:
        result = driver.run(target, plan=plan, threads=threads, rampup_s=rampup, duration_s=duration,
                            jmeter_bin=jmeter_bin, launcher=launcher, workdir=workdir)  # type: ignore[arg-type]
    except DriverError as exc:
        _fail(str(exc), code=1)
    _emit(result, as_json, max_error_rate)


@load_app.command()
def locust(
    target: Annotated[str, typer.Option(help="URL to load, path included, e.g. http://127.0.0.1:8080/work?ms=5.")],
    users: Annotated[int, typer.Option(min=1, max=10_000, help="Concurrent simulated users.")] = 10,
    spawn_rate: Annotated[float, float_option(min=0.1, max=10_000, help="Users started per second.")] = 10.0,
    duration: Annotated[int, typer.Option(min=1, max=86_400, help="Seconds to run.")] = 10,
    workdir: Annotated[Optional[Path], typer.Option(help="Keep Locust's per-request samples here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    max_error_rate: MaxErrorOpt = 0.01,
) -> None:
    """Run Locust headless against TARGET; same report as `load jmeter`, for machines without Java."""
    from joulesched.workloads.load import locust as driver
    from joulesched.workloads.load.results import DriverError

    _check_target(target)
    _check_workdir(workdir)
    try:
        result = driver.run(target, users=users, spawn_rate=spawn_rate, duration_s=duration, workdir=workdir)
    except DriverError as exc:
        _fail(str(exc), code=1)
    _emit(result, as_json, max_error_rate)


@load_app.command()
def blocker(
    target: Annotated[str, typer.Option(help="Base URL of a running blocker app, e.g. http://127.0.0.1:8080.")],
    duration: Annotated[float, float_option(help="Seconds the load runs.")] = 60.0,
    cpu_m: Annotated[int, typer.Option(help="Millicores to hold busy.")] = 0,
    memory_mib: Annotated[int, typer.Option(help="MiB to allocate and hold.")] = 0,
    disk_read_mbps: Annotated[float, float_option(help="MB/s to read.")] = 0.0,
    disk_write_mbps: Annotated[float, float_option(help="MB/s to write.")] = 0.0,
    net_mbps: Annotated[float, float_option(help="Mbit/s to stream to --net-target.")] = 0.0,
    net_target: Annotated[Optional[str], typer.Option(help="URL that takes the stream, e.g. another blocker's /sink.")] = None,
    wait: Annotated[bool, typer.Option(help="Wait until the load ended and print the final status.")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the running load instead of starting one.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Start a load on a blocker app (only the options given are sent; the app rejects what it cannot do)."""
    from joulesched.workloads.load import blocker as client
    from joulesched.workloads.load.results import DriverError

    _check_target(target)
    given = {"cpu_m": cpu_m, "memory_mib": memory_mib, "disk_read_mbps": disk_read_mbps,
             "disk_write_mbps": disk_write_mbps, "net_mbps": net_mbps, "net_target": net_target}
    if stop:
        # A load described beside --stop would be silently dropped: the user meant one or the other.
        load = [f"--{k.replace('_', '-')}" for k, v in given.items() if v] + (["--duration"] * (duration != 60.0))
        if load:
            _fail(f"--stop stops the running load; {', '.join(load)} describe{'s' * (len(load) == 1)} a load to start")
    try:
        if stop:
            st = client.stop(target)
        else:
            params = {"duration_s": duration} | {k: v for k, v in given.items() if v}
            st = client.start(target, params)
            if wait:
                st = client.wait_idle(target, duration + 30)
    except DriverError as exc:
        _fail(str(exc), code=2 if " 400:" in str(exc) else 1)
    last = st.get("last_run") if wait and not stop and st["state"] == "idle" else None
    line = f"{st['kind']} blocker at {target}: {st['state']}"
    if last is not None:  # how the load ended, as --json shows it: a load cut short must not read as done
        line += f"; the load ended: {last.get('end_reason')} after {last.get('elapsed_s')} s"
        line += "".join(f"; {e}" for e in _load_errors(last, retried_too=True))
    typer.echo(json.dumps(st, indent=2) if as_json else line)
    if wait and not stop:  # `--stop --wait` stops: it waits for nothing
        if last is None:
            _fail(f"{target} has no record of the load it was given (was the app restarted?)", code=1)
        if last.get("end_reason") != BLOCKER_COMPLETED or _load_errors(last):
            _fail("; ".join([f"the load did not run its course: {last.get('end_reason')} after "
                             f"{last.get('elapsed_s')} s of {duration:g}", *_load_errors(last)]), code=1)


#: The blocker app's end_reason of a load that ran its whole --duration (workloads/service.py); the others,
#: "stopped by request", "server shutting down" and "a load failed" (a worker died of an error), cut it short.
BLOCKER_COMPLETED = "duration elapsed"


def _load_errors(run: dict[str, Any], retried_too: bool = False) -> list[str]:
    """``load: error`` for each of a blocker run's loads that an error ended (memory, disk); ``retried_too``
    adds a network load's ``last_error``, a connection that failed and was retried."""
    keys = ("error", "last_error") if retried_too else ("error",)
    return [f"{name}: {stats[k]}" for name, stats in (run.get("loads") or {}).items() for k in keys if stats.get(k)]


@workload_app.command()
def manifest(
    app: Annotated[ManifestApp, typer.Argument(
        metavar="APP", help=f"Which app to render Deployment + Service for: {', '.join(a.value for a in ManifestApp)}.")],
    scheduler_name: Annotated[str, typer.Option(help="spec.schedulerName of the pods.")] = "default-scheduler",
    image: Annotated[Optional[str], typer.Option(help="Container image (default joulesched/<app>:latest).")] = None,
    namespace: Annotated[str, typer.Option(help="Namespace of both objects.")] = "default",
    replicas: Annotated[int, typer.Option(min=0, max=1000)] = 1,
    cpu_request: Annotated[str, typer.Option(help="resources.requests.cpu (default: the app's own)")] = "",
    memory_request: Annotated[str, typer.Option(help="resources.requests.memory (default: the app's own)")] = "",
    cpu_limit: Annotated[str, typer.Option(help="resources.limits.cpu (default: the app's own)")] = "",
    memory_limit: Annotated[str, typer.Option(help="resources.limits.memory (default: the app's own)")] = "",
) -> None:
    """Print the app's Kubernetes Deployment and Service as YAML."""
    from joulesched.workloads.manifests import render_yaml

    try:
        typer.echo(render_yaml(app.value, scheduler_name=scheduler_name, image=image, namespace=namespace,
                               replicas=replicas, cpu_request=cpu_request or None,
                               memory_request=memory_request or None, cpu_limit=cpu_limit or None,
                               memory_limit=memory_limit or None), nl=False)
    except ValueError as exc:
        _fail(str(exc))


if __name__ == "__main__":  # the workload images: `python3 -m joulesched.pipelines.cli.workload serve cpu ...`
    workload_app(prog_name="python3 -m joulesched.pipelines.cli.workload")
