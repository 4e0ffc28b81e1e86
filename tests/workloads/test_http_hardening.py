"""The workload apps on the hardened server, started for real (`joulesched workload serve` on loopback): body
caps (413), Content-Length checks (400), bounded /stream and /sink (429), a bounded thread count, net_target
limited to the allow-list (the cloud metadata address above all), upstream URL segments quoted, and Hypothesis
fuzzing of every app: random methods, paths, headers and bodies, each answered 2xx/4xx in time."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
import requests as http
from hypothesis import HealthCheck, given, settings

from joulesched.workloads.egress import EgressError, NetAllow
from joulesched.workloads.server import APP_LIMITS
from joulesched.workloads.service import MAX_CONTENT_LENGTH, MAX_STREAMS
from tests.support.httpfuzz import NoAnswer, Req, open_idle, requests, send
from tests.workloads.conftest import start_app, stop_app, wait_for

pytestmark = pytest.mark.slow

APPS = {
    "cpu": ("/start", "/stop", "/status", "/healthz"),
    "memory": ("/start", "/stop", "/status", "/healthz"),
    "disk": ("/start", "/stop", "/status", "/healthz"),
    "network": ("/start", "/stop", "/status", "/healthz", "/stream", "/sink"),
    "combined": ("/start", "/stop", "/status", "/healthz", "/stream", "/sink"),
    "testapp": ("/work", "/test", "/healthz"),
    "shop": ("/api/products", "/api/products/1", "/api/products/reserve", "/api/carts", "/api/carts/x",
             "/api/carts/x/items", "/api/orders", "/api/orders/1", "/healthz"),
}


@pytest.fixture(scope="module")
def apps(tmp_path_factory):
    d = tmp_path_factory.mktemp("apps")
    started = {}
    try:
        for kind in APPS:
            extra = ("--scratch-dir", str(d)) if kind in ("disk", "combined") else ()
            extra += ("--db", str(d / "shop.db")) if kind == "shop" else ()
            started[kind] = start_app(kind, *extra, stderr_path=d / f"{kind}.stderr")
        yield started
    finally:
        leftovers = [pid for s in started.values() for pid in stop_app(s)]
        assert leftovers == []


def _port(app) -> int:
    return int(app.url.rsplit(":", 1)[1])


# ----------------------------------------------------------------------------------------------- net_target
@pytest.mark.parametrize("target", [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "http://[fe80::1]/", "http://[fd00:ec2::254]/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://10.0.0.1:8080/sink", "http://0.0.0.0:8080/sink", "http://example.com/sink",
    "http://2852039166/",  # 169.254.169.254 as one decimal number
])
def test_net_target_outside_the_allow_list_is_refused(apps, target):
    r = apps["network"].post("/start", json={"duration_s": 5, "net_mbps": 10, "net_target": target})
    assert r.status_code == 400 and "net_target" in r.json()["error"], r.text
    assert apps["network"].get("/status").json()["state"] == "idle"


def test_metadata_stays_refused_even_when_its_network_is_allowed(tmp_path):
    app = start_app("network", "--net-allow", "169.254.0.0/16", "--net-allow", "127.0.0.0/8",
                    stderr_path=tmp_path / "e")
    try:
        r = app.post("/start", json={"duration_s": 5, "net_mbps": 10, "net_target": "http://169.254.169.254/"})
        assert r.status_code == 400 and "metadata" in r.json()["error"]
        ok = app.post("/start", json={"duration_s": 1, "net_mbps": 1, "net_target": "http://127.0.0.1:9/sink"})
        assert ok.status_code == 202, ok.text
    finally:
        assert stop_app(app) == []


def test_a_bad_allow_list_pattern_exits_2():
    import subprocess

    from tests.workloads.conftest import BIN

    r = subprocess.run([str(BIN), "workload", "serve", "network", "--net-allow", "10.*.0.1", "--listen",
                        "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--net-allow: '10.*.0.1' is neither an IP network" in r.stderr, r.stderr


def test_in_cluster_service_names_pass_and_resolve_is_checked_again():
    """A permitted name that resolves to the metadata service is refused at connect time (DNS can change
    between /start and a reconnect). The resolver is injected: no DNS server here can be made to lie."""
    allow = NetAllow(resolver=lambda host, port: {"sink.ns.svc": ["10.96.0.7"],
                                                  "evil.ns.svc": ["10.96.0.8", "169.254.169.254"]}[host])
    assert allow.check_url("http://sink.ns.svc:8080/sink") == "sink.ns.svc"
    assert allow.check_url("http://SINK.ns.svc.cluster.local./sink") == "sink.ns.svc.cluster.local"
    assert allow.resolve("http://sink.ns.svc:8080/sink") == "10.96.0.7"
    with pytest.raises(EgressError, match="169.254.169.254"):
        allow.resolve("http://evil.ns.svc/sink")
    for bad in ("http://svc/", "http://sink.ns.svc.evil.com/", "ftp://127.0.0.1/", "http://localhost.evil/"):
        with pytest.raises(EgressError):
            allow.check_url(bad)
    with pytest.raises(EgressError, match="neither"):
        NetAllow(["10.0.0.0/8", "a*b"])


@pytest.mark.parametrize("bad", ["not a net!!", "_sink", "sink_", "-sink", "sink-", "a..b", "*.svc!", "*.-x"])
def test_a_pattern_that_is_no_host_name_is_refused(bad):
    with pytest.raises(EgressError, match=f"net allow-list: (bad suffix pattern )?{re.escape(repr(bad))}"):
        NetAllow(["127.0.0.0/8", bad])
    allow = NetAllow(["Sink.NS.svc.", "sink-1", "my_sink", "*.svc.cluster.local", "fd00::/8"])  # what stays valid
    assert allow.check_url("http://sink.ns.svc/") == "sink.ns.svc" and allow.check_url("http://SINK-1/")
    assert allow.check_url("http://my_sink:8080/sink") == "my_sink"  # a Docker Compose service name


def test_a_net_target_that_is_the_blocker_itself_is_refused(apps):
    app = apps["network"]
    port = _port(app)
    for target in (app.url + "/sink", f"http://localhost:{port}/start", f"http://[::ffff:127.0.0.1]:{port}/sink"):
        r = app.post("/start", json={"duration_s": 5, "net_mbps": 10, "net_target": target})
        assert r.status_code == 400 and "is this blocker itself" in r.json()["error"], (target, r.text)
    assert app.get("/status").json()["state"] == "idle"


# ----------------------------------------------------------------------------------------------- bodies
def test_bodies_over_max_content_length_are_413(apps):
    big = b"x" * (MAX_CONTENT_LENGTH + 1)
    for kind, path in (("cpu", "/start"), ("shop", "/api/orders"), ("shop", "/api/carts/x/items")):
        r = http.post(apps[kind].url + path, data=big, headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 413, (kind, path, r.status_code)
    # Declared and not sent: refused from the header alone, at once.
    code, _ = send(_port(apps["cpu"]), Req("POST", "/start", (("Content-Type", "application/json"),), b"",
                                           str(10 * MAX_CONTENT_LENGTH)).to_bytes(), deadline_s=3)
    assert code == 413


def test_chunked_bodies_over_the_cap_are_413_and_under_it_are_read_whole(apps):
    """werkzeug cut a chunked body at the app's cap without a word: the cut JSON read as malformed (400)."""
    big = b'{"duration_s": 1, "pad": "' + b"x" * MAX_CONTENT_LENGTH + b'"}'
    for kind, path in (("cpu", "/start"), ("shop", "/api/orders")):
        r = http.post(apps[kind].url + path, data=iter([big[:1000], big[1000:]]),  # an iterator: sent chunked
                      headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 413 and "over the" in r.json()["error"], (kind, path, r.status_code, r.text)
    r = http.post(apps["cpu"].url + "/start", data=iter([b'{"duration_s": 1, ', b'"kind": "x"}']),
                  headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "does not take kind" in r.json()["error"], r.text  # the whole body, parsed
    # Neither a length nor chunks: no body (read raw, the socket was waited on for 30 s, then 500)
    for kind, path in (("cpu", "/start"), ("shop", "/api/orders")):
        t0 = time.monotonic()
        code, _ = send(_port(apps[kind]), Req("POST", path, (("Content-Type", "application/json"),), b"",
                                              None).to_bytes(), deadline_s=5)
        assert code == 400 and time.monotonic() - t0 < 3, (kind, code)


@pytest.mark.parametrize("kind,path", [("cpu", "/start"), ("combined", "/start"), ("shop", "/api/orders"),
                                       ("shop", "/api/carts/x/items"), ("shop", "/api/products/reserve")])
def test_deeply_nested_json_is_400(apps, kind, path):
    for body in ("[" * 60000, '{"a":' * 12000):  # under the 64 KiB cap, far over the parser's recursion limit
        r = http.post(apps[kind].url + path, data=body, headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"].startswith("body must be a JSON object"), (path, r.text)


@pytest.mark.parametrize("length", ["-1", "abc", "1e3"])
def test_negative_or_non_numeric_content_length_is_400(apps, length):
    for kind in ("cpu", "testapp", "shop"):
        code, _ = send(_port(apps[kind]), Req("POST", "/start", (), b"{}", length).to_bytes(), deadline_s=3)
        assert code == 400, (kind, length)


def test_every_app_sets_max_content_length(tmp_path):
    from joulesched.workloads import shop, testapp
    from joulesched.workloads.service import BlockerService, create_app

    for app in (create_app(BlockerService("cpu")), testapp.create_app(), shop.create_app(tmp_path / "s.db")):
        assert 0 < app.config["MAX_CONTENT_LENGTH"] <= 1 << 20, app.name


# ----------------------------------------------------------------------------------------------- streams
@pytest.mark.parametrize("query", ["mbps=0.000001&seconds=1", "mbps=1e-300&seconds=1", "mbps=1e-300&seconds=3600"])
def test_a_stream_too_slow_for_one_chunk_is_400_at_once(apps, query):
    # 0.000001 Mbit/s used to hold a stream slot for hours before its first chunk; 1e-300 was a 500.
    r = http.get(apps["network"].url + "/stream?" + query, timeout=5)
    assert r.status_code == 400 and "too slow to move one 1024-byte transfer" in r.json()["error"], r.text


def test_stream_and_sink_are_bounded(apps):
    app = apps["network"]
    streams = [http.get(app.url + "/stream?mbps=1&seconds=60", stream=True, timeout=10) for _ in range(MAX_STREAMS)]
    try:
        assert all(r.status_code == 200 for r in streams)
        extra = http.get(app.url + "/stream?mbps=1&seconds=60", timeout=10)
        assert extra.status_code == 429 and extra.headers["Retry-After"] == "1"
        assert http.post(app.url + "/sink", data=b"abc", timeout=10).status_code == 429
        assert app.get("/status").status_code == 200  # the rest of the app still answers
    finally:
        for r in streams:
            r.close()
    # Closing the clients frees the slots (the server notices on its next write).
    assert wait_for(lambda: http.get(app.url + "/stream?mbps=1&seconds=0.1", timeout=10).status_code == 200, 10)
    assert http.post(app.url + "/sink", data=b"abc", timeout=10).json() == {"received": 3}


def test_idle_connections_cannot_exhaust_threads(apps):
    app = apps["testapp"]
    proc = psutil.Process(app.pid)
    base = proc.num_threads()
    socks = open_idle(_port(app), APP_LIMITS.max_connections + 10)
    try:
        assert wait_for(lambda: proc.num_threads() >= base + APP_LIMITS.max_connections, 5)
        time.sleep(0.3)
        assert proc.num_threads() <= base + APP_LIMITS.max_connections
        code, _ = send(_port(app), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", deadline_s=3)
        assert code == 503
    finally:
        for s in socks:
            s.close()
    assert wait_for(lambda: proc.num_threads() <= base + 1, 10)
    assert app.get("/healthz").status_code == 200


# ----------------------------------------------------------------------------------------------- shop
class _Recorder(BaseHTTPRequestHandler):
    paths: list[str] = []
    reply = (404, "application/json", json.dumps({"error": "no such cart"}).encode())

    def log_message(self, *a) -> None:
        pass

    def do_GET(self) -> None:
        self.paths.append(self.path)
        code, kind, data = self.reply
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def upstream():
    """A stand-in for the cart and catalogue services that records the paths asked for."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _Recorder.paths = []
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_shop_quotes_the_cart_id_in_upstream_urls(upstream):
    from joulesched.workloads.shop import CartHTTP, ShopError

    with pytest.raises(ShopError, match="no such cart") as err:
        CartHTTP(upstream).get("a/../../api/products/reserve?x=1#y")
    assert err.value.status == 404
    assert _Recorder.paths == ["/api/carts/a%2F..%2F..%2Fapi%2Fproducts%2Freserve%3Fx%3D1%23y"]


@pytest.mark.parametrize("cart_id", [".", "..", "a/../../api/products/reserve?x=1#y", "nope", "A" * 32])
def test_orders_refuse_a_cart_id_the_shop_never_made_without_asking_upstream(tmp_path, upstream, cart_id):
    from joulesched.workloads.shop import create_app

    orders = create_app(tmp_path / "o.db", "orders", catalogue_url=upstream, cart_url=upstream).test_client()
    r = orders.post("/api/orders", json={"cart_id": cart_id})
    assert r.status_code == 404 and "cart ids are 32 hex digits" in r.json["error"], r.json
    assert _Recorder.paths == []


@pytest.mark.parametrize("reply,code", [
    ((404, "text/html", b"<!doctype html><title>404 Not Found</title>"), 502),  # a wrong URL, a proxy's page
    ((400, "application/json", b"[1, 2]"), 502),
    ((200, "text/html", b"<html>hello</html>"), 502),
    ((404, "application/json", b'{"error": "no cart 0123"}'), 404),  # the shop's own 404 passes through
])
def test_an_upstream_reply_that_is_not_the_shops_json_is_a_502(tmp_path, upstream, monkeypatch, reply, code):
    from joulesched.workloads.shop import create_app

    monkeypatch.setattr(_Recorder, "reply", reply)
    orders = create_app(tmp_path / "o.db", "orders", catalogue_url=upstream, cart_url=upstream).test_client()
    r = orders.post("/api/orders", json={"cart_id": "0123456789abcdef" * 2})
    assert r.status_code == code and r.json["error"], (r.status_code, r.data[:200])
    assert _Recorder.paths == ["/api/carts/" + "0123456789abcdef" * 2]


# ----------------------------------------------------------------------------------------------- fuzzing
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=requests(tuple(p for paths in APPS.values() for p in paths)))
@pytest.mark.parametrize("kind", list(APPS))
def test_fuzz_app(apps, kind, data):
    app = apps[kind]
    try:
        code, head = send(_port(app), data.to_bytes(), deadline_s=5)
    except NoAnswer as e:
        raise AssertionError(f"{kind}: {data}: {e}") from None
    except ConnectionRefusedError:
        raise AssertionError(f"{kind} is down after {data}") from None
    assert 200 <= code < 300 or 400 <= code < 500, (kind, code, data, head)
    if data.bad_length:
        assert code == 400, (kind, code, data)
    assert psutil.Process(app.pid).num_threads() <= 8 + APP_LIMITS.max_connections


def test_apps_survive_the_fuzzing(apps):
    for kind, app in apps.items():
        assert app.proc.poll() is None, kind
        assert app.get("/healthz").status_code == 200, kind
        with socket.create_connection(("127.0.0.1", _port(app)), timeout=3):
            pass


def test_sink_takes_a_stream_longer_than_the_servers_request_deadline():
    # The server cuts a request whose head and body take longer than timeout_s (slow clients must not hold
    # a slot); a load's stream into /sink lasts as long as the load, so /sink lifts that limit for itself.
    import dataclasses

    from joulesched.workloads.server import make_server
    from joulesched.workloads.service import BlockerService, create_app

    srv = make_server("127.0.0.1", 0, create_app(BlockerService("network")),
                      dataclasses.replace(APP_LIMITS, timeout_s=1.0))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.server_port), timeout=10) as s:
            s.sendall(b"POST /sink HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(8):  # 2.4 s of stream, a chunk every 0.3 s: each read well within 1 s
                time.sleep(0.3)
                s.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")
            s.sendall(b"0\r\n\r\n")
            out = b""
            while data := s.recv(4096):
                out += data
        assert out.startswith(b"HTTP/1.1 200"), out[:200]
        assert json.loads(out.split(b"\r\n\r\n", 1)[1]) == {"received": 8 * 1024}
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)
