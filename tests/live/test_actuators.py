"""Each power actuator against the real server or emulator of its interface, on loopback: libvirt's test
driver, sushy-tools' Redfish emulator, a pyghmi IPMI BMC, a real sshd plus a UDP listener for Wake-on-LAN, and
moto's EC2 server. (The libvirt actuator on a real QEMU guest: tests/infra/test_qemu_guest.py.)"""

from __future__ import annotations

import math
import re
import socket
import threading

import pytest

from joulesched.live.actuators import ActuatorOptions, make_actuator
from joulesched.live.actuators.base import (
    OFF,
    ON,
    UNKNOWN,
    ActuatorError,
    AddressError,
    PowerAddress,
    Target,
    off_requested,
    parse_address,
)
from joulesched.live.actuators.credentials import Credentials, Login
from tests.support.procs import free_port


def target(node, address):
    return Target(node, parse_address(address))


@pytest.mark.parametrize("text,needle", [
    ("gopher://x", "unknown scheme 'gopher'"), ("libvirt:///", "needs a domain"),
    ("redfish://bmc", "needs the system path"), ("ipmi://", "needs a host"),
    ("redfish://admin:pw@bmc/redfish/v1/Systems/1", "credentials do not belong in an address"),
])
def test_addresses_are_checked(text, needle):
    with pytest.raises(AddressError, match=needle):
        parse_address(text)


def test_one_actuator_refuses_a_node_addressed_for_another():
    a = make_actuator("libvirt", ActuatorOptions(libvirt_uri="test:///default")) if _has("libvirt") else None
    if a is None:
        pytest.skip("libvirt-python is not installed")
    with pytest.raises(AddressError, match="not one for the libvirt actuator"):
        a.sleep(target("n", "ipmi://10.0.0.1"))


def _has(mod: str) -> bool:
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


# ---- libvirt ----------------------------------------------------------------------------------------------
def test_libvirt_managed_save_and_restore_on_the_test_driver():
    from tests.support.machines import Machines

    m = Machines()
    try:
        addr = m.add("n1")
        a = make_actuator("libvirt", ActuatorOptions(libvirt_uri="test:///default"))
        t = target("n1", addr)
        assert a.state(t) == ON
        a.sleep(t)
        assert a.state(t) == OFF and m.saved("n1")  # managedSave: stopped, with a saved image
        a.sleep(t)  # idempotent
        a.wake(t)
        assert a.state(t) == ON and not m.lookup("n1").hasManagedSaveImage(0)  # restored from the image
        with pytest.raises(ActuatorError, match="not found"):
            a.sleep(target("n2", "libvirt:///no-such-domain"))
    finally:
        m.close()


# ---- Redfish ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_redfish_against_sushy_emulator(tmp_path):
    pytest.importorskip("sushy_tools")
    from tests.support.power_servers import redfish_emulator

    systems = [{"uuid": "0a4b8d5e-2b7f-4f0c-9b1e-1d2c3e4f5a6b", "name": "node-1", "power_state": "On"}]
    with redfish_emulator(tmp_path, systems) as (host, user, password):
        addr = f"redfish+http://{host}/redfish/v1/Systems/{systems[0]['uuid']}"
        good = make_actuator("redfish", ActuatorOptions(credentials=Credentials(Login(user, password)), poll_s=0.5,
                                                        graceful_timeout_s=20, allow_redfish_http=True))
        t = target("node-1", addr)
        assert good.state(t) == ON
        good.sleep(t)  # GracefulShutdown; the fake driver applies it after 1-11 s
        assert good.state(t) == OFF
        good.wake(t)
        import time

        deadline = time.monotonic() + 20
        while good.state(t) != ON and time.monotonic() < deadline:
            time.sleep(0.5)
        assert good.state(t) == ON
        bad = make_actuator("redfish", ActuatorOptions(credentials=Credentials(Login(user, "wrong")),
                                                       allow_redfish_http=True))
        with pytest.raises(ActuatorError) as e:
            bad.sleep(t)
        assert "wrong" not in str(e.value) and password not in str(e.value)
        assert "HTTP 401" in str(e.value)  # the kind and the code; never the BMC's own text
        plain = make_actuator("redfish", ActuatorOptions(credentials=Credentials(Login(user, password))))
        with pytest.raises(ActuatorError, match="allow-redfish-http"):
            plain.state(t)  # plain HTTP is refused before any connection unless the operator allows it


