"""`joulesched serve`, `joulesched extender` and `joulesched node-power`: typer signatures over
:mod:`joulesched.live.daemon` and :mod:`joulesched.live.nodepower`.

Settings are resolved once, in this order: command-line options, then built-in defaults. Every input is
checked before anything starts; a bad one prints one red line and exits 2.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from joulesched.cluster.kube.metrics_feed import DEFAULT_CPU_QUERY, DEFAULT_POWER_QUERY
from joulesched.cluster.nodepower import DEFAULT_SLEEP_WATTS, DEFAULT_WAKE_S
from joulesched.pipelines.cli.common import errors, float_option

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
EnergySourceOpt = Annotated[str, typer.Option(
    "--energy-source", help="Where node watts come from: joulesched (--power-query) or kepler (Kepler 0.11's "
                            "package+DRAM, GPU and platform metrics; docs/power.md).")]
ProfilesOpt = Annotated[Optional[str], typer.Option(
    "--power-profiles", help="YAML file of power curves (name: [11 watts]); mount a ConfigMap here in a cluster.")]
IntervalOpt = Annotated[float, float_option("--metrics-interval", min=1.0, help="Seconds between Prometheus queries.")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, help="Seed of the policy's tie breaks.")]
LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_level(value: str) -> str:
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.lower()


LogOpt = Annotated[str, typer.Option("--log-level", callback=_log_level, help="debug, info, warning or error.")]
# The node power controller's options, shared by `node-power` and `serve --node-power`.
ActuatorOpt = Annotated[str, typer.Option(
    "--actuator", help="How nodes are powered: none (cordon only), auto (by each node's power address: its "
                       "--addresses entry, or an annotation --allow-annotated admits), libvirt, redfish, ipmi, wol, aws, metal3 (BareMetalHost spec.online), rufio "
                       "(Tinkerbell Machine power Jobs).")]
SleepAfterOpt = Annotated[float, float_option("--sleep-after", min=0.0, help="Seconds a node must be empty "
                                              "(mirror pods and pods of a DaemonSet that selects them do not count) before it sleeps.")]
MinAwakeOpt = Annotated[int, typer.Option("--min-awake", min=0, help="Nodes that always stay awake.")]
SpareCpuOpt = Annotated[int, typer.Option("--spare-cpu", min=0, help="Free requested millicores the awake nodes "
                                          "keep among them.")]
ConsolidateOpt = Annotated[bool, typer.Option("--consolidate/--no-consolidate", help="Evict the pods of an "
                                              "under-used node when they all fit elsewhere, so that it can sleep.")]
CredentialsOpt = Annotated[Optional[str], typer.Option(
    "--credentials", help="BMC logins (Redfish, IPMI): a YAML file or a mounted Secret; never on the command line.")]
AddressesOpt = Annotated[Optional[str], typer.Option(
    "--addresses", help="YAML map of node name to power address, or a mounted ConfigMap (a key per node): "
                        "authoritative, it wins over a node's joulesched.io/power annotation; read again when it "
                        "changes.")]
LibvirtUriOpt = Annotated[str, typer.Option("--libvirt-uri", help="libvirt connection of the libvirt actuator "
                                             "(+tcp and no_verify=1 need --allow-libvirt-insecure).")]
AllowAnnotatedOpt = Annotated[Optional[list[str]], typer.Option(
    "--allow-annotated", help="SCHEME=PATTERN (repeatable): let a node's own joulesched.io/power annotation name "
    "this target: redfish/ipmi/wol=HOST, HOST:PORT or CIDR (wol: the SSH host and the broadcast address), "
    "aws=INSTANCE-ID or * (must also match spec.providerID), libvirt=DOMAIN or * (must be the node's name), "
    "metal3/rufio=NAMESPACE or * (the object must carry the node's name). "
    "Default: none; the --addresses map is always used.")]
NodeSleepWattsOpt = Annotated[Optional[float], float_option(
    "--node-sleep-watts", min=0.0, help="Where a node power controller puts idle nodes to sleep (--node-power here, "
    "or a node-power Deployment): a sleeping node's watts. The policy then sees a cluster that sleeps, as the twin "
    "trains and measures it (the DQN's sleep-saving and wake-time columns, empty=asleep). Default: the node power "
    "controller's estimate (10 W) with --node-power, else nodes never sleep.")]
NodeWakeOpt = Annotated[float, float_option("--node-wake-s", min=0.0, help="Seconds a sleeping node takes to wake "
                                            "(with --node-sleep-watts or --node-power).")]
AllowRedfishHttpOpt = Annotated[bool, typer.Option("--allow-redfish-http", help="Accept redfish+http:// addresses "
                                                   "(the BMC login travels unencrypted).")]
AllowLibvirtInsecureOpt = Annotated[bool, typer.Option(
    "--allow-libvirt-insecure", help="Accept a --libvirt-uri that is unencrypted (qemu+tcp://) or skips checking "
    "the peer (no_verify=1, known_hosts_verify=ignore).")]
ConsolidateIntervalOpt = Annotated[float, float_option("--consolidate-interval", min=1.0,
                                                       help="Seconds between consolidation rounds.")]
MaxEvictionsOpt = Annotated[int, typer.Option("--max-evictions-per-hour", min=0,
                                              help="Eviction budget over any sliding hour.")]
RestartOpt = Annotated[float, float_option("--restart-s", min=0.0, help="Predicted cost of restarting one evicted "
                                           "pod, in seconds at its request.")]
HorizonOpt = Annotated[float, float_option("--horizon-s", min=0.0, help="Seconds a consolidation's saving is "
                                           "counted for against that cost.")]
DisruptionBudgetOpt = Annotated[Optional[list[str]], typer.Option(
    "--disruption-budget", help="NODES or 'NODES;CRON;DURATION' (repeatable; Karpenter's budgets): at most "
    "NODES (3 or 10%) nodes emptied at once, only in the cron window (UTC) if given, e.g. '0;0 9 * * "
    "1-5;8h' stops consolidation in office hours.")]
BalancedOpt = Annotated[float, float_option("--balanced", min=0.0, help="Consolidate only when the savings "
                                            "fraction over the disruption fraction is at least this (Karpenter's "
                                            "Balanced: 0.5; 0 = off).")]
WakeTimeoutOpt = Annotated[float, float_option("--wake-timeout", min=1.0, help="Seconds a woken node has to turn "
                                               "Ready before the next node is tried.")]
MaxSleepsOpt = Annotated[int, typer.Option(
    "--max-sleeps-per-hour", min=0, help="At most this many sleeps started over any sliding hour (0 = no limit): "
    "bounds how many machines a misconfiguration can switch off, and power cycles. Idle nodes and the autoscaler "
    "provider's sleeps wait for room; a resumed sleep and a node consolidation emptied count but go ahead.")]
RedfishCaOpt = Annotated[Optional[str], typer.Option("--redfish-ca", help="CA bundle for BMC certificates "
                                                     "(default: the system store; never unverified).")]
ForceOffOpt = Annotated[bool, typer.Option("--force-off/--no-force-off", help="Allow a hard power-off when a "
                                           "graceful one does not finish (Redfish, IPMI).")]
SshKeyOpt = Annotated[Optional[str], typer.Option("--ssh-key", help="Key file for the wol actuator's SSH.")]
KnownHostsOpt = Annotated[Optional[str], typer.Option("--known-hosts", help="Pinned host keys for the wol "
                                                      "actuator's SSH (default ~/.ssh/known_hosts).")]
SshUserOpt = Annotated[str, typer.Option("--ssh-user", help="SSH user of the wol actuator.")]
SuspendCommandOpt = Annotated[str, typer.Option("--suspend-command", help="What the wol actuator runs on the "
                                                "host to sleep.")]
AwsRegionOpt = Annotated[Optional[str], typer.Option("--aws-region", help="EC2 region (default: boto3's).")]
AwsEndpointOpt = Annotated[Optional[str], typer.Option("--aws-endpoint", help="EC2 endpoint URL.")]


#: The node power controller's options beyond those each command declares itself, shared by `node-power` and
#: `serve --node-power` (:func:`_with_power_options`): name -> (annotation, default).
_POWER_OPTIONS: dict[str, tuple[Any, Any]] = {
    "consolidate_interval": (ConsolidateIntervalOpt, 300.0), "max_evictions_per_hour": (MaxEvictionsOpt, 60),
    "restart_s": (RestartOpt, 30.0), "horizon_s": (HorizonOpt, 3600.0),
    "disruption_budget": (DisruptionBudgetOpt, None),
    "balanced": (BalancedOpt, 0.0), "wake_timeout": (WakeTimeoutOpt, 600.0), "max_sleeps_per_hour": (MaxSleepsOpt, 60),
    "redfish_ca": (RedfishCaOpt, None), "force_off": (ForceOffOpt, True), "ssh_key": (SshKeyOpt, None),
    "known_hosts": (KnownHostsOpt, None), "ssh_user": (SshUserOpt, "root"),
    "suspend_command": (SuspendCommandOpt, "systemctl suspend"), "aws_region": (AwsRegionOpt, None),
    "aws_endpoint": (AwsEndpointOpt, None),
}


def _with_power_options(fn: Callable) -> Callable:
    """Give ``fn`` (which takes ``**shared``) the options of :data:`_POWER_OPTIONS` too, for typer: one
    definition for both commands."""
    kw = inspect.Parameter.KEYWORD_ONLY
    base = inspect.signature(fn, eval_str=True)
    own = [p.replace(kind=kw) for p in base.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    extra = [inspect.Parameter(n, kw, default=d, annotation=a) for n, (a, d) in _POWER_OPTIONS.items()]
    fn.__signature__ = base.replace(parameters=own + extra)  # type: ignore[attr-defined]
    return fn


def _power_options(*, consolidate_interval, max_evictions_per_hour, restart_s, horizon_s, disruption_budget,
                   balanced, wake_timeout, max_sleeps_per_hour, redfish_ca, force_off, ssh_key, known_hosts,
                   ssh_user, suspend_command, aws_region, aws_endpoint) -> dict:
    """:data:`_POWER_OPTIONS`' values as :func:`_node_power_daemon` takes them."""
    return dict(consolidation=dict(consolidate_interval_s=consolidate_interval,
                                   max_evictions_per_hour=max_evictions_per_hour, restart_s=restart_s,
                                   horizon_s=horizon_s, budgets=disruption_budget or [], balanced_k=balanced),
                wake_timeout_s=wake_timeout, max_sleeps_per_hour=max_sleeps_per_hour,
                actuator_options=dict(redfish_ca=redfish_ca, force_off=force_off, ssh_key=ssh_key,
                                      known_hosts=known_hosts, ssh_user=ssh_user, suspend_command=suspend_command,
                                      aws_region=aws_region, aws_endpoint=aws_endpoint))


