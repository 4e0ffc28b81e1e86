"""The `serve` and `extender` commands, as plain typer-annotated functions.

Register them on the root app with ``app.command("serve")(serve)`` and ``app.command("extender")(extender)``.
Both also run standalone: ``python -m pipelines.serve_cli serve --help``.

Settings are resolved once, in this order: command-line options, then built-in defaults. Every input is
checked before anything starts (policy spec, kubeconfig, listen address, Prometheus URL, power profiles);
a bad one prints one red line and exits with code 2.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Optional

import typer
from rich.console import Console

from cluster.kube.metrics_feed import DEFAULT_CPU_QUERY, DEFAULT_POWER_QUERY

err = Console(stderr=True)
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class ServeInputError(ValueError):
    """A bad option value of `serve` or `extender`."""


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) into (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ServeInputError(f"--listen {listen!r} must be HOST:PORT, e.g. 127.0.0.1:8888")
    return host.strip("[]"), int(port)


def _check_url(url: str) -> str:
    if url and not (url.startswith("http://") or url.startswith("https://")):
        raise ServeInputError(f"--prometheus {url!r} must be an http:// or https:// URL")
    return url.rstrip("/")


@contextmanager
def _usage_errors() -> Iterator[None]:
    from agent.policy import PolicyError
    from cluster.kube.client import KubeConfigError
    from cluster.kube.objects import ObjectError

    try:
        yield
    except (ServeInputError, PolicyError, KubeConfigError, ObjectError) as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as e:  # the listen port is taken, or not ours to bind
        err.print(f"[red]error:[/red] cannot listen: {e.strerror or e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _wait_for_signal(stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def _default_namespace() -> str:
    try:
        with open(SA_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or "joulesched"
    except OSError:
        return "joulesched"


def _build_backend(kubeconfig: Optional[str], context: Optional[str], prometheus: str, cpu_query: str,
                   power_query: str, node_label: str, power_profiles: Optional[str], interval_s: float):
    from cluster.kube.backend import KubeBackend
    from cluster.kube.client import load_api_client
    from cluster.kube.metrics_feed import FeedConfig
    from cluster.kube.objects import CurveResolver, load_profiles

    feed = FeedConfig(url=_check_url(prometheus or ""), cpu_query=cpu_query, power_query=power_query,
                      node_label=node_label, interval_s=interval_s)
    curves = CurveResolver(load_profiles(power_profiles) if power_profiles else None)
    api = load_api_client(kubeconfig, context)
    return KubeBackend(api, curves=curves, feed=feed)


def _logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


PolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="Policy NAME, NAME:key=value,... or dqn=MODEL.")]
KubeconfigOpt = Annotated[Optional[str], typer.Option(
    "--kubeconfig", help="Kubeconfig file. Default: in-cluster service account, else $KUBECONFIG or ~/.kube/config.")]
ContextOpt = Annotated[Optional[str], typer.Option(
    "--context", help="Kubeconfig context to use. Default: the kubeconfig's current context.")]
PrometheusOpt = Annotated[Optional[str], typer.Option(
    "--prometheus", help="Prometheus URL for node CPU usage and watts. Without it (or while it is down) usage "
                         "is request-based.")]
CpuQueryOpt = Annotated[str, typer.Option("--cpu-query", help="PromQL: CPU busy fraction 0..1 per node.")]
PowerQueryOpt = Annotated[str, typer.Option("--power-query", help="PromQL: watts per node.")]
NodeLabelOpt = Annotated[str, typer.Option("--node-label", help="Series label holding the node name.")]
ProfilesOpt = Annotated[Optional[str], typer.Option(
    "--power-profiles", help="YAML file of power curves (name: [11 watts]); mount a ConfigMap here in a cluster.")]
IntervalOpt = Annotated[float, typer.Option("--metrics-interval", min=1.0, help="Seconds between Prometheus queries.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the policy's tie breaks.")]
LogOpt = Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")]


def serve(
    scheduler_name: Annotated[str, typer.Option("--scheduler-name", help="Schedule pods whose spec.schedulerName is this.")] = "joulesched",
    policy: PolicyOpt = "default-k8s",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    prometheus: PrometheusOpt = None,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT of /metrics and /healthz.")] = "127.0.0.1:10259",
    leader_elect: Annotated[bool, typer.Option("--leader-elect/--no-leader-elect",
                                               help="Elect a leader with a Lease (needed with several replicas).")] = True,
    lease_namespace: Annotated[Optional[str], typer.Option(
        "--lease-namespace", help="Namespace of the leader Lease. Default: the pod's namespace, else joulesched.")] = None,
    bind_workers: Annotated[int, typer.Option("--bind-workers", min=1, max=64, help="Binding requests in flight.")] = 4,
    cpu_query: CpuQueryOpt = DEFAULT_CPU_QUERY,
    power_query: PowerQueryOpt = DEFAULT_POWER_QUERY,
    node_label: NodeLabelOpt = "node",
    power_profiles: ProfilesOpt = None,
    metrics_interval: IntervalOpt = 15.0,
    seed: SeedOpt = 0,
    log_level: LogOpt = "info",
) -> None:
    """Run POLICY as a secondary scheduler: bind pending pods whose schedulerName matches, until SIGTERM."""
    _run_serve(scheduler_name=scheduler_name, policy=policy, kubeconfig=kubeconfig, context=context,
               prometheus=prometheus, listen=listen, leader_elect=leader_elect, lease_namespace=lease_namespace, bind_workers=bind_workers,
               cpu_query=cpu_query, power_query=power_query, node_label=node_label, power_profiles=power_profiles,
               metrics_interval=metrics_interval, seed=seed, log_level=log_level)


def _run_serve(*, scheduler_name: str, policy: str, kubeconfig: Optional[str], prometheus: Optional[str],
               context: Optional[str] = None,
               listen: str, leader_elect: bool, lease_namespace: Optional[str], bind_workers: int, cpu_query: str,
               power_query: str, node_label: str, power_profiles: Optional[str], metrics_interval: float, seed: int,
               log_level: str, stop: threading.Event | None = None) -> None:
    from agent.policy import make_policy
    from pipelines.serve import Scheduler, ServeConfig, StatusServer

    with _usage_errors():
        if not scheduler_name.strip():
            raise ServeInputError("--scheduler-name must not be empty")
        host, port = parse_listen(listen)
        pol = make_policy(policy)
        backend = _build_backend(kubeconfig, context, prometheus or "", cpu_query, power_query, node_label,
                                 power_profiles, metrics_interval)
        cfg = ServeConfig(scheduler_name=scheduler_name, seed=seed, leader_elect=leader_elect,
                          lease_namespace=lease_namespace or _default_namespace(), bind_workers=bind_workers)
        sched = Scheduler(backend, pol, cfg)
        status = StatusServer(sched.registry, sched.healthy, host, port)
    _logging(log_level)
    logging.getLogger("joulesched.serve").info(
        "scheduler %s: policy %s, identity %s, leader election %s, metrics on http://%s:%d/metrics",
        scheduler_name, policy, cfg.identity, "on" if leader_elect else "off", host, status.port)
    status.start()
    sched.start()
    try:
        _wait_for_signal(stop)
    finally:
        sched.stop()
        status.stop()


def extender(
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to serve /filter and /prioritize on.")] = "127.0.0.1:8888",
    policy: PolicyOpt = "default-k8s",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    prometheus: PrometheusOpt = None,
    cpu_query: CpuQueryOpt = DEFAULT_CPU_QUERY,
    power_query: PowerQueryOpt = DEFAULT_POWER_QUERY,
    node_label: NodeLabelOpt = "node",
    power_profiles: ProfilesOpt = None,
    metrics_interval: IntervalOpt = 15.0,
    seed: SeedOpt = 0,
    log_level: LogOpt = "info",
) -> None:
    """Serve POLICY as a kube-scheduler extender (POST /filter, /prioritize; extender v1 JSON), until SIGTERM."""
    _run_extender(listen=listen, policy=policy, kubeconfig=kubeconfig, context=context, prometheus=prometheus,
                  cpu_query=cpu_query,
                  power_query=power_query, node_label=node_label, power_profiles=power_profiles,
                  metrics_interval=metrics_interval, seed=seed, log_level=log_level)


def _run_extender(*, listen: str, policy: str, kubeconfig: Optional[str], prometheus: Optional[str], cpu_query: str,
                  context: Optional[str] = None,
                  power_query: str, node_label: str, power_profiles: Optional[str], metrics_interval: float,
                  seed: int, log_level: str, stop: threading.Event | None = None) -> None:
    from agent.policy import make_policy
    from pipelines.extender import Extender, ExtenderServer

    with _usage_errors():
        host, port = parse_listen(listen)
        pol = make_policy(policy)
        backend = _build_backend(kubeconfig, context, prometheus or "", cpu_query, power_query, node_label,
                                 power_profiles, metrics_interval)
        ext = Extender(backend, pol, seed=seed)
        server = ExtenderServer(ext, host, port)
    _logging(log_level)
    logging.getLogger("joulesched.extender").info("extender: policy %s on http://%s:%d", policy, host, server.port)
    backend.start()
    server.start()
    try:
        _wait_for_signal(stop)
    finally:
        server.stop()
        backend.stop()


def _standalone() -> typer.Typer:
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
    app.command("serve")(serve)
    app.command("extender")(extender)
    return app


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _standalone()()
