"""Build and run the live daemons from their options: the scheduler (``serve``) and the extender.

The CLI and the kube pipeline use the same code: a daemon is a context manager that validates every option
before anything starts (policy spec, kubeconfig, listen address, Prometheus URL, power profiles), starts its
threads on entry, exposes readiness as an event (caches synced, and the Lease held where leader election is
on), and stops cleanly on exit. Nothing here sleeps for a fixed time.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from functools import partial
from typing import Optional
from urllib.parse import urlsplit

from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.metrics_feed import DEFAULT_CPU_QUERY, DEFAULT_POWER_QUERY
from joulesched.cluster.nodepower import DEFAULT_WAKE_S
from joulesched.core.errors import JouleschedError, UsageError
from joulesched.core.net import parse_listen, url_port

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

log = logging.getLogger("joulesched.live")


class DaemonInputError(UsageError):
    """A bad option value of `serve` or `extender`."""


class NotReady(JouleschedError):
    """The daemon did not become ready in time (no apiserver answer, or the Lease is held elsewhere)."""


@dataclass
class CacheOptions:
    """Where the cluster cache reads from.

    :param kubeconfig: a kubeconfig file; None = in-cluster service account, else $KUBECONFIG or ~/.kube/config.
    :param context: the kubeconfig context (None: its current one).
    :param prometheus: URL of the Prometheus with node CPU and watts; empty = request-based usage only.
    :param cpu_query, power_query, node_label: the PromQL of the feed and the label naming the node.
    :param energy_source: where watts come from: ``joulesched`` (``power_query``) or a preset of
        :mod:`joulesched.power.energy_sources` (``kepler``), which replaces ``power_query``.
    :param power_profiles: YAML file of named power curves (a ConfigMap in a cluster).
    :param metrics_interval: seconds between Prometheus queries.
    :param sleep_watts: where a node power controller puts idle nodes to sleep, a sleeping node's watts (with
        ``wake_s``, the seconds one takes to wake): the cache's :attr:`~KubeCache.sleep_model`. None: nodes
        never sleep.
    """

    kubeconfig: Optional[str] = None
    context: Optional[str] = None
    prometheus: str = ""
    cpu_query: str = DEFAULT_CPU_QUERY
    power_query: str = DEFAULT_POWER_QUERY
    node_label: str = "node"
    power_profiles: Optional[str] = None
    metrics_interval: float = 15.0
    energy_source: str = "joulesched"
    sleep_watts: Optional[float] = None
    wake_s: float = DEFAULT_WAKE_S


#: The rate window of a preset's watts in the feed (as the default CPU query's 2m: several scrapes).
FEED_RATE_WINDOW_S = 120.0


def feed_power_query(opts: CacheOptions) -> str:
    """The feed's watts query: ``power_query``, or the energy source preset's (never both)."""
    from joulesched.power.energy_sources import energy_source

    source = energy_source(opts.energy_source)
    if opts.energy_source == "joulesched":
        return opts.power_query
    if opts.power_query != DEFAULT_POWER_QUERY:
        raise DaemonInputError(f"--power-query and --energy-source {opts.energy_source} both say where watts come "
                               "from; give one of them")
    return source.watts(FEED_RATE_WINDOW_S, opts.node_label)


def check_url(url: str, option: str = "--prometheus") -> str:
    if url and not (url.startswith("http://") or url.startswith("https://")):
        # Not echoed: a user:password@ typed into it must not reach the terminal's or a log's copy of the error.
        raise DaemonInputError(f"{option} must be an http:// or https:// URL (like http://prometheus:9090)")
    try:
        url_port(urlsplit(url))
        bad = bool(url) and not urlsplit(url).hostname
    except ValueError:
        bad = True
    if bad:
        raise DaemonInputError(f"{option} must name a host and, if any, a port in 1..65535 "
                               "(like http://prometheus:9090)")
    return url.rstrip("/")


def build_cache(opts: CacheOptions) -> KubeCache:
    """A :class:`KubeCache` over the configured apiserver, with the Prometheus feed and power curves."""
    from joulesched.cluster.kube.client import load_api_client
    from joulesched.cluster.kube.metrics_feed import FeedConfig
    from joulesched.cluster.kube.objects import CurveResolver, load_profiles

    feed = FeedConfig(url=check_url(opts.prometheus or ""), cpu_query=opts.cpu_query,
                      power_query=feed_power_query(opts), node_label=opts.node_label,
                      interval_s=opts.metrics_interval)
    curves = CurveResolver(load_profiles(opts.power_profiles) if opts.power_profiles else None)
    api = load_api_client(opts.kubeconfig, opts.context)
    cache = KubeCache(api, curves=curves, feed=feed)
    if opts.sleep_watts is not None:
        cache.sleep_model = (opts.sleep_watts, opts.wake_s)
    return cache


def check_names(scheduler_name: str, lease_namespace: str | None) -> None:
    """``--scheduler-name`` and ``--lease-namespace`` as Kubernetes takes them, refused at startup (exit 2) rather
    than by the API server at the first Lease or Event write."""
    from joulesched.core.names import is_dns_label

    if not scheduler_name.strip():
        raise DaemonInputError("--scheduler-name must not be empty")
    if lease_namespace is not None and not is_dns_label(lease_namespace):
        raise DaemonInputError(f"--lease-namespace {lease_namespace!r} is not a namespace name (a DNS label)")


def default_namespace() -> str:
    """The pod's own namespace when running in a cluster, else ``joulesched``."""
    try:
        with open(SA_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or "joulesched"
    except OSError:
        return "joulesched"


def _listen(listen: str, server_cls, *args):
    host, port = parse_listen(listen)
    try:
        return server_cls(*args, host, port)
    except OSError as e:  # the port is taken, or not ours to bind
        raise DaemonInputError(f"cannot listen on {listen}: {e.strerror or e}") from None


class SchedulerDaemon:
    """``joulesched serve``: a :class:`~joulesched.live.scheduler.Scheduler` plus its /metrics and /healthz.

    Everything is built (and every option checked) in the constructor; ``with`` starts it and stops it.
    :meth:`wait_ready` blocks until the caches are synced and this replica may bind.
    """

    def __init__(self, *, policy: str, scheduler_name: str = "joulesched", listen: str = "127.0.0.1:10259",
                 leader_elect: bool = True, lease_namespace: Optional[str] = None, bind_workers: int = 4,
                 seed: int = 0, cache: CacheOptions | None = None, sample_pct: Optional[int] = None,
                 batch: int = 8, event_writer: str = "process") -> None:
        from joulesched.agent.registry import make_policy, refuse_twin_only
        from joulesched.live.events import EVENT_WRITERS
        from joulesched.live.scheduler import Scheduler, ServeConfig, StatusServer

        check_names(scheduler_name, lease_namespace)
        if sample_pct is not None and not 0 <= sample_pct <= 100:
            raise DaemonInputError(f"--sample-pct {sample_pct} must be in 0..100 (0: kube-scheduler's adaptive "
                                   "percentage)")
        if batch < 1:
            raise DaemonInputError(f"--batch {batch} must be at least 1")
        if event_writer not in EVENT_WRITERS:
            raise DaemonInputError(f"--event-writer {event_writer!r} must be process or thread")
        parse_listen(listen)
        pol = make_policy(policy)
        refuse_twin_only(pol, policy)
        self.policy_spec = policy
        self.cache = build_cache(cache or CacheOptions())
        self.cfg = ServeConfig(scheduler_name=scheduler_name, seed=seed, leader_elect=leader_elect,
                               lease_namespace=lease_namespace or default_namespace(), bind_workers=bind_workers,
                               sample_pct=sample_pct, batch=batch, event_writer=event_writer)
        self.scheduler = Scheduler(self.cache, pol, self.cfg)
        self.status = _listen(listen, partial(StatusServer, ready=self.scheduler.readiness_checks),
                              self.scheduler.registry, self.scheduler.health_checks)

    @property
    def port(self) -> int:
        return self.status.port

    def __enter__(self) -> "SchedulerDaemon":
        log.info("scheduler %s: policy %s, identity %s, leader election %s, metrics on http://%s:%d/metrics",
                 self.cfg.scheduler_name, self.policy_spec, self.cfg.identity,
                 "on" if self.cfg.leader_elect else "off", self.status.httpd.server_address[0], self.port)
        self.status.start()
        self.scheduler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.scheduler.stop()
        self.status.stop()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once the scheduler decides and binds; raise :class:`NotReady` after ``timeout`` seconds."""
        if not self.scheduler.ready.wait(timeout):
            why = "the caches never synced" if not self.cache.synced else "this replica never became leader"
            raise NotReady(f"scheduler {self.cfg.scheduler_name} not ready after {timeout:.0f} s: {why}")


class ExtenderDaemon:
    """``joulesched extender``: the cache and the extender's HTTP server, started and stopped together."""

    def __init__(self, *, policy: str, listen: str = "127.0.0.1:8888", seed: int = 0,
                 cache: CacheOptions | None = None) -> None:
        from joulesched.agent.registry import make_policy, refuse_twin_only
        from joulesched.live.extender import Extender, ExtenderServer

        parse_listen(listen)
        pol = make_policy(policy)
        refuse_twin_only(pol, policy)
        self.policy_spec = policy
        self.cache = build_cache(cache or CacheOptions())
        self.extender = Extender(self.cache, pol, seed=seed)
        self.server = _listen(listen, ExtenderServer, self.extender)

    @property
    def port(self) -> int:
        return self.server.port

    def __enter__(self) -> "ExtenderDaemon":
        log.info("extender: policy %s on http://%s:%d", self.policy_spec, self.server.httpd.server_address[0],
                 self.port)
        self.cache.start()
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.cache.stop()

    def wait_ready(self, timeout: float = 30.0) -> None:
        if not self.cache.wait_synced(timeout):
            raise NotReady(f"extender caches not synced after {timeout:.0f} s")


def wait_for_signal(stop: threading.Event | None = None) -> None:
    """Block until SIGTERM or SIGINT (or ``stop`` is set, for tests and embedding)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
