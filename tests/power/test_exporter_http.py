"""The exporter's HTTP endpoint on the hardened base: content negotiation, gzip, bodies capped, and Hypothesis
fuzzing (random methods, paths, headers, bodies): every answer is 2xx/4xx in time, threads stay bounded."""

from __future__ import annotations

import gzip
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings

from joulesched.power.exporter import EXPORTER_LIMITS, Exporter
from joulesched.power.monitor import PowerMonitor
from joulesched.power.powercap import PowercapMeter
from tests.support.httpfuzz import NoAnswer, Req, open_idle, requests, send
from tests.support.procs import wait_for
from tests.support.sysfs import SyntheticPowercap, SyntheticProc


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    root = tmp_path_factory.mktemp("hw")
    pc, proc = SyntheticPowercap(root / "powercap"), SyntheticProc(root / "proc")
    pc.add("intel-rapl:0", "package-0")
    exp = Exporter(PowerMonitor(PowercapMeter(str(pc.root)), proc_root=str(proc.root)), port=0,
                   interval_s=0.2).start()
    try:
        yield exp
    finally:
        exp.stop()


def _in_use(exp) -> int:
    return EXPORTER_LIMITS.max_connections - exp._server._slots_sem()._value


def test_metrics_text_openmetrics_and_gzip(exporter):
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    plain = urllib.request.urlopen(url, timeout=5)
    assert plain.headers["Content-Type"].startswith("text/plain") and b"joulesched_node_joules_total" in plain.read()
    om = urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/openmetrics-text"}),
                                timeout=5)
    assert om.headers["Content-Type"].startswith("application/openmetrics-text") and om.read().endswith(b"# EOF\n")
    gz = urllib.request.urlopen(urllib.request.Request(url, headers={"Accept-Encoding": "gzip"}), timeout=5)
    assert gz.headers["Content-Encoding"] == "gzip" and b"joulesched_node_watts" in gzip.decompress(gz.read())


@pytest.mark.parametrize("header, gz", [("gzip", True), ("deflate, GZIP;q=0.5", True), ("*", True),
                                        ("gzip;q=0", False), ("gzip;q=0.0, identity", False), ("*;q=0", False),
                                        ("gzip;q=0, *", False), ("identity", False), ("gzip;q=x", False),
                                        ("x-gzip", False)])
def test_gzip_only_where_the_scraper_accepts_it(exporter, header, gz):
    r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{exporter.port}/metrics",
                                                      headers={"Accept-Encoding": header}), timeout=5)
    body = r.read()
    assert (r.headers["Content-Encoding"] == "gzip") is gz and r.headers["Vary"] == "Accept, Accept-Encoding"
    assert b"joulesched_node_watts" in (gzip.decompress(body) if gz else body)


def test_bodies_and_methods_are_refused(exporter):
    assert send(exporter.port, Req("GET", "/metrics", (), b"", "-1").to_bytes())[0] == 400
    assert send(exporter.port, Req("GET", "/metrics", (), b"", str(EXPORTER_LIMITS.max_body + 1)).to_bytes())[0] == 413
    assert send(exporter.port, Req("POST", "/metrics", (), b"{}", "2").to_bytes())[0] == 405
    assert send(exporter.port, Req("GET", "/nope", (), b"", None).to_bytes())[0] == 404


def test_idle_connections_are_bounded(exporter):
    socks = open_idle(exporter.port, EXPORTER_LIMITS.max_connections + 5)
    try:
        # The server takes the connections one by one (a loaded machine may take a while); each holds its slot
        # for the socket timeout (10 s).
        wait_for(lambda: _in_use(exporter) == EXPORTER_LIMITS.max_connections, 8, "every slot taken",
                 interval=0.02)
        # Over the bound, connections are answered 503 at once instead of getting a thread.
        assert send(exporter.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 503
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 3
    while _in_use(exporter) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _in_use(exporter) == 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=requests(("/metrics", "/healthz", "/", "/metrics/")))
def test_fuzz_exporter(exporter, req):
    try:
        code, head = send(exporter.port, req.to_bytes(), deadline_s=5)
    except NoAnswer as e:
        raise AssertionError(f"{req}: {e}") from None
    assert 200 <= code < 300 or 400 <= code < 500, (code, req, head)
    if req.bad_length:
        assert code == 400
    assert _in_use(exporter) <= EXPORTER_LIMITS.max_connections
    assert send(exporter.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200
