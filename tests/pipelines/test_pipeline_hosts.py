"""`joulesched pipeline --hosts INVENTORY --calibrate`: host-side stages over SSH, end to end.

The host is this machine behind a REAL OpenSSH server on 127.0.0.1 (tests/support/sshd.py; per-run keys, the
host key pinned in a known_hosts file). Its power exporter is the real one reading a synthetic powercap tree
whose package counter advances at a constant 100 W (no RAPL here), and `joulesched power calibrate` runs on
the host for real. The pipeline then trains and benchmarks the twin on the measured curve.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.power.exporter import Exporter
from joulesched.power.monitor import PowerMonitor
from joulesched.power.powercap import PowercapMeter
from tests.pipelines.test_remote import ConstantPackage
from tests.support.sshd import sshd_server
from tests.support.sysfs import SyntheticProc

pytestmark = [pytest.mark.integration, pytest.mark.heavy]
JOULESCHED = str(Path(sys.executable).parent / "joulesched")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    with sshd_server(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def host(sshd, tmp_path, monkeypatch):
    """An inventory for the sshd host, its exporter running, its package drawing 100 W."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with ConstantPackage(tmp_path / "host-powercap") as package:
        proc = SyntheticProc(tmp_path / "host-proc")
        exp = Exporter(PowerMonitor(PowercapMeter(str(package.pc.root)), proc_root=str(proc.root)), port=0,
                       interval_s=0.05).start()
        try:
            inv = tmp_path / "hosts.yml"
            inv.write_text(yaml.safe_dump({"all": {"children": {"power_hosts": {"hosts": {"testhost": {
                "ansible_host": sshd.address, "ansible_port": sshd.port, "ansible_user": sshd.user,
                "ansible_ssh_private_key_file": str(sshd.client_key), "joulesched_bin": JOULESCHED,
                "power_exporter_listen": f"127.0.0.1:{exp.port}",
                "joulesched_calibrate_args": ["--meter", "powercap", "--powercap-root", str(package.pc.root),
                                              "--settle-seconds", "0.1", "--sample-seconds", "0.2",
                                              "--workers", "2"]}}}}}}))
            yield inv
        finally:
            exp.stop()


