"""A real Prometheus scrapes the exporter while the synthetic RAPL counters wrap around.

How the check stays exact despite ``increase()`` extrapolation: Prometheus extrapolates a range's first and
last samples towards the window's edges, which scales the result by up to (window)/(sampled span), several
percent at a 1 s scrape interval and a short window. So the test (1) holds the counters still long enough for
Prometheus to scrape the baseline, (2) injects a known number of joules through a wraparound, (3) holds still
again until the final value has been scraped, then reads the raw samples' timestamps and evaluates
``increase(c[W])`` at the last sample's timestamp with W reaching 1 ms before the last baseline sample. Both
ends of the window then sit (within 1 ms) on samples, the extrapolation factor is 1 + 1 ms/W, and the result
must equal the injected joules; the 1 % tolerance of the issue is far wider than what is left. Starting the
window 1 ms early also keeps the baseline sample inside whether the range is left-closed (Prometheus 2.x) or
left-open (3.x).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from joulesched.power.exporter import Exporter
from joulesched.power.monitor import PowerMonitor
from joulesched.power.powercap import PowercapMeter
from tests.support.procs import PROMETHEUS, free_port, prometheus_server, wait_for
from tests.support.sysfs import SyntheticPowercap, SyntheticProc

MAX_RANGE = 262_143_328_850
pytestmark = pytest.mark.integration


@pytest.fixture
def exporter(tmp_path):
    pc = SyntheticPowercap(tmp_path / "powercap")
    pc.add("intel-rapl:0", "package-0", energy_uj=MAX_RANGE - 20_000_000)  # wraps 20 J in
    pc.add("intel-rapl:0:0", "core", energy_uj=MAX_RANGE - 5_000_000)  # wraps 5 J in
    pc.add("intel-rapl:0:2", "dram", energy_uj=123_456)
    pc.add("intel-rapl-mmio:0", "package-0", energy_uj=42)  # the duplicate: must not show up
    proc = SyntheticProc(tmp_path / "proc")
    exp = Exporter(PowerMonitor(PowercapMeter(str(pc.root)), proc_root=str(proc.root)), port=0,
                   interval_s=0.2).start()
    yield pc, exp
    exp.stop()


@pytest.fixture
def prometheus(tmp_path, exporter):
    if not Path(PROMETHEUS).exists():
        pytest.skip(f"{PROMETHEUS} not found: apt-get install prometheus (make test does)")
    _, exp = exporter
    from prometheus_api_client import PrometheusConnect

    with prometheus_server(tmp_path, free_port(), [f"127.0.0.1:{exp.port}"]) as url:
        yield PrometheusConnect(url=url)  # plain http on loopback; TLS verification is left on


def _raw(prom, zone: str) -> list[tuple[float, float]]:
    res = prom.custom_query(f'joulesched_node_joules_total{{zone="{zone}"}}[5m]')
    return [(float(t), float(v)) for t, v in res[0]["values"]] if res else []


def test_increase_matches_injected_joules_through_a_wrap(exporter, prometheus):
    pc, _ = exporter
    zones = {"intel-rapl:0": "package-0", "intel-rapl:0:0": "core-0", "intel-rapl:0:2": "dram-0"}

    # (1) baseline: at least two scrapes of the still counters.
    wait_for(lambda: all(len(_raw(prometheus, z)) >= 2 for z in zones.values()), 30, "two baseline scrapes")
    baseline = {z: _raw(prometheus, z)[-1] for z in zones.values()}
    assert all(v == 0.0 for _, v in baseline.values())

    # (2) inject 60 J into the package (wrapping at 20 J), 30 J into core (wrapping at 5 J), 12 J into dram.
    per_step = {"intel-rapl:0": 6_000_000, "intel-rapl:0:0": 3_000_000, "intel-rapl:0:2": 1_200_000}
    for _ in range(10):
        for d, uj in per_step.items():
            pc.advance(d, uj)
        pc.advance("intel-rapl-mmio:0", 9_000_000)
        time.sleep(0.25)
    injected = {zones[d]: uj * 10 / 1e6 for d, uj in per_step.items()}
    assert int(pc.energy_path("intel-rapl:0").read_text()) < MAX_RANGE - 20_000_000, "package counter wrapped"

    # (3) hold still until Prometheus has scraped the final value twice (the final value: two scrapes of an
    # earlier one, the exporter's refresh starved on a loaded machine, would cut the window short).
    def settled():
        return all(len(s := _raw(prometheus, z)) >= 2 and s[-1][1] == s[-2][1] == pytest.approx(injected[z])
                   for z in zones.values())

    wait_for(settled, 20, "two scrapes of the final counters")

    for zone, joules in injected.items():
        samples = _raw(prometheus, zone)
        values = [v for _, v in samples]
        assert values == sorted(values), f"{zone}: a counter decreased: {values}"
        t_base = max(t for t, v in samples if v == 0.0)  # last baseline scrape
        t_end = samples[-1][0]
        window_ms = round((t_end - t_base) * 1000) + 1
        res = prometheus.custom_query(f'increase(joulesched_node_joules_total{{zone="{zone}"}}[{window_ms}ms])',
                                      params={"time": f"{t_end:.3f}"})
        got = float(res[0]["value"][1])
        assert got == pytest.approx(joules, rel=0.01), f"{zone}: increase {got} J, injected {joules} J"
        assert res[0]["metric"]["source"] == "powercap"
    assert {r["metric"]["zone"] for r in prometheus.custom_query("joulesched_node_joules_total")} == set(zones.values())
