"""Usage and power from Prometheus (prometheus-api-client), and the request-based fallback when it is down."""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.kube.metrics_feed import DEFAULT_CPU_QUERY, DEFAULT_POWER_QUERY, FeedConfig
from tests.live.conftest import wait_until


class FakePrometheus:
    """Answers /api/v1/query with the vectors in ``results`` (query -> {node: value}); ``down`` answers 503."""

    def __init__(self) -> None:
        self.results: dict[str, dict[str, float]] = {}
        self.down = False
        self.queries: list[str] = []
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
                fake.queries.append(q)
                if fake.down:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                vec = [{"metric": {"node": n}, "value": [0, str(v)]} for n, v in fake.results.get(q, {}).items()]
                data = json.dumps({"status": "success", "data": {"resultType": "vector", "result": vec}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def prom():
    p = FakePrometheus()
    yield p
    p.stop()


def _backend(emu, url):
    b = KubeCache(api_client_for(emu.url), feed=FeedConfig(url=url, interval_s=0.05, timeout_s=1))
    b.start()
    assert b.wait_synced(10)
    return b


def test_usage_and_watts_from_prometheus(emu, prom):
    emu.add_node("a", cpu="4")
    emu.add_node("b", cpu="4")
    emu.add_pod("r", cpu="1", node_name="a", scheduler_name="default-scheduler")
    prom.results = {DEFAULT_CPU_QUERY: {"a": 0.5}, DEFAULT_POWER_QUERY: {"a": 123.0, "b": 45.0}}
    b = _backend(emu, prom.url)
    try:
        wait_until(lambda: b.registry.get_sample_value("joulesched_metrics_fallback", {"feed": "cpu"}) == 0)

        def usage():
            with b.lock:
                return b.state().usage_cpu.tolist()
        # a: measured 50 % of 4000m; b: no sample -> its requests (0)
        wait_until(lambda: usage() == [2000.0, 0.0], what="measured usage")
        with b.lock:
            st = b.state()
            assert st.measured_watts.tolist() == [123.0, 45.0]
            # A pod bound after the scrape counts on top of the measurement until the next one.
            pods = {p.name: p for p in b.pods.values()}
            b.assume("x", "a")  # unknown uid: nothing to account
            assert b.state().usage_cpu[0] == 2000.0
        emu.add_pod("new", cpu="1", node_name="a", scheduler_name="default-scheduler")
        wait_until(lambda: len(b.pods) == 2)
        with b.lock:
            assert b.state().usage_cpu[0] in (3000.0, 2000.0)  # 2000 again once the next scrape landed
        assert pods
    finally:
        b.stop()


def test_fallback_when_prometheus_down_is_logged_once_and_recovers(emu, prom, caplog):
    emu.add_node("a", cpu="4")
    emu.add_pod("r", cpu="1", node_name="a", scheduler_name="default-scheduler")
    prom.down = True
    caplog.set_level(logging.INFO, logger="joulesched.kube")
    b = _backend(emu, prom.url)
    try:
        wait_until(lambda: len(prom.queries) >= 6, what="several refreshes")
        assert b.registry.get_sample_value("joulesched_metrics_fallback", {"feed": "cpu"}) == 1
        with b.lock:
            assert b.state().usage_cpu.tolist() == [1000.0]  # request-based
        falls = [r for r in caplog.records if "falling back" in r.getMessage() and r.getMessage().startswith("cpu")]
        assert len(falls) == 1
        prom.down = False
        prom.results = {DEFAULT_CPU_QUERY: {"a": 0.75}}
        wait_until(lambda: b.registry.get_sample_value("joulesched_metrics_fallback", {"feed": "cpu"}) == 0)

        def usage0():
            with b.lock:
                return b.state().usage_cpu[0]
        wait_until(lambda: np.isclose(usage0(), 3000.0), what="measured usage after recovery")  # 75 % of 4000m
        assert any("using Prometheus" in r.getMessage() for r in caplog.records)
    finally:
        b.stop()


def test_unreachable_prometheus_never_stops_scheduling(emu, make_scheduler):
    emu.add_node("a")
    emu.add_pod("p", cpu="100m")
    s = make_scheduler(backend_kw={"feed": FeedConfig(url="http://127.0.0.1:9", interval_s=0.05, timeout_s=0.5)})
    wait_until(lambda: len(emu.bindings) == 1)
    assert s.registry.get_sample_value("joulesched_metrics_fallback", {"feed": "power"}) == 1


def test_a_node_change_keeps_what_was_bound_since_the_scrape(emu):
    """Usage is the measured fraction plus what was bound since the scrape. A rebuild (any node's label, a taint,
    a node added) reset that baseline, so the pods bound since vanished from usage until the next scrape
    (a review: 2400 m read as 400 m)."""
    emu.add_node("a", cpu="4")
    emu.add_node("b", cpu="4")
    c = KubeCache(api_client_for(emu.url)).start()  # no feed: the scrape is handed over by hand
    try:
        assert c.wait_synced(10)
        with c.lock:
            c.state()
        assert c._apply_metrics({"a": 0.1, "b": 0.1}, {}) == 2  # one scrape, naming both nodes
        emu.add_pod("new", cpu="2", node_name="a", scheduler_name="default-scheduler")  # bound after it
        wait_until(lambda: any(p.name == "new" for p in c.pods.values()), what="the new pod")
        with c.lock:
            assert c.state().usage_cpu.tolist() == [2400.0, 400.0]
            epoch = c.epoch
        emu.patch("nodes", "", "b", {"metadata": {"labels": {"team": "x"}}})  # a change to another node
        wait_until(lambda: (c.state(), c.epoch)[1] > epoch, what="the rebuild")
        with c.lock:
            assert c.state().usage_cpu.tolist() == [2400.0, 400.0]
        c._apply_metrics({"a": 0.6, "b": 0.1}, {})  # the next scrape has the pod in it
        with c.lock:
            assert c.state().usage_cpu.tolist() == [2400.0, 400.0]
    finally:
        c.stop()


def test_samples_that_name_no_node_of_the_cluster_are_a_fallback(emu, prom, caplog):
    """node-exporter's label holding an FQDN or IP:port: every node went on with its requests while the gauge
    said 0 and the log "using Prometheus" (a review). Now the gauge says 1 and the log says why."""
    caplog.set_level(logging.INFO, logger="joulesched.kube")
    emu.add_node("a", cpu="4")
    emu.add_pod("r", cpu="1", node_name="a", scheduler_name="default-scheduler")
    prom.results = {DEFAULT_CPU_QUERY: {"a.cluster.example": 0.9}, DEFAULT_POWER_QUERY: {"10.0.0.5:9100": 200.0}}
    b = _backend(emu, prom.url)
    try:
        wait_until(lambda: len(prom.queries) >= 6, what="several refreshes")
        assert b.registry.get_sample_value("joulesched_metrics_fallback", {"feed": "cpu"}) == 1
        assert b.registry.get_sample_value("joulesched_metrics_fallback", {"feed": "power"}) == 1
        with b.lock:
            assert b.state().usage_cpu.tolist() == [1000.0]
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cpu feed")]
        assert len(said) == 1 and "names a node of the cluster (e.g. a.cluster.example)" in said[0], said
    finally:
        b.stop()