class _FirmwareBmc:
    """A Redfish BMC whose one system offers only ``allowed`` ResetTypes; an accepted reset sets its power state
    (PushPowerButton toggles it). Plain HTTP on loopback, as a lab BMC is reached with --allow-redfish-http."""

    def __init__(self, allowed: list[str]) -> None:
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        bmc = self
        self.power, self.posts = "On", []
        reset = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _send(self, code: int, body: dict | None = None) -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                docs = {"/redfish/v1": {"@odata.id": "/redfish/v1", "Id": "RootService", "RedfishVersion": "1.0.0",
                                        "Systems": {"@odata.id": "/redfish/v1/Systems"}},
                        "/redfish/v1/Systems/1": {
                            "@odata.id": "/redfish/v1/Systems/1", "Id": "1", "PowerState": bmc.power,
                            "Actions": {"#ComputerSystem.Reset": {
                                "target": reset, "ResetType@Redfish.AllowableValues": allowed}}}}
                p = self.path.rstrip("/")
                self._send(200, docs[p]) if p in docs else self._send(404)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != reset:  # a session login: none here, basic auth it is
                    self._send(404)
                    return
                kind = json.loads(body)["ResetType"]
                bmc.posts.append(kind)
                bmc.power = {"On": "On", "ForceOn": "On", "ForceOff": "Off", "GracefulShutdown": "Off",
                             "PushPowerButton": "Off" if bmc.power == "On" else "On"}[kind]
                self._send(204)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"redfish+http://127.0.0.1:{self.server.server_port}/redfish/v1/Systems/1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("allowed, force_off, sleep_sent, wake_sent", [
    (["On", "ForceOff", "ForceRestart", "Nmi", "PushPowerButton"], True, ["PushPowerButton"], ["On"]),
    (["ForceOn", "ForceOff", "GracefulShutdown"], True, ["GracefulShutdown"], ["ForceOn"]),
    (["On", "ForceOff"], True, ["ForceOff"], ["On"]),
    (["On", "ForceOff"], False, None, None),
])
def test_redfish_uses_the_reset_types_the_system_offers(allowed, force_off, sleep_sent, wake_sent):
    """A review: GracefulShutdown and On were hard-coded, and sushy refused them before sending where the firmware
    does not list them (some offer PushPowerButton only), so no sleep ever worked there."""
    from joulesched.live.actuators.redfish import RedfishActuator

    bmc = _FirmwareBmc(allowed)
    try:
        a = RedfishActuator(Credentials(default=Login("u", "p")), allow_http=True, force_off=force_off,
                            graceful_timeout_s=1, poll_s=0.05)
        t = Target("n1", parse_address(bmc.address), deadline=math.inf)
        if sleep_sent is None:  # no graceful off offered and no hard off allowed: nothing is sent
            with pytest.raises(ActuatorError, match="offers no graceful power-off") as e:
                a.sleep(t)
            assert bmc.posts == [] and not off_requested(e.value)
            return
        a.sleep(t)
        assert bmc.posts == sleep_sent and a.state(t) == OFF
        a.wake(t)
        assert bmc.posts == sleep_sent + wake_sent and a.state(t) == ON
    finally:
        bmc.close()


# ---- IPMI -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bmc(tmp_path_factory):
    """Module scope, with its actuator's first status read done: pyghmi's client starts a process-wide I/O
    thread on first use, which must already exist when the per-test thread-leak check takes its snapshot."""
    from tests.support.power_servers import ipmi_bmc

    with ipmi_bmc(tmp_path_factory.mktemp("bmc")) as (host, user, password, state):
        a = make_actuator("ipmi", ActuatorOptions(credentials=Credentials(hosts={host: Login(user, password)}),
                                                  poll_s=0.1, graceful_timeout_s=5))
        first = a.state(target("n1", f"ipmi://{host}"))
        yield host, state, a, first


def test_ipmi_against_a_pyghmi_bmc(bmc):
    host, state, a, first = bmc
    if True:
        t = target("n1", f"ipmi://{host}")
        assert first == ON and a.state(t) == ON
        a.sleep(t)
        assert state.read_text() == "off" and a.state(t) == OFF
        a.wake(t)
        assert state.read_text() == "on" and a.state(t) == ON
        nologin = make_actuator("ipmi", ActuatorOptions())
        with pytest.raises(ActuatorError, match="no IPMI login"):
            nologin.wake(t)


def test_ipmi_a_silent_bmc_holds_up_no_other_nodes_action(bmc):
    """A BMC that answers nothing keeps its login waiting for seconds; that wait held the actuator's one lock,
    so every other node's action waited too, past its deadline (a review: 5 s per dead BMC)."""
    import time

    host, state, a, _ = bmc
    black = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    black.bind(("127.0.0.1", 0))  # receives and never answers
    dead_host = f"127.0.0.1:{black.getsockname()[1]}"
    creds = a.actuator.credentials  # (the module's actuator, its live BMC session open)
    creds.hosts[dead_host] = Login("x", "y")
    err: list[BaseException] = []

    def sleep_dead() -> None:
        try:
            a.sleep(target("dead", f"ipmi://{dead_host}"))
        except BaseException as e:  # noqa: BLE001 - what it raised is what we check
            err.append(e)

    th = threading.Thread(target=sleep_dead)
    th.start()
    try:
        time.sleep(0.5)  # the dead BMC's login under way
        t0 = time.monotonic()
        assert a.state(target("n1", f"ipmi://{host}")) in (ON, OFF)
        assert time.monotonic() - t0 < 2.0
    finally:
        th.join(30)
        black.close()
        del creds.hosts[dead_host]
    assert err and isinstance(err[0], ActuatorError)


