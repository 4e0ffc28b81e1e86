"""The node power controller end to end on the API emulator: the real `kubernetes` client over HTTP, the real
libvirt actuator on libvirt's test driver (test:///default), and emulated kubelets whose Ready condition
follows the machines (tests/support/machines.py). No kube-apiserver or kubelet can run here (machines.md); the
emulator and the kubelets are the mock parts.

Checked: idle nodes are cordoned, tainted and slept after sleep_after_s; pending pods wake a node and are bound
only once it is Ready; control-plane and never-sleep nodes are never touched; min_awake holds; dry-run writes
nothing; two replicas never both act; actuator failures are reported, uncordoned and retried, and a failed
wake moves on to the next node; 300 pods of churn lose no pod and bind none twice; consolidation honours PDBs
on the Eviction API (429) and its eviction budget."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import replace
from types import SimpleNamespace

import pytest

from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.nodepower import (
    ASLEEP_TAINT,
    NEVER_SLEEP_ANNOTATION,
    POWER_ADDRESS_ANNOTATION,
    POWER_OWNER_ANNOTATION,
    POWER_STATE_ANNOTATION,
    PowerPolicy,
)
from joulesched.live.actuators import ActuatorOptions, make_actuator
from joulesched.live.actuators.base import UNKNOWN, ActuatorError
from joulesched.live.nodepower import NodePowerConfig, NodePowerController, NodePowerStatusServer
from tests.live.conftest import wait_until
from tests.support.kube_emulator import make_pod
from tests.support.machines import Kubelets, Machines

CTL_FAST = dict(resync_s=0.05, settle_s=0.1, retry_initial_s=0.3, retry_max_s=1.0, wake_timeout_s=5.0,
                sleep_timeout_s=5.0, drain_timeout_s=5.0, poll_s=0.02, takeover_grace_s=0.3,
                lease_duration_s=0.6, renew_deadline_s=0.4, retry_period_s=0.05, lease_namespace="default")


@pytest.fixture
def machines():
    m = Machines()
    yield m
    m.close()


@pytest.fixture
def kubelets(emu, machines):
    k = Kubelets(emu, machines).start()
    yield k
    k.stop()


@pytest.fixture
def make_controller(emu, machines):
    made: list[NodePowerController] = []

    def make(policy: PowerPolicy | None = None, *, actuator: str = "libvirt", start: bool = True,
             **kw) -> NodePowerController:
        # The machines' addresses are the operator's map (the same dict: machines added later are in it too).
        cfg = NodePowerConfig(policy=policy or PowerPolicy(sleep_after_s=0.3),
                              **{**CTL_FAST, "leader_elect": False, "addresses": machines.addresses, **kw})
        act = make_actuator(actuator, ActuatorOptions(libvirt_uri="test:///default"))
        c = NodePowerController(api_client_for(emu.url), act, cfg)
        made.append(c)
        return c.start() if start else c

    yield make
    for c in made:
        c.stop()


def add_nodes(emu, machines, names, cpu="4", memory="8Gi", annotations=None, labels=None):
    """Nodes backed by machines whose addresses are in the operator's map (``machines.addresses``)."""
    for n in names:
        machines.add(n)
        emu.add_node(n, cpu=cpu, memory=memory, annotations=annotations, labels=labels)


def pstate(emu, node) -> str:
    return ((emu.get("nodes", node) or {}).get("metadata", {}).get("annotations") or {}).get(POWER_STATE_ANNOTATION,
                                                                                           "awake")


def asleep(emu, machines, node) -> bool:
    obj = emu.get("nodes", node)
    return (pstate(emu, node) == "asleep" and machines.saved(node) and obj["spec"].get("unschedulable") is True
            and any(t["key"] == ASLEEP_TAINT and t["effect"] == "NoSchedule" for t in obj["spec"].get("taints", [])))


def awake(emu, machines, node) -> bool:
    obj = emu.get("nodes", node)
    return (pstate(emu, node) == "awake" and machines.running(node) and not obj["spec"].get("unschedulable")
            and not any(t["key"] == ASLEEP_TAINT for t in obj["spec"].get("taints", [])))


def events(emu, reason=None):
    return [e for e in emu.list("events") if e["involvedObject"]["kind"] == "Node"
            and (reason is None or e["reason"] == reason)]


def check_bindings_only_to_awake_nodes(emu, kubelets, finished=None):
    """Every binding went to a node that was Ready and awake at that moment, or that was being put to sleep
    (cordoned, still running: a decision made before the taint was seen) and whose sleep was then called off,
    or whose pod had finished (``finished``: pod -> time) before the machine went off."""
    for ns, pod, _uid, node, t in emu.bindings:
        states = [(pt, p["metadata"]["annotations"][POWER_STATE_ANNOTATION]) for n, p, pt in emu.node_patches
                  if n == node and POWER_STATE_ANNOTATION in (p.get("metadata") or {}).get("annotations", {})]
        before = [s for pt, s in states if pt <= t]
        after = [s for pt, s in states if pt > t]
        ok = not before or before[-1] == "awake" or (before[-1] == "sleeping" and after[:1] == ["awake"])
        if not ok and before[-1] == "sleeping" and finished and pod in finished:
            off = [rt for rt, n, r in kubelets.log if n == node and rt > t and not r]
            ok = bool(off) and finished[pod] < off[0]  # it was gone before its node went down
        assert ok, f"{ns}/{pod} bound to {node} while it was {before[-1]} (then {after[:1]})"
        ready = [r for rt, n, r in kubelets.log if n == node and rt <= t]
        assert not ready or ready[-1], f"{ns}/{pod} bound to {node} while it was not Ready"


def test_idle_nodes_are_cordoned_tainted_and_put_to_sleep_after_sleep_after_s(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["a", "b"])
    t0 = time.monotonic()
    ctl = make_controller(PowerPolicy(sleep_after_s=0.5))
    wait_until(lambda: all(asleep(emu, machines, n) for n in "ab"), 10, "both nodes asleep")
    first = min(t for t, a, _ in ctl.actions if a == "sleep")
    assert first - t0 >= 0.5
    wait_until(lambda: len(events(emu, "NodeAsleep")) == 2, 10, "two NodeAsleep events")
    assert len(events(emu, "NodeSleeping")) == 2
    wait_until(lambda: not any(r for _, n, r in kubelets.log[-2:]), 10, "kubelets reporting the nodes gone")
    # Asleep, the nodes keep the joules-saved estimate growing.
    saved = ctl.registry.get_sample_value("joulesched_node_power_joules_saved_total")
    wait_until(lambda: ctl.registry.get_sample_value("joulesched_node_power_joules_saved_total") > saved, 10)
    # Counted from the controller's informer, which may not have seen its own last patch yet.
    wait_until(lambda: ctl.registry.get_sample_value("joulesched_node_power_nodes", {"state": "asleep"}) == 2, 10)


