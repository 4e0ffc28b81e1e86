"""Pod requests as kube computes them (sidecars, pod-level requests), the resources and host ports the kubelet
admits by (named resources, NodePorts), and the unschedulable message counted in one pass."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from kubernetes import client as k8s

from joulesched.cluster.filters import REASON_PORTS, FilterChain
from joulesched.cluster.kube.cache import KubeCache, kube_unschedulable_message
from joulesched.cluster.kube.objects import CurveResolver, node_gate_reason, parse_node, parse_pod, pod_request
from joulesched.cluster.state import ClusterState, PodRequest
from tests.live.conftest import wait_until
from tests.support.kube_emulator import make_node, make_pod

CURVE = [50.0 + 10 * k for k in range(11)]


def _container(name: str, cpu: str | None = None, *, memory: str | None = None, sidecar: bool = False,
               **extra: str) -> dict:
    req = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None} | extra
    c: dict = {"name": name, "image": "x", "resources": {"requests": req}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def _with(pod: dict, *, init: list[dict] = (), pod_requests: dict | None = None, overhead: dict | None = None,
          ports: list[dict] | None = None) -> dict:
    if init:
        pod["spec"]["initContainers"] = list(init)
    if pod_requests is not None:
        pod["spec"]["resources"] = {"requests": dict(pod_requests)}
    if overhead is not None:
        pod["spec"]["overhead"] = dict(overhead)
    if ports is not None:
        pod["spec"]["containers"][0]["ports"] = list(ports)
    return pod


def _uid(pod: dict, uid: str, node: str = "") -> dict:
    pod["metadata"]["uid"] = uid
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"
    return pod


# ---- 1. requests as kube's PodRequests computes them ---------------------------------------------------------
def test_a_sidecar_counts_beside_the_containers():
    pod = _with(make_pod("s", cpu="1"), init=[_container("side", "1", sidecar=True)])
    assert parse_pod(pod).request.cpu_m == 2000


@pytest.mark.parametrize("init, cpu", [
    # KEP-753: max(containers + every sidecar, each init container + the sidecars declared before it)
    ([_container("side", "1", sidecar=True), _container("init", "3")], 4000),  # 3 + 1 > 1 + 1
    ([_container("init", "3"), _container("side", "1", sidecar=True)], 3000),  # the init runs before the sidecar
    ([_container("a", "500m", sidecar=True), _container("init", "1"), _container("b", "2", sidecar=True)], 3500),
    ([_container("side", None, memory="1Gi", sidecar=True), _container("init", "1500m")], 1500),
])
def test_init_containers_and_sidecars_follow_kep_753(init, cpu):
    assert pod_request(_with(make_pod("s", cpu="1"), init=init)).cpu_m == cpu


def test_sidecar_memory_and_named_resources_add_up_too():
    pod = _with(make_pod("s", cpu="1", memory="1Gi"),
                init=[_container("side", "1", memory="512Mi", sidecar=True, **{"ephemeral-storage": "1Gi"})])
    pod["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = "2Gi"
    r = pod_request(pod)
    assert (r.cpu_m, r.memory_mib, r.named) == (2000, 1536, (("ephemeral-storage", 3 << 30),))


def test_pod_level_requests_replace_the_containers_sum_per_resource():
    pod = _with(make_pod("p", cpu="1", memory="1Gi", containers=2), pod_requests={"cpu": "3"},
                overhead={"cpu": "250m", "memory": "64Mi"})
    r = pod_request(pod)
    assert (r.cpu_m, r.memory_mib) == (3250, 2112)  # cpu: pod-level + overhead; memory: containers + overhead
    # Only cpu, memory and hugepages-* are taken from pod level (component-helpers' IsSupportedPodLevelResource).
    pod = _with(make_pod("p", cpu="1"), pod_requests={"hugepages-2Mi": "4Mi", "example.com/foo": "9"})
    pod["spec"]["containers"][0]["resources"]["requests"] |= {"hugepages-2Mi": "2Mi", "example.com/foo": "1"}
    assert pod_request(pod).named == (("example.com/foo", 1), ("hugepages-2Mi", 4 << 20))


def test_named_requests_and_host_ports_are_parsed_as_kube_reads_them():
    pod = make_pod("p", cpu="100m")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "example.com/zero": "0"},
                                                 "limits": {"example.com/foo": "2"}}  # request defaults to limit
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080},
                                             {"containerPort": 53, "hostPort": 53, "protocol": "UDP",
                                              "hostIP": "10.0.0.1"}, {"containerPort": 9090}]
    pod["spec"]["initContainers"] = [{"name": "side", "restartPolicy": "Always", "ports": [{"hostPort": 7}]},
                                     {"name": "init", "ports": [{"hostPort": 8}]}]  # gone before the pod runs
    r = pod_request(pod)
    assert r.named == (("example.com/foo", 2),)
    assert r.host_ports == (("TCP", "0.0.0.0", 7), ("TCP", "0.0.0.0", 8080), ("UDP", "10.0.0.1", 53))
    assert r.extra and not PodRequest(100, 100).extra
    n = parse_node(make_node("n"), CurveResolver())
    assert n.named == () and node_gate_reason(n, parse_pod(pod)) == "Insufficient example.com/foo"
    node = make_node("n")
    node["status"]["allocatable"] |= {"example.com/foo": "4", "ephemeral-storage": "100Gi", "nvidia.com/gpu": "1"}
    n = parse_node(node, CurveResolver())
    assert n.named == (("ephemeral-storage", 100 << 30), ("example.com/foo", 4))
    assert node_gate_reason(n, parse_pod(pod)) == ""


def test_a_pod_with_a_sidecar_is_not_bound_where_it_does_not_fit(emu, make_scheduler):
    emu.add_node("n", cpu="1500m", memory="4Gi")
    emu.add_object("pods", _with(make_pod("s", cpu="1"), init=[_container("side", "1", sidecar=True)]), "default")
    make_scheduler()
    wait_until(lambda: [e for e in emu.list("events") if e["reason"] == "FailedScheduling"], 10, "FailedScheduling")
    assert not emu.get("pods", "s", "default")["spec"].get("nodeName")
    ev = [e for e in emu.list("events") if e["reason"] == "FailedScheduling"][0]
    assert ev["message"] == "0/1 nodes are available: 1 Insufficient cpu."


# ---- 2. named resources and host ports --------------------------------------------------------------------
def _cache(nodes: list[dict], pods: list[dict]) -> KubeCache:
    c = KubeCache(k8s.ApiClient())
    c._replace_nodes(nodes)
    c._replace_pods(pods)
    return c


def _node(name: str, alloc: dict[str, str] | None = None) -> dict:
    n = make_node(name)
    n["status"]["allocatable"] |= alloc or {}
    return n


def _names(c: KubeCache, pod: dict) -> list[str]:
    with c.lock:
        st = c.state()
        return [st.names[i] for i in np.flatnonzero(c.feasible(parse_pod(pod), st))]


def _foo(name: str, n: str = "1", **kw) -> dict:
    p = make_pod(name, cpu="100m", **kw)
    p["spec"]["containers"][0]["resources"]["requests"]["example.com/foo"] = n
    return _uid(p, f"u-{name}", kw.get("node_name", ""))


def test_named_resources_fit_allocatable_minus_the_pods_requests():
    nodes = [_node("a", {"example.com/foo": "2"}), _node("b", {"example.com/foo": "1"}), _node("none")]
    c = _cache(nodes, [_foo("old", node_name="b")])
    assert _names(c, _foo("p")) == ["a"]  # b's one is taken, "none" has none
    assert _names(c, _foo("p2", "3")) == []
    with c.lock:
        c._set_pod("u-x", parse_pod(_foo("x")))
        c.assume("u-x", "a")  # an assumed pod counts at once...
        assert _names(c, _foo("p")) == ["a"]
        c._set_pod("u-y", parse_pod(_foo("y", node_name="a")))  # ... as does a bound one
        assert _names(c, _foo("p")) == []
        st = c.state()
        why = [st.filter_reasons(i, parse_pod(_foo("p")).request) for i in range(3)]
        assert why == [["Insufficient example.com/foo"]] * 3
        c.forget("u-x")  # released when forgotten, or deleted
        assert _names(c, _foo("p")) == ["a"]
        c._set_pod("u-y", None)
        c._set_pod("u-old", None)
        assert _names(c, _foo("p")) == ["a", "b"]
    eph = _uid(make_pod("eph", cpu="100m"), "u-eph")
    eph["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = "500Gi"
    assert _names(c, eph) == []
    big = _cache([_node("disk", {"ephemeral-storage": "1Ti"}), _node("small", {"ephemeral-storage": "100Gi"})], [])
    assert _names(big, eph) == ["disk"]
    hp = _uid(make_pod("hp", cpu="100m"), "u-hp")
    hp["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "hugepages-2Mi": "1Gi"},
                                                "limits": {"hugepages-2Mi": "1Gi"}}
    assert _names(_cache([_node("h", {"hugepages-2Mi": "2Gi"}), _node("n")], []), hp) == ["h"]


def _ported(name: str, port: int = 80, proto: str = "TCP", ip: str = "", node: str = "") -> dict:
    p = make_pod(name, cpu="100m")
    p["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port, "protocol": proto,
                                            **({"hostIP": ip} if ip else {})}]
    return _uid(p, f"u-{name}", node)


@pytest.mark.parametrize("used, wanted, conflict", [
    (("TCP", "", 80), ("TCP", "", 80), True),
    (("TCP", "", 80), ("UDP", "", 80), False),  # another protocol
    (("TCP", "", 80), ("TCP", "", 81), False),
    (("TCP", "10.0.0.1", 80), ("TCP", "10.0.0.2", 80), False),  # other IPs
    (("TCP", "10.0.0.1", 80), ("TCP", "10.0.0.1", 80), True),
    (("TCP", "10.0.0.1", 80), ("TCP", "0.0.0.0", 80), True),  # the any-address IP overlaps every IP
    (("TCP", "0.0.0.0", 80), ("TCP", "10.0.0.1", 80), True),
])
def test_host_ports_conflict_as_kube_nodeports_says(used, wanted, conflict):
    proto, ip, port = used
    c = _cache([make_node("n"), make_node("m")], [_ported("old", port, proto, ip, node="n")])
    proto, ip, port = wanted
    pod = _ported("p", port, proto, ip)
    assert _names(c, pod) == (["m"] if conflict else ["m", "n"])
    with c.lock:  # a node's reasons (node by node) agree with the mask
        assert c.state().filter_reasons(1, parse_pod(pod).request) == ([REASON_PORTS] if conflict else [])


def test_host_ports_count_assumed_pods_and_say_why():
    c = _cache([make_node("n")], [])
    with c.lock:
        c._set_pod("u-a", parse_pod(_ported("a")))
        c.assume("u-a", "n")
        assert _names(c, _ported("b")) == []
        st = c.state()
        assert st.filter_reasons(0, parse_pod(_ported("b")).request) == [REASON_PORTS]
        assert c.unschedulable_message(parse_pod(_ported("b"))) == (
            "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports.")
        c.forget("u-a")
        assert _names(c, _ported("b")) == ["n"]


def test_nodeports_comes_before_noderesourcesfit_in_the_reasons():
    """kube stops at the first failing plugin: a node short of ports and cpu says only the ports."""
    c = _cache([make_node("n", cpu="1")], [_ported("old", node="n")])
    pod = _ported("p")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    with c.lock:
        assert c.state().filter_reasons(0, parse_pod(pod).request) == [REASON_PORTS]


def test_the_reviewers_pods_land_only_where_the_kubelet_admits_them(emu, make_scheduler):
    emu.add_node("n", cpu="4", memory="4Gi")  # no example.com/foo, no ephemeral-storage
    node = make_node("foo", cpu="4", memory="4Gi")
    node["status"]["allocatable"]["example.com/foo"] = "1"
    node["spec"]["taints"] = [{"key": "foo", "value": "only", "effect": "NoSchedule"}]
    emu.add_object("nodes", node)
    ext = make_pod("ext", cpu="100m", tolerations=[{"key": "foo", "operator": "Exists"}])
    ext["spec"]["containers"][0]["resources"] |= {"limits": {"example.com/foo": "1"}}
    ext["spec"]["containers"][0]["resources"]["requests"]["example.com/foo"] = "1"
    eph = make_pod("eph", cpu="100m")
    eph["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = "500Gi"
    hp1, hp2 = _ported("hp1"), _ported("hp2")
    for p in (ext, eph, hp1, hp2):
        p["metadata"].pop("uid", None)
        emu.add_object("pods", p, "default")
    make_scheduler()

    def where() -> dict:
        return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in emu.list("pods")}
    wait_until(lambda: where()["ext"] and (where()["hp1"] or where()["hp2"]), 10, "ext and one host-port pod bound")
    failed = lambda: {e["involvedObject"]["name"]: e["message"] for e in emu.list("events")  # noqa: E731
                      if e["reason"] == "FailedScheduling"}
    wait_until(lambda: "eph" in failed() and len({"hp1", "hp2"} & set(failed())) == 1, 10, "eph and a port refused")
    assert where()["ext"] == "foo" and not where()["eph"]
    assert sorted([where()["hp1"], where()["hp2"]]) == ["", "n"]
    assert failed()["eph"] == ("0/2 nodes are available: 1 Insufficient ephemeral-storage, "
                               "1 node(s) had untolerated taint {foo: only}.")
    loser = "hp1" if not where()["hp1"] else "hp2"
    assert failed()[loser] == ("0/2 nodes are available: 1 node(s) didn't have free ports for the requested pod "
                               "ports, 1 node(s) had untolerated taint {foo: only}.")


def test_the_extender_answers_from_the_same_chain(emu):
    from joulesched.agent.registry import make_policy
    from joulesched.cluster.kube.client import api_client_for
    from joulesched.live.extender import Extender

    emu.add_node("n")
    emu.add_object("nodes", _node("foo", {"example.com/foo": "2"}))
    for p in (_ported("old", node="n"), _foo("old2", node_name="foo")):
        p["metadata"].pop("uid")
        emu.add_object("pods", p, "default")
    cache = KubeCache(api_client_for(emu.url)).start()
    try:
        assert cache.wait_synced(10)
        ext = Extender(cache, make_policy("most-allocated"))
        out = ext.filter({"Pod": _ported("p"), "NodeNames": ["n", "foo"]})
        assert out["NodeNames"] == ["foo"] and out["FailedNodes"] == {"n": REASON_PORTS}
        out = ext.filter({"Pod": _foo("p", "2"), "NodeNames": ["n", "foo"]})
        assert out["NodeNames"] == []
        assert out["FailedNodes"] == {"foo": "Insufficient example.com/foo"}  # 1 of its 2 is taken
        # More than the node has at all: no eviction helps (kube's unresolvable NodeResourcesFit).
        assert out["FailedAndUnresolvableNodes"] == {"n": "Insufficient example.com/foo"}
    finally:
        cache.stop()


def test_a_pod_asking_nothing_extra_skips_the_extra_filters(monkeypatch):
    """Most pods ask no host ports and no named resources: their feasibility question never reaches the two
    filters (nor the extras' arrays)."""
    from joulesched.cluster import filters

    def boom(*a, **k):
        raise AssertionError("an extra filter ran for a pod that asks nothing extra")
    monkeypatch.setattr(filters.NodePorts, "mask", staticmethod(boom))
    monkeypatch.setattr(filters.NamedResourcesFit, "mask", staticmethod(boom))
    st = ClusterState(["a", "b"], [1000, 1000], [1024, 1024], [10, 10], [CURVE] * 2)
    assert st.feasible(PodRequest(100, 100)).tolist() == [True, True]
    st.bind(0, PodRequest(100, 100))
    assert not st.extras.used and not st.extras.ports


# ---- 3. the unschedulable message, one pass -----------------------------------------------------------------
def _mixed_cluster() -> tuple[KubeCache, list[dict]]:
    nodes, pods = [], []
    for k in range(40):
        n = make_node(f"n{k:02d}", cpu="4", memory="8Gi", pods="3" if k % 7 == 0 else "110",
                      labels={"zone": f"z{k % 3}"})
        if k % 5 == 0:
            n["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
        if k % 11 == 0:
            n["spec"]["unschedulable"] = True
        if k % 4 == 0:
            n["status"]["allocatable"]["example.com/foo"] = "2"
        if k % 9 == 0:
            n["status"]["allocatable"] |= {"nvidia.com/gpu": "1"}
        nodes.append(n)
        for j in range(3 if k % 7 == 0 else 1 + k % 3):
            p = _uid(make_pod(f"b{k}-{j}", cpu="1", memory="2Gi"), f"u{k}-{j}", f"n{k:02d}")
            if (k + j) % 6 == 0:
                p["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 80}]
            if k % 8 == 0 and j == 0:
                p["spec"]["containers"][0]["resources"]["requests"]["example.com/foo"] = "2"
            pods.append(p)
    return _cache(nodes, pods), nodes


def _pending(**kw) -> dict:
    p = _ported("p", **kw)
    p["spec"]["containers"][0]["resources"]["requests"] |= {"cpu": "2", "memory": "5Gi", "example.com/foo": "1"}
    return p


@pytest.mark.parametrize("shape", ["plain", "selector", "fields", "gpu"])
def test_the_unschedulable_message_counts_what_each_node_says_in_one_state(shape, monkeypatch):
    c, nodes = _mixed_cluster()
    pod = _pending()
    if shape == "selector":
        pod["spec"]["nodeSelector"] = {"zone": "z1"}
        pod["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    if shape == "fields":
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                                    "values": ["n01", "n02"]}]}]}}}
    if shape == "gpu":
        pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
        pod["metadata"]["annotations"] = {"alibabacloud.com/gpu-card-model": "H100"}
    info = parse_pod(pod)

    def node_by_node() -> str:
        st = c.state()
        expect = Counter()
        for i in range(len(st)):
            expect.update(st.filter_reasons(i, info.request))
        assert len(expect) >= 4  # a mixed answer: several filters speak
        return kube_unschedulable_message(len(nodes), expect)
    with c.lock:
        expect = node_by_node()
        built = []
        real = c.state
        monkeypatch.setattr(c, "state", lambda: built.append(1) or real())
        assert c.unschedulable_message(info) == expect
        assert len(built) == 1  # one state for all 40 nodes (it was one per node, each refreshing the usage)
        assert c.unschedulable_message(info) == expect  # asked again (the node filters' counts are cached)
        for uid in [u for u in c.pods if u.endswith("-0")]:  # pods leave: the resources' counts follow
            c._set_pod(uid, None)
        monkeypatch.setattr(c, "state", real)
        assert node_by_node() != expect
        assert c.unschedulable_message(info) == node_by_node()


