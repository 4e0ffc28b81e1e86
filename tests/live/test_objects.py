"""Parsing Kubernetes objects: quantities, pod requests (kube's rules), power curves, taints and messages."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from joulesched.cluster.kube.cache import kube_unschedulable_message
from joulesched.cluster.kube.objects import (
    ADMIN_PROFILE_LABEL,
    POWER_PROFILE_KEY,
    POWER_TRUSTED_LABEL,
    POWER_WATTS_ANNOTATION,
    CurveResolver,
    ObjectError,
    cpu_millis,
    load_profiles,
    memory_mib,
    node_gate_reason,
    parse_node,
    parse_pod,
    pod_request,
)
from joulesched.cluster.state import PodRequest
from joulesched.power.curves import SPECPOWER
from tests.support.kube_emulator import make_node, make_pod


@pytest.mark.parametrize("q,m", [("500m", 500), ("2", 2000), ("0.1", 100), ("1.5", 1500), ("250m", 250), (1, 1000)])
def test_cpu(q, m):
    assert cpu_millis(q) == m


@pytest.mark.parametrize("q,mib", [("512Mi", 512), ("1Gi", 1024), ("1G", 954), ("1000Ki", 1), ("0", 0)])
def test_memory_requests_round_up(q, mib):
    assert memory_mib(q) == mib


def test_memory_allocatable_rounds_down():
    assert memory_mib("1000Ki", round_up=False) == 0
    with pytest.raises(ObjectError):
        cpu_millis("lots")


def test_pod_request_sums_containers_and_keeps_none_and_zero():
    assert pod_request(make_pod("p")) == PodRequest(None, None, nz_cpu_m=100, nz_memory_mib=200)
    # scoring's non-zero memory: 200 MiB for each of the three containers without a request (kube's
    # NonMissingContainerRequests), not 200 for the pod
    assert pod_request(make_pod("p", cpu="500m", containers=3)) == PodRequest(1500, None, nz_cpu_m=1500,
                                                                               nz_memory_mib=600)
    assert pod_request(make_pod("p", cpu="0", memory="0")) == PodRequest(0, 0, nz_cpu_m=0, nz_memory_mib=0)
    pod = make_pod("p", cpu="100m", memory="64Mi")
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "2"}}}]
    pod["spec"]["overhead"] = {"memory": "10Mi"}
    # max(sum, largest init) + overhead; for scoring, the init container without a memory request counts
    # 200 MiB: max(64, 200) + 10 = 210
    assert pod_request(pod) == PodRequest(2000, 74, nz_cpu_m=2000, nz_memory_mib=210)


@pytest.mark.parametrize("containers, init, overhead, nz", [
    # worked out with kube's PodRequests(NonMissingContainerRequests: 100m, 200Mi), a review's three pods
    ([{"cpu": "500m", "memory": "256Mi"}, {}], [], None, (600, 456)),
    ([{}], [{"cpu": "50m", "memory": "64Mi"}], None, (100, 200)),
    ([{}], [], {"cpu": "250m", "memory": "120Mi"}, (350, 320)),
])
def test_scorings_non_zero_requests_are_per_container(containers, init, overhead, nz):
    spec = {"containers": [{"name": f"c{i}", "resources": {"requests": r}} for i, r in enumerate(containers)],
            "initContainers": [{"name": f"i{i}", "resources": {"requests": r}} for i, r in enumerate(init)]}
    if overhead:
        spec["overhead"] = overhead
    req = pod_request({"metadata": {"name": "p"}, "spec": spec})
    assert (req.nz_cpu, req.nz_mem) == nz


def test_parse_pod_fields():
    p = parse_pod({**make_pod("p", "ns", cpu="1", node_name="n1"), "metadata": {"name": "p", "namespace": "ns",
                                                                               "uid": "u1"}})
    assert (p.uid, p.key, p.node_name, p.scheduler_name, p.phase, p.active) == ("u1", "ns/p", "n1", "joulesched",
                                                                                 "Pending", True)


def test_curve_sources_in_order(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("mine: [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]\nn3: {power_watts: [1,2,3,4,5,6,7,8,9,10,11]}\n")
    cr = CurveResolver(load_profiles(str(prof)))
    own = [50.0 + i for i in range(11)]
    trusted = {POWER_TRUSTED_LABEL: "true"}
    n1 = parse_node(make_node("n1", labels=trusted, annotations={POWER_WATTS_ANNOTATION: json.dumps(own)}), cr)
    assert n1.curve == tuple(own) and n1.curve_source == "annotation"
    n2 = parse_node(make_node("n2", labels={POWER_PROFILE_KEY: "mine", **trusted}), cr)
    assert n2.curve[0] == 10 and n2.curve_source == "profile:mine"
    assert parse_node(make_node("n3"), cr).curve_source == "profile:node"
    n4 = parse_node(make_node("n4", labels={POWER_PROFILE_KEY: "hp-ml110-g5", **trusted}), cr)
    assert n4.curve == tuple(float(w) for w in SPECPOWER["hp-ml110-g5"])
    bad = parse_node(make_node("n5", labels=trusted, annotations={POWER_WATTS_ANNOTATION: "[1, 2]"}), cr)
    assert bad.curve_source == "default" and "11 points" in cr.errors["n5"]
    admin = parse_node(make_node("n7", labels={ADMIN_PROFILE_LABEL: "mine"}), cr)  # admin-only: no trust label
    assert admin.curve_source == "profile:mine"


def test_a_node_cannot_pick_its_own_curve_without_the_admin_label(tmp_path, caplog):
    """A kubelet may write its Node's annotations and joulesched.io labels: a compromised node claiming a tiny
    curve must not attract pods. Before: the annotation was used as given."""
    prof = tmp_path / "p.yaml"
    prof.write_text("n2: [90, 100, 110, 120, 130, 140, 150, 160, 170, 180, 190]\n")
    cr = CurveResolver(load_profiles(str(prof)))
    tiny = json.dumps([1] * 11)
    with caplog.at_level("WARNING", logger="joulesched.kube.curves"):
        n1 = parse_node(make_node("n1", annotations={POWER_WATTS_ANNOTATION: tiny}), cr)
        parse_node(make_node("n1", annotations={POWER_WATTS_ANNOTATION: tiny}), cr)  # said once, not per re-read
    assert n1.curve_source == "default" and n1.curve == cr.default
    assert POWER_TRUSTED_LABEL in cr.errors["n1"] and "ignored" in cr.errors["n1"]
    assert len([r for r in caplog.records if "n1" in r.getMessage()]) == 1
    # The ConfigMap's curve for the node (the scheduler's namespace) wins over what the node says.
    n2 = parse_node(make_node("n2", labels={POWER_PROFILE_KEY: "hp-ml110-g5"},
                              annotations={POWER_WATTS_ANNOTATION: tiny}), cr)
    assert n2.curve_source == "profile:node" and n2.curve[0] == 90
    # A trust label with another value, or set as an annotation (which kubelets can write), is no trust.
    for meta in ({"labels": {POWER_TRUSTED_LABEL: "yes"}}, {"annotations": {POWER_TRUSTED_LABEL: "true"}}):
        ann = {POWER_WATTS_ANNOTATION: tiny, **meta.get("annotations", {})}
        assert parse_node(make_node("n3", labels=meta.get("labels"), annotations=ann), cr).curve_source == "default"
    assert parse_node(make_node("n6", cpu="4", memory="8Gi", pods="110"), cr).cpu_m == 4000


def test_profiles_file_errors(tmp_path):
    with pytest.raises(ObjectError, match="does not exist|cannot read"):
        load_profiles(str(tmp_path / "missing.yaml"))
    f = tmp_path / "bad.yaml"
    f.write_text("x: [3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]\n")
    with pytest.raises(ObjectError, match="non-decreasing"):
        load_profiles(str(f))
    # A binary file and a ConfigMap value that is no JSON list: tracebacks before (UnicodeDecodeError,
    # JSONDecodeError), now one line naming the file and the profile.
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ObjectError, match="not UTF-8 text"):
        load_profiles(str(f))
    f.write_text('x: "150, 200"\n')
    with pytest.raises(ObjectError, match="profile 'x': '150, 200' is not a JSON list of 11 watts"):
        load_profiles(str(f))
    f.write_text("b: {x: 1}\n")  # said: 'NoneType' object is not iterable
    with pytest.raises(ObjectError, match="profile 'b': a node group needs power_watts"):
        load_profiles(str(f))
    f.write_text("b: 150\n")
    with pytest.raises(ObjectError, match="profile 'b': expected 11 watts .* got int"):
        load_profiles(str(f))


def test_gates_follow_kube_plugin_order():
    cr = CurveResolver()
    n = parse_node(make_node("n", unschedulable=True), cr)
    p = parse_pod(make_pod("p"))
    assert node_gate_reason(n, p) == "node(s) were unschedulable"
    t = make_node("t")
    t["spec"]["taints"] = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    tn = parse_node(t, cr)
    assert node_gate_reason(tn, p) == "node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"
    tol = make_pod("q")
    tol["spec"]["tolerations"] = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
    assert node_gate_reason(tn, parse_pod(tol)) == ""
    sel = make_pod("s")
    sel["spec"]["nodeSelector"] = {"disk": "ssd"}
    assert node_gate_reason(parse_node(make_node("x"), cr), parse_pod(sel)) == \
        "node(s) didn't match Pod's node affinity/selector"
    assert node_gate_reason(parse_node(make_node("y", labels={"disk": "ssd"}), cr), parse_pod(sel)) == ""


def test_message_sorted_like_kube():
    msg = kube_unschedulable_message(5, Counter({"Insufficient memory": 2, "Insufficient cpu": 3,
                                                 "node(s) were unschedulable": 1}))
    assert msg == "0/5 nodes are available: 1 node(s) were unschedulable, 2 Insufficient memory, 3 Insufficient cpu."