def test_a_pending_pod_wakes_a_node_and_is_bound_once_it_is_ready(emu, machines, kubelets, make_controller,
                                                                 make_scheduler):
    add_nodes(emu, machines, ["a", "b"])
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2))
    wait_until(lambda: all(asleep(emu, machines, n) for n in "ab"), 10, "both nodes asleep")
    sched = make_scheduler("most-allocated", node_wait_poll_s=0.05)
    emu.add_pod("p0", cpu="500m", memory="256Mi")
    wait_until(lambda: emu.get("pods", "p0", "default")["spec"].get("nodeName"), 10, "p0 bound")
    node = emu.get("pods", "p0", "default")["spec"]["nodeName"]
    pod = emu.get("pods", "p0", "default")
    assert pod["status"].get("nominatedNodeName") == node  # the scheduler chose the sleeping node and waited
    assert awake(emu, machines, node)
    other = ({"a", "b"} - {node}).pop()
    assert asleep(emu, machines, other)  # only one node was woken
    check_bindings_only_to_awake_nodes(emu, kubelets)
    assert sched.registry.get_sample_value("joulesched_pods_waited_for_node_total") == 1
    # The controller uncordons the node, then records the wake and posts NodeAwake: the scheduler may bind
    # p0 in between.
    wait_until(lambda: [e["reason"] for e in events(emu) if e["involvedObject"]["name"] == node][-2:]
               == ["NodeWaking", "NodeAwake"], 10, "NodeAwake after NodeWaking")
    assert ctl.registry.get_sample_value("joulesched_node_power_wake_latency_seconds_count") == 1


def test_pods_of_another_scheduler_that_fit_no_awake_node_wake_the_most_efficient(emu, machines, kubelets,
                                                                                  make_controller):
    add_nodes(emu, machines, ["small"], cpu="2")
    add_nodes(emu, machines, ["big"], cpu="16")  # same default curve on 8x the cores: more efficient
    make_controller(PowerPolicy(sleep_after_s=0.2))
    wait_until(lambda: asleep(emu, machines, "small") and asleep(emu, machines, "big"), 10)
    emu.add_pod("k", cpu="1", scheduler_name="default-scheduler")
    wait_until(lambda: awake(emu, machines, "big"), 10, "big woken")
    time.sleep(0.5)  # k stays pending (no default scheduler here): big is kept awake for it, small never woken
    assert awake(emu, machines, "big") and asleep(emu, machines, "small")
    emu.bind("default", "k", {"target": {"name": "big"}}, None)  # as kube-scheduler would
    time.sleep(0.3)
    assert awake(emu, machines, "big") and asleep(emu, machines, "small")

def test_our_schedulers_new_pod_keeps_the_awake_node_it_fits_awake_and_wakes_nothing(emu, machines, kubelets,
                                                                                      make_controller):
    """Within ``nominate_grace_s`` our scheduler's pod is its scheduler's to place: it wakes no node, but the
    awake node it fits is where it is about to be bound, so that node must not be put to sleep meanwhile (a
    review: such pods were left out altogether, and an idle node they were bound to could be switched off)."""
    add_nodes(emu, machines, ["a"], cpu="4")
    add_nodes(emu, machines, ["b"], cpu="16")
    machines.lookup("b").managedSave(0)
    emu.patch("nodes", "", "b", {"metadata": {"annotations": {POWER_STATE_ANNOTATION: "asleep"}},
                                 "spec": {"unschedulable": True, "taints": [
                                     {"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})
    emu.add_pod("p", cpu="1")  # our scheduler's (none runs here): never nominated, never bound
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=0), nominate_grace_s=2.0)
    time.sleep(1.2)  # six sleep_after_s, within the grace
    assert awake(emu, machines, "a") and asleep(emu, machines, "b")
    assert not any(a in ("sleep", "wake") for _, a, _ in ctl.actions)
    time.sleep(1.2)  # past the grace: a pending pod like any other, which a fits: still nothing to do
    assert awake(emu, machines, "a") and asleep(emu, machines, "b")
    emu.delete("pods", "default", "p")
    wait_until(lambda: asleep(emu, machines, "a"), 10, "a asleep once nothing wants it")



def test_a_scheduling_gated_pod_wakes_no_node_until_its_gate_is_lifted(emu, machines, kubelets, make_controller):
    """No scheduler takes a pod with ``spec.schedulingGates`` (kube keeps it SchedulingGated): waking a node for
    it would only spend energy, and it might never be released."""
    add_nodes(emu, machines, ["a"])
    make_controller(PowerPolicy(sleep_after_s=0.2))
    wait_until(lambda: asleep(emu, machines, "a"), 10, "a asleep")
    k = make_pod("k", cpu="1", scheduler_name="default-scheduler")
    k["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    emu.add_object("pods", k, "default")
    time.sleep(0.5)
    assert asleep(emu, machines, "a")
    emu.patch("pods", "default", "k", {"spec": {"schedulingGates": None}})
    wait_until(lambda: awake(emu, machines, "a"), 10, "a woken once the gate is lifted")


def test_a_pod_asking_an_extended_resource_wakes_a_node_that_has_it(emu, machines, kubelets, make_controller):
    """The wake question is the filter chain's: a node without the pod's extended resource would never take it
    (the kubelet would refuse it), however efficient."""
    add_nodes(emu, machines, ["small"], cpu="2")
    add_nodes(emu, machines, ["big"], cpu="16")  # the more efficient one, without example.com/foo
    small = emu.get("nodes", "small")
    small["status"]["allocatable"]["example.com/foo"] = "1"
    emu.replace("nodes", "", "small", small)
    make_controller(PowerPolicy(sleep_after_s=0.2))
    wait_until(lambda: asleep(emu, machines, "small") and asleep(emu, machines, "big"), 10)
    k = make_pod("k", cpu="1", scheduler_name="default-scheduler")
    k["spec"]["containers"][0]["resources"]["requests"]["example.com/foo"] = "1"
    emu.add_object("pods", k, "default")
    wait_until(lambda: awake(emu, machines, "small"), 10, "small woken")
    time.sleep(0.5)
    assert awake(emu, machines, "small") and asleep(emu, machines, "big")


def test_no_more_sleeps_start_in_an_hour_than_max_sleeps_per_hour(emu, machines, kubelets, make_controller,
                                                                  caplog):
    """A bound on what a misconfiguration can switch off: the third idle node waits for room, and says so."""
    add_nodes(emu, machines, ["a", "b", "c"])
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=0), max_sleeps_per_hour=2)
    wait_until(lambda: sum(asleep(emu, machines, n) for n in "abc") == 2, 10, "two nodes asleep")
    time.sleep(1.0)  # five more sleep_after_s: the third stays awake
    assert sum(asleep(emu, machines, n) for n in "abc") == 2
    assert sum(a == "sleep" for _, a, _ in ctl.actions) == 2
    assert "sleeps were started in the last hour (max_sleeps_per_hour)" in caplog.text
    (left,) = [n for n in "abc" if not asleep(emu, machines, n)]
    assert ctl.request_sleep(left) is False  # the autoscaler provider's sleeps wait for room too


def test_control_plane_and_never_sleep_nodes_are_never_touched_and_min_awake_holds(emu, machines, kubelets,
                                                                                  make_controller):
    add_nodes(emu, machines, ["cp"], labels={"node-role.kubernetes.io/control-plane": ""})
    add_nodes(emu, machines, ["keep"], annotations={NEVER_SLEEP_ANNOTATION: "true"})
    add_nodes(emu, machines, ["w0", "w1", "w2", "w3"])
    # Ready schedulable workers count: keep (a worker that never sleeps) and w0..w3, not the control plane.
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=4))
    wait_until(lambda: sum(asleep(emu, machines, n) for n in ("w0", "w1", "w2", "w3")) == 1, 10)
    time.sleep(1.0)  # well past sleep_after_s: nothing more happens
    assert sum(asleep(emu, machines, n) for n in ("w0", "w1", "w2", "w3")) == 1
    touched = {n for n, _, _ in emu.node_patches if n in ("cp", "keep")}
    assert touched <= {"cp", "keep"} and not [p for n, p, _ in emu.node_patches if n in ("cp", "keep")
                                              and POWER_STATE_ANNOTATION in (p.get("metadata") or {}).get(
                                                  "annotations", {})]
    assert machines.running("cp") and machines.running("keep")
    assert len([a for a in ctl.actions if a[1] == "sleep"]) == 1


