"""Review fixes in `serve`: scheduling-gated pods are left alone, GPUs asked by init containers and sidecars
count, a bad GPU-share annotation costs only the share, a pooled connection the apiserver closed while idle is
retried, the shipped RBAC allows what the Event recorder sends, a pod stops waiting for a node that never
wakes, and a new leader resyncs its pods before its first decision."""

from __future__ import annotations

import http.client
import json
import logging
import time
from pathlib import Path

import pytest
import yaml

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.kube.objects import ASLEEP_TAINT, ObjectError, parse_pod, pod_request
from joulesched.live.scheduler import Scheduler, ServeConfig
from tests.live.conftest import FAST, wait_until
from tests.support.kube_emulator import KubeEmulator, make_pod

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"


def _pod(emu, name: str) -> dict:
    return emu.get("pods", name, "default")


def _bound(emu, name: str) -> str:
    return _pod(emu, name)["spec"].get("nodeName") or ""


def _gpu(container: dict, n: str = "1", *, limit_only: bool = False) -> dict:
    res = container.setdefault("resources", {})
    res.setdefault("limits", {})["nvidia.com/gpu"] = n
    if not limit_only:
        res.setdefault("requests", {})["nvidia.com/gpu"] = n
    return container


# ---- 1. scheduling gates --------------------------------------------------------------------------------------
def test_a_gated_pod_is_neither_decided_nor_bound_until_its_last_gate_is_lifted(emu, make_scheduler):
    """kube-scheduler keeps a pod with ``spec.schedulingGates`` SchedulingGated (the apiserver refuses its
    binding: 409); the MODIFIED event that lifts the last gate queues it."""
    emu.add_node("n1")
    gated = make_pod("gated", cpu="100m")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/a"}, {"name": "example.com/b"}]
    emu.add_object("pods", gated, "default")
    s = make_scheduler(event_writer="thread")
    emu.add_pod("free", cpu="100m")
    wait_until(lambda: _bound(emu, "free"), 10, "the ungated pod bound")
    emu.patch("pods", "default", "gated", {"spec": {"schedulingGates": [{"name": "example.com/b"}]}})
    time.sleep(0.3)
    assert not _bound(emu, "gated") and not _pod(emu, "gated")["status"].get("nominatedNodeName")
    assert emu.bind_requests == 1 and s.pending() == 0  # never tried, never queued
    assert s.registry.get_sample_value("joulesched_schedule_attempts_total", {"result": "error"}) == 0
    emu.patch("pods", "default", "gated", {"spec": {"schedulingGates": None}})
    wait_until(lambda: _bound(emu, "gated") == "n1", 10, "the pod bound once its gates are lifted")
    assert emu.bind_requests == 2 and not emu.conflicts


