"""The autoscaler provider's limits: a configuration whose values the externalgrpc messages cannot carry (an
infinite or 1e300-second duration, a size past int32, an infinite price) is refused at load, exit 2 naming the
field, instead of failing every NodeGroupGetOptions / NodeGroups call; the largest accepted values are served.
NodeGroupDeleteNodes naming one node twice is refused before any node is touched."""

from __future__ import annotations

import pytest

from joulesched.cluster.kube.objects import NodeInfo
from joulesched.core.errors import UsageError
from joulesched.power.curves import SPECPOWER

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (pip install 'joulesched[autoscaler]')")
pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install 'joulesched[autoscaler]')")

from joulesched.live.autoscaler import (  # noqa: E402
    MAX_DURATION_S,
    AutoscalerProvider,
    ProviderConfig,
    ProviderServer,
    load_protos,
    load_provider_config,
)

PB, SVC, _ = load_protos()
GROUP = "groups: [{id: g, nodes: [a]%s}]\n"


@pytest.mark.parametrize("text, where", [
    (GROUP % ", options: {scale_down_unneeded_s: .inf}", "groups.0.options.scale_down_unneeded_s"),
    (GROUP % ", options: {scale_down_unready_s: .nan}", "groups.0.options.scale_down_unready_s"),
    (GROUP % ", options: {max_node_provision_s: 1e300}", "groups.0.options.max_node_provision_s"),
    (GROUP % ", options: {max_node_startup_s: 2592001}", "groups.0.options.max_node_startup_s"),
    (GROUP % ", min_size: 1099511627776", "groups.0.min_size"),
    (GROUP % ", max_size: 2147483648", "groups.0.max_size"),
    (GROUP % "" + "price_per_kwh: .inf\n", "price_per_kwh"),
    (GROUP % "" + "price_per_kwh: -0.1\n", "price_per_kwh"),
    (GROUP % "" + "pricing_utilization: .nan\n", "pricing_utilization"),
    (GROUP % ", min_size: true", "groups.0.min_size"),  # pydantic took true as 1
    (GROUP % ", max_size: 2.5", "groups.0.max_size"),
    (GROUP % "" + "price_per_kwh: 1e300\n", "price_per_kwh"),  # finite, but prices overflowed to inf
    (GROUP % ", options: {scale_down_utilization_threshold: true}",
     "groups.0.options.scale_down_utilization_threshold"),
    (GROUP % ", options: {ignore_daemonsets_utilization: 'no'}", "groups.0.options.ignore_daemonsets_utilization"),
], ids=["unneeded-inf", "unready-nan", "provision-1e300", "startup-30d+1s", "min_size-2^40", "max_size-2^31",
        "price-inf", "price-negative", "utilization-nan", "min_size-bool", "max_size-float", "price-1e300",
        "threshold-bool", "switch-string"])
def test_values_the_protocol_cannot_carry_are_refused_at_load(tmp_path, text, where):
    p = tmp_path / "as.yaml"
    p.write_text(text)
    with pytest.raises(UsageError, match=f": {where}: ") as e:
        load_provider_config(p)
    assert e.value.exit_code == 2


class _Controller:
    """The controller's side the provider reads: two awake nodes of the group; sleeps are recorded."""

    class cfg:
        dry_run = False
        wake_timeout_s = 60.0

    def __init__(self) -> None:
        self.delegated = None
        self.slept: list[str] = []
        curve = SPECPOWER["ibm-x3250-x3470"]
        self.infos = {n: NodeInfo(n, 4000, 8192, 110, curve, "default", provider_id=f"joulesched://{n}")
                      for n in ("w1", "w2")}

    def node_infos(self) -> dict[str, NodeInfo]:
        return dict(self.infos)

    def action_of(self, name: str) -> str | None:
        return "sleep" if name in self.slept else None

    def is_leader(self) -> bool:
        return True

    def workload_pods_on(self, name: str) -> list[str]:
        return []

    def request_sleep(self, name: str) -> bool:
        if name in self.slept:  # already going: the controller refuses a second action
            return False
        self.slept.append(name)
        return True


@pytest.fixture
def serve():
    made = []

    def start(conf: dict):
        ctl = _Controller()
        srv = ProviderServer(AutoscalerProvider(ctl, ProviderConfig.model_validate(conf)), "127.0.0.1:0").start()
        ch = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
        made.append((srv, ch))
        return ctl, SVC.CloudProviderStub(ch)

    yield start
    for srv, ch in made:
        ch.close()
        srv.stop()