# ---- Wake-on-LAN + SSH ------------------------------------------------------------------------------------
def test_wake_on_lan_sends_the_magic_packet():
    port = free_port()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", port))
    sock.settimeout(5)
    got = []
    th = threading.Thread(target=lambda: got.append(sock.recvfrom(1024)[0]))
    th.start()
    try:
        a = make_actuator("wol")
        a.wake(target("n1", f"wol://52:54:00:12:34:56?broadcast=127.0.0.1&port={port}"))
        th.join(5)
    finally:
        sock.close()
    mac = bytes.fromhex("525400123456")
    assert got and got[0] == b"\xff" * 6 + mac * 16
    assert a.state(target("n1", "wol://52:54:00:12:34:56")) == UNKNOWN
    with pytest.raises(AddressError, match="not a MAC"):
        target("n1", "wol://not-a-mac")
    with pytest.raises(ActuatorError, match="not a MAC"):  # the actuator's own check, for an unparsed address
        a.wake(Target("n1", PowerAddress("wol", "not-a-mac")))


@pytest.mark.integration
def test_wake_on_lan_sleeps_the_host_over_ssh_with_pinned_keys(tmp_path):
    from tests.support.sshd import sshd_server

    with sshd_server(tmp_path / "sshd") as s:
        marker = tmp_path / "suspended"
        a = make_actuator("wol", ActuatorOptions(ssh_key=str(s.client_key), known_hosts=str(s.known_hosts),
                                                 ssh_user=s.user, suspend_command=f"touch {marker}"))
        a.sleep(target("n1", f"wol://52:54:00:12:34:56?ssh=127.0.0.1:{s.port}"))
        assert marker.exists()  # the suspend command ran on the host
        other = tmp_path / "other_known_hosts"
        other.write_text(f"[127.0.0.1]:{s.port} ssh-ed25519 "
                         "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
        pinned_wrong = make_actuator("wol", ActuatorOptions(ssh_key=str(s.client_key), known_hosts=str(other),
                                                            ssh_user=s.user, suspend_command=f"rm {marker}"))
        with pytest.raises(ActuatorError, match="does NOT match known_hosts"):
            pinned_wrong.sleep(target("n1", f"wol://52:54:00:12:34:56?ssh=127.0.0.1:{s.port}"))
        assert marker.exists()  # nothing ran on a host whose key did not match


# ---- AWS --------------------------------------------------------------------------------------------------
def test_aws_stop_and_start_on_moto_server(monkeypatch):
    pytest.importorskip("moto")
    import boto3

    from tests.support.power_servers import moto_ec2

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with moto_ec2() as url:
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
        ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        plain = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="t3.micro")
        hib = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="t3.micro",
                                HibernationOptions={"Configured": True})
        a = make_actuator("aws", ActuatorOptions(aws_region="us-east-1", aws_endpoint=url, poll_s=0.1))
        for r in (plain, hib):
            iid = r["Instances"][0]["InstanceId"]
            t = target("n", f"aws://{iid}")
            assert a.state(t) == ON
            a.sleep(t)
            assert a.state(t) == OFF
            a.wake(t)
            assert a.state(t) in (ON, "transitioning")
        with pytest.raises(ActuatorError, match="i-0000000000000dead"):
            a.sleep(target("n", "aws://i-0000000000000dead"))


# ---- bounded caches ---------------------------------------------------------------------------------------
def test_aws_clients_are_bounded_by_region():
    pytest.importorskip("boto3")
    from joulesched.live.actuators.aws import AwsActuator

    a = AwsActuator(endpoint_url="http://127.0.0.1:9", max_clients=2)  # clients are made, never used here
    for region in ("us-east-1", "eu-west-1", "ap-south-1", "eu-west-1"):
        a._ec2(target("n", f"aws://i-0abc?region={region}"))
    assert list(a._clients) == ["ap-south-1", "eu-west-1"]


@pytest.mark.parametrize("kw,needle", [
    ({"ssh_key": "/nonexistent/id_ed25519"}, "--ssh-key /nonexistent/id_ed25519: no such file"),
    ({"known_hosts": "/nonexistent/known_hosts"}, "--known-hosts"),
    ({"redfish_ca": "/nonexistent/ca.pem"}, "--redfish-ca"),
    ({"libvirt_uri": " "}, "--libvirt-uri is empty"),
    ({"ssh_user": ""}, "--ssh-user is empty"),
    ({"suspend_command": " "}, "--suspend-command is empty"),
    ({"aws_region": ""}, "--aws-region is empty"),
    ({"aws_endpoint": "notaurl"}, "expected an http(s):// URL"),
])
def test_actuator_options_that_could_never_work_are_refused_at_startup(kw, needle):
    """They were taken as given and failed only at the first sleep or wake (found walking the CLI)."""
    with pytest.raises(AddressError, match=re.escape(needle)):
        ActuatorOptions(**kw)
    assert ActuatorOptions(aws_endpoint="http://127.0.0.1:5000", aws_region="eu-west-1")  # the good forms pass
