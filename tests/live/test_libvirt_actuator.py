"""The libvirt actuator's bounds: insecure connection URIs refused unless opted in (as bad input, exit 2), a
keepalive on every connection with libvirt's event loop running, and no lock held across a call to libvirt: a
connect or a lookup that hangs (a dead qemu+ssh host, faked by patching ``libvirt.open``) ends each action at its
own deadline and holds up no other domain's wake."""

from __future__ import annotations

import threading
import time

import pytest
import typer
from typer.testing import CliRunner

from joulesched.live.actuators import ActuatorOptions, make_actuator
from joulesched.live.actuators.base import ActuatorError, AddressError, Target, parse_address
from joulesched.pipelines.cli.live import node_power, serve

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed")
from joulesched.live.actuators import libvirt as lv  # noqa: E402 - after the skip

INSECURE = ["qemu+tcp://host/system", "QEMU+TCP://host/system", "qemu+tls://host/system?no_verify=1",
            "qemu+ssh://root@host/system?keyfile=/k&no_verify=1",
            "qemu+libssh2://host/system?known_hosts_verify=ignore"]
SECURE = ["qemu:///system", "qemu+ssh://root@host/system", "qemu+tls://host/system?no_verify=0", "test:///default"]
REMOTE = "qemu+ssh://root@hypervisor/system"
WAIT_S = 10.0  # generous bound of every wait below (busy CI cores)


@pytest.fixture(autouse=True)
def no_thread_leaks():
    # libvirt's event loop thread lives as long as the process, by design; the workers are checked by hand.
    yield


@pytest.mark.parametrize("uri", INSECURE)
def test_an_insecure_uri_is_refused_unless_opted_in(uri):
    with pytest.raises(AddressError, match="--allow-libvirt-insecure"):
        ActuatorOptions(libvirt_uri=uri)
    with pytest.raises(AddressError, match="--allow-libvirt-insecure"):
        lv.LibvirtActuator(uri)
    ActuatorOptions(libvirt_uri=uri, allow_libvirt_insecure=True)
    lv.check_uri(uri, allow_insecure=True)


@pytest.mark.parametrize("uri", SECURE)
def test_a_secure_uri_is_accepted(uri):
    assert lv.insecure_uri_reason(uri) is None
    ActuatorOptions(libvirt_uri=uri)


def test_the_commands_refuse_an_insecure_uri_with_exit_2_and_take_the_opt_in(emu, tmp_path):
    app = typer.Typer(add_completion=False)
    app.command("node-power")(node_power)
    app.command("serve")(serve)
    kc = emu.kubeconfig(str(tmp_path / "kc"))
    amap = tmp_path / "a.yaml"
    amap.write_text("n1: ftp://bmc/1\n")  # checked after the URI: it stops the command either way, nothing runs
    bad = ["--libvirt-uri", "qemu+tcp://hypervisor/system", "--addresses", str(amap)]
    for cmd in (["node-power", "--kubeconfig", kc, "--listen", "127.0.0.1:0"],
                ["serve", "--kubeconfig", kc, "--node-power", "--listen", "127.0.0.1:0"]):
        r = CliRunner().invoke(app, [*cmd, *bad])
        assert r.exit_code == 2 and "unencrypted" in r.output and "--allow-libvirt-insecure" in r.output, r.output
        r = CliRunner().invoke(app, [*cmd, *bad, "--allow-libvirt-insecure"])
        assert r.exit_code == 2 and "unknown scheme 'ftp'" in r.output, r.output  # the URI passed
        assert "allow-libvirt-insecure" not in r.output, r.output


# ---- a fake hypervisor behind libvirt.open ------------------------------------------------------------------
class FakeDomain:
    def __init__(self, conn: FakeConn, name: str) -> None:
        self.conn, self.name = conn, name

    def isActive(self):
        return self.name in self.conn.running

    def create(self):
        self.conn.running.add(self.name)
        return 0

    def managedSave(self, flags=0):
        self.conn.running.discard(self.name)
        return 0


class FakeConn:
    """A connection whose lookups of the domains in ``hang`` block until ``release`` is set."""

    def __init__(self, release: threading.Event, hang: tuple[str, ...] = ()) -> None:
        self.release, self.hang = release, hang
        self.keepalive: tuple | None = None
        self.running: set[str] = set()

    def setKeepAlive(self, interval, count):
        self.keepalive = (interval, count)
        return 0

    def isAlive(self):
        return 1

    def lookupByName(self, name):
        if name in self.hang:
            self.release.wait(WAIT_S * 3)
        return FakeDomain(self, name)

    def close(self):
        return 0