@_with_power_options
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
    batch: Annotated[int, typer.Option("--batch", min=1, max=64, help="At most this many pods decided in a row "
                                       "under one hold of the cache lock, while pods are ready and binding "
                                       "slots free (1: the lock is taken and released per pod).")] = 8,
    event_writer: Annotated[str, typer.Option(
        "--event-writer",
        help="Where Events and PodScheduled conditions are written from: a helper process (so that the decisions "
        "keep the interpreter lock) or threads of the scheduler's own process.")] = "process",
    sample_pct: Annotated[Optional[int], typer.Option(
        "--sample-pct", min=0, max=100, help="percentageOfNodesToScore for policies that do not sample themselves "
        "(dqn, sleep-aware): 0 = kube's adaptive percentage. Default: they see every feasible node.")] = None,
    cpu_query: CpuQueryOpt = DEFAULT_CPU_QUERY,
    power_query: PowerQueryOpt = DEFAULT_POWER_QUERY,
    node_label: NodeLabelOpt = "node",
    energy_source: EnergySourceOpt = "joulesched",
    power_profiles: ProfilesOpt = None,
    metrics_interval: IntervalOpt = 15.0,
    seed: SeedOpt = 0,
    log_level: LogOpt = "info",
    node_power: Annotated[bool, typer.Option("--node-power/--no-node-power", help="Also run the node power "
                                             "controller (on this scheduler's cache and Lease identity, under the "
                                             "joulesched-node-power Lease a node-power Deployment also uses): idle "
                                             "nodes sleep, pending pods wake them.")] = False,
    actuator: ActuatorOpt = "none",
    sleep_after: SleepAfterOpt = 300.0,
    min_awake: MinAwakeOpt = 1,
    spare_cpu: SpareCpuOpt = 0,
    consolidate: ConsolidateOpt = False,
    credentials: CredentialsOpt = None,
    addresses: AddressesOpt = None,
    libvirt_uri: LibvirtUriOpt = "qemu:///system",
    allow_annotated: AllowAnnotatedOpt = None,
    allow_redfish_http: AllowRedfishHttpOpt = False,
    allow_libvirt_insecure: AllowLibvirtInsecureOpt = False,
    node_sleep_watts: NodeSleepWattsOpt = None,
    node_wake_s: NodeWakeOpt = DEFAULT_WAKE_S,
    **shared: Any,
) -> None:
    """Run POLICY as a secondary scheduler: bind pending pods whose schedulerName matches, until SIGTERM."""
    shared = {n: shared.get(n, d) for n, (_, d) in _POWER_OPTIONS.items()}  # (a direct call may leave some out)
    power = dict(actuator=actuator, sleep_after=sleep_after, min_awake=min_awake, spare_cpu=spare_cpu,
                 consolidate=consolidate, credentials=credentials, addresses=addresses,
                 libvirt_uri=libvirt_uri, allow_annotated=allow_annotated or [],
                 allow_redfish_http=allow_redfish_http, allow_libvirt_insecure=allow_libvirt_insecure, **shared)
    if not node_power:
        _refuse_node_power_options(power)
    elif node_sleep_watts is None:
        node_sleep_watts = DEFAULT_SLEEP_WATTS
    run_serve(scheduler_name=scheduler_name, policy=policy, listen=listen, leader_elect=leader_elect,
              lease_namespace=lease_namespace, bind_workers=bind_workers, batch=batch, event_writer=event_writer,
              sample_pct=sample_pct,
              seed=seed, log_level=log_level,
              cache=dict(kubeconfig=kubeconfig, context=context, prometheus=prometheus or "", cpu_query=cpu_query,
                         power_query=power_query, node_label=node_label, power_profiles=power_profiles,
                         metrics_interval=metrics_interval, energy_source=energy_source,
                         sleep_watts=node_sleep_watts, wake_s=node_wake_s),
              # (the controller's joules-saved and wake choices use the draw the scheduler is told of)
              node_power={**_node_power_args(power), "sleep_watts": node_sleep_watts} if node_power else None)


