"""`serve` and `extender` as commands: bad input is one red line and exit 2; a real run binds pods and stops
cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from joulesched.core.net import parse_listen
from joulesched.pipelines.cli.live import extender, serve
from tests.live.conftest import wait_until
from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def app() -> typer.Typer:
    a = typer.Typer(add_completion=False)
    a.command("serve")(serve)
    a.command("extender")(extender)
    return a


@pytest.mark.parametrize("args,needle", [
    (["serve", "--policy", "nope"], "unknown policy 'nope'"),
    (["serve", "--kubeconfig", "/does/not/exist"], "kubeconfig /does/not/exist does not exist"),
    (["serve", "--listen", "localhost"], "expected HOST:PORT"),
    (["serve", "--scheduler-name", " "], "--scheduler-name must not be empty"),
    (["serve", "--event-writer", "fork"], "--event-writer 'fork' must be process or thread"),
    (["extender", "--listen", "1.2.3.4:99999"], "port must be a number from 0 to 65535"),
    (["extender", "--policy", "dqn=/missing.pt"], "missing.pt"),
    (["serve", "--energy-source", "scaphandre"], "--energy-source 'scaphandre': expected one of joulesched, kepler"),
    (["serve", "--energy-source", "kepler", "--power-query", "my_watts"], "give one of them"),
    (["extender", "--energy-source", "kepler", "--power-query", "my_watts"], "give one of them"),
])
def test_bad_input_exits_2_with_one_line(app, args, needle):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_bad_prometheus_and_profiles(app, emu, tmp_path):
    kc = emu.kubeconfig(str(tmp_path / "kc"))
    r = CliRunner().invoke(app, ["serve", "--kubeconfig", kc, "--prometheus", "prometheus:9090"])
    assert r.exit_code == 2 and "must be an http:// or https:// URL" in r.output
    r = CliRunner().invoke(app, ["serve", "--kubeconfig", kc, "--power-profiles", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and "power profiles" in r.output


@pytest.mark.parametrize("args,model", [
    ([], None),
    (["--node-power"], (10.0, 60.0)),
    (["--node-power", "--node-wake-s", "20"], (10.0, 20.0)),
    (["--node-sleep-watts", "4"], (4.0, 60.0)),
])
def test_serve_tells_the_cache_how_nodes_sleep(app, monkeypatch, args, model):
    """The sleep model the cache gets: none unless nodes are put to sleep (--node-power here, or a node-power
    Deployment the operator states with --node-sleep-watts)."""
    import joulesched.pipelines.cli.live as live_cli
    from joulesched.live.nodepower import NodePowerConfig

    assert NodePowerConfig().sleep_watts == live_cli.DEFAULT_SLEEP_WATTS == 10.0
    seen: dict = {}
    monkeypatch.setattr(live_cli, "run_serve", lambda **kw: seen.update(kw))
    r = CliRunner().invoke(app, ["serve", *args])
    assert r.exit_code == 0, r.output
    got = seen["cache"]["sleep_watts"]
    assert (None if got is None else (got, seen["cache"]["wake_s"])) == model
    monkeypatch.setattr(live_cli, "run_extender", lambda **kw: seen.update(kw))
    assert CliRunner().invoke(app, ["extender", "--node-sleep-watts", "3"]).exit_code == 0
    assert seen["cache"]["sleep_watts"] == 3.0


def test_parse_listen():
    assert parse_listen("127.0.0.1:8888") == ("127.0.0.1", 8888)
    assert parse_listen("[::1]:80") == ("::1", 80)


def test_serve_command_binds_and_stops_on_sigterm(emu, tmp_path):
    kc = emu.kubeconfig(str(tmp_path / "kubeconfig"))
    emu.add_node("n1", cpu="2")
    for i in range(3):
        emu.add_pod(f"p{i}", cpu="100m")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "joulesched.pipelines.cli", "serve", "--scheduler-name", "joulesched",
                             "--policy", "most-allocated", "--kubeconfig", kc, "--listen", f"127.0.0.1:{port}",
                             "--lease-namespace", "default"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: len(emu.bindings) == 3 or proc.poll() is not None, timeout=30, what="3 bindings")
        assert proc.poll() is None, proc.stdout.read()
        wait_until(lambda: b"ok" == urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").read(), timeout=10)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert 'joulesched_schedule_attempts_total{result="scheduled"} 3.0' in text
        lease = emu.get("leases", "joulesched", "default")
        assert lease["spec"]["holderIdentity"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert emu.get("leases", "joulesched", "default")["spec"]["holderIdentity"] == ""  # released on the way out


def test_extender_command_serves_and_stops(emu, tmp_path):
    kc = emu.kubeconfig(str(tmp_path / "kubeconfig"))
    emu.add_node("n1")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "joulesched.pipelines.cli", "extender", "--listen",
                             f"127.0.0.1:{port}", "--policy", "peaks", "--kubeconfig", kc], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    try:
        def up() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read() == b"ok"
            except OSError:
                return False
        wait_until(lambda: up() or proc.poll() is not None, timeout=30, what="extender up")
        assert proc.poll() is None
        req = urllib.request.Request(f"http://127.0.0.1:{port}/prioritize", method="POST",
                                     data=b'{"Pod":{"metadata":{"name":"p"},"spec":{"containers":[]}},'
                                          b'"NodeNames":["n1"]}')
        assert urllib.request.urlopen(req, timeout=5).read() == b'[{"Host":"n1","Score":10}]'
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    time.sleep(0)


@pytest.mark.parametrize("command", ["serve", "extender", "node-power", "autoscaler-provider"])
def test_an_unknown_log_level_exits_2_naming_it(command):
    # It used to be taken silently as info.
    from joulesched.pipelines.cli import app as joulesched

    r = CliRunner().invoke(joulesched, [command, "--log-level", "loud"])
    assert r.exit_code == 2 and "--log-level" in r.output and "'loud' is not one of" in r.output, r.output
