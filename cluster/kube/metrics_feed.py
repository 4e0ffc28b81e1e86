"""Node CPU usage and power from Prometheus, with a request-based fallback that never stops scheduling.

The feed runs in its own thread and never on the scheduling path: each refresh runs two PromQL queries
(configurable) through prometheus-api-client and hands the per-node results to the backend. When Prometheus
cannot be reached, or a query returns no sample for a node, that node's usage falls back to the sum of its
pods' CPU requests. Each switch to or from the fallback is logged once, and the gauge
``joulesched_metrics_fallback{feed="cpu"|"power"}`` shows whether the fallback is in use (1) or not (0).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from joulesched.power.meter import NODE_ZONES

log = logging.getLogger("joulesched.kube")

#: CPU busy fraction (0..1) per node, from node-exporter. Needs a ``node`` label on the series, which the usual
#: kubernetes_sd relabelling (``__meta_kubernetes_pod_node_name`` or ``__meta_kubernetes_node_name``) adds.
DEFAULT_CPU_QUERY = '1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[2m]))'
#: Watts per node from the joulesched power exporter: the zones a whole node's energy is measured by
#: (:data:`~joulesched.power.meter.NODE_ZONES`: packages and DRAM, or the model meter's platform; a package
#: already contains its core and uncore, so summing every zone would count power twice). Before 2026-12-07 the
#: packages alone: DRAM left out, and no watts at all from a host on the model meter.
DEFAULT_POWER_QUERY = f'sum by (node) (joulesched_node_watts{{zone=~"{NODE_ZONES}"}})'


@dataclass
class FeedConfig:
    """:param url: Prometheus base URL (``http://prometheus:9090``); empty = no feed, request-based usage.
    :param cpu_query: PromQL giving each node's CPU busy fraction in [0, 1].
    :param power_query: PromQL giving each node's watts.
    :param node_label: the series label holding the Kubernetes node name.
    :param interval_s: seconds between refreshes.
    :param timeout_s: per-query timeout.
    """

    url: str = ""
    cpu_query: str = DEFAULT_CPU_QUERY
    power_query: str = DEFAULT_POWER_QUERY
    node_label: str = "node"
    interval_s: float = 15.0
    timeout_s: float = 5.0


class PrometheusFeed:
    """Polls Prometheus and calls ``apply(cpu_fraction_by_node, watts_by_node)``; either dict may be empty.
    ``apply`` may return how many known nodes the samples name: 0 with samples is reported as a fallback."""

    def __init__(self, cfg: FeedConfig, apply: Callable[[dict[str, float], dict[str, float]], int | None],
                 registry: CollectorRegistry) -> None:
        self.cfg = cfg
        self.apply = apply
        self.fallback = Gauge("joulesched_metrics_fallback",
                              "1 when the feed falls back to request-based state (Prometheus down or no samples).",
                              ["feed"], registry=registry)
        self.fallback.labels("cpu").set(1)
        self.fallback.labels("power").set(1)
        self._in_fallback = {"cpu": None, "power": None}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prom = None
        if cfg.url:
            from prometheus_api_client import PrometheusConnect
            from urllib3.util.retry import Retry

            # TLS verification stays on (disable_ssl=False); plain http URLs simply do not use TLS. No retries
            # inside a refresh (the client's default backs off for seconds): the next refresh is the retry.
            self._prom = PrometheusConnect(url=cfg.url, disable_ssl=False, timeout=cfg.timeout_s,
                                           retry=Retry(total=0, connect=0, read=0, status=0))

    def start(self) -> "PrometheusFeed":
        if self._prom is None:
            self._note("cpu", False, "no Prometheus URL given")
            self._note("power", False, "no Prometheus URL given")
            return self
        self._thread = threading.Thread(target=self._loop, name="prometheus-feed", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.cfg.timeout_s * 2 + 5)

    def _note(self, feed: str, ok: bool, why: str = "") -> None:
        """Log a switch to/from the fallback once, and keep the gauge current."""
        self.fallback.labels(feed).set(0 if ok else 1)
        was = self._in_fallback[feed]
        if ok and was is not False:
            log.info("%s feed: using Prometheus", feed)
        elif not ok and was is not True:
            log.warning("%s feed: falling back to request-based state (%s)", feed, why)
        self._in_fallback[feed] = not ok

    def _query(self, q: str) -> tuple[dict[str, float], str]:
        """The query's value per node label, and why there is none when it is empty."""
        try:
            result = self._prom.custom_query(q, timeout=self.cfg.timeout_s)
        except Exception as e:  # connection refused, timeout, bad PromQL: all mean "no data"
            return {}, f"{type(e).__name__}: {str(e)[:200]}"
        out = {}
        for r in result or []:
            node = (r.get("metric") or {}).get(self.cfg.node_label)
            try:
                v = float(r["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if node and math.isfinite(v):
                out[node] = v
        return out, "" if out else f"query returned no samples with a {self.cfg.node_label!r} label"

    def refresh(self) -> None:
        cpu, cpu_why = self._query(self.cfg.cpu_query)
        watts, watts_why = self._query(self.cfg.power_query)
        matched = self.apply(cpu, watts)
        for feed, got, why in (("cpu", cpu, cpu_why), ("power", watts, watts_why)):
            if not got:
                self._note(feed, False, why)
            elif isinstance(matched, int) and matched == 0:
                # Samples that name no node of the cluster (an FQDN or IP:port in the label) are no measurement:
                # every node goes on with its requests, and the gauge must say so.
                self._note(feed, False, f"no sample's {self.cfg.node_label!r} label names a node of the cluster "
                                        f"(e.g. {', '.join(sorted(got)[:3])}); relabel it to the node's name")
            else:
                self._note(feed, True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # never let the feed thread die
                log.exception("metrics feed refresh failed")
            self._stop.wait(self.cfg.interval_s)