def test_calibrate_on_the_hosts_then_train_and_benchmark_on_their_curve(sshd, host, tmp_path):
    out = tmp_path / "run"
    args = ["pipeline", "-s", "scenarios/tiny.yaml", "--steps", "150", "--hosts", str(host), "--known-hosts",
            str(sshd.known_hosts), "--calibrate", "--calibrate-step-seconds", "0.4", "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    # The exporter was read on the host, over SSH.
    assert "joulesched_node_joules_total" in (out / "hosts" / "testhost.metrics").read_text()
    # Calibrated there: its profile, then the fleet profile, then the twin's scenarios and the training.
    prof = yaml.safe_load((out / "profiles" / "testhost.yaml").read_text())
    assert prof["name_prefix"] == "testhost"
    fleet = yaml.safe_load((out / "node-profile.yaml").read_text())
    assert fleet["power_watts"] == prof["power_watts"]  # one host: the mean is its curve
    # The injected 100 W, read back at every knot the measured utilisations reached (which ones depends on what
    # else loads this shared machine; calibrate's header lists the extrapolated ones).
    text = (out / "profiles" / "testhost.yaml").read_text()
    match = re.search(r"extrapolated at ([0-9%, ]+)", text)
    extrapolated = {int(k) // 10 for k in re.findall(r"(\d+)%", match.group(1))} if match else set()
    measured = [w for k, w in enumerate(fleet["power_watts"]) if k not in extrapolated]
    assert measured and all(abs(w - ConstantPackage.WATTS) < 15 for w in measured), (text, extrapolated)
    # The twin ran on the measured curve (scenarios are calibrated in memory; nodes.json records what ran).
    name = json.loads((out / "results.json").read_text())["scenarios"][0]["name"]  # a scenario's one key
    curves = json.loads((out / "nodes.json").read_text())[name]["group_curves"]
    assert curves and all(c == fleet["power_watts"] for c in curves.values()), curves
    stages = {p.stem for p in (out / ".stages").iterdir()}
    assert {"calibrate-hosts", "train", "benchmark", "report"} <= stages
    assert (out / "results.json").is_file() and (out / "report.html").is_file()
    # Logs were collected (this machine has no systemd journal: the files say so rather than failing).
    logs = sorted(p.name for p in (out / "logs" / "hosts").iterdir())
    assert logs == ["testhost-joulesched-power-exporter.log", "testhost-prometheus-node-exporter.log"], logs
    # Resumable: the same command skips the measurement on the hosts.
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "calibrate-hosts: skipped (inputs unchanged)" in again.output


def test_an_unpinned_host_fails_the_run_with_the_fix(sshd, host, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    r = CliRunner().invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--steps", "10", "--hosts", str(host),
                                 "--known-hosts", str(empty), "--calibrate", "--out", str(tmp_path / "o")])
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "exporter on testhost" in text and "host key is unknown" in text and "ssh-keyscan" in text


@pytest.mark.parametrize("extra,needle", [
    (["--calibrate"], "need hosts: --hosts INVENTORY, or a --stack that exports hosts"),
    (["--calibrate", "--node-profile", "p.yaml"], "not both"),
    (["--hosts", "/nonexistent/hosts.yml"], "inventory does not exist"),
])
def test_host_options_bad_input_exits_2(tmp_path, extra, needle):
    r = CliRunner().invoke(app, ["pipeline", "-s", "scenarios/tiny.yaml", "--steps", "10", *extra,
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split()) and not (tmp_path / "o").exists()


# The cluster side of test_kube_pipeline.py: the API emulator, a kube-scheduler stand-in, a real Prometheus
# scraping an exporter, the test app.
from tests.pipelines.test_kube_pipeline import emu, kubeconfig, needs_prometheus, power, prometheus, schedulers, testapp  # noqa: E402,F401,F811


@needs_prometheus
def test_kube_calibrates_the_hosts_trains_on_them_and_measures_the_dqn(sshd, host, emu, kubeconfig, schedulers,
                                                                       power, prometheus, testapp, tmp_path):
    """Sim-to-real, closed, on the cluster path: the hosts' curves measured over SSH, the DQN trained on the
    twin with them, then measured on the cluster beside the baselines (its own `joulesched serve`)."""
    out = tmp_path / "run"
    r = CliRunner().invoke(app, [
        "pipeline", "--env", "kube", "--kubeconfig", kubeconfig, "--prometheus", prometheus, "--target", testapp,
        "--pods", "2", "--load-seconds", "3", "--hosts", str(host), "--known-hosts", str(sshd.known_hosts),
        "--calibrate", "--calibrate-step-seconds", "0.4", "-s", "scenarios/tiny.yaml", "--steps", "120",
        "-p", "default-k8s", "-p", "energy-greedy", "--out", str(out)])  # two baselines beside the DQN
    assert r.exit_code == 0, r.output
    fleet = yaml.safe_load((out / "node-profile.yaml").read_text())["power_watts"]
    trained_on = json.loads((out / "model.json").read_text())["training"]["node_curves"]["tiny"]
    assert trained_on and all(c == fleet for c in trained_on.values()), trained_on
    doc = yaml.safe_load((out / "results.json").read_text())
    dqn = f"dqn={out / 'model.pt'}"
    assert doc["policies"] == ["default-k8s", "energy-greedy", dqn]
    measured = doc["scenarios"][0]["policies"][dqn]
    assert measured["scheduler_name"] == "joulesched" and measured["placements"] == 2
    assert measured["energy_joules"] > 0
    assert emu.list("pods") == [] and len(emu.bindings) == 6  # two pods per policy, bound, then deleted
    assert (out / "logs" / "hosts" / "testhost-joulesched-power-exporter.log").is_file()
