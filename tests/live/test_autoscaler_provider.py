"""`joulesched autoscaler-provider`: cluster-autoscaler's externalgrpc CloudProvider over the node power
controller, driven by a gRPC client built from the published interface (live/protos/externalgrpc.proto: its
package, service, messages and field numbers are cluster-autoscaler's), over mTLS.

The cluster is the API emulator (real HTTP, the real `kubernetes` client), the machines are libvirt test-driver
domains switched by the real libvirt actuator, and emulated kubelets report Ready as the machines run
(tests/support/machines.py): the kubelets and the apiserver are the mock parts. No cluster-autoscaler binary
can run here (no Go toolchain or release binary is reachable); its side of the protocol is the client below.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.kube.objects import POWER_TRUSTED_LABEL, POWER_WATTS_ANNOTATION
from joulesched.cluster.nodepower import ASLEEP_TAINT, POWER_STATE_ANNOTATION, PowerPolicy
from joulesched.core.errors import UsageError
from joulesched.live.actuators import ActuatorOptions, make_actuator
from joulesched.live.nodepower import NodePowerConfig, NodePowerController
from tests.live.conftest import wait_until
from tests.support.kube_emulator import make_node
from tests.support.machines import Kubelets, Machines
from tests.support.tls import TestCA

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (pip install 'joulesched[autoscaler]')")
pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install 'joulesched[autoscaler]')")

from google.protobuf.timestamp_pb2 import Timestamp  # noqa: E402

from joulesched.live.autoscaler import (  # noqa: E402
    AutoscalerProvider,
    ProviderConfig,
    ProviderServer,
    TLSFiles,
    load_protos,
    load_provider_config,
)

CTL_FAST = dict(resync_s=0.05, settle_s=0.1, retry_initial_s=0.3, retry_max_s=1.0, wake_timeout_s=5.0,
                leader_elect=False, lease_namespace="default")
PB, SVC, K8S = load_protos()
CA_TAINT = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}
#: Curves: the "big" nodes do 16 cores at 200 W peak (12.5 mW/m), "small" 4 cores at 120 W (30 mW/m).
BIG = [100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200]
SMALL = [60, 66, 72, 78, 84, 90, 96, 102, 108, 114, 120]


def node(emu, machines, name, *, cpu="4", labels=None, provider=True, curve=SMALL, machine=True):
    obj = make_node(name, cpu=cpu, labels={**(labels or {}), POWER_TRUSTED_LABEL: "true"})
    obj["metadata"]["annotations"][POWER_WATTS_ANNOTATION] = json.dumps(curve)
    if provider:
        obj["spec"]["providerID"] = f"joulesched://{name}"
    emu._create("nodes", obj)
    if machine:
        machines.add(name)


@pytest.fixture
def cluster(emu):
    machines = Machines()
    kubelets = Kubelets(emu, machines).start()
    node(emu, machines, "cp", labels={"node-role.kubernetes.io/control-plane": ""}, machine=False)
    for n in ("w1", "w2", "w3"):
        node(emu, machines, n, labels={"node-restriction.kubernetes.io/pool": "general"})
    node(emu, machines, "big1", cpu="16", labels={"node-restriction.kubernetes.io/pool": "big"}, curve=BIG)
    node(emu, machines, "loose", labels={"node-restriction.kubernetes.io/pool": "none"})  # in no group
    node(emu, machines, "noid", labels={"node-restriction.kubernetes.io/pool": "general"}, provider=False)
    yield emu, machines
    kubelets.stop()
    machines.close()


CONFIG = {"groups": [{"id": "general", "selector": {"node-restriction.kubernetes.io/pool": "general"},
                      "min_size": 1, "options": {"scale_down_unneeded_s": 120}},
                     {"id": "big", "selector": {"node-restriction.kubernetes.io/pool": "big"}}],
          "price_per_kwh": 0.5}


@pytest.fixture
def provider(cluster, tmp_path):
    emu, machines = cluster
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=0.3, min_awake=0), addresses=dict(machines.addresses),
                          **CTL_FAST)
    ctl = NodePowerController(api_client_for(emu.url), make_actuator("libvirt", ActuatorOptions(
        libvirt_uri="test:///default")), cfg)
    prov = AutoscalerProvider(ctl, ProviderConfig.model_validate(CONFIG))
    ca = TestCA(tmp_path / "pki")
    cert, key = ca.issue("provider", server=True)
    server = ProviderServer(prov, "127.0.0.1:0", TLSFiles(str(cert), str(key), str(ca.cert))).start()
    ctl.start()
    wait_until(lambda: ctl.synced, 10, "controller synced")
    yield emu, machines, ctl, prov, server, ca
    server.stop()
    ctl.stop()


def channel(server, ca: TestCA | None, client: tuple[Path, Path] | None):
    root = ca.cert.read_bytes() if ca else None
    key, chain = (client[1].read_bytes(), client[0].read_bytes()) if client else (None, None)
    creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)
    return grpc.secure_channel(f"127.0.0.1:{server.port}", creds)


@pytest.fixture
def stub(provider):
    _, _, _, _, server, ca = provider
    ch = channel(server, ca, ca.issue("cluster-autoscaler", server=False))
    yield SVC.CloudProviderStub(ch)
    ch.close()


def pstate(emu, name):
    return (emu.get("nodes", name)["metadata"].get("annotations") or {}).get(POWER_STATE_ANNOTATION, "awake")


def taint_keys(emu, name):
    return {t["key"] for t in emu.get("nodes", name)["spec"].get("taints") or []}


def target(stub, gid):
    return stub.NodeGroupTargetSize(PB.NodeGroupTargetSizeRequest(id=gid)).targetSize


def test_groups_membership_and_the_controller_leaves_them_alone(provider, stub):
    emu, machines, ctl, *_ = provider
    groups = {g.id: g for g in stub.NodeGroups(PB.NodeGroupsRequest()).nodeGroups}
    assert set(groups) == {"general", "big"}
    assert (groups["general"].minSize, groups["general"].maxSize) == (1, 3)  # noid has no providerID: not in it
    assert (groups["big"].minSize, groups["big"].maxSize) == (0, 1)
    for name, pid, want in (("w2", "", "general"), ("", "joulesched://big1", "big"), ("cp", "", ""),
                            ("loose", "", ""), ("noid", "", "")):
        got = stub.NodeGroupForNode(PB.NodeGroupForNodeRequest(node=PB.ExternalGrpcNode(name=name, providerID=pid)))
        assert got.nodeGroup.id == want, (name, pid)
    # Every node idles past sleep_after: the controller sleeps the one in no group, none of the groups' nodes.
    wait_until(lambda: pstate(emu, "loose") == "asleep", 10, "the node in no group asleep")
    time.sleep(0.5)
    assert {n: pstate(emu, n) for n in ("w1", "w2", "w3", "big1", "noid")} == dict.fromkeys(
        ("w1", "w2", "w3", "big1", "noid"), "awake")
    assert target(stub, "general") == 3 and target(stub, "big") == 1
    insts = stub.NodeGroupNodes(PB.NodeGroupNodesRequest(id="general")).instances
    assert sorted(i.id for i in insts) == [f"joulesched://w{k}" for k in (1, 2, 3)]
    assert {i.status.instanceState for i in insts} == {PB.InstanceStatus.instanceRunning}


def test_delete_nodes_sleeps_them_and_increase_size_wakes_the_most_efficient(provider, stub):
    emu, machines, ctl, prov, *_ = provider
    emu.add_pod("web", cpu="100m", node_name="w1", owner="ReplicaSet")
    with pytest.raises(grpc.RpcError) as e:  # the autoscaler drains first: a node still running pods is refused
        stub.NodeGroupDeleteNodes(PB.NodeGroupDeleteNodesRequest(
            id="general", nodes=[PB.ExternalGrpcNode(providerID="joulesched://w1", name="w1")]))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "drain it first" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:  # a node of another group
        stub.NodeGroupDeleteNodes(PB.NodeGroupDeleteNodesRequest(
            id="general", nodes=[PB.ExternalGrpcNode(providerID="joulesched://big1")]))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # The autoscaler has tainted w2 and w3 and drained them; it deletes them: they sleep.
    for n in ("w2", "w3"):
        emu.patch("nodes", "", n, {"spec": {"taints": [CA_TAINT]}})
    stub.NodeGroupDeleteNodes(PB.NodeGroupDeleteNodesRequest(
        id="general", nodes=[PB.ExternalGrpcNode(providerID=f"joulesched://{n}", name=n) for n in ("w2", "w3")]))
    assert target(stub, "general") == 1  # at once: both are being deleted
    wait_until(lambda: all(pstate(emu, n) == "asleep" and machines.saved(n) for n in ("w2", "w3")), 10,
               "w2 and w3 asleep")
    assert target(stub, "general") == 1

    def listed():  # the provider reads its informer cache and the controller's actions: it catches up a little later
        insts = stub.NodeGroupNodes(PB.NodeGroupNodesRequest(id="general")).instances
        assert all(i.status.instanceState == PB.InstanceStatus.instanceDeleting for i in insts
                   if i.id != "joulesched://w1"), insts  # meanwhile a sleeping node is only ever "deleting"
        return [i.id for i in insts]

    wait_until(lambda: listed() == ["joulesched://w1"], 10, "only w1 listed")
    with pytest.raises(grpc.RpcError) as e:  # min_size 1
        stub.NodeGroupDeleteNodes(PB.NodeGroupDeleteNodesRequest(
            id="general", nodes=[PB.ExternalGrpcNode(providerID="joulesched://w1")]))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "min size" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.NodeGroupIncreaseSize(PB.NodeGroupIncreaseSizeRequest(id="general", delta=3))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Scale up by one: a sleeping node wakes, loses our taint, our cordon and the autoscaler's taint.
    stub.NodeGroupIncreaseSize(PB.NodeGroupIncreaseSizeRequest(id="general", delta=1))
    assert target(stub, "general") == 2
    woken = wait_until(lambda: next((n for n in ("w2", "w3") if pstate(emu, n) == "awake"
                                     and machines.running(n)), None), 10, "one node awake")
    assert not taint_keys(emu, woken) & {ASLEEP_TAINT, CA_TAINT["key"]}
    assert not emu.get("nodes", woken)["spec"].get("unschedulable")
    other = ({"w2", "w3"} - {woken}).pop()
    assert pstate(emu, other) == "asleep" and not machines.running(other)
    want = {"joulesched://w1": PB.InstanceStatus.instanceRunning,
            f"joulesched://{woken}": PB.InstanceStatus.instanceRunning}

    def states():
        return {i.id: i.status.instanceState
                for i in stub.NodeGroupNodes(PB.NodeGroupNodesRequest(id="general")).instances}

    # Creating until the controller's wake action has returned and its cache has the awake node.
    wait_until(lambda: states() == want, 10, f"both instances running (last {states()})")
    # The actuator's calls, as the machines saw them: the two sleeps, then the one wake.
    acts = [(a, n) for _, a, n in ctl.actions if n in ("w2", "w3")]
    assert sorted(acts[:2]) == [("sleep", "w2"), ("sleep", "w3")] and acts[2:] == [("wake", woken)]


def test_concurrent_deletes_never_take_a_group_below_its_min_size(provider):
    # cluster-autoscaler deletes nodes of a group concurrently; each call alone keeps min_size, together they
    # must too. The barrier lets every call read the group's size before any of them acts.
    import threading

    from joulesched.live.autoscaler import ProviderError

    emu, machines, ctl, prov, *_ = provider
    barrier, read = threading.Barrier(3), prov.target_size

    def target_size(gid):
        n = read(gid)
        try:
            barrier.wait(timeout=1.0)
        except threading.BrokenBarrierError:
            pass
        return n

    prov.target_size = target_size
    results: dict[str, str] = {}

    def delete(n):
        try:
            prov.delete_nodes("general", [(f"joulesched://{n}", n)])
            results[n] = "deleted"
        except ProviderError as e:
            results[n] = e.code

    threads = [threading.Thread(target=delete, args=(n,)) for n in ("w1", "w2", "w3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(results.values()) == ["FAILED_PRECONDITION", "deleted", "deleted"], results  # min_size 1
    kept = next(n for n, r in results.items() if r != "deleted")
    assert ctl.action_of(kept) is None and pstate(emu, kept) == "awake"


def test_increase_size_wakes_in_order_of_efficiency(cluster, tmp_path):
    emu, machines = cluster
    # A group of two sizes: the 16-core node at 12.5 mW/m wakes before the 4-core ones at 30 mW/m.
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=0.2, min_awake=0), addresses=dict(machines.addresses),
                          **CTL_FAST)
    ctl = NodePowerController(api_client_for(emu.url), make_actuator("libvirt", ActuatorOptions(
        libvirt_uri="test:///default")), cfg)
    prov = AutoscalerProvider(ctl, ProviderConfig.model_validate(
        {"groups": [{"id": "mixed", "nodes": ["w1", "w2", "big1"]}]}))
    ctl.start()
    try:
        wait_until(lambda: ctl.synced, 10, "synced")
        prov.delete_nodes("mixed", [("", n) for n in ("w1", "w2", "big1")])
        wait_until(lambda: not prov.instances("mixed"), 10, "all asleep, as the provider sees them")
        assert all(pstate(emu, n) == "asleep" for n in ("w1", "w2", "big1")) and prov.target_size("mixed") == 0
        assert prov.increase_size("mixed", 2) == ["big1", "w1"]
        wait_until(lambda: pstate(emu, "big1") == "awake" and pstate(emu, "w1") == "awake", 10, "two awake")
        assert pstate(emu, "w2") == "asleep"
    finally:
        ctl.stop()


def test_template_prices_options_and_gpu_label(provider, stub):
    node = K8S.Node()
    node.ParseFromString(stub.NodeGroupTemplateNodeInfo(PB.NodeGroupTemplateNodeInfoRequest(id="big")).nodeBytes)
    assert node.metadata.labels["node-restriction.kubernetes.io/pool"] == "big"
    assert node.status.allocatable["cpu"].string == "16000m" and node.status.capacity["pods"].string == "110"
    assert [c.type for c in node.status.conditions] == ["Ready"]
    assert ASLEEP_TAINT not in {t.key for t in node.spec.taints}
    hour = (Timestamp(seconds=0), Timestamp(seconds=3600))

    def price(name, start, end, **kw):
        return stub.PricingNodePrice(PB.PricingNodePriceRequest(node=PB.ExternalGrpcNode(name=name, **kw),
                                                                startTimestamp=start, endTimestamp=end)).price

    # 0.5 utilisation: 150 W (big) and 90 W (small) for an hour at 0.5 per kWh.
    assert price("big1", *hour) == pytest.approx(0.150 * 0.5)
    assert price("w1", *hour) == pytest.approx(0.090 * 0.5)
    # A template node, known by its group annotation, costs what its group's nodes cost.
    assert stub.PricingNodePrice(PB.PricingNodePriceRequest(
        node=PB.ExternalGrpcNode(name="template-big-1234", annotations={"joulesched.io/node-group": "big"}),
        startTimestamp=hour[0], endTimestamp=hour[1])).price == pytest.approx(0.150 * 0.5)
    with pytest.raises(grpc.RpcError) as e:
        price("loose", *hour)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # A pod asking 2 cores costs its share of the most efficient node (150 W / 16 cores).
    pod = K8S.Pod()
    c = pod.spec.containers.add(name="app")
    c.resources.requests["cpu"].string = "2"
    pp = stub.PricingPodPrice(PB.PricingPodPriceRequest(pod_bytes=pod.SerializeToString(), startTimestamp=hour[0],
                                                        endTimestamp=hour[1])).price
    assert pp == pytest.approx(150 / 16000 * 2000 / 1000 * 0.5)
    defaults = PB.NodeGroupAutoscalingOptions(scaleDownUtilizationThreshold=0.5)
    defaults.scaleDownUnneededDuration.seconds = 600
    got = stub.NodeGroupGetOptions(PB.NodeGroupAutoscalingOptionsRequest(id="general", defaults=defaults))
    o = got.nodeGroupAutoscalingOptions
    assert o.scaleDownUnneededDuration.seconds == 120 and o.scaleDownUtilizationThreshold == 0.5
    assert stub.GPULabel(PB.GPULabelRequest()).label == "nvidia.com/gpu.product"
    with pytest.raises(grpc.RpcError) as e:
        stub.NodeGroupTargetSize(PB.NodeGroupTargetSizeRequest(id="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        stub.NodeGroupDecreaseTargetSize(PB.NodeGroupDecreaseTargetSizeRequest(id="general", delta=-1))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_nodes_sharing_a_provider_id_are_in_no_group_and_never_slept_for_each_other(provider, stub):
    """The kubelet writes spec.providerID: a cloned config gives two nodes one id. DeleteNodes names instances
    by it, so neither may be a member; before, the last node listed took the id and a delete of w1 slept w3."""
    emu, *_ = provider
    emu.patch("nodes", "", "w3", {"spec": {"providerID": "joulesched://w1"}})
    wait_until(lambda: target(stub, "general") == 1, 10, "w1 and w3 out of the group")
    insts = stub.NodeGroupNodes(PB.NodeGroupNodesRequest(id="general")).instances
    assert [i.id for i in insts] == ["joulesched://w2"]
    for name, pid in (("w1", ""), ("w3", ""), ("", "joulesched://w1")):
        got = stub.NodeGroupForNode(PB.NodeGroupForNodeRequest(node=PB.ExternalGrpcNode(name=name, providerID=pid)))
        assert got.nodeGroup.id == "", (name, pid)
    with pytest.raises(grpc.RpcError) as e:
        stub.NodeGroupDeleteNodes(PB.NodeGroupDeleteNodesRequest(
            id="general", nodes=[PB.ExternalGrpcNode(providerID="joulesched://w1")]))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    time.sleep(0.5)
    assert (pstate(emu, "w1"), pstate(emu, "w3")) == ("awake", "awake")
    assert "joulesched.io/asleep" not in taint_keys(emu, "w1") | taint_keys(emu, "w3")


def test_arguments_out_of_protobufs_range_are_invalid_not_internal(stub):
    huge = (Timestamp(seconds=-(2**62)), Timestamp(seconds=2**62))
    for call in (lambda: stub.PricingNodePrice(PB.PricingNodePriceRequest(
            node=PB.ExternalGrpcNode(name="w1"), startTimestamp=huge[0], endTimestamp=huge[1])),
                 lambda: stub.PricingPodPrice(PB.PricingPodPriceRequest(
                     pod_bytes=K8S.Pod().SerializeToString(), startTimestamp=huge[0], endTimestamp=huge[1]))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Timestamp" in e.value.details()
    d = PB.NodeGroupAutoscalingOptions()
    d.scaleDownUnneededDuration.seconds, d.scaleDownUnneededDuration.nanos = 2**63 - 1, -999999999
    with pytest.raises(grpc.RpcError) as e:
        stub.NodeGroupGetOptions(PB.NodeGroupAutoscalingOptionsRequest(id="general", defaults=d))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "scaleDownUnneededDuration" in e.value.details()


def test_mtls_refuses_clients_without_a_certificate_of_its_ca(provider, tmp_path):
    *_, server, ca = provider
    request = PB.NodeGroupsRequest()
    for label, client in (("no client certificate", None),
                          ("a certificate of another CA", TestCA(tmp_path / "other").issue("intruder", server=False))):
        ch = channel(server, ca, client)
        with pytest.raises(grpc.RpcError) as e:
            SVC.CloudProviderStub(ch).NodeGroups(request, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, label
        ch.close()
    ok = channel(server, ca, ca.issue("cluster-autoscaler", server=False))
    assert len(SVC.CloudProviderStub(ok).NodeGroups(request, timeout=5).nodeGroups) == 2
    ok.close()


def test_plaintext_only_on_loopback_and_bad_configs_exit_2(tmp_path):
    class Ctl:
        delegated = None

    prov = AutoscalerProvider(Ctl(), ProviderConfig.model_validate(CONFIG))
    with pytest.raises(UsageError, match="plaintext gRPC only on loopback"):
        ProviderServer(prov, "0.0.0.0:0")
    for text, msg in (("groups: []", "groups"), ("groups: [{id: a}]", "selector or a list of nodes"),
                      ("groups: [{id: a, nodes: [x]}, {id: a, nodes: [y]}]", "appears twice"),
                      ("groups: [{id: a, nodes: [x], min_size: 3, max_size: 1}]", "max_size 1 < min_size 3"),
                      ("groups: [{id: a, nodes: [x]}]\nprice: 1", "price"), ("groups: [", "not YAML")):
        p = tmp_path / "c.yaml"
        p.write_text(text)
        with pytest.raises(UsageError, match=msg):
            load_provider_config(p)


def test_the_command_serves_until_sigterm(emu, tmp_path):
    """`joulesched autoscaler-provider` as a user starts it: a process, the emulator's kubeconfig, mTLS."""
    import signal
    import subprocess
    import sys

    from tests.support.procs import free_port

    for n in ("a1", "a2"):
        obj = make_node(n, labels={"node-restriction.kubernetes.io/pool": "p"})
        obj["spec"]["providerID"] = f"joulesched://{n}"
        emu._create("nodes", obj)
    (tmp_path / "groups.yaml").write_text("groups: [{id: p, selector: {node-restriction.kubernetes.io/pool: p}}]\n")
    ca = TestCA(tmp_path / "pki")
    cert, key = ca.issue("provider", server=True)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "joulesched.pipelines.cli", "autoscaler-provider", "--config",
         str(tmp_path / "groups.yaml"), "--grpc-listen", f"127.0.0.1:{port}", "--tls-cert", str(cert), "--tls-key",
         str(key), "--client-ca", str(ca.cert), "--kubeconfig", emu.kubeconfig(str(tmp_path / "kc")),
         "--no-leader-elect", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        class Server:
            pass

        Server.port = port
        ch = channel(Server, ca, ca.issue("cluster-autoscaler", server=False))
        grpc.channel_ready_future(ch).result(timeout=60)
        stub = SVC.CloudProviderStub(ch)
        got = wait_until(lambda: [(g.id, g.maxSize) for g in stub.NodeGroups(PB.NodeGroupsRequest()).nodeGroups
                                  if g.maxSize], 20, "the group's two nodes")
        assert got == [("p", 2)]
        assert target(stub, "p") == 2
        ch.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out  # SIGTERM is how a daemon is stopped: a clean exit
    assert "autoscaler provider on 127.0.0.1" in out and "Traceback" not in out


def test_tls_files_that_are_no_pem_or_do_not_match_are_named_before_anything_starts(tmp_path):
    """gRPC reported a bad PEM as "Failed to bind to address" (a RuntimeError traceback), after the node power
    controller had started: each file is parsed first, and the key must be the certificate's."""
    ca = TestCA(tmp_path / "pki")
    cert, key = ca.issue("provider", server=True)
    _, other_key = ca.issue("other", server=True)
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"\x00\x01\xff\xfe garbage")
    TLSFiles(str(cert), str(key), str(ca.cert)).check()  # the good set passes
    for files, needle in (((junk, key, ca.cert), "--tls-cert"), ((cert, junk, ca.cert), "--tls-key"),
                          ((cert, key, junk), "--client-ca"), ((cert, other_key, ca.cert), "is not the key of")):
        with pytest.raises(UsageError, match=needle):
            TLSFiles(*map(str, files)).check()
