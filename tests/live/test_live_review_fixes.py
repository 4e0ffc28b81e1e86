"""Review fixes in the live path: NotReady nodes that are not asleep are no candidates for serve (the extender
judges them as kube-scheduler does), nominations are cleared when a pod is decided away from its node, a stale extender steps
aside, and a binding ends before the term."""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.kube.objects import ASLEEP_TAINT, WAKE_FAILED_ANNOTATION, parse_pod
from joulesched.live.extender import Extender, ExtenderServer
from tests.live.conftest import wait_until
from tests.live.test_extender import _post
from tests.support.kube_emulator import make_pod

TOLERATE_ALL = [{"operator": "Exists"}]


def _pod(emu, name: str = "p") -> dict:
    return emu.get("pods", name, "default")


def _events(emu, reason: str) -> list[dict]:
    return [e for e in emu.list("events") if e["reason"] == reason]


def _put_to_sleep(emu, name: str) -> None:
    """What the node power controller leaves behind: cordoned, tainted joulesched.io/asleep, and NotReady."""
    node = emu.get("nodes", name)
    node["spec"]["unschedulable"] = True
    node["metadata"].setdefault("annotations", {})["joulesched.io/cordoned"] = "true"  # the cordon is ours
    node["spec"]["taints"] = [{"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]
    emu.replace("nodes", "", name, node)
    emu.set_node_ready(name, False)


# ---- 1. a NotReady node that is not asleep is no candidate ----------------------------------------------------
def test_a_pod_tolerating_every_taint_is_not_parked_on_a_notready_node(emu, make_scheduler):
    emu.add_node("good", cpu="4", memory="8Gi")
    emu.add_node("dead", cpu="64", memory="256Gi")  # empty and big: LeastAllocated's favourite
    emu.set_node_ready("dead", False)
    emu.add_pod("filler", cpu="3", memory="6Gi", node_name="good")
    emu.add_pod("p", cpu="100m", memory="100Mi", tolerations=TOLERATE_ALL)
    make_scheduler()
    wait_until(lambda: _pod(emu)["spec"].get("nodeName"), 10, "p bound")
    assert _pod(emu)["spec"]["nodeName"] == "good"
    assert not _pod(emu)["status"].get("nominatedNodeName")
    assert not _events(emu, "WaitingForNode")


def test_a_pod_that_fits_only_a_notready_node_is_unschedulable_and_says_why(emu, make_scheduler):
    emu.add_node("good", cpu="1", memory="8Gi")
    emu.add_node("dead", cpu="64", memory="256Gi")
    emu.set_node_ready("dead", False)
    emu.add_pod("p", cpu="2", memory="100Mi", tolerations=TOLERATE_ALL)
    make_scheduler()
    wait_until(lambda: _events(emu, "FailedScheduling"), 10, "a FailedScheduling event")
    assert _events(emu, "FailedScheduling")[0]["message"] == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) were not ready.")
    assert not _pod(emu)["spec"].get("nodeName") and not _pod(emu)["status"].get("nominatedNodeName")
    assert not _events(emu, "WaitingForNode")


@contextlib.contextmanager
def _extender_on(emu, policy: str = "most-allocated") -> Iterator[tuple[KubeCache, Callable[..., Any]]]:
    """An extender over the emulator, synced: its cache, and ``ask(pod, node_names, verb="filter")`` -> its
    answer (filter or prioritize)."""
    cache = KubeCache(api_client_for(emu.url))
    srv = ExtenderServer(Extender(cache, make_policy(policy)), "127.0.0.1", 0).start()
    cache.start()

    def ask(pod: dict, names: list[str], verb: str = "filter") -> Any:
        code, out = _post(f"http://127.0.0.1:{srv.port}/{verb}", {"Pod": pod, "NodeNames": names})
        assert code == 200 and (verb != "filter" or out["Error"] == ""), out
        return out
    try:
        assert cache.wait_synced(10)
        yield cache, ask
    finally:
        srv.stop()
        cache.stop()


def test_the_extender_judges_a_notready_node_as_kube_does_and_serve_keeps_it_out(emu, make_scheduler):
    """One chain, two profiles: kube-scheduler asking the extender gets kube's answer (a NotReady node fails only
    a pod that does not tolerate the not-ready taint, with kube's taint reason), ``serve`` deciding for itself
    never takes one (NodeReady, "node(s) were not ready"), even for a pod that tolerates every taint."""
    emu.add_node("good", cpu="4", memory="8Gi")
    emu.add_node("dead", cpu="64", memory="256Gi")
    emu.set_node_ready("dead", False)
    pod = make_pod("p", cpu="100m", memory="100Mi", tolerations=TOLERATE_ALL)
    info = parse_pod({**pod, "metadata": {**pod["metadata"], "uid": "u"}})
    big = parse_pod({**make_pod("q", cpu="8", tolerations=TOLERATE_ALL), "metadata": {"uid": "q"}})
    with _extender_on(emu, "default-k8s") as (cache, filter_):  # LeastAllocated: the big empty node first
        assert cache.kube_readiness
        out = filter_(pod, ["good", "dead"])
        assert out["NodeNames"] == ["good", "dead"] and not out["FailedNodes"] and not out["FailedAndUnresolvableNodes"]
        # ... but a Ready candidate is preferred: the dead node, big and empty, scores 0 (LeastAllocated would
        # give it 10).
        scores = {r["Host"]: r["Score"] for r in filter_(pod, ["good", "dead"], "prioritize")}
        assert scores == {"good": 10, "dead": 0}
        out = filter_(make_pod("plain", cpu="100m"), ["good", "dead"])
        assert out["NodeNames"] == ["good"] and out["FailedAndUnresolvableNodes"] == {
            "dead": "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"}
        with cache.lock:
            assert cache.unschedulable_message(big) == "0/2 nodes are available: 1 Insufficient cpu."
        sched = make_scheduler()  # serve's cache: joulesched's own profile of the same chain
        assert sched.cache.wait_synced(10) and sched.cache.sleep_aware and not sched.cache.kube_readiness
        with pytest.raises(ValueError, match="a cache of its own"):  # it would hand serve NotReady nodes
            Extender(sched.cache, make_policy("most-allocated"))
        assert not sched.cache.kube_readiness
        with sched.cache.lock:
            st = sched.cache.state()
            assert sched.cache.feasible(info, st).tolist() == [n == "good" for n in st.names]
            assert sched.cache.reasons(info, st.names.index("dead")) == ["node(s) were not ready"]
            assert sched.cache.unschedulable_message(big) == (
                "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) were not ready.")


def test_a_pick_only_policy_picks_among_the_ready_nodes_it_scores(emu):
    """random (no scorer, a pick) was handed the NotReady node too: when it picked that one, every Ready node
    scored alike and the extender said nothing."""
    for name in ("a", "b", "dead"):
        emu.add_node(name, cpu="4", memory="8Gi")
    emu.set_node_ready("dead", False)
    pod = make_pod("p", cpu="100m", memory="100Mi", tolerations=TOLERATE_ALL)
    with _extender_on(emu, "random") as (_cache, ask):
        for _ in range(30):
            scores = {r["Host"]: r["Score"] for r in ask(pod, ["a", "b", "dead"], "prioritize")}
            assert scores["dead"] == 0 and sorted((scores["a"], scores["b"])) == [0, 10], scores


def test_the_extender_lets_kube_place_an_operator_on_a_cluster_with_no_ready_node(emu):
    """Bootstrap: no node is Ready until the CNI runs, and the CNI's operator (tigera-operator: a Deployment,
    hostNetwork, tolerating every taint) must be placed first. With the extender attached to the default
    scheduler it must pass and score those nodes, or the cluster never comes up."""
    for name in ("cp", "w1", "w2"):
        emu.add_node(name, cpu="4", memory="8Gi")
        emu.set_node_ready(name, False)
    operator = make_pod("tigera-operator", cpu="100m", memory="128Mi", tolerations=TOLERATE_ALL,
                        owner="ReplicaSet")
    with _extender_on(emu) as (cache, filter_):
        out = filter_(operator, ["cp", "w1", "w2"])
        assert out["NodeNames"] == ["cp", "w1", "w2"] and not out["FailedAndUnresolvableNodes"]
        scores = filter_(operator, ["cp", "w1", "w2"], "prioritize")
        assert sorted(s["Host"] for s in scores) == ["cp", "w1", "w2"] and max(s["Score"] for s in scores) == 10
        out = filter_(make_pod("web", cpu="100m"), ["cp", "w1", "w2"])  # anything else waits, as under kube
        assert out["NodeNames"] == [] and len(out["FailedAndUnresolvableNodes"]) == 3


def test_a_pod_that_names_a_notready_node_may_go_there_once_it_is_ready(emu, make_scheduler):
    """A DaemonSet's pod (pinned by matchFields, tolerating everything, as a CNI plugin's): the extender passes
    its booting node, as kube-scheduler must bind it there for the node to become Ready; ``serve`` never takes
    a NotReady node, so it reports the pod unschedulable (FailedScheduling, PodScheduled=False) until then,
    never parking it elsewhere or nominating anything. A pod naming several nodes is no DaemonSet's: the
    NotReady one stays out and it goes to the Ready one at once."""
    emu.add_node("good", cpu="4", memory="8Gi")
    emu.add_node("boot", cpu="4", memory="8Gi")
    emu.set_node_ready("boot", False)
    pin = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["boot"]}]}]}}}
    kw = dict(cpu="100m", tolerations=TOLERATE_ALL, affinity=pin, owner="DaemonSet")
    with _extender_on(emu) as (_, filter_):
        out = filter_(make_pod("p", **kw), ["good", "boot"])
        assert out["NodeNames"] == ["boot"]
        assert out["FailedAndUnresolvableNodes"] == {"good": "node(s) didn't match Pod's node affinity/selector"}
    emu.add_pod("p", **kw)
    s = make_scheduler()
    tries = {"result": "unschedulable"}
    wait_until(lambda: s.registry.get_sample_value("joulesched_schedule_attempts_total", tries) >= 2, 10, "retries")
    assert s.registry.get_sample_value("joulesched_schedule_attempts_total", {"result": "error"}) == 0
    assert not _pod(emu)["spec"].get("nodeName") and not _pod(emu)["status"].get("nominatedNodeName")
    wait_until(lambda: _events(emu, "FailedScheduling"), 10, "a FailedScheduling event")
    assert _events(emu, "FailedScheduling")[0]["message"] == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) were not ready.")
    # The condition is written apart from the event (its own queue): waited for, not read at once.
    wait_until(lambda: _pod(emu)["status"].get("conditions"), 10, "the PodScheduled condition")
    cond = {c["type"]: c for c in _pod(emu)["status"].get("conditions", [])}
    assert cond["PodScheduled"]["status"] == "False" and cond["PodScheduled"]["reason"] == "Unschedulable"
    emu.set_node_ready("boot", True)
    wait_until(lambda: _pod(emu)["spec"].get("nodeName") == "boot", 15, "p bound to boot once it is Ready")
    assert not _events(emu, "WaitingForNode")
    emu.add_node("big", cpu="64", memory="256Gi")  # down, big and empty: least-allocated's favourite
    emu.set_node_ready("big", False)
    both = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["big", "good"]}]}]}}}
    emu.add_pod("q", cpu="100m", tolerations=TOLERATE_ALL, affinity=both)
    wait_until(lambda: _pod(emu, "q")["spec"].get("nodeName") == "good", 10, "q bound to the Ready node")