def test_min_awake_1_with_a_control_plane_and_three_empty_workers_leaves_one_worker_awake(emu, machines, kubelets,
                                                                                         make_controller):
    add_nodes(emu, machines, ["cp"], labels={"node-role.kubernetes.io/control-plane": ""})
    add_nodes(emu, machines, ["w0", "w1", "w2"])
    emu.add_node("other-cordoned", cpu="4")  # cordoned by an admin: not schedulable, does not count either
    emu.patch("nodes", "", "other-cordoned", {"spec": {"unschedulable": True}})
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=1))
    wait_until(lambda: sum(asleep(emu, machines, n) for n in ("w0", "w1", "w2")) == 2, 10, "two workers asleep")
    time.sleep(1.0)
    assert sum(awake(emu, machines, n) for n in ("w0", "w1", "w2")) == 1  # the control plane is not the one
    assert len([a for a in ctl.actions if a[1] == "sleep"]) == 2
    assert emu.get("nodes", "other-cordoned")["spec"]["unschedulable"] is True


def test_dry_run_announces_every_action_and_changes_nothing(emu, machines, make_controller):  # no kubelets: no writes
    add_nodes(emu, machines, ["a", "b"])
    rv = emu.resource_version
    ctl = make_controller(PowerPolicy(sleep_after_s=0.1), dry_run=True)
    wait_until(lambda: len(ctl.actions) == 2, 10, "two announced sleeps")
    time.sleep(0.5)
    assert sorted(n for _, a, n in ctl.actions if a == "sleep") == ["a", "b"] and len(ctl.actions) == 2
    assert emu.node_patches == [] and events(emu) == [] and emu.list("leases") == []
    assert emu.resource_version == rv  # not one write
    assert machines.running("a") and machines.running("b")


def test_two_replicas_never_both_act(emu, machines, kubelets, make_controller, make_scheduler):
    add_nodes(emu, machines, ["a", "b", "c"])
    pol = PowerPolicy(sleep_after_s=0.2)
    r1 = make_controller(pol, leader_elect=True, identity="r1")
    r2 = make_controller(pol, leader_elect=True, identity="r2")
    wait_until(lambda: all(asleep(emu, machines, n) for n in "abc"), 10)
    acting = [r for r in (r1, r2) if r.actions]
    assert len(acting) == 1
    first, second = (r1, r2) if acting[0] is r1 else (r2, r1)
    for t, _, _ in first.actions:  # every action inside one of its terms as leader
        assert any(s <= t <= e for s, e in first.leader.terms)
    first.stop()
    wait_until(second.is_leader, 10, "takeover")
    make_scheduler("most-allocated", node_wait_poll_s=0.05)
    emu.add_pod("p", cpu="1")
    wait_until(lambda: emu.get("pods", "p", "default")["spec"].get("nodeName"), 10, "p bound after takeover")
    assert second.actions and all(t >= first.leader.terms[-1][1] for t, _, _ in second.actions)


def test_a_failed_sleep_whose_power_is_unknown_stays_cordoned_and_is_retried(emu, machines, kubelets,
                                                                            make_controller, caplog):
    # The map names a domain that does not exist (yet): sleep fails and state() cannot say the machine is on.
    emu.add_node("ghost")
    ctl = make_controller(PowerPolicy(sleep_after_s=0.1),
                          addresses={**machines.addresses, "ghost": f"libvirt:///ghost-{machines.tag}"})
    caplog.set_level("WARNING", logger="joulesched.nodepower")
    wait_until(lambda: events(emu, "NodeSleepFailed"), 10, "a NodeSleepFailed event")
    ev = events(emu, "NodeSleepFailed")[0]
    assert ev["type"] == "Warning" and "kept cordoned and tainted" in ev["message"]
    assert "ghost-" not in ev["message"]  # generic text: the actuator's detail is in the log
    assert "not found" in caplog.text.lower()
    node = emu.get("nodes", "ghost")
    assert node["spec"].get("unschedulable") is True and any(t["key"] == ASLEEP_TAINT for t in node["spec"]["taints"])
    assert pstate(emu, "ghost") == "sleeping"  # no action in flight: resumed after the backoff
    assert ctl.registry.get_sample_value("joulesched_node_power_failures_total", {"op": "sleep"}) >= 1
    ctl.cfg.addresses["ghost"] = machines.add("ghost")  # the machine turns up: the next retry succeeds
    wait_until(lambda: asleep(emu, machines, "ghost"), 10, "ghost asleep after a retry")


def test_a_failed_sleep_of_a_machine_reported_on_is_uncordoned(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["a"])
    ctl = make_controller(PowerPolicy(sleep_after_s=0.1), start=False)
    real = ctl.actuator.sleep

    def refuse(target):  # the BMC refuses the power-off; the machine stays on and says so
        raise RuntimeError("refused")

    ctl.actuator.sleep = refuse
    ctl.start()
    wait_until(lambda: events(emu, "NodeSleepFailed"), 10, "a NodeSleepFailed event")
    assert "reports the machine on: uncordoned" in events(emu, "NodeSleepFailed")[0]["message"]
    wait_until(lambda: awake(emu, machines, "a"), 10, "a uncordoned and untainted")
    ctl.actuator.sleep = real
    wait_until(lambda: asleep(emu, machines, "a"), 10, "a asleep after a retry")


def test_a_failed_wake_tries_the_next_node(emu, machines, kubelets, make_controller, make_scheduler):
    add_nodes(emu, machines, ["a"], cpu="16")  # the most efficient: woken first
    add_nodes(emu, machines, ["b"], cpu="4")
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2))
    wait_until(lambda: asleep(emu, machines, "a") and asleep(emu, machines, "b"), 10)
    machines.remove("a")  # its machine is gone: waking it fails
    emu.add_pod("k", cpu="1", scheduler_name="default-scheduler")
    wait_until(lambda: events(emu, "NodeWakeFailed"), 10, "a NodeWakeFailed event")
    wait_until(lambda: awake(emu, machines, "b"), 10, "b woken instead")
    assert events(emu, "NodeWakeFailed")[0]["involvedObject"]["name"] == "a"
    assert ctl.registry.get_sample_value("joulesched_node_power_failures_total", {"op": "wake"}) >= 1


def test_status_endpoints(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["a"])
    ctl = make_controller(PowerPolicy(sleep_after_s=0.1))
    srv = NodePowerStatusServer(ctl, port=0).start()
    try:
        base = f"http://127.0.0.1:{srv.port}"
        wait_until(lambda: ctl.synced, 10)
        assert urllib.request.urlopen(base + "/readyz", timeout=5).read() == b"ok"
        assert urllib.request.urlopen(base + "/healthz", timeout=5).read() == b"ok"
        wait_until(lambda: asleep(emu, machines, "a"), 10)
        wait_until(lambda: ctl.registry.get_sample_value("joulesched_node_power_nodes", {"state": "asleep"}) == 1, 10)
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        for name in ("joulesched_node_power_nodes{state=\"asleep\"} 1.0", "joulesched_node_power_wake_latency_seconds",
                     "joulesched_node_power_failures_total", "joulesched_node_power_evictions_total",
                     "joulesched_node_power_joules_saved_total"):
            assert name in text
    finally:
        srv.stop()


