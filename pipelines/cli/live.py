"""`joulesched serve` and `joulesched extender`: typer signatures over :mod:`joulesched.live.daemon`.

Settings are resolved once, in this order: command-line options, then built-in defaults. Every input is
checked before anything starts; a bad one prints one red line and exits 2.
"""

from __future__ import annotations

import threading
from typing import Annotated, Optional

import typer

from joulesched.cluster.kube.metrics_feed import DEFAULT_CPU_QUERY, DEFAULT_POWER_QUERY
from joulesched.pipelines.cli.common import errors

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
SeedOpt = Annotated[int, typer.Option("--seed", min=0, help="Seed of the policy's tie breaks.")]
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
    run_serve(scheduler_name=scheduler_name, policy=policy, listen=listen, leader_elect=leader_elect,
              lease_namespace=lease_namespace, bind_workers=bind_workers, seed=seed, log_level=log_level,
              cache=dict(kubeconfig=kubeconfig, context=context, prometheus=prometheus or "", cpu_query=cpu_query,
                         power_query=power_query, node_label=node_label, power_profiles=power_profiles,
                         metrics_interval=metrics_interval))


def run_serve(*, log_level: str = "info", stop: threading.Event | None = None, cache: dict, **options) -> None:
    """The body of ``serve`` (``stop`` ends it without a signal, for tests)."""
    from joulesched.live.daemon import CacheOptions, SchedulerDaemon, configure_logging, wait_for_signal

    with errors():
        daemon = SchedulerDaemon(cache=CacheOptions(**cache), **options)
    configure_logging(log_level)
    with daemon:
        wait_for_signal(stop)


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
    run_extender(listen=listen, policy=policy, seed=seed, log_level=log_level,
                 cache=dict(kubeconfig=kubeconfig, context=context, prometheus=prometheus or "",
                            cpu_query=cpu_query, power_query=power_query, node_label=node_label,
                            power_profiles=power_profiles, metrics_interval=metrics_interval))


def run_extender(*, log_level: str = "info", stop: threading.Event | None = None, cache: dict, **options) -> None:
    """The body of ``extender`` (``stop`` ends it without a signal, for tests)."""
    from joulesched.live.daemon import CacheOptions, ExtenderDaemon, configure_logging, wait_for_signal

    with errors():
        daemon = ExtenderDaemon(cache=CacheOptions(**cache), **options)
    configure_logging(log_level)
    with daemon:
        wait_for_signal(stop)