def test_the_largest_accepted_values_are_served(serve):
    month = int(MAX_DURATION_S)
    _, stub = serve({"groups": [{"id": "g", "nodes": ["w1", "w2"], "min_size": 2**31 - 1, "max_size": 2**31 - 1,
                                 "options": {"scale_down_unneeded_s": month, "max_node_provision_s": month}}],
                     "price_per_kwh": 1e6})
    g = stub.NodeGroups(PB.NodeGroupsRequest(), timeout=5).nodeGroups[0]
    assert (g.id, g.minSize, g.maxSize) == ("g", 2**31 - 1, 2)
    o = stub.NodeGroupGetOptions(PB.NodeGroupAutoscalingOptionsRequest(id="g"), timeout=5).nodeGroupAutoscalingOptions
    assert o.scaleDownUnneededDuration.seconds == o.MaxNodeProvisionDuration.seconds == 30 * 24 * 3600


def test_deleting_a_node_listed_twice_is_refused_before_any_sleep(serve):
    ctl, stub = serve({"groups": [{"id": "g", "nodes": ["w1", "w2"]}]})
    for nodes in ([PB.ExternalGrpcNode(name="w1"), PB.ExternalGrpcNode(name="w1")],
                  [PB.ExternalGrpcNode(name="w2"), PB.ExternalGrpcNode(providerID="joulesched://w2")]):
        with pytest.raises(grpc.RpcError) as e:
            stub.NodeGroupDeleteNodes(PB.NodeGroupDeleteNodesRequest(id="g", nodes=nodes), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "listed twice" in e.value.details()
    assert ctl.slept == []
    stub.NodeGroupDeleteNodes(PB.NodeGroupDeleteNodesRequest(id="g", nodes=[PB.ExternalGrpcNode(name="w1")]),
                              timeout=5)
    assert ctl.slept == ["w1"]


class _Controller:
    """The controller as the provider sees it: two nodes of one group, w1 running and w2 asleep."""

    class cfg:
        dry_run, wake_timeout_s, request_timeout_s = False, 60.0, 5.0

    def __init__(self) -> None:
        from joulesched.cluster.kube.objects import NodeInfo
        from joulesched.power.curves import SPECPOWER

        curve = SPECPOWER["ibm-x3250-x3470"]
        self.infos = {"w1": NodeInfo("w1", 4000, 8192, 110, curve, "d", provider_id="joulesched://w1"),
                      "w2": NodeInfo("w2", 4000, 8192, 110, curve, "d", provider_id="joulesched://w2",
                                     power_state="asleep", asleep=True)}
        self.slept: list[str] = []
        self.woken: list[str] = []
        self.delegated = None

    def node_infos(self):
        return dict(self.infos)

    def action_of(self, n):
        return "sleep" if n in self.slept else ("wake" if n in self.woken else None)

    def is_leader(self):
        return True

    def workload_pods_on(self, n):
        return []

    def request_sleep(self, n):
        self.slept.append(n)
        return True

    def request_wake(self, n):
        self.woken.append(n)
        return True


def test_a_failed_wake_is_no_capacity_and_a_waking_node_is_not_deleted():
    """A review: the min-size check counted a wake that failed (reported "creating" with its error, so the
    autoscaler hears of it) as a machine, and let the group's last running node go; and DeleteNodes of a node
    being woken answered success while the wake went on."""
    import dataclasses

    from joulesched.live.autoscaler import AutoscalerProvider, ProviderConfig, ProviderError

    ctl = _Controller()
    p = AutoscalerProvider(ctl, ProviderConfig.model_validate({"groups": [{"id": "g", "nodes": ["w1", "w2"],
                                                                           "min_size": 1}]}))
    p.increase_size("g", 1)
    ctl.woken.clear()  # w2's wake failed: the controller ended it and marked the node
    ctl.infos["w2"] = dataclasses.replace(ctl.infos["w2"], wake_failed=True)
    assert [(i.name, i.state, bool(i.error)) for i in p.instances("g")] == [("w1", "running", False),
                                                                           ("w2", "creating", True)]
    with pytest.raises(ProviderError, match="below its min size 1"):
        p.delete_nodes("g", [("joulesched://w1", "w1")])
    assert ctl.slept == []

    ctl = _Controller()
    p = AutoscalerProvider(ctl, ProviderConfig.model_validate({"groups": [{"id": "g", "nodes": ["w1", "w2"]}]}))
    p.increase_size("g", 1)  # w2 is being woken
    with pytest.raises(ProviderError, match="w2 is being woken"):
        p.delete_nodes("g", [("joulesched://w2", "w2")])
    assert ctl.slept == [] and p.target_size("g") == 2