def test_the_emulator_refuses_to_bind_a_gated_pod_as_the_apiserver_does(emu):
    gated = make_pod("gated", cpu="100m")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    emu.add_object("pods", gated, "default")
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=5)
    conn.request("POST", "/api/v1/namespaces/default/pods/gated/binding",
                 json.dumps({"metadata": {"name": "gated"}, "target": {"name": "n1"}}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    body = json.loads(r.read())
    conn.close()
    assert r.status == 409 and body["reason"] == "Conflict"
    assert body["message"] == ('Operation cannot be fulfilled on pods/binding "gated": pod gated has non-empty '
                               '.spec.schedulingGates')
    assert not _bound(emu, "gated")


# ---- 2. GPUs of init containers and sidecars --------------------------------------------------------------------
def test_gpus_are_counted_as_kube_counts_them_with_init_containers_and_sidecars():
    init = make_pod("i", cpu="100m")
    init["spec"]["initContainers"] = [_gpu({"name": "warm", "image": "x"})]
    assert pod_request(init).gpu == 1
    side = make_pod("s", cpu="100m")
    side["spec"]["initContainers"] = [_gpu({"name": "sc", "image": "x", "restartPolicy": "Always"}, limit_only=True)]
    assert pod_request(side).gpu == 1
    # containers 1 + sidecar 1 = 2, raised to the init container after the sidecar: 3 + 1 = 4
    both = make_pod("b", cpu="100m")
    _gpu(both["spec"]["containers"][0])
    both["spec"]["initContainers"] = [_gpu({"name": "sc", "image": "x", "restartPolicy": "Always"}),
                                      _gpu({"name": "big", "image": "x"}, "3")]
    assert pod_request(both).gpu == 4
    both["spec"]["initContainers"].reverse()  # the init container before the sidecar: max(3, 1 + 1)
    assert pod_request(both).gpu == 3


def test_a_pod_whose_init_container_or_sidecar_asks_for_a_gpu_goes_to_a_gpu_node(emu, make_scheduler):
    emu.add_node("cpu-only", cpu="16", memory="64Gi")  # big and empty: least-allocated's favourite
    gpu = emu.add_node("gpu", cpu="4", memory="8Gi")
    gpu["status"]["allocatable"]["nvidia.com/gpu"] = "2"
    emu.replace("nodes", "", "gpu", gpu)
    init = make_pod("gpu-init", cpu="100m")
    init["spec"]["initContainers"] = [_gpu({"name": "warm", "image": "x"})]
    side = make_pod("gpu-sidecar", cpu="100m")
    side["spec"]["initContainers"] = [_gpu({"name": "sc", "image": "x", "restartPolicy": "Always"}, limit_only=True)]
    for p in (init, side):
        emu.add_object("pods", p, "default")
    make_scheduler(event_writer="thread")
    for name in ("gpu-init", "gpu-sidecar"):
        wait_until(lambda n=name: _bound(emu, n), 10, f"{name} bound")
        assert _bound(emu, name) == "gpu"


# ---- 3. a bad GPU-share annotation --------------------------------------------------------------------------------
def test_a_bad_gpu_share_annotation_drops_only_the_share_and_is_logged_once_per_pod(caplog):
    pod = make_pod("p", cpu="3", memory="6Gi", annotations={"alibabacloud.com/gpu-milli": "1500"})
    pod["metadata"]["uid"] = "u-bad-share"
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    pod["spec"]["containers"][0]["resources"]["requests"]["example.com/foo"] = "2"
    with caplog.at_level(logging.WARNING, logger="joulesched.kube.pods"):
        for _ in range(3):  # the watch parses a pod again on each of its events
            r = parse_pod(pod).request
    assert (r.cpu_m, r.memory_mib, r.gpu) == (3000, 6144, 0)
    assert r.host_ports == (("TCP", "0.0.0.0", 8080),) and r.named == (("example.com/foo", 2),)
    logged = [m for m in caplog.messages if "gpu-milli" in m]
    assert logged == ["pod default/p: annotation alibabacloud.com/gpu-milli 1500 is outside 1..1000; its GPU share "
                      "is ignored"]
    _gpu(pod["spec"]["containers"][0])  # whole GPUs from the containers stay
    pod["metadata"]["annotations"]["alibabacloud.com/gpu-milli"] = "half"
    assert parse_pod(pod).request.gpu == 1
    with pytest.raises(ObjectError, match="'half' is not an integer"):
        parse_pod(pod, strict=True)  # a request's Pod (the extender's): an error, as before


def test_a_pod_with_a_bad_gpu_share_annotation_still_counts_its_cpu(emu, make_scheduler):
    emu.add_node("n1", cpu="4", memory="8Gi")
    emu.add_pod("big1", cpu="3", memory="6Gi")
    make_scheduler(event_writer="thread")
    wait_until(lambda: _bound(emu, "big1"), 10, "big1 bound")
    emu.add_pod("big2", cpu="3", memory="6Gi", annotations={"alibabacloud.com/gpu-milli": "0"})
    wait_until(lambda: [e for e in emu.list("events") if e["reason"] == "FailedScheduling"], 10, "FailedScheduling")
    assert not _bound(emu, "big2")


# ---- 4. a pooled connection the apiserver closed while idle --------------------------------------------------------
def test_the_first_binding_after_a_quiet_spell_does_not_fail_on_a_closed_connection():
    """kube-apiserver closes keep-alive connections idle for 90 s (0.3 s here)."""
    with KubeEmulator(idle_timeout_s=0.3) as emu:
        emu.add_node("n1")
        emu.add_pod("p1", cpu="100m")
        s = Scheduler(KubeCache(api_client_for(emu.url)), make_policy("default-k8s"),
                      ServeConfig(**{**FAST, "leader_elect": False, "event_writer": "thread",
                                     "backoff_initial_s": 1.0, "backoff_max_s": 10.0}))
        s.start()
        try:
            wait_until(lambda: _bound(emu, "p1"), 10, "p1 bound")
            time.sleep(0.8)  # quiet: the pooled connections are closed by the server
            emu.add_pod("p2", cpu="100m")
            wait_until(lambda: _bound(emu, "p2"), 10, "p2 bound")
            assert s.registry.get_sample_value("joulesched_schedule_attempts_total", {"result": "error"}) == 0
            assert s.registry.get_sample_value("joulesched_bind_errors_total", {"code": "connection"}) is None
            assert s.http.retried >= 1
        finally:
            s.stop()


# ---- 5. RBAC: the shipped role allows what the scheduler sends ------------------------------------------------------
def test_the_shipped_rbac_allows_every_request_of_serve_events_aggregation_included(emu, make_scheduler):
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "joulesched"]
    (lease,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "joulesched-leader-election"]
    emu.grant(role["rules"])
    emu.grant(lease["rules"], lease["metadata"]["namespace"])
    emu.add_node("n1", cpu="1")
    emu.add_pod("fits", cpu="100m")
    emu.add_pod("toobig", cpu="2")
    s = make_scheduler(event_writer="thread", event_update_interval_s=0.1, leader_elect=True,
                       lease_namespace=lease["metadata"]["namespace"], lease_name="joulesched")

    def count() -> int:
        ev = [e for e in emu.list("events") if e["involvedObject"]["name"] == "toobig"]
        return ev[0].get("count", 0) if ev else 0

    wait_until(lambda: _bound(emu, "fits") and count() >= 3, 10, "a bound pod and an aggregated Event")
    assert emu.denied == []
    assert s.registry.get_sample_value("joulesched_events_dropped_total") == 0


def test_the_emulator_enforces_granted_rules(emu):
    emu.grant([{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}])
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=5)
    conn.request("PATCH", "/api/v1/namespaces/default/events/e1", b"{}",
                 {"Content-Type": "application/merge-patch+json"})
    r = conn.getresponse()
    assert r.status == 403 and "cannot patch resource \"events\"" in json.loads(r.read())["message"]
    conn.close()
    assert emu.denied == [("patch", "", "events", "e1")]