def _node_power_args(power: dict) -> dict:
    """``serve``'s node power options as :func:`_node_power_daemon` takes them."""
    shared = {k: power.pop(k) for k in list(power) if k in inspect.signature(_power_options).parameters}
    return {**power, **_power_options(**shared)}


def _refuse_node_power_options(power: dict) -> None:
    """``serve`` without ``--node-power``: an option of the controller given anyway would do nothing; say so."""
    from joulesched.core.errors import UsageError

    params = inspect.signature(serve).parameters
    given = [k for k, v in power.items() if v != (params[k].default if k != "allow_annotated" else [])]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        with errors():
            raise UsageError(f"{flags}: options of the node power controller; add --node-power (or run "
                             "`joulesched node-power`)")


def _node_power_daemon(*, actuator: str, sleep_after: float, min_awake: int, spare_cpu: int, consolidate: bool,
                       credentials, addresses, libvirt_uri: str, allow_libvirt_insecure: bool = False, **kw):
    from joulesched.cluster.nodepower import PowerPolicy, parse_budget
    from joulesched.core.errors import UsageError
    from joulesched.live.nodepower import NodePowerDaemon

    cons = dict(kw.pop("consolidation", {}))
    try:
        cons["budgets"] = tuple(parse_budget(b) for b in cons.get("budgets", ()))
        policy = PowerPolicy(sleep_after_s=sleep_after, min_awake=min_awake, spare_cpu_m=spare_cpu,
                             consolidate=consolidate, **cons)
    except ValueError as e:
        raise UsageError(f"--disruption-budget/--balanced: {e}") from None
    # The metal3 and rufio actuators write custom objects: on serve's connection, else the same kubeconfig.
    kube = ({"kube_api": kw["cache"].api} if kw.get("cache") is not None
            else {"kubeconfig": kw.get("kubeconfig"), "kube_context": kw.get("context")})
    return NodePowerDaemon(actuator=actuator, policy=policy, credentials=credentials, addresses=addresses,
                           actuator_options={"libvirt_uri": libvirt_uri,
                                             "allow_libvirt_insecure": allow_libvirt_insecure,
                                             **kube, **kw.pop("actuator_options", {})},
                           **kw)