@pytest.mark.slow
def test_300_pods_of_churn_lose_no_pod_and_bind_none_twice(emu, machines, kubelets, make_controller, make_scheduler):
    """Waves of short pods with idle gaps, so nodes sleep between waves and are woken for the next one."""
    add_nodes(emu, machines, [f"n{k}" for k in range(5)], cpu="4", memory="8Gi")
    ctl = make_controller(PowerPolicy(sleep_after_s=0.15))
    make_scheduler("most-allocated", node_wait_poll_s=0.05, bind_workers=4)
    made, done = [], {}
    deadline = time.monotonic() + 60
    for wave in range(10):
        names = [f"w{wave}-{k}" for k in range(30)]
        for n in names:
            emu.add_pod(n, cpu="500m", memory="512Mi")
            made.append(n)
        # Each pod "runs" until it is bound, then finishes (its kubelet marks it Succeeded).
        while len(done) < len(made) and time.monotonic() < deadline:
            for n in made:
                if n not in done:
                    pod = emu.get("pods", n, "default")
                    if pod["spec"].get("nodeName"):
                        emu.set_pod_phase("default", n, "Succeeded")
                        done[n] = time.monotonic()
            time.sleep(0.02)
        time.sleep(0.4 if wave % 2 else 0.05)  # idle gaps: nodes go to sleep, the next wave wakes them
    assert len(done) == 300, f"{300 - len(done)} pods never bound"
    stats = emu.stats()
    assert stats["pods_bound_twice"] == 0 and stats["bindings"] == 300
    check_bindings_only_to_awake_nodes(emu, kubelets, done)
    sleeps = [a for a in ctl.actions if a[1] == "sleep"]
    wakes = [a for a in ctl.actions if a[1] == "wake"]
    assert sleeps and wakes  # the churn really went through sleep and wake cycles


# ---- consolidation -----------------------------------------------------------------------------------------
def _spread(emu, k_per_node, nodes, labels):
    """Pods owned by a ReplicaSet, bound directly (as if placed earlier), k per node."""
    for n in nodes:
        for k in range(k_per_node):
            name = f"{n}-p{k}"
            emu.add_pod(name, cpu="500m", memory="256Mi", labels=labels, owner="ReplicaSet")
            emu.bind("default", name, {"target": {"name": n}}, None)


def test_consolidation_honours_pdbs_then_empties_a_node_which_sleeps(emu, machines, kubelets, make_controller,
                                                                    make_scheduler):
    add_nodes(emu, machines, ["a", "b"], cpu="4")
    _spread(emu, 1, ["a", "b"], {"app": "web"})
    emu.add_pdb("web", match_labels={"app": "web"}, min_available=2)  # no disruption allowed
    pol = PowerPolicy(sleep_after_s=0.2, consolidate=True, consolidate_interval_s=0.2, restart_s=1)
    ctl = make_controller(pol)
    make_scheduler("most-allocated", node_wait_poll_s=0.05)
    time.sleep(1.0)
    # The controller reads the PDB and does not even try while it allows nothing.
    assert emu.evictions == [] and all(awake(emu, machines, n) for n in "ab")
    # A PDB that allows one disruption: a node is drained (its pod evicted, replaced, placed on the other).
    emu.delete("poddisruptionbudgets", "default", "web")
    emu.add_pdb("web", match_labels={"app": "web"}, min_available=1)
    wait_until(lambda: any(code == 201 for *_, code, _ in emu.evictions), 10, "an eviction")
    drained = next(n for n in "ab" if asleep(emu, machines, n) or pstate(emu, n) in ("draining", "sleeping"))
    wait_until(lambda: asleep(emu, machines, drained), 10, f"{drained} asleep after its pod left")
    other = ({"a", "b"} - {drained}).pop()

    def web():
        return [p for p in emu.list("pods") if p["metadata"].get("labels", {}).get("app") == "web"]

    # The evicted pod's replacement is the scheduler's to bind: that may come after its old node is asleep.
    wait_until(lambda: all(p["spec"].get("nodeName") for p in web()), 10, "the replacement bound")
    pods = web()
    assert len(pods) == 2 and all(p["spec"].get("nodeName") == other for p in pods)
    assert ctl.registry.get_sample_value("joulesched_node_power_evictions_total", {"result": "evicted"}) == 1
    check_bindings_only_to_awake_nodes(emu, kubelets)


def test_eviction_answered_429_aborts_the_drain_and_uncordons(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["a", "b"], cpu="4")
    _spread(emu, 1, ["a", "b"], {"app": "web"})
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, consolidate=True, consolidate_interval_s=0.3),
                          start=False)
    # The PDB appears between the controller's read of it and its eviction: the Eviction API answers 429.
    real = ctl._do_drain

    def drain_after_a_pdb(name, pods):
        emu.add_pdb("web", match_labels={"app": "web"}, min_available=2)
        real(name, pods)

    ctl._do_drain = drain_after_a_pdb
    ctl.start()
    wait_until(lambda: any(code == 429 for *_, code, _ in emu.evictions), 10, "a 429")
    wait_until(lambda: events(emu, "NodeConsolidationAborted"), 10)
    wait_until(lambda: all(awake(emu, machines, n) for n in "ab"), 10, "both nodes uncordoned and awake")
    assert ctl.registry.get_sample_value("joulesched_node_power_evictions_total", {"result": "refused"}) == 1
    assert len([p for p in emu.list("pods")]) == 2


def test_consolidation_keeps_to_its_eviction_budget(emu, machines, kubelets, make_controller, make_scheduler):
    add_nodes(emu, machines, ["a", "b", "c", "d"], cpu="8")
    _spread(emu, 2, ["a", "b", "c"], {"app": "batch"})  # d is empty; a, b, c could each be emptied
    pol = PowerPolicy(sleep_after_s=0.2, consolidate=True, consolidate_interval_s=0.2, max_evictions_per_hour=3)
    ctl = make_controller(pol)
    make_scheduler("most-allocated", node_wait_poll_s=0.05)
    wait_until(lambda: sum(code == 201 for *_, code, _ in emu.evictions) >= 2, 10)
    time.sleep(2.0)  # many consolidation rounds later
    assert sum(code == 201 for *_, code, _ in emu.evictions) == 2  # one node's two pods; a second needs 4 > 3
    assert ctl.core.eviction_budget(ctl.clock()) == 1

    def batch():
        return [p for p in emu.list("pods") if p["metadata"].get("labels", {}).get("app") == "batch"]

    assert len(batch()) == 6
    wait_until(lambda: all(p["spec"].get("nodeName") for p in batch()), 10, "the replacements bound")


def test_an_address_from_the_map_is_written_onto_the_node_and_used(emu, machines, kubelets, make_controller):
    addr = machines.add("m1")
    emu.add_node("m1")  # no annotation: the address comes from the map (a ConfigMap, or the kvm stack's output)
    make_controller(PowerPolicy(sleep_after_s=0.2), addresses={"m1": addr})
    wait_until(lambda: emu.get("nodes", "m1")["metadata"]["annotations"].get(POWER_ADDRESS_ANNOTATION) == addr, 10)
    wait_until(lambda: asleep(emu, machines, "m1"), 10, "m1 asleep through its mapped address")