def test_a_filter_without_masks_is_asked_node_by_node():
    from joulesched.cluster.filters import NodeResourcesFit

    class Odd:
        name = "Odd"

        def mask(self, st, pod):
            return np.arange(len(st)) % 2 == 0

        def reasons(self, st, i, pod):
            return [] if i % 2 == 0 else ["node(s) were odd"]

    st = ClusterState(list("abcd"), [1000, 100, 1000, 100], [1024] * 4, [10] * 4, [CURVE] * 4,
                      chain=FilterChain(resources=(NodeResourcesFit(), Odd())))
    pod = PodRequest(500, 10)
    assert st.filter_reason_counts(pod) == Counter({"Insufficient cpu": 2})  # b, d: NodeResourcesFit comes first
    st.bind(0, PodRequest(600, 10))
    assert st.filter_reason_counts(pod) == Counter({"Insufficient cpu": 3})
    assert st.filter_reason_counts(PodRequest(1, 1)) == Counter({"node(s) were odd": 2})


def test_a_host_ports_counts_go_when_its_last_user_leaves():
    # Each (protocol, port) seen holds an array over the nodes; a port nobody uses any more must not keep one
    # (host-network pods make every container port a host port: over time, many ports come and go).
    c = _cache([make_node("n"), make_node("m")], [])
    with c.lock:
        for k, node in enumerate(("n", "m")):
            c._set_pod(f"u-{k}", parse_pod(_ported(f"p{k}", 8080)))
            c.assume(f"u-{k}", node)
        st = c.state()
        assert ("TCP", 8080) in st.extras.ports
        c.forget("u-0")
        assert ("TCP", 8080) in c.state().extras.ports and _names(c, _ported("q", 8080)) == ["n"]
        c.forget("u-1")
        assert ("TCP", 8080) not in c.state().extras.ports and _names(c, _ported("q", 8080)) == ["m", "n"]
