"""Property: for any mix of pending pods and injected faults, every pod ends bound exactly once to a node that
had room for it, or pending with the right "0/N nodes are available" reason; with one replica or with two
racing for the leader Lease (whose terms never overlap, and each binding request is sent inside its sender's
term). Runs against the emulator (no kube-apiserver can run here; tests/e2e/ is the real-cluster path)."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as stn
from hypothesis.errors import InvalidArgument

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache, kube_unschedulable_message
from joulesched.cluster.kube.client import api_client_for
from joulesched.live.scheduler import Scheduler, ServeConfig
from tests.live.conftest import FAST, wait_until
from tests.support.kube_emulator import KubeEmulator

CPU = {None: None, "100m": 100, "500m": 500, "1": 1000, "3": 3000}
MEM = {None: None, "128Mi": 128, "1Gi": 1024, "5Gi": 5120}
NODE_CPU = {"1": 1000, "2": 2000, "4": 4000}
NODE_MEM = {"1Gi": 1024, "2Gi": 2048, "4Gi": 4096}

FAULTS = [("500", "bind"), ("409", "bind"), ("lost-response", "bind"), ("slow", "bind"), ("delete-node", "bind"),
          ("cut", "bind"), ("cut", "watch:pods"), ("gone", "watch:pods"), ("cut", "watch:nodes"),
          ("500", "get:pods"), ("500", "list:pods"), ("500", "create:events"), ("500", "patch-status:pods"),
          ("500", "update:leases"), ("409", "update:leases"), ("500", "get:leases"), ("slow", "get:leases")]

nodes_st = stn.lists(stn.tuples(stn.sampled_from(list(NODE_CPU)), stn.sampled_from(list(NODE_MEM)),
                                stn.sampled_from(["3", "110"])), min_size=1, max_size=4)
pods_st = stn.lists(stn.tuples(stn.sampled_from(list(CPU)), stn.sampled_from(list(MEM))), min_size=1, max_size=14)
faults_st = stn.lists(stn.tuples(stn.sampled_from(FAULTS), stn.integers(1, 3)), min_size=1, max_size=8)
policy_st = stn.sampled_from(["default-k8s", "most-allocated", "energy-greedy", "peaks", "random"])


def _event(msg: str) -> None:
    try:
        event(msg)
    except InvalidArgument:  # called outside a hypothesis test (a stress loop)
        pass


def _expected(nodes: dict[str, tuple[int, int, int]], bound: dict[str, str], req: dict[str, tuple]) -> dict[str, str]:
    """Oracle, written independently of the scheduler: the FailedScheduling message of every unbound pod."""
    used = {n: [0, 0, 0] for n in nodes}
    for pod, node in bound.items():
        if node in used:
            c, m = req[pod]
            used[node][0] += c or 0
            used[node][1] += m or 0
            used[node][2] += 1
    out = {}
    for pod, (c, m) in req.items():
        if pod in bound:
            continue
        reasons: Counter = Counter()
        for n, (ac, am, ap) in nodes.items():
            if c and ac - used[n][0] < c:
                reasons["Insufficient cpu"] += 1
            if m and am - used[n][1] < m:
                reasons["Insufficient memory"] += 1
            if ap - used[n][2] <= 0:
                reasons["Too many pods"] += 1
        out[pod] = kube_unschedulable_message(len(nodes), reasons) if nodes else "no nodes available to schedule pods"
    return out


def _run(node_specs, pod_specs, faults, policy: str, replicas: int, drop_watches: bool,
         kill_leader: bool = False) -> None:
    with KubeEmulator(seed=len(pod_specs)) as emu:
        nodes = {}
        for k, (cpu, mem, maxp) in enumerate(node_specs):
            emu.add_node(f"n{k}", cpu=cpu, memory=mem, pods=maxp)
            nodes[f"n{k}"] = (NODE_CPU[cpu], NODE_MEM[mem], int(maxp))
        req = {}
        for k, (cpu, mem) in enumerate(pod_specs):
            emu.add_pod(f"p{k}", cpu=cpu, memory=mem)
            req[f"p{k}"] = (CPU[cpu], MEM[mem])
        emu.add_pod("not-ours", cpu="100m", scheduler_name="default-scheduler")
        for (kind, op), times in faults:
            emu.faults.add(kind, op, times=times, delay_s=0.05)
        scheds = []
        try:
            for r in range(replicas):
                cfg = ServeConfig(**{**FAST, "leader_elect": replicas > 1, "lease_namespace": "default",
                                     "identity": f"replica-{r}", "seed": r})
                scheds.append(Scheduler(KubeCache(api_client_for(emu.url)), make_policy(policy), cfg).start())
            if drop_watches or kill_leader:
                wait_until(lambda: emu.bindings or emu.list("events"), timeout=60, what="a first decision")
            if drop_watches:
                emu.drop_watches()  # the next watches meet the injected watch faults
            if kill_leader:
                leader = next((s for s in scheds if s.is_leader()), None)
                if leader is not None:
                    leader.stop()  # releases the Lease; the standby takes over

            def settled() -> bool:
                pods = {p["metadata"]["name"]: p for p in emu.list("pods") if p["metadata"]["name"] in req}
                bound = {n: p["spec"].get("nodeName", "") for n, p in pods.items() if p["spec"].get("nodeName")}
                alive = {n: v for n, v in nodes.items() if emu.get("nodes", n) is not None}
                want = _expected(alive, bound, req)
                for name, msg in want.items():
                    conds = [c for c in pods[name]["status"].get("conditions", []) if c["type"] == "PodScheduled"]
                    if not conds or conds[0]["message"] != msg or conds[0]["reason"] != "Unschedulable":
                        return False
                return True

            wait_until(settled, timeout=60, what="every pod bound or reported unschedulable with the right reason")
        finally:
            for s in scheds:
                s.stop()

        # Bound exactly once, each to a node that had room (or that the delete-node fault removed mid-bind).
        names = [b[1] for b in emu.bindings]
        assert len(names) == len(set(names)), f"double binding: {names}"
        assert "not-ours" not in names
        pods = {p["metadata"]["name"]: p for p in emu.list("pods")}
        bound = {n: p["spec"]["nodeName"] for n, p in pods.items() if p["spec"].get("nodeName")}
        assert set(bound) == set(names)
        deleted = set(emu.deleted_nodes)
        if deleted:
            assert any(k == "delete-node" for k, _ in emu.faults.log)
        for n, (ac, am, ap) in nodes.items():
            on = [p for p, node in bound.items() if node == n]
            assert sum(req[p][0] or 0 for p in on) <= ac and sum(req[p][1] or 0 for p in on) <= am
            assert len(on) <= ap
        assert set(bound.values()) <= set(nodes)
        # No pod was sent a binding once the scheduler knew it was bound: a conflict needs an unclear answer.
        unclear = sum(1 for k, op in emu.faults.log if op == "bind" and k in ("lost-response", "cut"))
        if replicas == 1:
            assert len(emu.conflicts) <= unclear, (emu.conflicts, emu.faults.log)
        else:
            terms = [(s.cfg.identity, t) for s in scheds for t in s.leader.terms]
            for i, (a, ta) in enumerate(terms):
                for b, tb in terms[i + 1:]:
                    if a != b:
                        assert max(ta[0], tb[0]) >= min(ta[1], tb[1]), f"overlapping terms {a} {ta} / {b} {tb}"
            for s in scheds:
                for t, _uid in s.bind_sent:
                    assert any(lo <= t <= hi for lo, hi in s.leader.terms), f"{s.cfg.identity} bound outside its term"
        _event(f"faults fired: {sorted({k + ' ' + op for k, op in emu.faults.log})}")
        _event(f"{len(bound)}/{len(req)} bound, {len(emu.conflicts)} conflicts")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(nodes_st, pods_st, faults_st, policy_st, stn.booleans())
def test_no_pod_lost_one_replica(node_specs, pod_specs, faults, policy, drop):
    _run(node_specs, pod_specs, faults, policy, replicas=1, drop_watches=drop)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(nodes_st, pods_st, faults_st, policy_st, stn.booleans(), stn.booleans())
def test_no_pod_lost_two_replicas_racing_for_the_lease(node_specs, pod_specs, faults, policy, drop, kill):
    _run(node_specs, pod_specs, faults, policy, replicas=2, drop_watches=drop, kill_leader=kill)