# ---- constraints are the filters', cordons are their owners' -----------------------------------------------
def test_consolidation_moves_no_pod_to_a_node_its_own_constraints_exclude(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["a", "b"], cpu="4")
    emu.patch("nodes", "", "a", {"metadata": {"labels": {"zone": "x"}}})
    # Pinned to zone x (only a), and not tolerating b's taint: no other node may take it, so a is never drained.
    emu.add_pod("pinned", cpu="500m", owner="ReplicaSet", node_selector={"zone": "x"})
    emu.bind("default", "pinned", {"target": {"name": "a"}}, None)
    emu.add_pod("other", cpu="500m", owner="ReplicaSet")
    emu.bind("default", "other", {"target": {"name": "b"}}, None)
    emu.patch("nodes", "", "b", {"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}})
    make_controller(PowerPolicy(sleep_after_s=0.2, consolidate=True, consolidate_interval_s=0.2, restart_s=1))
    time.sleep(2.0)  # ten consolidation rounds
    assert not [e for e in emu.evictions if e[1] == "pinned"]
    assert awake(emu, machines, "a")


def test_job_pods_are_evicted_only_when_marked_safe_to_evict():
    from joulesched.cluster.kube.objects import parse_pod
    from joulesched.live.nodepower import eviction_blocker
    from tests.support.kube_emulator import make_pod

    job = make_pod("j", owner="Job")
    assert "Job" in eviction_blocker(parse_pod(job))  # its progress would be lost
    job["metadata"]["annotations"] = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}
    assert eviction_blocker(parse_pod(job)) == ""
    assert eviction_blocker(parse_pod(make_pod("r", owner="ReplicaSet"))) == ""
    assert eviction_blocker(parse_pod(make_pod("bare"))) == "no controller"


def test_our_uncordon_never_lifts_a_cordon_we_did_not_set(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["a"])
    machines.lookup("a").managedSave(0)
    # Asleep and tainted by us, but cordoned by an admin (no joulesched.io/cordoned marker: not our cordon).
    emu.patch("nodes", "", "a", {"metadata": {"annotations": {POWER_STATE_ANNOTATION: "asleep"}},
                                 "spec": {"unschedulable": True, "taints": [
                                     {"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})
    ctl = make_controller(PowerPolicy(sleep_after_s=60))
    # A pod that does not tolerate the cordon wakes nothing: the wake would not lift the admin's cordon, so the
    # node would stay of no use to it (a review: the wake planner judged the node without any cordon).
    emu.add_pod("plain", cpu="100m", scheduler_name="default-scheduler")
    time.sleep(1.0)
    assert pstate(emu, "a") == "asleep" and not any(a == "wake" for _, a, _ in ctl.actions)
    emu.delete("pods", "default", "plain")
    emu.add_pod("k", cpu="100m", scheduler_name="default-scheduler", tolerations=[  # a DaemonSet's, say
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}])
    wait_until(lambda: pstate(emu, "a") == "awake" and machines.running("a"), 10, "a woken")
    node = emu.get("nodes", "a")
    assert node["spec"].get("unschedulable") is True  # the admin's cordon stays
    assert not any(t["key"] == ASLEEP_TAINT for t in node["spec"].get("taints") or [])  # our taint is gone


def test_a_pod_whose_volume_is_pinned_to_a_node_wakes_that_node(emu, machines, kubelets, make_controller):
    """kube-scheduler's VolumeBinding for a bound claim: a pod whose PV's node affinity names the small node
    wakes the small one, not the more efficient big one it would otherwise get."""
    add_nodes(emu, machines, ["small"], cpu="2")
    add_nodes(emu, machines, ["big"], cpu="16")
    emu.add_object("persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "local-small"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "local": {"path": "/data"},
                 "claimRef": {"namespace": "default", "name": "data"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": ["small"]}]}]}}}})
    emu.add_object("persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "volumeName": "local-small"}}, "default")
    make_controller(PowerPolicy(sleep_after_s=0.2))
    wait_until(lambda: asleep(emu, machines, "small") and asleep(emu, machines, "big"), 10)
    emu.add_pod("db", cpu="1", scheduler_name="default-scheduler",
                volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])
    wait_until(lambda: awake(emu, machines, "small"), 10, "small woken for its volume")
    time.sleep(0.5)
    assert awake(emu, machines, "small") and asleep(emu, machines, "big")


@pytest.mark.parametrize("standby", [False, True], ids=["leader", "standby"])
def test_a_scheduler_on_the_same_cache_sees_which_nodes_the_controller_would_sleep(emu, machines, standby):
    """serve --node-power: the controller and the scheduler share one cache. A node without a power address the
    controller may use (here: not in the operator's map) never sleeps, and the scheduler's state says so; so
    does a node that gains an address later, once the controller has resolved it, and one delegated to another
    controller."""
    from joulesched.cluster.kube.cache import KubeCache

    add_nodes(emu, machines, ["mapped"])
    emu.add_node("unmapped", cpu="4", memory="8Gi")  # no machine, no address
    emu.add_node("cp", cpu="4", memory="8Gi", labels={"node-role.kubernetes.io/control-plane": ""})
    cache = KubeCache(api_client_for(emu.url)).start()
    try:
        assert cache.wait_synced(10)
        cache.sleep_model = (10.0, 60.0)
        before = dict(zip(cache.state().names, cache.state().may_sleep.tolist()))
        assert before == {"cp": False, "mapped": True, "unmapped": True}  # no controller: every unprotected node
        # A standby (the node-power Lease held by another replica) acts on nothing but still answers.
        cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=60.0),
                              **{**CTL_FAST, "leader_elect": standby, "addresses": machines.addresses})
        leader = SimpleNamespace(is_leader=lambda: False) if standby else None
        ctl = NodePowerController(cache, make_actuator("libvirt", ActuatorOptions(libvirt_uri="test:///default")),
                                  cfg, leader=leader).start()
        try:
            def may_sleep():
                st = cache.state()
                return dict(zip(st.names, st.may_sleep.tolist()))

            wait_until(lambda: may_sleep() == {"cp": False, "mapped": True, "unmapped": False}, 10)
            machines.add("unmapped")  # the operator maps it: the controller resolves it on its next pass
            wait_until(lambda: may_sleep()["unmapped"], 10)
            if standby:
                assert ctl.actions == [] and not emu.node_patches  # it resolved addresses, and wrote nothing
                return
            # Handed to another controller (the cluster-autoscaler provider's node groups): no node object
            # changes, so only the controller's word makes the scheduler's state anew.
            ctl.delegated = lambda info: info.name == "mapped"
            wait_until(lambda: may_sleep() == {"cp": False, "mapped": False, "unmapped": True}, 10)
        finally:
            ctl.stop()
    finally:
        cache.stop()


class _SleepFails:
    """An actuator whose sleep fails and whose state() cannot say (a BMC that cannot be reached, an SSH suspend
    refused): the machine stays on, the controller cannot know it."""

    name = "libvirt"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def sleep(self, target) -> None:
        self.calls.append(("sleep", target.node))
        raise ActuatorError(f"{target.node}: the management interface did not answer")

    def wake(self, target) -> None:
        self.calls.append(("wake", target.node))

    def state(self, target) -> str:
        return UNKNOWN


def _failed_sleep(emu, make_controller, **kw):
    """Two nodes, one of which idles into a sleep that fails unconfirmed: (controller, actuator, it, the other)."""
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=1), start=False, **kw)
    act = ctl.actuator = _SleepFails()
    ctl.start()
    wait_until(lambda: act.calls, 10, "a sleep attempted")
    victim = act.calls[0][1]
    wait_until(lambda: events(emu, "NodeSleepFailed"), 10, "the failure reported")
    assert pstate(emu, victim) == "sleeping" and emu.get("nodes", victim)["spec"].get("unschedulable") is True
    return ctl, act, victim, "b" if victim == "a" else "a"


def test_a_pending_pod_wakes_a_node_whose_sleep_failed_instead_of_another_retry(emu, machines, kubelets,
                                                                                make_controller):
    # Kept cordoned (pods must not land on a machine that may be going down), the node was retried to sleep
    # before the wake pass could look at it, for as long as the actuator failed: a pod needing it waited.
    # Woken, it counts as awake only once its kubelet renews its Lease after that sleep's deadline (the machine
    # may have been going down, its kubelet still alive): here 1.5 s.
    add_nodes(emu, machines, ["a", "b"], cpu="4")
    # (retry_max_s short: the retried sleeps' backoff must not keep the node out of the wake pass's reach.)
    ctl, act, victim, other = _failed_sleep(emu, make_controller, sleep_timeout_s=1.5, retry_max_s=0.5)
    emu.add_pod("filler", cpu="3", memory="64Mi", node_name=other, owner="ReplicaSet")
    emu.add_pod("p", cpu="3500m", memory="64Mi", scheduler_name="default-scheduler", owner="ReplicaSet")
    wait_until(lambda: pstate(emu, victim) == "awake" and not emu.get("nodes", victim)["spec"].get("unschedulable"),
               15, "the node the pending pod needs, uncordoned")
    assert ("wake", victim) in act.calls
    # Its NodeAwake is posted after the uncordon seen above.
    wait_until(lambda: any(e["involvedObject"]["name"] == victim for e in events(emu, "NodeAwake")), 10,
               "its NodeAwake")


def test_a_node_that_keeps_running_after_a_failed_sleep_is_uncordoned(emu, machines, kubelets, make_controller):
    # No pod needs it: its kubelet still renewing the node's Lease a whole sleep deadline after the failure
    # shows that the machine did not go down, so the cordon ends (it would otherwise last as long as the
    # actuator fails). retry_max_s keeps the next attempt away long enough to see it.
    add_nodes(emu, machines, ["a", "b"], cpu="4")
    ctl, act, victim, _ = _failed_sleep(emu, make_controller, sleep_timeout_s=1.0, retry_max_s=30.0)
    wait_until(lambda: any("kept running" in e["message"] for e in events(emu, "NodeSleepFailed")), 10,
               "the node uncordoned for it kept running")
    obj = emu.get("nodes", victim)
    assert pstate(emu, victim) == "awake" and not obj["spec"].get("unschedulable")
    assert not any(t["key"] == ASLEEP_TAINT for t in obj["spec"].get("taints") or [])
    assert ("wake", victim) not in act.calls


def test_a_new_leader_wakes_no_node_another_replica_may_still_be_putting_to_sleep(emu, machines, kubelets,
                                                                                 make_controller):
    # The old leader's soft-off may be on its way: the machine is still on, its kubelet alive, so a wake would
    # "succeed", uncordon the node and mark it awake, and the machine then goes off, never to be woken again.
    add_nodes(emu, machines, ["a"], cpu="4", annotations={POWER_STATE_ANNOTATION: "sleeping",
                                                          POWER_OWNER_ANNOTATION: "old-leader"})
    emu.add_pod("p", cpu="3", memory="64Mi", scheduler_name="default-scheduler", owner="ReplicaSet")
    ctl = make_controller(PowerPolicy(sleep_after_s=100), takeover_grace_s=1.5)
    t0 = time.monotonic()
    wait_until(lambda: any(a == "wake" for _, a, _ in ctl.actions), 8, "the wake, after the grace")
    assert min(t for t, a, _ in ctl.actions if a == "wake") - t0 >= 1.0


def test_the_address_map_is_read_again_when_its_file_changes(emu, machines, kubelets, make_controller, tmp_path):
    # The inventory's role adds a node's entry to the ConfigMap as the node joins: the controller must use it
    # without a restart, and a broken edit must not take the map away (or swap in half of it).
    import yaml

    from joulesched.live.nodepower import load_addresses

    add_nodes(emu, machines, ["a", "b"], cpu="4")
    amap = tmp_path / "addresses.yaml"
    amap.write_text(yaml.safe_dump({"a": machines.addresses["a"]}))
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=0), addresses=load_addresses(str(amap)),
                          addresses_file=str(amap))
    wait_until(lambda: asleep(emu, machines, "a"), 10, "a, in the map, asleep")
    time.sleep(0.5)
    assert awake(emu, machines, "b") and ctl.address_of("b").address is None  # no entry: never touched
    amap.write_text(yaml.safe_dump({"a": machines.addresses["a"], "b": machines.addresses["b"]}))
    wait_until(lambda: asleep(emu, machines, "b"), 10, "b asleep once the map names its machine")
    good = dict(ctl.cfg.addresses)
    amap.write_text("a: [unclosed\n")
    time.sleep(1.5)  # past the settle time (0.5 s): read, refused
    assert ctl.cfg.addresses == good and ctl.address_of("b").address is not None
    for blank in ("", "# power addresses\n"):  # an editor's rewrite caught between truncating and writing
        amap.write_text(blank)
        time.sleep(1.5)
        assert ctl.cfg.addresses == good, repr(blank)
    amap.write_text(yaml.safe_dump({"b": machines.addresses["b"]}))
    wait_until(lambda: set(ctl.cfg.addresses) == {"b"}, 10, "the map's next whole version read")


def test_a_mounted_configmap_swapped_by_the_kubelet_changes_the_maps_stamp(tmp_path):
    # The kubelet updates a ConfigMap volume by writing a new ..<timestamp> directory and swapping ..data:
    # the names seen in the mount stay the same links, their targets are new files.
    import os

    from joulesched.live.nodepower import _files_stamp, load_addresses

    def publish(version: str, entries: dict[str, str]) -> None:
        d = tmp_path / f"..{version}"
        d.mkdir()
        for k, v in entries.items():
            (d / k).write_text(v)
        os.symlink(d.name, tmp_path / "..data_tmp")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        for k in entries:
            if not (tmp_path / k).is_symlink():
                os.symlink(f"..data/{k}", tmp_path / k)

    publish("v1", {"a": "libvirt:///a", "b": "libvirt:///b"})
    before = _files_stamp(str(tmp_path))
    assert load_addresses(str(tmp_path)) == {"a": "libvirt:///a", "b": "libvirt:///b"}
    publish("v2", {"a": "libvirt:///a", "b": "libvirt:///b2"})
    assert _files_stamp(str(tmp_path)) != before
    assert load_addresses(str(tmp_path))["b"] == "libvirt:///b2"


def test_a_node_named_twice_in_the_address_map_is_refused_not_the_last_one_kept(tmp_path):
    # Which machine a node's entry switches off must not hang on key order or file-name order.
    from joulesched.live.daemon import DaemonInputError
    from joulesched.live.nodepower import load_addresses

    one = tmp_path / "one.yaml"
    one.write_text("a: libvirt:///a\nb: libvirt:///b\na: libvirt:///other\n")
    with pytest.raises(DaemonInputError, match=r"key 'a' is given twice \(lines 1 and 3\)"):
        load_addresses(str(one))
    one.write_text("1: libvirt:///a\n'1': libvirt:///b\n")  # two keys, one node name: the int refused
    with pytest.raises(DaemonInputError, match="a key YAML reads as int 1 is not a node name"):
        load_addresses(str(one))
    blank = tmp_path / "blank.yaml"
    blank.write_text("# being written\n")
    with pytest.raises(DaemonInputError, match="holds no mapping"):  # not "every .yaml file ... a mapping"
        load_addresses(str(blank), allow_blank=False)
    assert load_addresses(str(blank)) == {}

    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "rack1.yaml").write_text("a: libvirt:///a\n")
    (mount / "rack2.yaml").write_text("b: libvirt:///b\n")
    assert load_addresses(str(mount)) == {"a": "libvirt:///a", "b": "libvirt:///b"}
    (mount / "rack2.yaml").write_text("b: libvirt:///b\na: libvirt:///a2\n")
    with pytest.raises(DaemonInputError, match=r"node a is given twice \(rack1.yaml and rack2.yaml\)"):
        load_addresses(str(mount))
    (mount / "rack2.yaml").write_text("b: libvirt:///b\n")
    (mount / "a").write_text("libvirt:///a3\n")  # a ConfigMap key per node beside a .yaml naming it too
    with pytest.raises(DaemonInputError, match=r"node a is given twice \(a and rack1.yaml\)"):
        load_addresses(str(mount))