def _waiting_for_sleepy(emu, make_scheduler, good_cpu: str, pod_cpu: str) -> None:
    """Nodes "good" (awake, ``good_cpu`` free) and "sleepy" (big, empty, asleep); pod "p" nominated for sleepy."""
    emu.add_node("good", cpu="4", memory="8Gi")
    emu.add_node("sleepy", cpu="64", memory="256Gi")
    _put_to_sleep(emu, "sleepy")
    emu.add_pod("filler", cpu=f"{4000 - int(good_cpu)}m", memory="64Mi", node_name="good")
    emu.add_pod("p", cpu=pod_cpu, memory="100Mi")
    make_scheduler(node_wait_poll_s=0.05)
    wait_until(lambda: _pod(emu)["status"].get("nominatedNodeName") == "sleepy", 10, "p nominated for sleepy")
    assert not _pod(emu)["spec"].get("nodeName")


def test_a_sleeping_notready_node_is_still_waited_for(emu, make_scheduler):
    _waiting_for_sleepy(emu, make_scheduler, good_cpu="1000", pod_cpu="100m")


def test_the_room_a_pod_waits_for_is_kept_from_other_pods(emu, make_scheduler):
    """As kube-scheduler counts a nominated pod's requests on its node: a second pod does not count on the room
    the first one waits for (a review: both were nominated for a node that holds one, and the second, bound
    first, left the first to be decided afresh once the node had woken)."""
    emu.add_node("good", cpu="4", memory="8Gi")
    emu.add_node("sleepy", cpu="2", memory="8Gi")
    _put_to_sleep(emu, "sleepy")
    emu.add_pod("filler", cpu="3", memory="64Mi", node_name="good")
    emu.add_pod("p", cpu="1500m", memory="100Mi")  # fits only sleepy
    sched = make_scheduler(node_wait_poll_s=0.05)
    wait_until(lambda: _pod(emu)["status"].get("nominatedNodeName") == "sleepy", 10, "p nominated for sleepy")
    uid = _pod(emu)["metadata"]["uid"]
    with sched.cache.lock:
        assert sched.cache.reserved_on("sleepy") == [uid]
    emu.add_pod("q", cpu="1500m", memory="100Mi")  # would fit sleepy, but for p
    wait_until(lambda: _events(emu, "FailedScheduling"), 10, "q unschedulable")
    assert not _pod(emu, "q")["status"].get("nominatedNodeName")
    emu.delete("pods", "default", "p")  # gone: its room is free again, and q waits for it
    wait_until(lambda: _pod(emu, "q")["status"].get("nominatedNodeName") == "sleepy", 20, "q nominated for sleepy")
    with sched.cache.lock:
        assert sched.cache.reserved_on("sleepy") == [_pod(emu, "q")["metadata"]["uid"]]


