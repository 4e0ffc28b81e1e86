"""Energy read back from Prometheus: ``increase()`` of the exporters' ``*_joules_total`` counters.

This is the meter of a real cluster run: the power exporter (``joulesched power exporter``, or Kepler) on each
node exposes cumulative joules, Prometheus scrapes them, and :class:`PrometheusMeter` answers "how many joules
between two instants" with ``sum(increase(SELECTOR[W]))`` evaluated at the window's end. ``increase()``
corrects counter resets, so an exporter restart inside the window costs nothing. What is summed is an
:class:`~joulesched.power.energy_sources.EnergySource` (a selector of joule counters, or the Kepler preset).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from joulesched.core.errors import JouleschedError
from joulesched.power.energy_sources import ENERGY_METRIC, JOULESCHED, EnergySource, selector_source

__all__ = ["ENERGY_METRIC", "PrometheusMeter", "PrometheusMeterError", "as_source"]


class PrometheusMeterError(JouleschedError):
    """Prometheus has no usable samples for the window (exporter not scraped, or the query returned nothing)."""


def _dt(unix: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(unix, tz=datetime.timezone.utc)


def as_source(selector: str | EnergySource) -> EnergySource:
    """A source as given, or the counters a PromQL selector matches; the default selector, :data:`ENERGY_METRIC`,
    is the ``joulesched`` source (its CPU zones and its GPUs)."""
    if isinstance(selector, EnergySource):
        return selector
    return JOULESCHED if selector == ENERGY_METRIC else selector_source(selector)


class PrometheusMeter:
    """An :class:`~joulesched.power.meter.EnergyMeter` over Prometheus; instants are Unix seconds.

    :param prom: a ``prometheus_api_client.PrometheusConnect``.
    :param selector: the PromQL series of joule counters summed for node energy, or an energy source.
    :param scrape_wait_s: how long :meth:`joules` waits for a sample at or after the window's end.
    """

    def __init__(self, prom: Any, selector: str | EnergySource = ENERGY_METRIC, *,
                 scrape_wait_s: float = 120.0) -> None:
        self.source = as_source(selector)
        self.prom, self.selector, self.scrape_wait_s = prom, self.source.fresh, scrape_wait_s
        self.last_query = ""

    def series(self) -> int:
        """How many series the source reads now (0: the exporter is not scraped)."""
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
        """The source's joules over ``[start, end]`` (``sum(increase(SELECTOR[end - start]))`` for counters)
        at ``end``, once the window's last scrape is in."""
        if end <= start:
            raise ValueError(f"energy window [{start}, {end}] is empty or reversed")
        self._wait_for(end)
        query = self.source.joules(end - start)
        res = self.prom.custom_query(query, params={"time": f"{end:.3f}"})
        if not res:
            raise PrometheusMeterError(f"{query} returned no series at {end:.3f}")
        self.last_query = query
        return float(res[0]["value"][1])

    def watts_by_node(self, start: float, end: float, *, rate_window_s: float = 60.0,
                      points: int = 60) -> dict[str, list[list[float]]]:
        """Each node's watts over ``[start, end]`` as ``{node (else instance): [[s since start, W], ...]}``:
        the source's watts (``sum by (node, instance) (rate(SELECTOR[W]))`` for counters) as a range query, for
        plots. ``rate_window_s`` must span at least two scrapes."""
        step = max(1.0, (end - start) / points)
        query = self.source.watts(rate_window_s)
        res = self.prom.custom_query_range(query, start_time=_dt(start), end_time=_dt(end), step=f"{step:.3f}")
        label = self.source.node_label
        return {r["metric"].get(label) or r["metric"].get("instance", "?"):
                [[round(float(t) - start, 3), round(float(v), 3)] for t, v in r["values"]] for r in res}
