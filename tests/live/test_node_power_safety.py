"""Node power that is safe by construction (#24), on the API emulator with real actuators and real listeners:

- no node steers the controller: annotated Redfish, IPMI, WoL and AWS targets the operator never allowed get
  nothing at all (no TCP connection, no UDP packet); the same addresses in the operator's map are used;
- no action outlives its leader: a Lease handed over in the middle of a sleep, and the old leader sends the
  machine nothing more (every call to it is recorded with its time);
- no BMC holds up the others: a Redfish BMC that never answers fails one wake within its deadline while the
  other wake goes on;
- one cache per process: ``serve --node-power`` lists and watches nodes and pods exactly as often as ``serve``.

The kubelets are emulated (tests/support/machines.py): that is the mock part."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.nodepower import ASLEEP_TAINT, POWER_STATE_ANNOTATION, PowerPolicy
from joulesched.live.actuators import ActuatorOptions, make_actuator
from joulesched.live.actuators.access import AddressPolicy
from joulesched.live.actuators.credentials import Credentials, Login
from joulesched.live.nodepower import NodePowerConfig, NodePowerController
from joulesched.pipelines.cli.live import run_serve
from tests.live.conftest import wait_until
from tests.live.test_node_power import CTL_FAST, asleep, awake, events, pstate
from tests.support.machines import Kubelets, Machines


class _Listener:
    """A socket on loopback and a thread that records what reaches it."""

    def __init__(self, kind: int) -> None:
        self.sock = socket.socket(socket.AF_INET, kind)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listener", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._receive()
            except OSError:
                continue

    def _receive(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


class TcpListener(_Listener):
    """Counts TCP connections; answers nothing (a BMC that accepts and then stays silent)."""

    def __init__(self) -> None:
        super().__init__(socket.SOCK_STREAM)
        self.sock.listen(64)
        self.accepted: list[float] = []
        self._conns: list[socket.socket] = []
        self._thread.start()

    def _receive(self) -> None:
        c, _ = self.sock.accept()
        self.accepted.append(time.monotonic())
        self._conns.append(c)

    def close(self) -> None:
        super().close()
        for c in self._conns:
            c.close()


class UdpListener(_Listener):
    """Counts UDP datagrams (an IPMI BMC's port, or where a Wake-on-LAN packet is broadcast)."""

    def __init__(self) -> None:
        super().__init__(socket.SOCK_DGRAM)
        self.packets: list[bytes] = []
        self._thread.start()

    def _receive(self) -> None:
        self.packets.append(self.sock.recvfrom(4096)[0])


@pytest.fixture(scope="module", autouse=True)
def _pyghmi_io_thread():
    """pyghmi starts one process-wide I/O thread on first use; start it before the thread-leak check looks."""
    from pyghmi.ipmi.private import session

    session.Session._assignsocket()
    yield


@pytest.fixture
def machines():
    m = Machines()
    yield m
    m.close()


def _controller(emu, actuator, **kw) -> NodePowerController:
    cfg = NodePowerConfig(**{**CTL_FAST, "leader_elect": False, **kw})
    return NodePowerController(api_client_for(emu.url), actuator, cfg)


# ---- 1. the operator decides where power is switched -------------------------------------------------------
def test_unlisted_annotated_targets_get_nothing_and_the_same_addresses_in_the_map_are_used(emu, tmp_path,
                                                                                          monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    redfish, ec2, ssh = TcpListener(), TcpListener(), TcpListener()
    ipmi, wol = UdpListener(), UdpListener()
    cred = tmp_path / "credentials.yaml"
    cred.write_text("default: {username: admin, password: default-pw}\n")  # any listed address may use it
    cred.chmod(0o600)
    iid = "i-0123456789abcdef0"
    addresses = {"rf": f"redfish://127.0.0.1:{redfish.port}/redfish/v1/Systems/1",
                 "bmc": f"ipmi://127.0.0.1:{ipmi.port}",
                 "wol": f"wol://52:54:00:aa:bb:cc?ssh=127.0.0.1:{ssh.port}&broadcast=127.0.0.1&port={wol.port}",
                 "ec2": f"aws://{iid}"}
    for name, addr in addresses.items():  # each node claims its address itself
        emu.add_node(name, annotations={"joulesched.io/power": addr})
    emu.patch("nodes", "", "ec2", {"spec": {"providerID": f"aws:///us-east-1a/{iid}"}})
    emu.add_node("wake-me", annotations={"joulesched.io/power": addresses["wol"]})  # a second claim, for wol
    opts = ActuatorOptions(credentials=Credentials.load(cred), aws_endpoint=f"http://127.0.0.1:{ec2.port}",
                           aws_region="us-east-1", request_timeout_s=0.5, connect_timeout_s=0.5)
    listeners = dict(redfish=redfish, ec2=ec2, ssh=ssh)
    try:
        ctl = _controller(emu, make_actuator("auto", opts), policy=PowerPolicy(sleep_after_s=0.1),
                          sleep_timeout_s=1.0, access=AddressPolicy())
        ctl.start()
        try:
            wait_until(lambda: ctl.synced, 10)
            time.sleep(2.0)  # twenty times sleep_after: every node would have slept by now
        finally:
            ctl.stop()
        assert {k: len(v.accepted) for k, v in listeners.items()} == {"redfish": 0, "ec2": 0, "ssh": 0}
        assert ipmi.packets == [] and wol.packets == []
        assert all(pstate(emu, n) == "awake" and not emu.get("nodes", n)["spec"].get("unschedulable")
                   for n in addresses)  # nothing was even cordoned: they have no usable power address
        assert ctl.actions == []
        # The same addresses in the operator's map: each target is contacted.
        ctl = _controller(emu, make_actuator("auto", opts), policy=PowerPolicy(sleep_after_s=0.1),
                          sleep_timeout_s=1.0, addresses=addresses, access=AddressPolicy())
        ctl.start()
        try:
            wait_until(lambda: redfish.accepted and ec2.accepted and ssh.accepted and ipmi.packets, 20,
                       "every mapped target contacted")
        finally:
            ctl.stop()
        assert "wake-me" not in {n for _, _, n in ctl.actions}  # its claim is on another node's machine
    finally:
        for x in (redfish, ec2, ssh, ipmi, wol):
            x.close()


# ---- 2. no action outlives its leader ----------------------------------------------------------------------
class RecordingActuator:
    """The real libvirt actuator behind a machine whose graceful shutdown takes ``shutdown_s`` (a BMC's
    GracefulShutdown): sleep polls the machine until then, with the action's checkpoint before every poll as
    the real actuators do. Every call that reaches the machine is recorded as (time, replica, call)."""

    name = "libvirt"

    def __init__(self, replica: str, log: list, shutdown_s: float) -> None:
        self.inner = make_actuator("libvirt", ActuatorOptions(libvirt_uri="test:///default"))
        self.replica, self.log, self.shutdown_s = replica, log, shutdown_s

    def _call(self, what: str, target):
        t = time.monotonic()  # taken before the checkpoint: a call logged at t was allowed at or after t
        target.checkpoint()
        self.log.append((t, self.replica, what, target.node))

    def sleep(self, target) -> None:
        self._call("shutdown", target)
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.shutdown_s:
            self._call("poll", target)
            self.inner.state(target)
            target.pause(0.05)
        self._call("off", target)
        self.inner.sleep(target)

    def wake(self, target) -> None:
        self._call("on", target)
        self.inner.wake(target)

    def state(self, target) -> str:
        self._call("state", target)
        return self.inner.state(target)


def test_a_lease_lost_in_the_middle_of_a_sleep_ends_every_call_of_the_old_leader(emu, machines):
    machines.add("a")
    emu.add_node("a")
    kubelets = Kubelets(emu, machines).start()
    calls: list = []
    pol = PowerPolicy(sleep_after_s=0.1)
    common = dict(leader_elect=True, addresses=machines.addresses)
    r1 = _controller(emu, RecordingActuator("r1", calls, shutdown_s=3.0), policy=pol, identity="r1", **common)
    r2 = None
    try:
        r1.start()
        wait_until(lambda: any(c[1] == "r1" and c[2] == "poll" for c in calls), 10, "r1 in the middle of a sleep")
        r2 = _controller(emu, RecordingActuator("r2", calls, shutdown_s=0.2), policy=pol, identity="r2", **common)
        r2.start()
        r1.leader._stop.set()  # r1's renewals stop (a partition, a stalled process): its Lease runs out
        wait_until(r2.is_leader, 10, "r2 takes the Lease")
        lost = r1.leader.terms[-1][1]  # when r1 stopped counting itself leader
        wait_until(lambda: asleep(emu, machines, "a"), 10, "a asleep, its sleep resumed by r2")
        late = [c for c in calls if c[1] == "r1" and c[0] > lost]
        assert late == [], f"r1 called the machine after it lost the Lease: {late}"
        assert any(c[1] == "r2" for c in calls)  # the new leader carried the sleep through
        assert r2.registry.get_sample_value("joulesched_node_power_recovered_total", {"state": "sleeping"}) == 1
        node = emu.get("nodes", "a")
        assert node["metadata"]["annotations"].get("joulesched.io/power-owner") is None  # final state: no owner
    finally:
        for r in (r1, r2):
            if r is not None:
                r.stop()
        kubelets.stop()


# ---- 3. a dead BMC costs one wake one deadline -------------------------------------------------------------
def _put_to_sleep(emu, name: str) -> None:
    """A node as the controller leaves it asleep (cordoned, marked ours, tainted, annotated)."""
    emu.patch("nodes", "", name, {"metadata": {"annotations": {POWER_STATE_ANNOTATION: "asleep",
                                                               "joulesched.io/cordoned": "true"}},
                                  "spec": {"unschedulable": True, "taints": [
                                      {"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})


def test_a_redfish_bmc_that_never_answers_fails_one_wake_within_its_deadline_and_others_go_on(emu, machines):
    dead = TcpListener()  # accepts the connection, never answers the TLS handshake or a request
    machines.add("alive")
    machines.lookup("alive").managedSave(0)
    for n in ("dead", "alive"):
        emu.add_node(n, labels={"kubernetes.io/hostname": n})
        _put_to_sleep(emu, n)
    kubelets = Kubelets(emu, machines).start()
    addresses = {**machines.addresses, "dead": f"redfish://127.0.0.1:{dead.port}/redfish/v1/Systems/1"}
    cred = Credentials(hosts={f"127.0.0.1:{dead.port}": Login("admin", "pw")})
    act = make_actuator("auto", ActuatorOptions(libvirt_uri="test:///default", credentials=cred))
    deadline = 3.0
    ctl = _controller(emu, act, policy=PowerPolicy(sleep_after_s=60), addresses=addresses,
                      wake_timeout_s=deadline)
    try:
        ctl.start()
        wait_until(lambda: ctl.synced, 10)
        t0 = time.monotonic()
        for n in ("dead", "alive"):  # each pod fits only its node
            emu.add_pod(f"for-{n}", cpu="100m", node_selector={"kubernetes.io/hostname": n},
                        scheduler_name="default-scheduler")
        wait_until(lambda: awake(emu, machines, "alive"), 10, "alive woken while the dead BMC hangs")
        t_alive = time.monotonic() - t0
        wait_until(lambda: events(emu, "NodeWakeFailed"), deadline + 10, "the dead BMC's wake fails")
        t_dead = time.monotonic() - t0
        assert events(emu, "NodeWakeFailed")[0]["involvedObject"]["name"] == "dead"
        assert t_alive < deadline, f"the live wake waited for the dead BMC ({t_alive:.1f} s)"
        assert t_dead < deadline + 2.0, f"the dead BMC's wake took {t_dead:.1f} s, deadline {deadline} s"
        assert dead.accepted  # it was tried (it is in the map)
        assert pstate(emu, "dead") == "asleep" and emu.get("nodes", "dead")["spec"]["unschedulable"] is True
    finally:
        ctl.stop()
        kubelets.stop()
        dead.close()


# ---- 4. one cache per process ------------------------------------------------------------------------------
def _serve_requests(emu, tmp_path, node_power: dict | None) -> dict[str, int]:
    kc = emu.kubeconfig(str(tmp_path / "kc"))
    stop = threading.Event()
    before = dict(emu.requests)
    t = threading.Thread(target=run_serve, kwargs=dict(
        stop=stop, scheduler_name="joulesched", policy="most-allocated", listen="127.0.0.1:0", leader_elect=True,
        lease_namespace="default", bind_workers=2, seed=0,
        cache=dict(kubeconfig=kc, context=None, prometheus="", power_profiles=None), node_power=node_power))
    t.start()
    try:
        wait_until(lambda: emu.requests["watch:nodes"] > before.get("watch:nodes", 0)
                   and emu.requests["watch:pods"] > before.get("watch:pods", 0), 20, "the watches")
        pod = f"p-{time.monotonic_ns()}"
        emu.add_pod(pod, cpu="100m")
        # Bound: this replica leads and has made its resync list (once per term), whenever its election ended.
        wait_until(lambda: emu.get("pods", pod, "default")["spec"].get("nodeName"), 30, "the pod bound")
        time.sleep(2.0)  # reconciles and decisions go on; no informer is added
    finally:
        stop.set()
        t.join(20)
    return {k: emu.requests[k] - before.get(k, 0) for k in ("list:nodes", "watch:nodes", "list:pods", "watch:pods")}


def test_serve_with_node_power_lists_and_watches_nodes_and_pods_as_often_as_serve_alone(emu, tmp_path):
    for n in ("a", "b"):
        emu.add_node(n)
    alone = _serve_requests(emu, tmp_path, None)
    with_power = _serve_requests(emu, tmp_path, dict(
        actuator="none", sleep_after=600, min_awake=0, spare_cpu=0, consolidate=False, credentials=None,
        addresses=None, libvirt_uri="qemu:///system"))
    print(f"serve: {alone}; serve --node-power: {with_power}")  # the figures for the record
    assert alone["watch:nodes"] >= 1 and alone["watch:pods"] >= 1
    assert with_power == alone, f"serve: {alone}, serve --node-power: {with_power}"