def run_serve(*, log_level: str = "info", stop: threading.Event | None = None, cache: dict,
              node_power: dict | None = None, **options) -> None:
    """The body of ``serve`` (``stop`` ends it without a signal, for tests). With ``node_power`` the node
    power controller runs beside the scheduler, on the scheduler's connection and Lease."""
    from joulesched.live.daemon import CacheOptions, SchedulerDaemon, configure_logging, wait_for_signal

    with errors():
        daemon = SchedulerDaemon(cache=CacheOptions(**cache), **options)
        power = None
        if node_power is not None:  # the scheduler's cache and Lease identity; the node power Lease
            power = _node_power_daemon(**node_power, cache=daemon.cache, identity=daemon.cfg.identity,
                                       leader_elect=daemon.cfg.leader_elect, scheduler_name=daemon.cfg.scheduler_name,
                                       lease_namespace=daemon.cfg.lease_namespace, status=False)
    configure_logging(log_level)
    with daemon:
        if power is None:
            wait_for_signal(stop)
        else:
            with power:
                wait_for_signal(stop)


@_with_power_options
def node_power(
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    actuator: ActuatorOpt = "none",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Log every action it would take; change nothing "
                                          "(no node, Event or Lease is written).")] = False,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT of /metrics, /healthz and /readyz.")] =
        "127.0.0.1:10262",
    leader_elect: Annotated[bool, typer.Option("--leader-elect/--no-leader-elect",
                                               help="Elect a leader with a Lease (needed with several replicas).")] = True,
    lease_namespace: Annotated[Optional[str], typer.Option(
        "--lease-namespace", help="Namespace of the Lease. Default: the pod's namespace, else joulesched.")] = None,
    sleep_after: SleepAfterOpt = 300.0,
    min_awake: MinAwakeOpt = 1,
    spare_cpu: SpareCpuOpt = 0,
    consolidate: ConsolidateOpt = False,
    resync: Annotated[float, float_option("--resync", min=0.05, help="Seconds between reconciles "
                                          "(informer events also trigger one).")] = 5.0,
    sleep_watts: Annotated[float, float_option("--sleep-watts", min=0.0, help="Estimated draw of a sleeping node, "
                                               "for the joules-saved metric.")] = 10.0,
    scheduler_name: Annotated[str, typer.Option("--scheduler-name", help="Pods of this scheduler wake the node it "
                                                "nominates.")] = "joulesched",
    credentials: CredentialsOpt = None,
    addresses: AddressesOpt = None,
    power_profiles: ProfilesOpt = None,
    libvirt_uri: LibvirtUriOpt = "qemu:///system",
    allow_annotated: AllowAnnotatedOpt = None,
    allow_redfish_http: AllowRedfishHttpOpt = False,
    allow_libvirt_insecure: AllowLibvirtInsecureOpt = False,
    log_level: LogOpt = "info",
    **shared: Any,
) -> None:
    """Put idle nodes to sleep, wake them for pending pods, optionally consolidate, until SIGTERM."""
    run_node_power(log_level=log_level, actuator=actuator, dry_run=dry_run, listen=listen, leader_elect=leader_elect,
                   lease_namespace=lease_namespace, kubeconfig=kubeconfig, context=context, sleep_after=sleep_after,
                   min_awake=min_awake, spare_cpu=spare_cpu, consolidate=consolidate,
                   resync_s=resync, sleep_watts=sleep_watts,
                   scheduler_name=scheduler_name, credentials=credentials, addresses=addresses,
                   power_profiles=power_profiles, libvirt_uri=libvirt_uri,
                   allow_annotated=allow_annotated or [], allow_redfish_http=allow_redfish_http,
                   allow_libvirt_insecure=allow_libvirt_insecure,
                   **_power_options(**{n: shared.get(n, d) for n, (_, d) in _POWER_OPTIONS.items()}))


