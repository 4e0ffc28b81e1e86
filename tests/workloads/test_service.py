"""The blocker service and its client in this process (Flask's test client, injected faults): a load thread that
dies, a disk load that would fill the disk, bad bodies, and a target that is no blocker."""

from __future__ import annotations

import re
import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from joulesched.workloads import service as service_mod
from joulesched.workloads.disk import DiskLoad
from joulesched.workloads.load import blocker as client
from joulesched.workloads.load.results import DriverError
from joulesched.workloads.network import NetworkLoad
from joulesched.workloads.service import BlockerService, create_app
from tests.workloads.conftest import wait_for


def _boom(*args, **kw):
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize("kind,body,patch", [
    ("network", {"net_mbps": 1, "net_target": "http://127.0.0.1:9/sink"}, (NetworkLoad, "_connect")),
    ("disk", {"disk_write_mbps": 1}, (DiskLoad, "_write_loop")),
])
def test_a_load_thread_that_dies_is_an_error_and_the_run_did_not_run_its_course(tmp_path, monkeypatch, kind, body,
                                                                               patch):
    monkeypatch.setattr(*patch, _boom)  # an exception the load did not expect, as OverflowError was
    svc = BlockerService(kind, scratch_dir=tmp_path)
    monkeypatch.setattr(client, "start", lambda target, params: svc.start(params))
    monkeypatch.setattr(client, "wait_idle", lambda target, timeout_s: wait_for(
        lambda: svc.status()["state"] == "idle", timeout_s) and svc.status())
    from joulesched.pipelines.cli import app

    args = ["load", "blocker", "--target", "http://127.0.0.1:9", "--duration", "0.3", "--wait"]
    for k, v in body.items():
        if k != "disk_file_mib":  # no such option: the app's default (64 MiB) is fine
            args += [f"--{k.replace('_', '-')}", str(v)]
    r = CliRunner().invoke(app, args)
    last = svc.status()["last_run"]
    assert last["end_reason"] == "a load failed"
    assert last["loads"][kind]["error"] == "ZeroDivisionError: boom"
    assert r.exit_code == 1 and "the load did not run its course: a load failed" in r.output, r.output


def test_a_disk_load_that_would_not_fit_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(service_mod.shutil, "disk_usage", lambda path: usage(10 << 30, 9 << 30, 1 << 30))
    svc = BlockerService("disk", scratch_dir=tmp_path)
    c = create_app(svc).test_client()
    r = c.post("/start", json={"duration_s": 5, "disk_read_mbps": 10, "disk_write_mbps": 10, "disk_file_mib": 300})
    assert r.status_code == 400, r.json
    assert r.json["error"].startswith(f"disk_file_mib=300 needs 600 MiB for 2 scratch file(s) in {tmp_path}, which "
                                      "has 1024 MiB free of which 512 MiB (5% of the filesystem) stay free")
    assert list(tmp_path.iterdir()) == [] and svc.status()["state"] == "idle"
    ok = c.post("/start", json={"duration_s": 5, "disk_write_mbps": 10, "disk_file_mib": 300})
    assert ok.status_code == 202, ok.json
    svc.stop()


@pytest.mark.parametrize("kind", ["cpu", "network"])
@pytest.mark.parametrize("body", ["[" * 60000, '{"a":' * 12000, '{"duration_s": ' + "[" * 20000])
def test_deeply_nested_json_is_a_400_not_a_500(kind, body):
    c = create_app(BlockerService(kind)).test_client()
    r = c.post("/start", data=body, content_type="application/json")
    assert r.status_code == 400 and r.json["error"].startswith("body must be a JSON object"), r.status_code


def test_net_target_naming_this_app_is_refused():
    c = create_app(BlockerService("network")).test_client()
    for target in ("http://127.0.0.1:8080/sink", "http://localhost:8080/start", "http://[::ffff:127.0.0.1]:8080/"):
        r = c.post("/start", json={"duration_s": 1, "net_mbps": 1, "net_target": target},
                   base_url="http://127.0.0.1:8080")  # werkzeug's server puts its bound address there
        assert r.status_code == 400 and "is this blocker itself" in r.json["error"], r.json
    r = c.post("/start", json={"duration_s": 1, "net_mbps": 1, "net_target": "http://127.0.0.1:99999/sink"})
    assert r.status_code == 400 and "port must be a number in 1..65535" in r.json["error"]


class _NotABlocker(BaseHTTPRequestHandler):
    body = b'{"hello": "world"}'
    code = 200

    def log_message(self, *a) -> None:
        pass

    def _answer(self) -> None:
        self.send_response(self.code)
        self.send_header("Content-Type", "text/html" if self.body.startswith(b"<") else "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = _answer


@pytest.fixture
def not_a_blocker():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NotABlocker)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("code,body", [(200, b'{"hello": "world"}'), (200, b"[1, 2]"), (200, b'{"kind": "cpu"}'),
                                       (200, b'{"kind": "gpu", "state": "idle"}'), (200, b"<html>\n</html>"),
                                       (404, b"<!doctype html>\n<title>404 Not Found</title>\n"), (400, b"[1]")])
def test_a_target_that_is_no_blocker_is_a_driver_error_not_a_key_error(not_a_blocker, monkeypatch, code, body):
    from joulesched.pipelines.cli import app

    monkeypatch.setattr(_NotABlocker, "body", body)
    monkeypatch.setattr(_NotABlocker, "code", code)
    # A 400 whose JSON is no object is still said in one line (it was an AttributeError).
    expected, exit_code = ("answered 400: [1]", 2) if code == 400 else ("does not look like a blocker app", 1)
    for call in (lambda: client.status(not_a_blocker), lambda: client.stop(not_a_blocker),
                 lambda: client.start(not_a_blocker, {"duration_s": 1, "cpu_m": 1})):
        with pytest.raises(DriverError, match=re.escape(expected)):
            call()
    for args in (["--cpu-m", "100", "--duration", "1"], ["--stop"], ["--cpu-m", "100", "--duration", "1", "--wait"]):
        r = CliRunner().invoke(app, ["load", "blocker", "--target", not_a_blocker, *args])
        assert r.exit_code == exit_code and expected in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
