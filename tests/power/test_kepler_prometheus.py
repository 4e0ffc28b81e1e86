"""The Kepler energy source preset against a real Prometheus scraping an exporter with Kepler 0.11's names.

The exporter (prometheus_client, in this process) emits ``kepler_node_cpu_joules_total{zone, path, node_name}``
with every RAPL zone, overlapping ones included (core and uncore inside each package, psys over everything),
``kepler_node_gpu_joules_total{gpu, gpu_uuid, vendor, node_name}`` and ``kepler_platform_watts`` with two
PowerControl entries of one chassis (the server and its CPU subsystem). Three nodes:

- ``rapl-gpu``: two sockets and two GPUs, no BMC reading: package + DRAM of both sockets + both GPUs;
- ``bmc``: a BMC reading beside RAPL and a GPU: the server's platform watts only;
- ``rapl``: one socket, no GPU: package + DRAM.

Summing any overlapping zone (core, uncore, psys), the CPU subsystem's PowerControl, or RAPL on top of the
platform would move the figures by 25 % or more; the checks hold them to 1 % (energy) and 5 % (watts).

Energy is checked exactly as in ``test_prometheus_integration.py``: counters hold still for a baseline, rise
at known rates, hold still again until scraped, and the window runs from 1 ms before the last baseline scrape
to the last scrape, so ``increase()`` extrapolates by at most 1 ms over the window.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from joulesched.cluster.kube.metrics_feed import FeedConfig, PrometheusFeed
from joulesched.live.daemon import FEED_RATE_WINDOW_S, CacheOptions, DaemonInputError, feed_power_query
from joulesched.power.energy_sources import KEPLER, energy_source
from joulesched.power.prometheus import PrometheusMeter
from tests.support.procs import PROMETHEUS, free_port, prometheus_server, wait_for

pytestmark = pytest.mark.integration

#: (node, zone, path) -> watts while the counters run. Overlapping zones are the traps.
CPU = {
    ("rapl-gpu", "package", "intel-rapl:0"): 50.0, ("rapl-gpu", "core", "intel-rapl:0:0"): 30.0,
    ("rapl-gpu", "uncore", "intel-rapl:0:1"): 5.0, ("rapl-gpu", "dram", "intel-rapl:0:2"): 8.0,
    ("rapl-gpu", "package", "intel-rapl:1"): 40.0, ("rapl-gpu", "core", "intel-rapl:1:0"): 25.0,
    ("rapl-gpu", "dram", "intel-rapl:1:2"): 7.0, ("rapl-gpu", "psys", "intel-rapl:2"): 160.0,
    ("bmc", "package", "intel-rapl:0"): 100.0, ("bmc", "core", "intel-rapl:0:0"): 80.0,
    ("bmc", "dram", "intel-rapl:0:2"): 10.0,
    ("rapl", "package", "intel-rapl:0"): 20.0, ("rapl", "core", "intel-rapl:0:0"): 15.0,
    ("rapl", "dram", "intel-rapl:0:2"): 3.0, ("rapl", "psys", "intel-rapl:1"): 40.0,
}
GPU = {("rapl-gpu", "0"): 70.0, ("rapl-gpu", "1"): 30.0, ("bmc", "0"): 60.0}
#: (node, power_control_id, name) -> watts, one chassis.
PLATFORM = {("bmc", "PC1", "Server Power Control"): 300.0, ("bmc", "PC2", "CPU Sub-system Power"): 120.0}
#: What each node must read: its disjoint parts, or the platform alone where there is one.
EXPECTED_W = {"rapl-gpu": 50 + 8 + 40 + 7 + 70 + 30, "bmc": 300.0, "rapl": 20 + 3}


class KeplerExporter:
    """Kepler 0.11's node metrics at the rates above while ``running``; the joules added are kept exactly."""

    def __init__(self) -> None:
        from prometheus_client import start_http_server

        self.cpu = dict.fromkeys(CPU, 1000.0)
        self.gpu = dict.fromkeys(GPU, 500.0)
        self.running = threading.Event()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        registry = CollectorRegistry()
        registry.register(self)
        self.port = free_port()
        self.server, self._serve = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        self._tick = threading.Thread(target=self._run, daemon=True)
        self._tick.start()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        cpu = CounterMetricFamily("kepler_node_cpu_joules", "Energy consumption of cpu at node level in joules",
                                  labels=["zone", "path", "node_name"])
        gpu = CounterMetricFamily("kepler_node_gpu_joules", "Total energy consumption of GPU at node level",
                                  labels=["gpu", "gpu_uuid", "vendor", "node_name"])
        plat = GaugeMetricFamily("kepler_platform_watts", "Current platform power consumption in watts",
                                 labels=["source", "node_name", "bmc_id", "chassis_id", "power_control_id",
                                         "power_control_name"])
        with self.lock:
            for (node, zone, path), j in self.cpu.items():
                cpu.add_metric([zone, path, node], j)
            for (node, idx), j in self.gpu.items():
                gpu.add_metric([idx, f"GPU-{node}-{idx}", "nvidia", node], j)
        for (node, pc, name), w in PLATFORM.items():
            plat.add_metric(["redfish", node, f"bmc-{node}", "1", pc, name], w)
        return [cpu, gpu, plat]

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.05):
            now = time.monotonic()
            if self.running.is_set():
                with self.lock:
                    for k in self.cpu:
                        self.cpu[k] += CPU[k] * (now - last)
                    for k in self.gpu:
                        self.gpu[k] += GPU[k] * (now - last)
            last = now

    def stop(self) -> None:
        self._stop.set()
        self._tick.join()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def kepler(tmp_path):
    if not Path(PROMETHEUS).exists():
        pytest.skip(f"{PROMETHEUS} not found: apt-get install prometheus (make test does)")
    from prometheus_api_client import PrometheusConnect

    exp = KeplerExporter()
    try:
        with prometheus_server(tmp_path, free_port(), [f"127.0.0.1:{exp.port}"]) as url:
            yield exp, url, PrometheusConnect(url=url)  # plain http on loopback; TLS verification stays on
    finally:
        exp.stop()