def _target(node: str, deadline_s: float | None = None) -> Target:
    deadline = time.monotonic() + deadline_s if deadline_s is not None else float("inf")
    return Target(node, parse_address(f"libvirt:///{node}"), deadline=deadline)


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("libvirt ") or t.name.startswith("libvirt-open")]


def test_each_connection_gets_a_keepalive_with_the_event_loop_running(monkeypatch):
    seen: dict = {}

    def fake_open(uri):
        seen["uri"], seen["loop"] = uri, [t.name for t in threading.enumerate() if t.name == "libvirt-event-loop"]
        seen["conn"] = FakeConn(threading.Event())
        return seen["conn"]

    monkeypatch.setattr(libvirt, "open", fake_open)
    a = lv.LibvirtActuator(REMOTE)
    a.wake(_target("vm-1"))
    assert seen["uri"] == REMOTE and seen["loop"] == ["libvirt-event-loop"]  # registered before the connect
    assert seen["conn"].keepalive == (lv.KEEPALIVE_INTERVAL_S, lv.KEEPALIVE_COUNT)
    assert seen["conn"].running == {"vm-1"}


def test_the_test_driver_has_no_keepalive_and_works_regardless(monkeypatch):
    from tests.support.machines import Machines

    tried = []
    real_open = libvirt.open

    def spy_open(uri):
        conn = real_open(uri)
        real = conn.setKeepAlive

        def set_keepalive(interval, count):
            tried.append((interval, count))
            return real(interval, count)  # "not supported by the connection driver"

        conn.setKeepAlive = set_keepalive
        return conn

    monkeypatch.setattr(libvirt, "open", spy_open)
    m = Machines()
    try:
        addr = m.add("n1")
        a = make_actuator("libvirt", ActuatorOptions(libvirt_uri="test:///default"))
        t = Target("n1", parse_address(addr))
        a.sleep(t)
        assert not m.running("n1")
        a.wake(t)
        assert m.running("n1") and tried == [(lv.KEEPALIVE_INTERVAL_S, lv.KEEPALIVE_COUNT)]
    finally:
        m.close()


def test_a_hung_lookup_ends_at_its_deadline_and_does_not_hold_up_another_domain(monkeypatch):
    release = threading.Event()
    conn = FakeConn(release, hang=("stuck",))
    monkeypatch.setattr(libvirt, "open", lambda uri: conn)
    a = lv.LibvirtActuator(REMOTE)
    outcome: dict = {}

    def wake_stuck():
        t0 = time.monotonic()
        try:
            a.wake(_target("stuck", deadline_s=1.0))
        except ActuatorError as e:
            outcome["stuck"] = (time.monotonic() - t0, str(e))

    try:
        th = threading.Thread(target=wake_stuck)
        th.start()
        time.sleep(0.3)  # the stuck lookup is under way
        other = threading.Thread(target=a.wake, args=(_target("other"),))
        other.start()
        other.join(WAIT_S)
        assert not other.is_alive() and "other" in conn.running, "a hung lookup held up another domain's wake"
        th.join(WAIT_S)
        elapsed, message = outcome["stuck"]
        assert elapsed < 5.0 and "no answer by the action's deadline" in message
    finally:
        release.set()
    deadline = time.monotonic() + WAIT_S
    while _worker_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _worker_threads()


def test_a_hung_connect_ends_each_action_at_its_deadline_and_is_not_repeated(monkeypatch):
    release = threading.Event()
    opens = []

    def hanging_open(uri):
        opens.append(uri)
        release.wait(WAIT_S * 3)  # a qemu+ssh host that never answers, until the test lets it
        return FakeConn(release)

    monkeypatch.setattr(libvirt, "open", hanging_open)
    a = lv.LibvirtActuator(REMOTE)
    try:
        results: list = []

        def wake(node):
            t0 = time.monotonic()
            try:
                a.wake(_target(node, deadline_s=1.0))
                results.append((node, time.monotonic() - t0, "woken"))
            except ActuatorError as e:
                results.append((node, time.monotonic() - t0, str(e)))

        threads = [threading.Thread(target=wake, args=(n,)) for n in ("vm-1", "vm-2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert len(results) == 2 and len(opens) == 1  # both waited on the one connect
        for node, elapsed, message in results:
            assert elapsed < 5.0 and f"{node}: libvirt {REMOTE} domain {node}: connect" in message, message
    finally:
        release.set()
    a.wake(_target("vm-3", deadline_s=WAIT_S))  # the connect finished meanwhile: it is used, not made again
    assert len(opens) == 1 and a._conn.running == {"vm-3"}
