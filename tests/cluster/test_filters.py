"""The filter chain (cluster/filters.py): the twin, ClusterState and the live cache agree on feasibility, with
each other and with kube-scheduler's rules written out independently here; the node power controller's
"wake a node for this pod" answer is one the filter accepts there."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from joulesched.cluster.filters import NodeTraits, Taint
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.objects import node_gate_reason, parse_node, parse_pod, CurveResolver
from joulesched.cluster.nodepower import NodePowerCore, PowerPolicy
from joulesched.cluster.scenario import ScenarioError, load_scenario
from joulesched.cluster.state import ASLEEP, ClusterState, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import Workload, build_workload
from tests.helpers import LINEAR_100_200, scenario

# ---- kube-scheduler's rules, written out from its documentation (not from cluster/filters.py) ------------------
GATING = {"NoSchedule", "NoExecute"}


def k_tolerates(tol: dict, taint: dict) -> bool:
    if tol.get("effect") and tol["effect"] != taint["effect"]:
        return False
    if tol.get("operator", "Equal") == "Exists":
        return not tol.get("key") or tol["key"] == taint["key"]
    return bool(tol.get("key")) and tol["key"] == taint["key"] and tol.get("value", "") == taint.get("value", "")


def k_requirement(req: dict, labels: dict) -> bool:
    v = labels.get(req["key"])
    op = req["operator"]
    if op == "In":
        return v in req["values"]
    if op == "NotIn":
        return v not in req["values"]
    if op == "Exists":
        return v is not None
    if op == "DoesNotExist":
        return v is None
    try:
        a, b = int(v), int(req["values"][0])
    except (TypeError, ValueError):
        return False
    return a > b if op == "Gt" else a < b


def k_admits(node: dict, pod: dict) -> bool:
    """Every non-resource filter kube-scheduler runs (NodeUnschedulable, TaintToleration, NodeAffinity)."""
    tols = pod.get("tolerations", [])
    if node.get("unschedulable") and not any(k_tolerates(t, {"key": "node.kubernetes.io/unschedulable",
                                                             "value": "", "effect": "NoSchedule"}) for t in tols):
        return False
    taints = list(node.get("taints", []))
    if not node.get("ready", True):
        taints.append({"key": "node.kubernetes.io/not-ready", "value": "", "effect": "NoSchedule"})
    if any(t["effect"] in GATING and not any(k_tolerates(o, t) for o in tols) for t in taints):
        return False
    labels = node.get("labels", {})
    if any(labels.get(k) != v for k, v in pod.get("node_selector", {}).items()):
        return False
    terms = pod.get("terms")
    if terms is not None and not any(term and all(k_requirement(r, labels) for r in term) for term in terms):
        return False
    return True


def k_fits(free: tuple[int, int, int], pod: dict) -> bool:
    c, m, p = free
    return p > 0 and (pod.get("cpu") or 0) <= c and (pod.get("mem") or 0) <= m


# ---- random clusters and pods --------------------------------------------------------------------------------
LABELS = {"zone": ["a", "b"], "disk": ["ssd", "hdd"], "gen": ["1", "3", "7", "x"]}
TAINTS = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
          {"key": "spot", "value": "", "effect": "NoExecute"},
          {"key": "soft", "value": "x", "effect": "PreferNoSchedule"}]


@st.composite
def nodes_(draw, max_nodes=6):
    out = []
    for k in range(draw(st.integers(1, max_nodes))):
        labels = {key: draw(st.sampled_from(vals)) for key, vals in LABELS.items() if draw(st.booleans())}
        out.append({"name": f"n{k}", "cpu": draw(st.sampled_from([1000, 2000, 4000])),
                    "mem": draw(st.sampled_from([1024, 4096])), "pods": draw(st.integers(1, 3)), "labels": labels,
                    "taints": draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique_by=lambda t: t["key"])),
                    "unschedulable": draw(st.integers(0, 4)) == 0})
    return out


TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
               {"key": "dedicated", "operator": "Exists"},
               {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
               {"key": "spot", "operator": "Equal", "value": "", "effect": "NoSchedule"},  # wrong effect
               {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
               {"operator": "Exists"}]


@st.composite
def requirement_(draw):
    op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]))
    key = "gen" if op in ("Gt", "Lt") else draw(st.sampled_from(sorted(LABELS)))
    if op in ("In", "NotIn"):
        vals = draw(st.lists(st.sampled_from(LABELS[key]), min_size=1, max_size=2, unique=True))
        if key == "gen" and "x" in vals:
            vals = ["1"]
    elif op in ("Gt", "Lt"):
        vals = [draw(st.sampled_from(["0", "3", "7", "8"]))]  # equal to a label, between, beyond
    else:
        vals = []
    return {"key": key, "operator": op, "values": vals}


@st.composite
def pod_(draw):
    pod = {"cpu": draw(st.sampled_from([None, 0, 300, 900, 2500])), "mem": draw(st.sampled_from([None, 256, 2048]))}
    if draw(st.booleans()):
        pod["node_selector"] = {k: draw(st.sampled_from(LABELS[k])) for k in
                                draw(st.lists(st.sampled_from(sorted(LABELS)), max_size=2, unique=True))}
    if draw(st.booleans()):
        pod["tolerations"] = draw(st.lists(st.sampled_from(TOLERATIONS), max_size=3))
    if draw(st.booleans()):
        pod["terms"] = draw(st.lists(st.lists(requirement_(), min_size=1, max_size=2), min_size=1, max_size=2))
    return pod


def scenario_of(nodes: list[dict], duration_s: float = 1000.0):
    return scenario([{"name_prefix": n["name"], "cpu_m": n["cpu"], "memory_mib": n["mem"], "max_pods": n["pods"],
                      "labels": n["labels"], "taints": [dict(t) for t in n["taints"]],
                      "unschedulable": n["unschedulable"]} for n in nodes], duration_s=duration_s)


def placement_of(pod: dict) -> dict:
    """The pod's constraints in the scenario's words (cluster/scenario.py PodPlacement)."""
    out: dict = {}
    if pod.get("node_selector") is not None:
        out["node_selector"] = pod["node_selector"]
    if pod.get("tolerations") is not None:
        out["tolerations"] = [dict(t) for t in pod["tolerations"]]
    if pod.get("terms") is not None:
        out["required_node_affinity"] = [{"match_expressions": [dict(r) for r in term]} for term in pod["terms"]]
    return out


def constraints_of(pod: dict):
    from joulesched.cluster.scenario import PodPlacement

    return PodPlacement.model_validate(placement_of(pod)).constraints()


def node_obj(n: dict, *, ready: bool = True, asleep: bool = False) -> dict:
    taints = [dict(t) for t in n["taints"]]
    if asleep:
        taints.append({"key": "joulesched.io/asleep", "value": "true", "effect": "NoSchedule"})
    return {"metadata": {"name": n["name"], "labels": dict(n["labels"]), "annotations": {}},
            "spec": {"taints": taints, "unschedulable": n["unschedulable"] or asleep},
            "status": {"allocatable": {"cpu": f"{n['cpu']}m", "memory": f"{n['mem']}Mi", "pods": str(n["pods"])},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod_obj(pod: dict, uid: str, node: str = "") -> dict:
    req = {}
    if pod.get("cpu") is not None:
        req["cpu"] = f"{pod['cpu']}m"
    if pod.get("mem") is not None:
        req["memory"] = f"{pod['mem']}Mi"
    spec: dict = {"containers": [{"name": "c", "resources": {"requests": req}}], "schedulerName": "joulesched"}
    if node:
        spec["nodeName"] = node
    if pod.get("node_selector") is not None:
        spec["nodeSelector"] = dict(pod["node_selector"])
    if pod.get("tolerations") is not None:
        spec["tolerations"] = [dict(t) for t in pod["tolerations"]]
    if pod.get("terms") is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [dict(r) for r in term]} for term in pod["terms"]]}}}
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default", "resourceVersion": "1"}, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def make_cache(nodes: list[dict], bound: list[tuple[dict, str]] = (), **node_kw) -> KubeCache:
    cache = KubeCache(k8s.ApiClient(k8s.Configuration()))
    cache._replace_nodes([node_obj(n, **node_kw.get(n["name"], {})) for n in nodes])
    cache._replace_pods([pod_obj(p, f"b{k}", node) for k, (p, node) in enumerate(bound)])
    return cache


def twin_mask(nodes: list[dict], bound: list[dict], where: list[int], pod: dict) -> tuple[np.ndarray, list[int]]:
    """Drive the twin: the ``bound`` pods arrive at t = 0, 1, ... and go to node ``where[k]`` when the twin's
    mask allows it (else the first node it allows); then ``pod`` arrives. Returns the twin's mask for it (all
    False when the twin had no decision for it at its arrival) and where the others went (-1: nowhere)."""
    pods = [*bound, pod]
    sel = [placement_of(p) for p in pods]
    keys: dict = {}
    codes = [keys.setdefault(constraints_of(p), len(keys) + 1) if s else 0 for p, s in zip(pods, sel)]
    table = (None, *keys)
    n = len(pods)
    wl = Workload(np.arange(n, dtype=float), np.full(n, 10_000.0),
                  np.array([-1 if p.get("cpu") is None else p["cpu"] for p in pods], np.int64),
                  np.array([-1 if p.get("mem") is None else p["mem"] for p in pods], np.int64), np.full(n, 10.0),
                  placement=np.array(codes, np.int32), placement_table=table)
    twin = Twin(scenario_of(nodes, duration_s=100_000.0), wl)
    twin.begin()
    went = [-1] * len(bound)
    while (d := twin.next_decision()) is not None and d.key < len(bound):
        j = where[d.key] if d.mask[where[d.key]] else int(np.flatnonzero(d.mask)[0])
        went[d.key] = j
        twin.place(j)
    if d is not None and d.key == len(bound) and twin.now == len(bound):
        return d.mask.copy(), went
    return np.zeros(len(nodes), dtype=bool), went


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=nodes_(), bound=st.lists(pod_(), max_size=5), pod=pod_(), data=st.data())
def test_twin_state_and_live_cache_agree_with_kube_rules(nodes, bound, pod, data):
    where = [data.draw(st.integers(0, len(nodes) - 1)) for _ in bound]
    tmask, went = twin_mask(nodes, bound, where, pod)
    placed = [(p, nodes[j]["name"]) for p, j in zip(bound, went) if j >= 0]
    # Free capacity after the placements the twin made; then kube's rules, node by node.
    free = {n["name"]: [n["cpu"], n["mem"], n["pods"]] for n in nodes}
    for p, name in placed:
        f = free[name]
        f[0] -= p.get("cpu") or 0
        f[1] -= p.get("mem") or 0
        f[2] -= 1
    want = np.array([k_admits(n, pod) and k_fits(tuple(free[n["name"]]), pod) for n in nodes])
    # ClusterState with the nodes' traits, the same placements bound.
    cs = ClusterState([n["name"] for n in nodes], [n["cpu"] for n in nodes], [n["mem"] for n in nodes],
                      [n["pods"] for n in nodes], [LINEAR_100_200] * len(nodes),
                      traits=[NodeTraits.of(n["labels"], [Taint(**t) for t in n["taints"]],
                                            unschedulable=n["unschedulable"]) for n in nodes])
    index = {n["name"]: k for k, n in enumerate(nodes)}
    for p, name in placed:
        cs.bind(index[name], PodRequest(p.get("cpu"), p.get("mem"), constraints_of(p)))
    req = PodRequest(pod.get("cpu"), pod.get("mem"), constraints_of(pod))
    # The live cache, from Node and Pod objects as the apiserver returns them.
    cache = make_cache(nodes, placed)
    info = parse_pod(pod_obj(pod, "p"))
    live = cache.feasible(info)
    live_names = {cache.state().names[k] for k in np.flatnonzero(live)}
    assert cs.feasible(req).tolist() == want.tolist()
    assert tmask.tolist() == want.tolist()
    assert live_names == {n["name"] for n, w in zip(nodes, want) if w}
    # The reasons say why exactly where the mask says no, in kube's words.
    for k, n in enumerate(nodes):
        r = cs.filter_reasons(k, req)
        assert (not r) == bool(want[k])
        assert cache.reasons(info, cache.state().names.index(n["name"])) == r
        gate = node_gate_reason(parse_node(node_obj(n), CurveResolver()), info)
        assert (gate == "") == k_admits(n, pod)


@settings(max_examples=100, deadline=None)
@given(nodes=nodes_(), pod=pod_(), data=st.data())
def test_a_node_woken_for_a_pod_is_one_the_filter_accepts_there(nodes, pod, data):
    """The node power controller's question, as it asks it (node_gate_reason on the node as it will be awake,
    then the decision core's choose_wake): every node it would wake passes the sleep-aware filter chain of the
    live cache for that pod; and when some sleeping node passes it while no awake one does, it wakes one."""
    asleep = {n["name"]: data.draw(st.booleans()) for n in nodes}
    ready = {n["name"]: asleep[n["name"]] or data.draw(st.integers(0, 5)) > 0 for n in nodes}
    cache = make_cache(nodes, **{n["name"]: {"asleep": asleep[n["name"]], "ready": ready[n["name"]]} for n in nodes})
    cache.sleep_aware = True
    st_ = cache.state()
    info = parse_pod(pod_obj(pod, "p"))
    feasible = cache.feasible(info)
    infos = [cache.nodes[name] for name in st_.names]
    fits = np.array([[not node_gate_reason(i.awake_view() if i.asleep else i, info) for i in infos]])
    woken = NodePowerCore(PowerPolicy()).choose_wake(st_, [info.request], [], fits)
    for j in woken:
        assert st_.power_state[j] == ASLEEP and feasible[j], (st_.names[j], cache.reasons(info, j))
    awake_ok = feasible & (st_.power_state != ASLEEP)
    if feasible.any() and not awake_ok.any():
        assert woken
    # Without the node power profile, a sleeping node is gated by the controller's taint and cordon.
    cache.sleep_aware = False
    gated = cache.feasible(info)
    for j in np.flatnonzero(st_.power_state == ASLEEP):
        assert not gated[j] or k_admits({**nodes[[n["name"] for n in nodes].index(st_.names[j])],
                                         "unschedulable": True,
                                         "taints": [{"key": "joulesched.io/asleep", "value": "true",
                                                     "effect": "NoSchedule"}]}, pod)


@pytest.mark.parametrize("wake_sleeping", [True, False])
def test_a_notready_node_that_is_not_asleep_takes_no_pod(wake_sleeping):
    """NodeReady (joulesched's own profile): a node down or booting (NotReady, not asleep) passes no pod, not
    even one tolerating every taint or pinned to it by name, with kube's "node(s) were not ready" counted once
    per node in the same pass as the other reasons; a sleeping node keeps its PowerState treatment in both
    profiles. kube-scheduler's node filters (the extender's profile) judge readiness by the not-ready taint
    alone: a pod tolerating it passes a NotReady node, one tolerating only its NoExecute effect (a DaemonSet's
    default tolerations) does not."""
    from joulesched.cluster.filters import (KUBE_NODE_FILTERS, REASON_NOT_READY, FilterChain, NodeSelectorTerm,
                                            Requirement, Toleration, pod_constraints)

    names = ["up", "down", "down2", "asleep", "full"]
    asleep_taint = Taint("joulesched.io/asleep", "true", "NoSchedule")
    traits = [NodeTraits.of(), NodeTraits.of(ready=False), NodeTraits.of(ready=False),
              NodeTraits.of(taints=[asleep_taint], unschedulable=True, ready=False, asleep=True), NodeTraits.of()]

    def cluster(**chain):
        return ClusterState(names, [1000, 8000, 8000, 8000, 100], [1024] * 5, [10] * 5, [LINEAR_100_200] * 5,
                            traits=traits, chain=FilterChain(wake_sleeping=wake_sleeping, **chain))

    cs, kube = cluster(), cluster(node_filters=KUBE_NODE_FILTERS)
    everything = pod_constraints(tolerations=[Toleration(operator="Exists")])
    pod = PodRequest(500, 100, everything)
    assert cs.feasible(pod).tolist() == [True, False, False, True, False]
    assert cs.filter_reasons(1, pod) == [REASON_NOT_READY] and cs.filter_reasons(3, pod) == []
    assert cs.unschedulable_message(PodRequest(2000, 100, everything)) == (
        "0/5 nodes are available: 2 Insufficient cpu, 2 node(s) were not ready.")
    # Kube's reasons first: a pod that does not tolerate the not-ready taint reads it, in either profile.
    plain = PodRequest(500, 100)
    for c in (cs, kube):
        assert c.filter_reasons(1, plain) == ["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"]
    # Pinned to "down" alone by name and tolerating everything (a CNI DaemonSet's pod): out here, in kube's set in.
    pinned = PodRequest(500, 100, pod_constraints(tolerations=[Toleration(operator="Exists")], required_terms=[
        NodeSelectorTerm(match_fields=(Requirement("metadata.name", "In", ("down",)),))]))
    assert cs.feasible(pinned).tolist() == [False] * 5 and cs.filter_reasons(1, pinned) == [REASON_NOT_READY]
    assert kube.feasible(pinned).tolist() == [False, True, False, False, False]
    # kube-scheduler's set: the tolerating pod may go to either NotReady node, as kube would place it.
    assert kube.feasible(pod).tolist() == [True, True, True, True, False]
    assert kube.unschedulable_message(PodRequest(9000, 100, everything)) == (
        "0/5 nodes are available: 5 Insufficient cpu.")
    no_execute = PodRequest(500, 100, pod_constraints(tolerations=[
        Toleration("node.kubernetes.io/not-ready", "Exists", "", "NoExecute")]))
    assert kube.feasible(no_execute).tolist() == [True, False, False, wake_sleeping, False]


# ---- the scenario's fields --------------------------------------------------------------------------------------
def test_existing_scenarios_have_plain_nodes_and_unconstrained_pods():
    """Every shipped scenario keeps the twin's plain chain: no node traits, no pod constraints."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "scenarios"
    for path in sorted(root.glob("*.yaml")):
        sc = load_scenario(path)
        twin = Twin(sc, build_workload(sc))
        assert twin.state.filter_table.plain and twin.state.filter_table.open is None, path.name
        assert twin.workload.placement_table == (None,) and not twin.workload.placement.any(), path.name