def _samples(prom, selector: str) -> list[tuple[float, float]]:
    res = prom.custom_query(f"{selector}[5m]")
    return [(float(t), float(v)) for t, v in res[0]["values"]] if res else []


def test_kepler_preset_reads_disjoint_zones_gpus_and_the_platform(kepler):
    exp, url, prom = kepler
    probe = 'kepler_node_cpu_joules_total{node_name="rapl",zone="package"}'
    wait_for(lambda: len(_samples(prom, probe)) >= 2, 30, "two baseline scrapes")
    t_base = _samples(prom, probe)[-1][0]

    exp.running.set()
    time.sleep(6)  # six scrapes at the rates above
    # serve's feed query, with a 4 s rate window instead of its 2 minutes (the counters have run for 6 s).
    assert feed_power_query(CacheOptions(energy_source="kepler")) == KEPLER.watts(FEED_RATE_WINDOW_S, "node")
    feed_query = KEPLER.watts(4, "node")
    got: dict[str, float] = {}
    feed = PrometheusFeed(FeedConfig(url=url, power_query=feed_query), lambda cpu, w: got.update(w),
                          registry=CollectorRegistry())
    feed.refresh()  # what serve's feed thread runs every interval
    exp.running.clear()
    for node, watts in EXPECTED_W.items():
        assert got.get(node) == pytest.approx(watts, rel=0.05), f"{node}: feed read {got.get(node)} W, not {watts}"
    assert set(got) == set(EXPECTED_W)

    # Hold still until the final counters are scraped twice, then read the window baseline .. last scrape.
    with exp.lock:
        final = exp.cpu[("rapl", "package", "intel-rapl:0")]

    def settled():
        s = _samples(prom, probe)
        return len(s) >= 2 and s[-1][1] == s[-2][1] == pytest.approx(final)

    wait_for(settled, 20, "two scrapes of the final counters")
    t_end = _samples(prom, probe)[-1][0]
    start = t_base - 0.001
    with exp.lock:
        rapl_gpu = sum(j - 1000.0 for (n, z, _), j in exp.cpu.items() if n == "rapl-gpu" and z in ("package", "dram"))
        rapl_gpu += sum(j - 500.0 for (n, _), j in exp.gpu.items() if n == "rapl-gpu")
        rapl = sum(j - 1000.0 for (n, z, _), j in exp.cpu.items() if n == "rapl" and z in ("package", "dram"))
    expected = rapl_gpu + rapl + 300.0 * (t_end - start)  # the BMC node: its server watts over the window
    meter = PrometheusMeter(prom, energy_source("kepler"), scrape_wait_s=10)
    assert meter.series() == len(CPU) + len(GPU) + len(PLATFORM)
    joules = meter.joules(start, t_end)
    assert joules == pytest.approx(expected, rel=0.01), meter.last_query
    assert "kepler_node_cpu_joules_total" in meter.last_query

    # What a summing bug would read instead: every zone, every PowerControl entry, RAPL beside the platform.
    naive = prom.custom_query(f"sum(increase({{__name__=~\"kepler_node_(cpu|gpu)_joules_total\"}}"
                              f"[{round((t_end - start) * 1000)}ms]))", params={"time": f"{t_end:.3f}"})
    assert float(naive[0]["value"][1]) > 1.25 * (rapl_gpu + rapl)

    watts = meter.watts_by_node(t_base, t_end, rate_window_s=4, points=10)
    assert set(watts) == set(EXPECTED_W)  # named by Kepler's node_name label
    assert max(w for _, w in watts["bmc"]) == pytest.approx(300.0)


def test_kepler_and_a_power_query_are_exclusive():
    with pytest.raises(DaemonInputError, match="give one"):
        feed_power_query(CacheOptions(energy_source="kepler", power_query="sum by (node) (my_watts)"))
    with pytest.raises(Exception, match="expected one of joulesched, kepler"):
        feed_power_query(CacheOptions(energy_source="scaphandre"))
    assert 'label_replace(' in feed_power_query(CacheOptions(energy_source="kepler", node_label="instance"))
    assert KEPLER.watts(60) == KEPLER.watts(60, KEPLER.node_label)  # no relabelling onto its own label
