"""Prometheus exporter: a collector that renders the monitor's latest immutable snapshot at scrape time.

Refreshing runs on its own timer, decoupled from scrapes (as in Kepler), so scrape frequency changes neither
the numbers nor the overhead. Counters are cumulative from the monitor and never decrease, wraps included.

A refresh that fails leaves the previous snapshot served; ``joulesched_exporter_refresh_errors_total{part}``
counts the failures (``node``: the whole refresh; ``gpu``: one GPU or every GPU not read, their joules held
and their watts 0, the other GPUs and the CPU side going on),
``joulesched_exporter_last_refresh_timestamp_seconds`` says when the last one succeeded, and ``/healthz``
answers 503 once that is older than ``max_age_s``.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import NamedTuple
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from joulesched.core.httpd import BackgroundHTTPServer, HardenedHandlerMixin, Limits, reply
from joulesched.power.meter import MeterError
from joulesched.power.monitor import PowerMonitor, Snapshot

log = logging.getLogger(__name__)


class RefreshStatus(NamedTuple):
    """The exporter's own health: when the last refresh succeeded (Unix seconds) and how many failed whole."""

    last_refresh_unix: float
    refresh_errors: int


class SnapshotCollector(Collector):
    """Builds every ``joulesched_*`` metric from one snapshot, so one scrape is always self-consistent."""

    def __init__(self, get_snapshot: Callable[[], Snapshot],
                 get_status: Callable[[], RefreshStatus] | None = None) -> None:
        self._get = get_snapshot
        self._status = get_status

    def describe(self) -> Iterator[Metric]:
        return iter(self._families(None) + self._health(None))

    def collect(self) -> Iterator[Metric]:
        s = self._get()
        return iter(self._families(s) + self._health(s))

    def _health(self, s: Snapshot | None) -> list[Metric]:
        if self._status is None:
            return []
        last = GaugeMetricFamily("joulesched_exporter_last_refresh_timestamp_seconds",
                                 "Unix time of the last successful refresh (the snapshot /metrics shows).")
        errors = CounterMetricFamily("joulesched_exporter_refresh_errors",
                                     "Failed refreshes: node (the whole refresh; the previous snapshot is served) "
                                     "or gpu (a GPU not read, one or all: its joules held, its watts 0; the other "
                                     "GPUs and the CPU metrics went on).", labels=["part"])
        if s is not None:
            st = self._status()
            last.add_metric([], st.last_refresh_unix)
            errors.add_metric(["node"], st.refresh_errors)
            errors.add_metric(["gpu"], s.gpu_errors)
        return [last, errors]

    @staticmethod
    def _families(s: Snapshot | None) -> list[Metric]:
        # prometheus-client appends _total to counter family names.
        node = CounterMetricFamily("joulesched_node_joules", "Energy per zone since the exporter started.",
                                   labels=["zone", "source"])
        active = CounterMetricFamily("joulesched_node_active_joules",
                                     "Energy per zone times the node CPU usage ratio (Kepler 0.10).", labels=["zone"])
        idle = CounterMetricFamily("joulesched_node_idle_joules",
                                   "Energy per zone not attributed to any workload.", labels=["zone"])
        watts = GaugeMetricFamily("joulesched_node_watts", "Average power per zone over the last interval.",
                                  labels=["zone", "source"])
        ratio = GaugeMetricFamily("joulesched_node_cpu_usage_ratio",
                                  "(Δtotal − Δidle − Δiowait) / Δtotal from /proc/stat over the last interval.")
        proc = CounterMetricFamily("joulesched_process_joules",
                                   "Active energy attributed to a process (top N by energy).", labels=["pid", "comm"])
        pod = CounterMetricFamily("joulesched_pod_joules", "Active energy attributed to a pod's container.",
                                  labels=["pod_uid", "container_id"])
        vm = CounterMetricFamily("joulesched_vm_joules", "Active energy attributed to a qemu VM.",
                                 labels=["vm_name"])
        # Kepler's kepler_node_gpu_joules_total{gpu}, under our prefix (the GPU meter, NVML).
        gpu = CounterMetricFamily("joulesched_node_gpu_joules", "Energy per GPU since the exporter started (NVML).",
                                  labels=["gpu"])
        gpu_w = GaugeMetricFamily("joulesched_node_gpu_watts", "Average power per GPU over the last interval.",
                                  labels=["gpu"])
        if s is not None:
            for zone, z in sorted(s.zones.items()):
                node.add_metric([zone, s.source], z.joules_total)
                active.add_metric([zone], z.active_joules_total)
                idle.add_metric([zone], z.idle_joules_total)
                watts.add_metric([zone, s.source], z.watts)
            ratio.add_metric([], s.usage_ratio)
            for p in s.processes:
                proc.add_metric([str(p.pid), p.comm], p.joules_total)
            for ref, e in s.pods.items():
                pod.add_metric([ref.pod_uid, ref.container_id], e.joules_total)
            for name, e in s.vms.items():
                vm.add_metric([name], e.joules_total)
            for g, e in s.gpus.items():
                gpu.add_metric([g], e.joules_total)
                gpu_w.add_metric([g], e.watts)
        return [node, active, idle, watts, ratio, proc, pod, vm, gpu, gpu_w]