def test_selectors_and_taints_steer_the_twin(tmp_path):
    """A scenario with a GPU pool (tainted, labelled), a cordoned node and services that select and tolerate:
    each pod lands only where kube would put it, and pods that fit no node even when empty are never placed."""
    path = tmp_path / "s.yaml"
    path.write_text("""
name: steer
seed: 3
duration_s: 3600
nodes:
  - {name_prefix: cpu, count: 3, cpu_m: 8000, memory_mib: 32768, power_watts: hp-ml110-g5, labels: {pool: cpu}}
  - {name_prefix: gpu, count: 2, cpu_m: 8000, memory_mib: 32768, power_watts: hp-ml110-g5, labels: {pool: gpu},
     taints: [{key: nvidia.com/gpu, effect: NoSchedule}]}
  - {name_prefix: dry, count: 1, cpu_m: 8000, memory_mib: 32768, power_watts: hp-ml110-g5, unschedulable: true}
workload:
  jobs:
    - {pods: 60, mean_interarrival_s: 20, node_selector: {pool: gpu},
       tolerations: [{key: nvidia.com/gpu, operator: Exists}]}
    - {pods: 60, mean_interarrival_s: 20,
       required_node_affinity: [{match_expressions: [{key: pool, operator: NotIn, values: [gpu]}]}]}
    - {pods: 5, mean_interarrival_s: 20, node_selector: {pool: tpu}}
""")
    sc = load_scenario(path)
    wl = build_workload(sc)
    twin = Twin(sc, wl)
    twin.begin()
    seen: dict[int, set[str]] = {}
    while (d := twin.next_decision()) is not None:
        j = int(np.flatnonzero(d.mask)[-1])
        seen.setdefault(int(wl.placement[d.key]), set()).add(twin.state.names[j][:3])
        twin.place(j)
    codes = {k: c for c, k in enumerate(wl.placement_table)}
    gpu = codes[sc.workload.jobs[0].constraints()]
    cpu = codes[sc.workload.jobs[1].constraints()]
    tpu = codes[sc.workload.jobs[2].constraints()]
    assert seen[gpu] == {"gpu"} and seen[cpu] == {"cpu"} and tpu not in seen
    assert (~twin.placeable).sum() == (wl.placement == tpu).sum() == 5
    r = twin.result()
    assert r.unschedulable_pods == 5