# ---- 2. the nomination is cleared when the pod is decided away from its node -----------------------------------
def test_the_nomination_is_cleared_when_the_pod_is_bound_elsewhere(emu, make_scheduler):
    _waiting_for_sleepy(emu, make_scheduler, good_cpu="1000", pod_cpu="100m")
    emu.delete_node("sleepy")  # the node it waited for is gone: decided afresh, bound to the awake one
    wait_until(lambda: _pod(emu)["spec"].get("nodeName") == "good", 10, "p bound to good")
    wait_until(lambda: "nominatedNodeName" not in _pod(emu)["status"], 10, "the nomination cleared")


def test_the_nomination_is_cleared_when_the_pod_gives_up_waiting_and_stays_pending(emu, make_scheduler):
    _waiting_for_sleepy(emu, make_scheduler, good_cpu="1000", pod_cpu="2")
    # The controller could not wake it: its taint stays, marked wake-failed (no longer asleep to the cache).
    node = emu.get("nodes", "sleepy")
    node["metadata"]["annotations"][WAKE_FAILED_ANNOTATION] = "true"
    emu.replace("nodes", "", "sleepy", node)
    wait_until(lambda: "nominatedNodeName" not in _pod(emu)["status"], 10, "the nomination cleared")
    assert not _pod(emu)["spec"].get("nodeName")
    wait_until(lambda: _events(emu, "FailedScheduling"), 10, "a FailedScheduling event")