#: A scrape sends no body; a few Prometheus servers (and a probe or two) at once.
EXPORTER_LIMITS = Limits(timeout_s=10.0, max_connections=16, max_body=64 << 10)


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip: listed (or ``*``, when gzip is not) with a q-value above 0
    (RFC 9110 12.5.3; ``gzip;q=0`` refuses it). Parsed here: werkzeug's parser is not in the scheduler image, which
    runs this exporter too."""
    q: dict[str, float] = {}
    for item in (accept_encoding or "").split(","):
        coding, *params = (p.strip() for p in item.split(";"))
        weight = 1.0
        for p in params:
            k, _, v = p.partition("=")
            if k.strip().lower() == "q":
                try:
                    weight = float(v)
                except ValueError:
                    weight = 0.0  # not a q-value: not an acceptance
        q[coding.lower()] = weight
    return q.get("gzip", q.get("*", 0.0)) > 0


def metrics_handler(registry: CollectorRegistry,
                    stale: Callable[[], str] = lambda: "") -> type[BaseHTTPRequestHandler]:
    """``GET /metrics`` (text or OpenMetrics as the scraper's Accept asks, gzip when accepted), ``GET /healthz``
    (503 with the reason when ``stale()`` gives one); anything else is 404, any other method 405 (the hardened
    base)."""

    class H(HardenedHandlerMixin, BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:
            pass

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept"))
                data, extra = encoder(registry), {"Vary": "Accept, Accept-Encoding"}  # text or OpenMetrics; gzip
                if accepts_gzip(self.headers.get("Accept-Encoding")):
                    data = gzip.compress(data, compresslevel=5)
                    extra["Content-Encoding"] = "gzip"
                reply(self, 200, data, ctype, extra)
            elif path in ("/healthz", "/livez", "/readyz"):
                why = stale()
                reply(self, 503 if why else 200, f"{why}\n".encode() if why else b"ok\n", "text/plain")
            else:
                reply(self, 404, b"not found; metrics are at /metrics\n", "text/plain")

        do_HEAD = do_GET

    return H


class Exporter:
    """Refreshes ``monitor`` every ``interval_s`` and serves /metrics on ``host:port`` (port 0 picks one).

    ``max_age_s`` (default: five intervals, at least 10 s) is how old the last successful refresh may be before
    /healthz answers 503. ``clock`` (monotonic) and ``wall`` (Unix time) are injected for tests."""

    def __init__(self, monitor: PowerMonitor, *, host: str = "127.0.0.1", port: int = 9102,
                 interval_s: float = 1.0, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if not interval_s > 0:
            raise ValueError("interval must be > 0 seconds")
        self.monitor = monitor
        self.interval_s = interval_s
        self.max_age_s = max_age_s if max_age_s is not None else max(5 * interval_s, 10.0)
        self._clock, self._wall = clock, wall
        self._last_ok: float | None = None  # on clock
        self._status = RefreshStatus(0.0, 0)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(SnapshotCollector(lambda: self.monitor.snapshot, lambda: self._status))
        self._host, self._port = host, port
        self._stop = threading.Event()
        self._http: BackgroundHTTPServer | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server else self._port

    def refresh(self) -> bool:
        """One refresh; a failure is logged and counted, and the previous snapshot stays served."""
        try:
            self.monitor.refresh()
        except Exception as e:  # keep serving the last good snapshot; the log says what broke
            self._status = self._status._replace(refresh_errors=self._status.refresh_errors + 1)
            if isinstance(e, MeterError):  # explained in its message: one line a refresh, not a traceback
                log.warning("power refresh failed (%s); serving the previous snapshot", e)
            else:
                log.exception("power refresh failed; serving the previous snapshot")
            return False
        self._last_ok = self._clock()
        self._status = self._status._replace(last_refresh_unix=self._wall())
        return True

    def stale(self) -> str:
        """Why the served snapshot is too old to be healthy, or "" when it is fresh."""
        if self._last_ok is None:
            return "no successful refresh yet"
        age = self._clock() - self._last_ok
        if age > self.max_age_s:
            return (f"stale: the last successful refresh was {age:.1f} s ago (over {self.max_age_s:g} s); "
                    "see the exporter's log")
        return ""

    def start(self) -> "Exporter":
        """Take the baseline reading, start serving, and start the refresh loop in a daemon thread."""
        self.monitor.refresh()
        self._last_ok, self._status = self._clock(), RefreshStatus(self._wall(), 0)
        self._http = BackgroundHTTPServer(metrics_handler(self.registry, self.stale), self._host, self._port,
                                          "joulesched-power-http", EXPORTER_LIMITS).start()
        self._server = self._http.httpd
        self._thread = threading.Thread(target=self._loop, name="joulesched-power-refresh", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        # Deadlines rather than fixed sleeps, so the interval does not drift by the refresh's own cost.
        deadline = time.monotonic()
        while True:
            # After a stall (a slow refresh, a suspended VM) skip the missed ticks rather than burst through them.
            deadline = max(deadline + self.interval_s, time.monotonic())
            if self._stop.wait(max(0.0, deadline - time.monotonic())):
                return
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._http:
            self._http.stop()

    def wait(self) -> None:
        """Block until stopped (the CLI's foreground mode)."""
        while not self._stop.wait(3600):
            pass