def test_a_control_plane_known_by_its_static_pods_and_the_controllers_own_node_never_sleep(emu, machines, kubelets,
                                                                                          make_controller):
    # A control plane without its role label looks empty (its pods are mirror pods, which keep no node awake),
    # and a controller whose own node sleeps leaves nobody to wake the others.
    add_nodes(emu, machines, ["cp", "mine", "w"], cpu="4")
    emu.add_pod("kube-apiserver-cp", "kube-system", cpu="250m", node_name="cp",
                labels={"component": "kube-apiserver", "tier": "control-plane"},
                annotations={"kubernetes.io/config.mirror": "0123abcd"})
    emu.add_pod("etcd-lookalike", "default", cpu="100m", node_name="w", labels={"component": "etcd"},
                annotations={"kubernetes.io/config.mirror": "x"})  # not kube-system: an ordinary static pod
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=0), own_node="mine")
    wait_until(lambda: asleep(emu, machines, "w"), 10, "the worker asleep")
    time.sleep(0.5)
    assert awake(emu, machines, "cp") and awake(emu, machines, "mine")
    assert [n for _, a, n in ctl.actions if a == "sleep"] == ["w"]
    infos = ctl.node_infos()
    assert not ctl.may_sleep(infos["cp"]) and not ctl.may_sleep(infos["mine"])
    assert not ctl.request_sleep("cp") and not ctl.request_sleep("mine")