def test_a_policy_that_ignores_the_mask_cannot_place_on_a_tainted_node():
    """A filter the policy does not know about still applies: the twin refuses a node outside the mask."""
    sc = scenario([{"taints": [{"key": "x", "effect": "NoSchedule"}]}, {}])
    twin = Twin(sc, Workload(np.array([0.0]), np.array([10.0]), np.array([100]), np.array([100]), np.array([50.0])))
    twin.begin()
    d = twin.next_decision()
    assert d.mask.tolist() == [False, True]
    with pytest.raises(ValueError, match="not feasible"):
        twin.place(0)


@pytest.mark.parametrize("group, pods, field", [
    ({"labels": {"bad key": "x"}}, {}, "nodes.0.labels"),
    ({"taints": [{"key": "k", "effect": "Sometimes"}]}, {}, "nodes.0.taints.0.effect"),
    ({}, {"tolerations": [{"operator": "Equal", "value": "v"}]}, "workload.synthetic.tolerations.0"),
    ({}, {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "workload.synthetic.tolerations.0"),
    ({}, {"required_node_affinity": [{"match_expressions": [{"key": "k", "operator": "In"}]}]},
     "workload.synthetic.required_node_affinity.0.match_expressions.0"),
    ({}, {"required_node_affinity": [{"match_expressions": [{"key": "k", "operator": "Gt", "values": ["x"]}]}]},
     "workload.synthetic.required_node_affinity.0.match_expressions.0"),
    ({}, {"required_node_affinity": []}, "workload.synthetic.required_node_affinity"),
    ({}, {"node_selector": {"k": "not a value!"}}, "workload.synthetic.node_selector"),
])
def test_bad_constraints_name_the_field(tmp_path, group, pods, field):
    import yaml

    raw = {"name": "b", "seed": 0, "duration_s": 100,
           "nodes": [{"name_prefix": "n", "count": 1, "cpu_m": 1000, "memory_mib": 1024, "power_watts": "hp-ml110-g5",
                      **group}],
           "workload": {"synthetic": {"pods": 3, "mean_interarrival_s": 1, **pods}}}
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ScenarioError, match=rf"{field.replace('.', '[.]')}\b") as e:
        load_scenario(path)
    assert e.value.exit_code == 2 if hasattr(e.value, "exit_code") else True


