"""`pipeline --env kube --energy-source kepler`: the kube pipeline measures each policy's energy from Kepler's
metrics (a real Prometheus scraping the Kepler-named exporter of tests/power/test_kepler_prometheus.py, every
overlapping zone present), and the scheduler it starts reads its power feed from the same preset."""

from __future__ import annotations

import pytest

from joulesched.power.energy_sources import KEPLER
from tests.pipelines.test_kube_pipeline import emu, kubeconfig, needs_prometheus, schedulers, testapp  # noqa: F401
from tests.power.test_kepler_prometheus import EXPECTED_W, KeplerExporter
from tests.support.procs import free_port, prometheus_server, wait_for

POLICIES = ("default-k8s", "energy-greedy")


@pytest.fixture
def kepler_prometheus(tmp_path):
    from prometheus_api_client import PrometheusConnect

    exp = KeplerExporter()
    exp.running.set()  # the counters rise at the module's rates for the whole test
    try:
        with prometheus_server(tmp_path, free_port(), [f"127.0.0.1:{exp.port}"]) as url:
            prom = PrometheusConnect(url=url)
            wait_for(lambda: (r := prom.custom_query("min(count_over_time(kepler_node_cpu_joules_total[1m]))"))
                     and float(r[0]["value"][1]) >= 2, 30, "two scrapes of the Kepler exporter", interval=0.25)
            yield url
    finally:
        exp.stop()


@pytest.mark.integration
@needs_prometheus
def test_kube_pipeline_measures_with_the_kepler_preset(emu, kubeconfig, schedulers, kepler_prometheus,  # noqa: F811
                                                        testapp, tmp_path):  # noqa: F811
    from joulesched.pipelines.kube_pipeline import run_kube

    out = tmp_path / "out"
    for node in EXPECTED_W:  # nodes named as Kepler's node_name: the scheduler's feed matches its samples to them
        emu.add_node(node, cpu="4", memory="8Gi")
    # A load of 5 s with a 3 s rate window: the per-node series has samples whose whole rate window lies in the
    # load (t >= 3) however the 1 s query grid falls on the window (with a 3 s load the one such sample could
    # land at 2.95 s and there was none).
    doc = run_kube(out, kubeconfig=kubeconfig, prometheus_url=kepler_prometheus, target=testapp, policies=POLICIES,
                   pods=2, load_seconds=5, users=1, driver="locust", bind_timeout_s=20, delete_timeout_s=20,
                   scrape_wait_s=20, rate_window_s=3, energy_selector=KEPLER)
    total_w = sum(EXPECTED_W.values())  # package+DRAM+GPUs, the BMC's server watts, package+DRAM
    for pol in POLICIES:
        r = doc.scenarios[0].policies[pol]
        window = r.window_end_unix - r.window_start_unix
        assert "kepler_node_cpu_joules_total" in r.energy_query and "kepler_platform_watts" in r.energy_query
        assert r.energy_joules == pytest.approx(total_w * window, rel=0.05), (pol, r.energy_joules, window)
        assert set(r.node_power) == set(EXPECTED_W)  # Kepler's node_name
        for node, watts in EXPECTED_W.items():
            late = [w for t, w in r.node_power[node] if t >= 3]
            assert late and all(w == pytest.approx(watts, rel=0.05) for w in late), (node, r.node_power[node])
    # Our scheduler (energy-greedy's run) took its power feed from the same preset.
    (log,) = [f.read_text() for f in (out / "logs").glob("serve-*.log") if "energy-greedy" in f.read_text()]
    assert "power feed: using Prometheus" in log, log[-2000:]