def test_a_failed_wake_after_a_failed_sleep_does_not_leave_the_node_cordoned(emu, machines, kubelets,
                                                                            make_controller):
    # The BMC is unreachable for both: the node stays `sleeping` (not `asleep`), so once its kubelet outlives
    # the sleep's deadline it is uncordoned, pod or no pod.
    class Unreachable(_SleepFails):
        def wake(self, target):
            self.calls.append(("wake", target.node))
            raise ActuatorError(f"{target.node}: the management interface did not answer")

    add_nodes(emu, machines, ["a", "b"], cpu="4")
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=1), start=False, sleep_timeout_s=1.5,
                          retry_max_s=0.5)
    act = ctl.actuator = Unreachable()
    ctl.start()
    wait_until(lambda: events(emu, "NodeSleepFailed"), 10, "the sleep failed")
    victim = act.calls[0][1]
    other = "b" if victim == "a" else "a"
    emu.add_pod("filler", cpu="3", memory="64Mi", node_name=other, owner="ReplicaSet")
    emu.add_pod("p", cpu="3500m", memory="64Mi", scheduler_name="default-scheduler", owner="ReplicaSet")
    wait_until(lambda: ("wake", victim) in act.calls, 10, "a wake tried")
    wait_until(lambda: any("kept running" in e["message"] for e in events(emu, "NodeSleepFailed")), 10,
               "uncordoned for its kubelet kept running")
    assert pstate(emu, victim) == "awake" and not emu.get("nodes", victim)["spec"].get("unschedulable")


def test_a_sleeping_node_without_a_usable_address_is_not_woken_in_a_loop(emu, machines, kubelets,
                                                                        make_controller):
    # Its map entry was removed (or its annotation is refused): nothing can wake it, so the wake pass must not
    # pick it again and again (each failed start kicked the loop: a busy spin of full reconciles).
    add_nodes(emu, machines, ["gone"], cpu="4", annotations={POWER_STATE_ANNOTATION: "asleep"})
    machines.addresses.pop("gone")
    emu.add_pod("p", cpu="3", memory="64Mi", scheduler_name="default-scheduler", owner="ReplicaSet")
    ctl = make_controller(PowerPolicy(sleep_after_s=100))
    wait_until(lambda: ctl.synced, 10, "synced")
    time.sleep(1.0)
    assert [a for _, a, n in ctl.actions if n == "gone"] == []


def test_an_address_map_that_cannot_be_read_leaves_the_loop_running_on_the_last_good_one(emu, machines, kubelets,
                                                                                        make_controller, tmp_path):
    amap = tmp_path / "addresses"
    amap.mkdir()
    add_nodes(emu, machines, ["a"], cpu="4")
    (amap / "a").write_text(machines.addresses["a"])
    from joulesched.live.nodepower import load_addresses

    ctl = make_controller(PowerPolicy(sleep_after_s=100), addresses=load_addresses(str(amap)),
                          addresses_file=str(amap))
    wait_until(lambda: ctl.synced, 10, "synced")
    (amap / "more.yaml").write_text("- a list, not a mapping\n")
    (amap / "b").write_bytes(b"\xff\xfe not utf-8")
    alive = ctl._alive
    wait_until(lambda: ctl._alive > alive + 0.3, 10, "the loop still turning")
    assert ctl._thread.is_alive() and ctl.cfg.addresses == {"a": machines.addresses["a"]}


def _claims_daemonset(emu, name, node, ds_name, uid, labels=None):
    """A workload pod whose author wrote a DaemonSet controller reference into it (the API lets anyone who
    creates pods do so)."""
    pod = make_pod(name, cpu="100m", node_name=node, labels=labels)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name,
                                           "uid": uid, "controller": True}]
    return emu.add_object("pods", pod, "default")


def test_a_pod_that_only_claims_a_daemonset_keeps_its_node_awake(emu, machines, kubelets, make_controller):
    """DaemonSet pods keep no node awake, but the controller reference is the pod author's to write: a node whose
    only pod names a DaemonSet that does not exist, names one with another uid, or names a real one that does
    not select it, stays awake; the node of the DaemonSet's real pod sleeps. The forged pods are never even
    planned around (no cordon and abort churn: the controller's view counts them as workload pods)."""
    add_nodes(emu, machines, ["real", "absent", "other-uid", "unselected"], cpu="4")
    real = emu.add_pod("proxy", cpu="50m", node_name="real", owner="DaemonSet")
    ds = emu.get("daemonsets.apps", "proxy-owner", "default")
    sel = ds["spec"]["selector"]["matchLabels"]
    _claims_daemonset(emu, "web-1", "absent", "no-such-ds", "0000")
    _claims_daemonset(emu, "web-2", "other-uid", "proxy-owner", "not-its-uid", labels=sel)
    _claims_daemonset(emu, "web-3", "unselected", "proxy-owner", ds["metadata"]["uid"])
    assert real["metadata"]["ownerReferences"][0]["uid"] == ds["metadata"]["uid"]
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=0))
    wait_until(lambda: asleep(emu, machines, "real"), 10, "the node holding only a DaemonSet pod asleep")
    time.sleep(1.0)  # several passes of the controller
    for n in ("absent", "other-uid", "unselected"):
        assert awake(emu, machines, n), n
    assert [n for _, a, n in ctl.actions if a == "sleep"] == ["real"]
    assert not events(emu, "NodeSleepAborted")
    assert sorted(ctl.workload_pods_on("unselected") or []) == ["default/web-3"]
    assert ctl.workload_pods_on("real") == []