# ---- 3. the extender: unknown nodes pass, a stale cache steps aside --------------------------------------------
@pytest.fixture
def extender(emu):
    emu.add_node("small", cpu="1", memory="1Gi")
    emu.add_node("big", cpu="8", memory="16Gi")
    cache = KubeCache(api_client_for(emu.url))
    ext = Extender(cache, make_policy("most-allocated"), stale_s=30.0)
    srv = ExtenderServer(ext, "127.0.0.1", 0).start()
    cache.start()
    assert cache.wait_synced(10)
    try:
        yield ext, f"http://127.0.0.1:{srv.port}"
    finally:
        srv.stop()
        cache.stop()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_extender_passes_nodes_its_cache_does_not_know(extender, emu):
    ext, url = extender
    pod = make_pod("p", cpu="2")
    code, out = _post(url + "/filter", {"Pod": pod, "NodeNames": ["small", "big", "new"]})
    assert code == 200 and out["Error"] == ""
    assert out["NodeNames"] == ["big", "new"] and out["FailedNodes"] == {"small": "Insufficient cpu"}
    new = {"metadata": {"name": "new"}}
    code, out = _post(url + "/filter", {"Pod": pod, "Nodes": {"items": [emu.get("nodes", "small"), new]}})
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["new"]
    assert out["FailedNodes"] == {"small": "Insufficient cpu"} and out["FailedAndUnresolvableNodes"] == {}


