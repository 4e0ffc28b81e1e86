"""Energy read back from Prometheus: ``increase()`` of the exporters' ``*_joules_total`` counters.

This is the meter of a real cluster run: the power exporter (``joulesched power exporter``, or Kepler) on each
node exposes cumulative joules, Prometheus scrapes them, and :class:`PrometheusMeter` answers "how many joules
between two instants" with ``sum(increase(SELECTOR[W]))`` evaluated at the window's end. ``increase()``
corrects counter resets, so an exporter restart inside the window costs nothing.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from joulesched.core.errors import JouleschedError

#: Whole-node energy without double counting: RAPL packages and DRAM (core/uncore sit inside a package, psys
#: contains everything), or the model meter's platform zone. Hosts with psys only: pass another selector.
ENERGY_METRIC = 'joulesched_node_joules_total{zone=~"package-.*|dram-.*|platform.*"}'


class PrometheusMeterError(JouleschedError):
    """Prometheus has no usable samples for the window (exporter not scraped, or the query returned nothing)."""


def _dt(unix: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(unix, tz=datetime.timezone.utc)


class PrometheusMeter:
    """An :class:`~joulesched.power.meter.EnergyMeter` over Prometheus; instants are Unix seconds.

    :param prom: a ``prometheus_api_client.PrometheusConnect``.
    :param selector: the PromQL series summed for node energy.
    :param scrape_wait_s: how long :meth:`joules` waits for a sample at or after the window's end.
    """

    def __init__(self, prom: Any, selector: str = ENERGY_METRIC, *, scrape_wait_s: float = 120.0) -> None:
        self.prom, self.selector, self.scrape_wait_s = prom, selector, scrape_wait_s
        self.last_query = ""

    def series(self) -> int:
        """How many series the selector matches now (0: the exporter is not scraped)."""
        res = self.prom.custom_query(f"count({self.selector})")
        return int(float(res[0]["value"][1])) if res else 0

    def _wait_for(self, end: float) -> None:
        deadline = time.monotonic() + self.scrape_wait_s
        while True:
            res = self.prom.custom_query(f"max(timestamp({self.selector}))")
            if res and float(res[0]["value"][1]) >= end:
                return
            if time.monotonic() > deadline:
                raise PrometheusMeterError(f"Prometheus has no sample of {self.selector} after the window's end "
                                           f"within {self.scrape_wait_s:.0f} s; is the exporter scraped?")
            time.sleep(0.25)

    def joules(self, start: float, end: float) -> float:
        """``sum(increase(SELECTOR[end - start]))`` at ``end``, once the window's last scrape is in."""
        if end <= start:
            raise ValueError(f"energy window [{start}, {end}] is empty or reversed")
        self._wait_for(end)
        window_ms = max(1, round((end - start) * 1000))
        query = f"sum(increase({self.selector}[{window_ms}ms]))"
        res = self.prom.custom_query(query, params={"time": f"{end:.3f}"})
        if not res:
            raise PrometheusMeterError(f"{query} returned no series at {end:.3f}")
        self.last_query = query
        return float(res[0]["value"][1])

    def watts_by_node(self, start: float, end: float, *, rate_window_s: float = 60.0,
                      points: int = 60) -> dict[str, list[list[float]]]:
        """Each node's watts over ``[start, end]`` as ``{node (else instance): [[s since start, W], ...]}``:
        ``sum by (node, instance) (rate(SELECTOR[W]))`` as a range query, for plots. ``rate_window_s`` must span
        at least two scrapes."""
        step = max(1.0, (end - start) / points)
        query = f"sum by (node, instance) (rate({self.selector}[{max(1, round(rate_window_s * 1000))}ms]))"
        res = self.prom.custom_query_range(query, start_time=_dt(start), end_time=_dt(end), step=f"{step:.3f}")
        return {r["metric"].get("node") or r["metric"].get("instance", "?"):
                [[round(float(t) - start, 3), round(float(v), 3)] for t, v in r["values"]] for r in res}