def test_cli_exits_2_on_a_bad_taint(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "b.yaml"
    path.write_text("name: b\nseed: 0\nduration_s: 100\nnodes:\n  - {name_prefix: n, count: 1, cpu_m: 1000, "
                    "memory_mib: 1024, power_watts: hp-ml110-g5, taints: [{key: k, effect: Never}]}\n"
                    "workload: {synthetic: {pods: 2, mean_interarrival_s: 1}}\n")
    r = subprocess.run([sys.executable, "-m", "joulesched.pipelines.cli", "validate", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "nodes.0.taints.0.effect" in r.stderr


def test_a_resource_filter_is_one_more_object():
    """A new resource (GPUs, later) is one more entry in the chain's resources: feasible, reasons and the
    pods never placed all follow it, and the default chain is untouched."""
    from joulesched.cluster.filters import FilterChain, NodeResourcesFit

    class EvenSlots:  # a stand-in resource: a node takes pods only while its free pod slots are even
        name = "EvenSlots"

        def mask(self, st, pod):
            return st.free_pods % 2 == 0

        def reasons(self, st, i, pod):
            return [] if st.free_pods[i] % 2 == 0 else ["Insufficient even-slots"]

        def fits_empty(self, st, nodes, cpu, mem):
            return np.full(len(cpu), bool((st.alloc_pods[nodes] % 2 == 0).any()))

        def fits_node(self, st, i, pod):
            return st.free_pods[i] % 2 == 0

    chain = FilterChain(resources=(NodeResourcesFit(), EvenSlots()))
    cs = ClusterState(["a", "b"], [1000, 1000], [1024, 1024], [2, 3], [LINEAR_100_200] * 2, chain=chain)
    pod = PodRequest(100, 100)
    assert cs.feasible(pod).tolist() == [True, False]
    assert cs.filter_reasons(1, pod) == ["Insufficient even-slots"] and cs.filter_reasons(0, pod) == []
    cs.bind(0, pod)
    assert cs.feasible(pod).tolist() == [False, False]
    assert chain.names[-2:] == ["NodeResourcesFit", "EvenSlots"]
    assert ClusterState(["a"], [1000], [1024], [3], [LINEAR_100_200]).feasible(pod).tolist() == [True]


def test_the_cache_states_the_clusters_sleep_model_as_the_twin_does():
    """With a sleep model (a node power controller puts idle nodes to sleep) the cache's state is a sleeping
    cluster's, as the twin's is: sleep watts, wake time, and every node but a control plane or one annotated
    never-sleep may sleep; so the DQN's sleep-saving column is what it was trained on. Without one, none sleeps."""
    from joulesched.agent.features import FeatureBuilder

    base = {"labels": {}, "taints": [], "unschedulable": False, "cpu": 4000, "mem": 8192, "pods": 110}
    objs = [node_obj({**base, "name": "cp", "labels": {"node-role.kubernetes.io/control-plane": ""}}),
            node_obj({**base, "name": "kept"}), node_obj({**base, "name": "w"})]
    objs[1]["metadata"]["annotations"]["joulesched.io/never-sleep"] = "true"
    cache = KubeCache(k8s.ApiClient(k8s.Configuration()))
    cache._replace_nodes(objs)
    cache.sleep_aware = True  # the scheduler's filter profile: not a statement that nodes sleep
    st_ = cache.state()
    assert not st_.can_sleep and not st_.may_sleep.any() and st_.wake_s == 0.0
    assert (FeatureBuilder(st_).static[:, 3] == 0).all()  # sleeping saves nothing
    cache.sleep_model = (7.5, 45.0)
    st_ = cache.state()
    assert st_.can_sleep and st_.wake_s == 45.0 and (st_.sleep_watts == 7.5).all()
    assert dict(zip(st_.names, st_.may_sleep.tolist())) == {"cp": False, "kept": False, "w": True}
    assert (FeatureBuilder(st_).static[:, 3] > 0).all()
    with pytest.raises(ValueError, match="must be >= 0"):
        cache.sleep_model = (-1.0, 45.0)


def test_a_sleeping_node_keeps_a_cordon_that_is_not_the_controllers():
    """The wake lifts only the controller's cordon (live/nodepower.py); judging a sleeping node as it will be
    once awake must keep anyone else's, or a pod is sent to wake a node it can never run on (a review)."""
    from joulesched.cluster.filters import REASON_UNSCHEDULABLE, node_unschedulable, power_state_view

    asleep = Taint("joulesched.io/asleep", "true", "NoSchedule")
    ours = NodeTraits.of(taints=[asleep], unschedulable=True, ready=False, asleep=True)
    theirs = NodeTraits.of(taints=[asleep], unschedulable=True, ready=False, asleep=True, foreign_cordon=True)
    assert power_state_view(ours, wake_sleeping=True) == NodeTraits.of()
    woken = power_state_view(theirs, wake_sleeping=True)
    assert woken.unschedulable and woken.taints == () and woken.ready and not woken.asleep
    assert node_unschedulable(woken, None, {}) == REASON_UNSCHEDULABLE
    # From the API: the marker says whose cordon it is.
    node = {"metadata": {"name": "n", "annotations": {"joulesched.io/power-state": "asleep"}},
            "spec": {"unschedulable": True, "taints": [{"key": "joulesched.io/asleep", "value": "true",
                                                         "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}, "conditions": []}}
    admin = parse_node(node, CurveResolver())
    node["metadata"]["annotations"]["joulesched.io/cordoned"] = "true"
    mine = parse_node(node, CurveResolver())
    assert admin.awake_view().unschedulable and admin.traits.awake().unschedulable
    assert not mine.awake_view().unschedulable and not mine.traits.awake().unschedulable