def test_a_stale_extender_answers_with_an_error_and_is_not_ready(extender, emu, monkeypatch):
    ext, url = extender
    args = {"Pod": make_pod("p", cpu="100m"), "NodeNames": ["small", "big"]}
    assert _get(url + "/healthz") == (200, b"ok")
    monkeypatch.setattr(ext.cache, "stale_for", lambda: 45.0)  # no answer from the apiserver for 45 s > 30 s
    code, out = _post(url + "/filter", args)
    assert code == 200 and "no answer from the apiserver for 45 s" in out["Error"]  # ignorable: skipped
    assert out["NodeNames"] is None and out["FailedNodes"] == {}
    code, out = _post(url + "/prioritize", args)
    assert code == 503 and "no answer" in out["Error"]
    for path in ("/healthz", "/readyz"):
        code, body = _get(url + path)
        assert code == 503 and b"no answer from the apiserver" in body
    monkeypatch.setattr(ext.cache, "stale_for", lambda: 10.0)  # a short gap is no reason to step aside
    code, out = _post(url + "/filter", args)
    assert out["Error"] == "" and out["NodeNames"] == ["small", "big"]
    assert _get(url + "/healthz") == (200, b"ok")


def test_an_unsynced_extender_answers_with_an_error(emu):
    emu.add_node("n", cpu="4", memory="8Gi")
    ext = Extender(KubeCache(api_client_for(emu.url)), make_policy("most-allocated"))  # never started
    code, out = ext.handle("filter", {"Pod": make_pod("p", cpu="100m"), "NodeNames": ["n"]})
    assert code == 200 and "not synced" in out["Error"] and out["NodeNames"] is None


# ---- 4. a binding request ends before the leader's term does ----------------------------------------------------
class _Elector:
    """A leader whose term ends ``left`` seconds from a clock that stands still."""

    renew_deadline_s = 10.0
    transitions = 0  # the term the scheduler starts in: no pod resync due

    def __init__(self, left: float) -> None:
        self.left = left

    def clock(self) -> float:
        return 1000.0

    def leading_until(self) -> float:
        return 1000.0 + self.left

    def is_leader(self) -> bool:
        return self.left > 0

    def start(self) -> "_Elector":
        return self

    def stop(self, release: bool = True) -> None:
        pass


def test_a_binding_is_not_sent_with_too_little_of_the_term_left_and_its_timeout_is_capped(emu, make_scheduler):
    emu.add_node("n", cpu="4", memory="8Gi")
    s = make_scheduler(start=False, request_timeout_s=10.0)
    s.leader = elector = _Elector(left=0.6)  # margin 0.5 s (5 % of 10 s): 0.1 s left for the request
    outcomes: list[str] = []
    finish = s._finish
    s._finish = lambda e, node, outcome, dt: (outcomes.append(outcome), finish(e, node, outcome, dt))
    timeouts: list[float] = []
    request = s.http.request

    def spy(method, path, body=None, **kw):
        if path.endswith("/binding"):
            timeouts.append(kw["timeout"])
        return request(method, path, body, **kw)

    s.http.request = spy
    s.start()
    emu.add_pod("p", cpu="100m")
    wait_until(lambda: outcomes.count("fenced") >= 2, 10, "the binding held back")
    assert timeouts == [] and emu.bind_requests == 0 and not _pod(emu)["spec"].get("nodeName")
    assert s.registry.get_sample_value("joulesched_schedule_attempts_total", {"result": "error"}) == 0
    elector.left = 3.0  # renewed: 3 s left, so the request may take 2.5 s, not 10
    wait_until(lambda: _pod(emu)["spec"].get("nodeName") == "n", 10, "p bound")
    assert timeouts and all(0 < t <= 2.5 for t in timeouts)