# ---- 6. a node that never wakes ------------------------------------------------------------------------------------
def test_a_pod_whose_sleeping_node_never_wakes_goes_to_an_awake_node_with_room(emu, make_scheduler):
    """Nobody wakes "sleepy" (no node power controller): after node_wait_max_s the pod is decided afresh without
    it, and bound to the awake node, instead of choosing the same empty sleeping node again for ever."""
    emu.add_node("awake", cpu="4")
    emu.add_node("sleepy", cpu="4")
    emu.patch("nodes", "", "sleepy", {"spec": {"taints": [{"key": ASLEEP_TAINT, "value": "true",
                                                           "effect": "NoSchedule"}]}})
    emu.set_node_ready("sleepy", False)
    emu.add_pod("filler", cpu="2", node_name="awake", scheduler_name="default-scheduler")
    emu.add_pod("p", cpu="100m")
    s = make_scheduler(event_writer="thread", node_wait_max_s=0.5, node_wait_poll_s=0.05)
    wait_until(lambda: _pod(emu, "p")["status"].get("nominatedNodeName") == "sleepy", 10, "p waiting for sleepy")
    wait_until(lambda: _bound(emu, "p") == "awake", 10, "p bound to the awake node")
    wait_until(lambda: "nominatedNodeName" not in _pod(emu, "p")["status"], 10, "the nomination cleared")
    assert s.registry.get_sample_value("joulesched_pods_waited_for_node_total") == 1


def test_a_pod_waits_again_for_a_node_that_never_woke_when_nothing_else_fits(emu, make_scheduler):
    emu.add_node("awake", cpu="1")
    emu.add_node("sleepy", cpu="4")
    emu.patch("nodes", "", "sleepy", {"spec": {"taints": [{"key": ASLEEP_TAINT, "value": "true",
                                                           "effect": "NoSchedule"}]}})
    emu.set_node_ready("sleepy", False)
    emu.add_pod("p", cpu="2")
    s = make_scheduler(event_writer="thread", node_wait_max_s=0.2, node_wait_poll_s=0.05)
    wait_until(lambda: _pod(emu, "p")["status"].get("nominatedNodeName") == "sleepy", 10, "p waiting for sleepy")
    time.sleep(0.6)  # past the wait, more than once
    assert _pod(emu, "p")["status"].get("nominatedNodeName") == "sleepy" and not _bound(emu, "p")
    assert not [e for e in emu.list("events") if e["reason"] == "FailedScheduling"]
    emu.patch("nodes", "", "sleepy", {"spec": {"taints": None}})
    emu.set_node_ready("sleepy", True)
    wait_until(lambda: _bound(emu, "p") == "sleepy", 10, "p bound once sleepy woke")
    assert s.registry.get_sample_value("joulesched_schedule_attempts_total", {"result": "error"}) == 0


# ---- 7. a new leader resyncs before deciding ------------------------------------------------------------------------
def test_a_new_leader_decides_nothing_before_its_resync_however_late_its_callback(emu, make_scheduler):
    """LeaderElector calls on_change after is_leader() has turned True (and after a log line: a blocked stderr
    delays it); the resync is keyed to the term, so the loop cannot decide in between."""
    emu.add_node("n1")
    for i in range(3):
        emu.add_pod(f"p{i}", cpu="100m")
    s = make_scheduler(start=False, event_writer="thread", leader_elect=True)
    assert s.leader is not None
    callback = s.leader.on_change

    def slow(leading: bool) -> None:
        time.sleep(0.5)
        callback(leading)

    s.leader.on_change = slow
    resyncs: list[float] = []
    resync = s.cache.resync_pods

    def timed() -> None:
        resyncs.append(time.monotonic())
        resync()

    s.cache.resync_pods = timed
    s.start()
    wait_until(lambda: all(_bound(emu, f"p{i}") for i in range(3)), 10, "every pod bound")
    assert resyncs and min(t for t, _ in s.bind_sent) > resyncs[0]
