"""`joulesched node-power` and `serve --node-power` as commands, against the API emulator (no kube-apiserver can
run here): bad input is one line and exit 2; dry-run writes nothing; serve with the controller sleeps idle
nodes and wakes one for a pending pod, which is then bound; credentials stay out of logs."""

from __future__ import annotations

import logging
import threading

import pytest
import typer
from typer.testing import CliRunner

from joulesched.cluster.nodepower import POWER_STATE_ANNOTATION
from joulesched.live.actuators.credentials import Credentials, CredentialsError
from joulesched.pipelines.cli import live as live_cli
from joulesched.pipelines.cli.live import _node_power_daemon, node_power, run_node_power, run_serve, serve
from tests.live.conftest import wait_until


@pytest.fixture
def app() -> typer.Typer:
    a = typer.Typer(add_completion=False)
    a.command("node-power")(node_power)
    a.command("serve")(serve)
    return a


def _state(emu, node):
    return (emu.get("nodes", node)["metadata"].get("annotations") or {}).get(POWER_STATE_ANNOTATION, "awake")


@pytest.mark.parametrize("args,needle", [
    (["--actuator", "hammer"], "--actuator 'hammer': known: auto, none"),
    (["--kubeconfig", "/does/not/exist"], "kubeconfig /does/not/exist does not exist"),
    (["--listen", "localhost"], "expected HOST:PORT"),
    (["--credentials", "/no/such/secret"], "credentials file /no/such/secret"),
    (["--sleep-after", "-1"], "-1"),
    (["--lease-namespace", "Bad NS!"], "--lease-namespace 'Bad NS!' is not a namespace name"),  # was unchecked
    (["--scheduler-name", " "], "--scheduler-name must not be empty"),
])
def test_bad_input_exits_2_with_one_line(app, args, needle):
    r = CliRunner().invoke(app, ["node-power", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_bad_address_map_and_world_readable_credentials(app, emu, tmp_path):
    kc = emu.kubeconfig(str(tmp_path / "kc"))
    (tmp_path / "a.yaml").write_text("n1: ftp://bmc/1\n")
    r = CliRunner().invoke(app, ["node-power", "--kubeconfig", kc, "--addresses", str(tmp_path / "a.yaml")])
    assert r.exit_code == 2 and "node n1" in r.output and "unknown scheme 'ftp'" in r.output
    cred = tmp_path / "c.yaml"
    cred.write_text("default: {username: admin, password: s3cret-pw}\n")
    cred.chmod(0o644)
    r = CliRunner().invoke(app, ["node-power", "--kubeconfig", kc, "--credentials", str(cred)])
    assert r.exit_code == 2 and "readable by other users" in r.output and "s3cret-pw" not in r.output


def test_credentials_file_and_secret_directory(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("default: {username: admin, password: pw1}\n"
                 "hosts: {'10.0.0.5:623': {username: ipmi, password: pw2}}\n")
    f.chmod(0o600)
    c = Credentials.load(f)
    assert c.for_host("10.0.0.5:623").username == "ipmi" and c.for_host("bmc:443").password == "pw1"
    assert "pw1" not in repr(c.for_host("bmc")) and "pw" not in repr(c)
    d = tmp_path / "secret"
    d.mkdir()
    (d / "username").write_text("root\n")
    (d / "password").write_text("pw3\n")
    with pytest.raises(CredentialsError, match="readable by other users"):  # a directory is checked too
        Credentials.load(d)
    for k in ("username", "password"):
        (d / k).chmod(0o600)
    assert Credentials.load(d).for_host("x").password == "pw3"
    f.write_text("default: [1, 2]\n")
    with pytest.raises(CredentialsError, match="needs a 'username'"):
        Credentials.load(f)


def test_dry_run_command_changes_nothing(emu, tmp_path, caplog):
    kc = emu.kubeconfig(str(tmp_path / "kc"))
    emu.add_node("a")
    rv = emu.resource_version
    stop = threading.Event()
    caplog.set_level(logging.INFO, logger="joulesched.nodepower")
    t = threading.Thread(target=run_node_power, kwargs=dict(
        stop=stop, kubeconfig=kc, actuator="none", dry_run=True, listen="127.0.0.1:0", leader_elect=True,
        lease_namespace="default", sleep_after=0.1, min_awake=0, spare_cpu=0, consolidate=False, credentials=None,
        addresses=None, libvirt_uri="qemu:///system", resync_s=0.05))
    t.start()
    try:
        wait_until(lambda: "dry-run: would sleep node a" in caplog.text, 10, "the dry-run announcement")
    finally:
        stop.set()
        t.join(10)
    assert emu.resource_version == rv and emu.list("leases") == []


def test_serve_with_node_power_sleeps_idle_nodes_and_wakes_one_for_a_pod(emu, tmp_path):
    """The `none` actuator: nodes are only cordoned and tainted (their kubelets stay Ready)."""
    kc = emu.kubeconfig(str(tmp_path / "kc"))
    for n in ("a", "b"):
        emu.add_node(n)
    stop = threading.Event()
    t = threading.Thread(target=run_serve, kwargs=dict(
        stop=stop, scheduler_name="joulesched", policy="most-allocated", listen="127.0.0.1:0", leader_elect=True,
        lease_namespace="default", bind_workers=2, seed=0,
        cache=dict(kubeconfig=kc, context=None, prometheus="", power_profiles=None),
        node_power=dict(actuator="none", sleep_after=0.2, min_awake=0, spare_cpu=0, consolidate=False,
                        credentials=None, addresses=None, libvirt_uri="qemu:///system")))
    t.start()
    try:
        wait_until(lambda: all(_state(emu, n) == "asleep" for n in "ab"), 20, "both nodes asleep")
        emu.add_pod("p", cpu="100m")
        node = wait_until(lambda: emu.get("pods", "p", "default")["spec"].get("nodeName"), 20, "p bound")
        assert _state(emu, node) == "awake" and not emu.get("nodes", node)["spec"].get("unschedulable")
        assert emu.get("pods", "p", "default")["status"]["nominatedNodeName"] == node
        leases = emu.list("leases")
        # The scheduler's Lease and the node power Lease (the one a node-power Deployment uses), one identity.
        assert sorted(lease["metadata"]["name"] for lease in leases) == ["joulesched", "joulesched-node-power"]
        assert len({lease["spec"]["holderIdentity"] for lease in leases}) == 1
    finally:
        stop.set()
        t.join(20)
    assert not t.is_alive()


def test_serve_refuses_node_power_options_without_node_power(app):
    """They would do nothing: a `--no-force-off` the operator relies on must not be dropped in silence."""
    r = CliRunner().invoke(app, ["serve", "--actuator", "redfish", "--no-force-off", "--max-sleeps-per-hour", "5"])
    assert r.exit_code == 2, r.output
    assert "--actuator, --max-sleeps-per-hour, --force-off: options of the node power controller; add --node-power" \
        in " ".join(r.output.split())


def test_serve_passes_every_node_power_option_to_the_controller(app, emu, tmp_path, monkeypatch):
    """`serve --node-power` takes what `node-power` takes (a review: the actuator's options, the wake timeout and
    consolidation's knobs could not be given there), and the controller is built with them."""
    seen: dict = {}
    monkeypatch.setattr(live_cli, "run_serve", lambda **kw: seen.update(kw))
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    r = CliRunner().invoke(app, [
        "serve", "--node-power", "--actuator", "redfish", "--no-force-off", "--redfish-ca", str(ca),
        "--max-sleeps-per-hour", "5", "--wake-timeout", "90", "--disruption-budget", "2",
        "--max-evictions-per-hour", "7", "--node-sleep-watts", "30"])
    assert r.exit_code == 0, r.output
    daemon = _node_power_daemon(**seen["node_power"], kubeconfig=emu.kubeconfig(str(tmp_path / "kc")),
                                context=None, status=False)
    redfish = daemon.actuator.actuator
    assert redfish.force_off is False and redfish.verify == str(ca)
    assert daemon.cfg.max_sleeps_per_hour == 5 and daemon.cfg.wake_timeout_s == 90
    assert daemon.cfg.policy.max_evictions_per_hour == 7 and daemon.cfg.policy.budgets[0].nodes == "2"
    assert daemon.cfg.sleep_watts == 30 and seen["cache"]["sleep_watts"] == 30  # one estimate for both