#: A command built on ``node-power`` (``autoscaler-provider``) sets this to ``daemon -> context manager``: it is
#: entered with the daemon, inside the same error handling, and runs beside the controller until the signal.
NODE_POWER_AROUND: contextvars.ContextVar[Callable[[Any], Any] | None] = contextvars.ContextVar(
    "node_power_around", default=None)


def run_node_power(*, log_level: str = "info", stop: threading.Event | None = None, **options) -> None:
    """The body of ``node-power`` (``stop`` ends it without a signal, for tests)."""
    from joulesched.live.daemon import configure_logging, wait_for_signal

    around = NODE_POWER_AROUND.get()
    with errors():
        daemon = _node_power_daemon(**options)
        extra = around(daemon) if around is not None else contextlib.nullcontext()
    configure_logging(log_level)
    with daemon, extra:
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
    energy_source: EnergySourceOpt = "joulesched",
    power_profiles: ProfilesOpt = None,
    metrics_interval: IntervalOpt = 15.0,
    seed: SeedOpt = 0,
    log_level: LogOpt = "info",
    node_sleep_watts: NodeSleepWattsOpt = None,
    node_wake_s: NodeWakeOpt = DEFAULT_WAKE_S,
) -> None:
    """Serve POLICY as a kube-scheduler extender (POST /filter, /prioritize; extender v1 JSON), until SIGTERM."""
    run_extender(listen=listen, policy=policy, seed=seed, log_level=log_level,
                 cache=dict(kubeconfig=kubeconfig, context=context, prometheus=prometheus or "",
                            cpu_query=cpu_query, power_query=power_query, node_label=node_label,
                            power_profiles=power_profiles, metrics_interval=metrics_interval,
                            energy_source=energy_source, sleep_watts=node_sleep_watts, wake_s=node_wake_s))


def run_extender(*, log_level: str = "info", stop: threading.Event | None = None, cache: dict, **options) -> None:
    """The body of ``extender`` (``stop`` ends it without a signal, for tests)."""
    from joulesched.live.daemon import CacheOptions, ExtenderDaemon, configure_logging, wait_for_signal

    with errors():
        daemon = ExtenderDaemon(cache=CacheOptions(**cache), **options)
    configure_logging(log_level)
    with daemon:
        wait_for_signal(stop)