def test_a_daemonset_that_cannot_be_read_keeps_its_pods_node_awake(emu, machines, kubelets, make_controller):
    """Without an answer about the DaemonSet (RBAC without get on apps daemonsets, an apiserver error), its pod is
    not taken at its word: the node is not put to sleep, and the last fresh check says it cannot tell."""
    add_nodes(emu, machines, ["n"], cpu="4")
    for k in range(3):  # three pods of one DaemonSet (one node here; on a cluster, one per node)
        emu.add_pod("proxy", cpu="50m", node_name="n", owner="DaemonSet") if k == 0 else emu.add_object(
            "pods", {**emu.get("pods", "proxy", "default"), "metadata": {
                **emu.get("pods", "proxy", "default")["metadata"], "name": f"proxy-{k}", "uid": ""}}, "default")
    emu.faults.add("403", "get:daemonsets.apps", times=-1)
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=0))
    time.sleep(1.5)  # many passes (resync 0.1 s)
    assert awake(emu, machines, "n") and not [a for _, a, _ in ctl.actions if a == "sleep"]
    # One read per DaemonSet per failure TTL, not one per pod and pass.
    assert len([op for _, op in emu.faults.log if op == "get:daemonsets.apps"]) == 1
    assert ctl.workload_pods_on("n") is None  # the last check reads afresh
    assert len([op for _, op in emu.faults.log if op == "get:daemonsets.apps"]) == 2
    emu.faults.clear()
    wait_until(lambda: asleep(emu, machines, "n"), 20, "asleep once the DaemonSet can be read (10 s failure TTL)")


def test_the_last_check_before_a_sleep_reads_the_daemonset_afresh(emu):
    """The planning passes trust a DaemonSet read for a minute; the check right before the switch does not: a
    DaemonSet deleted and made again (a new uid) since no longer vouches for the old pod."""
    from joulesched.cluster.kube.objects import parse_pod
    from joulesched.live.daemonsets import DaemonSetCheck

    emu.add_node("n", cpu="4")
    pod = parse_pod(emu.add_pod("proxy", cpu="50m", node_name="n", owner="DaemonSet"))
    check = DaemonSetCheck(api_client_for(emu.url), timeout_s=5)
    assert check.keeps_no_node_awake(pod) is True
    ds = emu.get("daemonsets.apps", "proxy-owner", "default")
    emu.delete("daemonsets.apps", "default", "proxy-owner")
    emu.add_object("daemonsets.apps", {**ds, "metadata": {"name": "proxy-owner"}}, "default")
    assert check.keeps_no_node_awake(pod) is True  # the passes' cached read
    assert check.keeps_no_node_awake(pod, fresh=True) is False
    assert check.keeps_no_node_awake(pod) is False  # and the fresh answer replaces it
    assert check.keeps_no_node_awake(replace(pod, daemonset=())) is False  # a DaemonSet reference, not the controller
    assert check.keeps_no_node_awake(replace(pod, mirror=True)) is True


def test_a_pod_whose_daemonset_is_not_confirmed_is_not_evicted():
    from joulesched.cluster.kube.objects import parse_pod
    from joulesched.live.nodepower import eviction_blocker

    pod = make_pod("web", cpu="100m", node_name="n", owner="DaemonSet")
    assert "DaemonSet" in eviction_blocker(parse_pod(pod))
    assert eviction_blocker(parse_pod(make_pod("web", cpu="100m", node_name="n", owner="ReplicaSet"))) == ""


@pytest.mark.parametrize("selector,labels,pdb,ds", [
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True, True),
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["0"]}]}, {"a": "1"}, False, False),  # node-only
    ({"matchExpressions": [{"key": "a", "operator": "Bogus", "values": ["9"]}]}, {"a": "1"}, False, False),
    ({}, {"a": "1"}, True, False),  # empty: a PDB's selects every pod, a DaemonSet's none
    (None, {"a": "1"}, False, False),
    ({"matchLabels": ["a"]}, {"a": "1"}, False, False),
])
def test_label_selectors_know_only_their_own_operators(selector, labels, pdb, ds):
    from joulesched.cluster.kube.objects import selector_matches

    assert selector_matches(selector, labels, empty_matches=True) is pdb
    assert selector_matches(selector, labels, empty_matches=False) is ds


def _consolidating(emu, **kw) -> NodePowerController:
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=600, consolidate=True, consolidate_interval_s=0.3,
                                             restart_s=1, **kw), leader_elect=False, resync_s=0.05, settle_s=0.1,
                          retry_initial_s=30, retry_max_s=60.0, drain_timeout_s=5.0, sleep_timeout_s=5.0, poll_s=0.02,
                          lease_namespace="default")
    return NodePowerController(api_client_for(emu.url), make_actuator("none", ActuatorOptions()), cfg).start()


def test_consolidation_evicts_no_pod_whose_room_it_cannot_count_nor_more_than_a_pdb_allows(emu):
    """A review: a pod asking for a device plugin's resource was evicted to a node whose only one was in use (its
    replacement stayed Pending, its node asleep); and two pods under a PDB allowing one disruption were both
    planned, the second refused (429) after the first was restarted for nothing."""
    from tests.support.kube_emulator import make_node

    for n in "ab":
        node = make_node(n)
        for f in ("capacity", "allocatable"):
            node["status"][f]["example.com/dongle"] = "1"
        emu.add_object("nodes", node)
    emu.add_node("c")

    def dongle(name: str, node: str, owner: str) -> dict:
        p = make_pod(name, cpu="500m", node_name=node, owner=owner, scheduler_name="default-scheduler")
        p["spec"]["containers"][0]["resources"]["requests"]["example.com/dongle"] = "1"
        return p

    emu.add_object("pods", dongle("pin", "b", ""), "default")  # b's dongle in use; b is no candidate
    emu.add_object("pods", dongle("d-1", "a", "ReplicaSet"), "default")
    emu.add_pod("hold", cpu="1", node_name="c")  # c is no candidate either
    for k in (1, 2):
        emu.add_pod(f"web-{k}", cpu="100m", node_name="c", owner="ReplicaSet", labels={"app": "web"},
                    scheduler_name="default-scheduler")
    emu.add_pdb("web", match_labels={"app": "web"}, max_unavailable=1)
    ctl = _consolidating(emu)
    time.sleep(2.0)
    ctl.stop()
    assert emu.evictions == [] and not any(a == "drain" for _, a, _ in ctl.actions)


def test_a_drain_backs_off_and_two_drains_never_outrun_the_eviction_budget(emu):
    """A review: evictions were counted when a drain ended, so a second drain planned meanwhile took 4 of a budget
    of 3; one drain at a time now."""
    for n in "abc":
        emu.add_node(n)
    emu.add_pod("pin", cpu="1", node_name="c")
    for n in "ab":
        for k in (1, 2):
            emu.add_pod(f"{n}-web-{k}", cpu="500m", node_name=n, owner="ReplicaSet", scheduler_name="default-scheduler")
    emu.faults.add("slow", "create-eviction:pods", times=-1, delay_s=0.6)
    ctl = _consolidating(emu, max_evictions_per_hour=3)
    time.sleep(3.0)
    ctl.stop()
    assert 0 < len(emu.evictions) <= 3, emu.evictions
