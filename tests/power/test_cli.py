"""`joulesched power read|exporter` on synthetic trees: output, bad input (exit 2, one red line), the real process."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import joulesched.power.meter
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from tests.support.procs import free_port
from tests.support.sysfs import FakeProcess

runner = CliRunner()


def _roots(powercap, proc, tmp_path):
    return ["--powercap-root", str(powercap.root), "--proc-root", str(proc.root), "--dev-root", str(tmp_path / "dev")]


def test_read_json_on_a_synthetic_host(powercap, proc, tmp_path):
    powercap.add("intel-rapl:0", "package-0")
    proc.add(FakeProcess(7, "qemu-system-x86", cmdline=b"/usr/bin/qemu-system-x86_64\0-name\0guest=vm-a,debug-threads=on\0"))
    r = runner.invoke(app, ["power", "read", "--duration", "0.05", "--json", *_roots(powercap, proc, tmp_path)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["source"] == "powercap" and data["primary_zones"] == ["package-0"]
    assert set(data) >= {"zones", "vms", "pods", "processes", "cpu_usage_ratio", "duration_s"}


def test_read_model_fallback_says_it_is_uncalibrated(proc, tmp_path):
    r = runner.invoke(app, ["power", "read", "--duration", "0.05", "--proc-root", str(proc.root),
                            "--powercap-root", str(tmp_path / "none"), "--dev-root", str(tmp_path / "none")])
    assert r.exit_code == 0, r.output
    assert "source model" in r.output and "uncalibrated" in r.output and "zone platform" in r.output


@pytest.mark.parametrize("args, message", [
    (["exporter", "--listen", "9102"], "expected HOST:PORT"),
    (["read", "--curve", "nope"], "--curve 'nope' is unknown"),
    (["read", "--curve", "hp-ml110-g4", "--profile", "x.yaml"], "not both"),
    (["read", "--meter", "msr"], "not found"),
    # Checked before any meter opens: msr, missing here, would fail first.
    (["exporter", "--gpu", "yes", "--meter", "msr"], "Invalid value for '--gpu': 'yes' is not one of 'auto', 'on', "
                                                     "'off'"),
])
def test_bad_input_exits_2_with_one_line(args, message, powercap, proc, tmp_path):
    r = runner.invoke(app, ["power", *args, *_roots(powercap, proc, tmp_path)])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


def test_permission_denied_exits_2_and_says_what_to_do(powercap, proc, tmp_path, monkeypatch):
    """Tests run as root, so chmod cannot deny; the read function raises what the kernel would."""
    powercap.add("intel-rapl:0", "package-0")

    def deny(path):
        if path.endswith("energy_uj"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return Path(path).read_bytes()

    monkeypatch.setattr(joulesched.power.meter, "read_bytes", deny)
    r = runner.invoke(app, ["power", "read", "--meter", "powercap", *_roots(powercap, proc, tmp_path)])
    assert r.exit_code == 2
    assert "permission denied" in r.output and "Run as root" in r.output and ".service" in r.output


def test_bad_profile_exits_2(proc, tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("power_watts: [1, 2, 3]\n")
    r = runner.invoke(app, ["power", "read", "--meter", "model", "--profile", str(prof), "--proc-root", str(proc.root)])
    assert r.exit_code == 2 and "needs 11 points" in r.output


def test_exporter_process_serves_and_stops_on_sigterm(powercap, proc, tmp_path):
    powercap.add("intel-rapl:0", "package-0")
    port = free_port()
    exe = Path(sys.executable).parent / "joulesched"
    p = subprocess.Popen([str(exe), "power", "exporter", "--listen", f"127.0.0.1:{port}", "--interval", "0.1",
                          *_roots(powercap, proc, tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline, body = time.monotonic() + 20, ""
        while time.monotonic() < deadline and "joulesched_node_joules_total" not in body:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
            except OSError:
                assert p.poll() is None, p.stdout.read().decode()
                time.sleep(0.1)
        assert 'joulesched_node_joules_total{source="powercap",zone="package-0"}' in body
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
