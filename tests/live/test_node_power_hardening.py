"""The node power controller's fixes from a safety review (2026-12-07), on the API emulator: consolidation moves
no pod whose place depends on other pods, that is terminating, or whose volume could not be read, and no pod to
an empty node; it waits while a drain's pods are not placed; a node whose wake timed out but came up is woken
again; a cordon mark someone lifted is dropped; the hourly sleep cap survives a new term and is checked and
counted at once; a lost Lease read is no renewal; a new term forgets when nodes emptied; an annotated BMC named
the other way from the rest is refused; Rufio power-off Jobs another process left are withdrawn."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.kube.objects import parse_pod
from joulesched.cluster.nodepower import (
    ASLEEP_TAINT,
    CORDONED_ANNOTATION,
    NEVER_SLEEP_ANNOTATION,
    POWER_SINCE_ANNOTATION,
    POWER_STATE_ANNOTATION,
    PowerPolicy,
)
from joulesched.live.actuators import ActuatorOptions, make_actuator
from joulesched.live.actuators.access import AddressPolicy
from joulesched.live.nodepower import NodePowerConfig, NodePowerController, _NodeRec, eviction_blocker
from tests.live.conftest import wait_until
from tests.live.test_delegate_actuators import (  # noqa: F401 (owners: a fixture)
    JOBS,
    Owner,
    _actuator,
    _add_machine,
    _target,
    owners,
    rufio,
)
from tests.live.test_node_power import add_nodes, awake, kubelets, machines, make_controller, pstate  # noqa: F401
from tests.support.kube_emulator import make_pod


# ---- what consolidation may evict ----
def _pod(**spec) -> dict:
    p = make_pod("web", owner="ReplicaSet", node_name="a")
    p["spec"].update(spec)
    return p


@pytest.mark.parametrize("spec", [
    {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}},
    {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}},
    {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                    "labelSelector": {"matchLabels": {"app": "web"}}}]},
])
def test_a_pod_placed_by_the_other_pods_is_not_evicted(spec):
    # A replica with hostname anti-affinity "fitted" a node holding its sibling: evicted, it stayed Pending.
    assert eviction_blocker(parse_pod(_pod(**spec))) == "inter-pod (anti-)affinity or topology spread"


@pytest.mark.parametrize("spec", [
    {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"labelSelector": {}, "topologyKey": "kubernetes.io/hostname"}}]}}},
    {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]},
])
def test_preferences_alone_do_not_block_an_eviction(spec):
    assert eviction_blocker(parse_pod(_pod(**spec))) == ""


def test_a_terminating_pod_is_not_evicted_again():
    p = _pod()
    p["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    assert eviction_blocker(parse_pod(p)) == "terminating"


def _consolidator(emu, addresses: dict[str, str], **policy) -> NodePowerController:
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=600, consolidate=True, consolidate_interval_s=0.2,
                                             restart_s=1, **policy), leader_elect=False, resync_s=0.05,
                          settle_s=0.1, retry_initial_s=30, retry_max_s=60.0, drain_timeout_s=5.0,
                          sleep_timeout_s=5.0, poll_s=0.02, lease_namespace="default", addresses=addresses)
    return NodePowerController(api_client_for(emu.url), make_actuator("none", ActuatorOptions()), cfg).start()


def test_pods_move_to_a_node_that_stays_awake_never_to_one_about_to_sleep(emu):
    """b is empty and may sleep: moving a's pod there would only swap which node sleeps, after a restart (and b
    could sleep before the pod's replacement is made). Once b never sleeps, the move is worth it."""
    for n in "ab":
        emu.add_node(n)
    emu.add_pod("web", cpu="500m", node_name="a", owner="ReplicaSet", scheduler_name="default-scheduler")
    ctl = _consolidator(emu, {"a": "none", "b": "none"})
    try:
        time.sleep(1.5)
        assert emu.evictions == [] and not any(a == "drain" for _, a, _ in ctl.actions)
        emu.patch("nodes", "", "b", {"metadata": {"annotations": {NEVER_SLEEP_ANNOTATION: "true"}}})
        wait_until(lambda: emu.evictions, 10, "a's pod evicted toward b")
    finally:
        ctl.stop()


def test_no_pod_is_moved_whose_volume_could_not_be_read_nor_while_a_pod_is_pending(emu):
    for n in "abc":
        emu.add_node(n)
    emu.add_pod("hold", cpu="100m", node_name="b", scheduler_name="default-scheduler")  # no controller: stays
    emu.add_pod("stateful", cpu="100m", node_name="a", owner="StatefulSet", scheduler_name="default-scheduler",
                volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}])  # no such claim
    ctl = _consolidator(emu, {n: "none" for n in "abc"})
    try:
        time.sleep(1.5)  # its PV may pin it to a: unreadable is no licence to evict
        assert emu.evictions == []
        emu.delete("pods", "default", "stateful")
        emu.add_pod("late", cpu="100m", scheduler_name="default-scheduler")  # fits, not yet placed
        emu.add_pod("huge", cpu="100", scheduler_name="default-scheduler")  # fits no node: holds nothing
        emu.add_pod("web", cpu="100m", node_name="a", owner="ReplicaSet", scheduler_name="default-scheduler")
        time.sleep(1.5)  # a drain's replacements would count the room of a pending pod as free
        assert emu.evictions == []
        emu.delete("pods", "default", "late")
        wait_until(lambda: emu.evictions, 10, "web evicted once no pending pod fits a node")
    finally:
        ctl.stop()


# ---- waking, cordons, the cap, leases, terms ----
def test_a_node_whose_wake_timed_out_but_came_up_is_woken_again(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["a"])  # its machine is running: the wake "failed" but the boot finished later
    emu.patch("nodes", "", "a", {"metadata": {"annotations": {
        POWER_STATE_ANNOTATION: "asleep", CORDONED_ANNOTATION: "true",
        "joulesched.io/wake-failed": "2026-12-07T10:00:00Z"}},
        "spec": {"unschedulable": True, "taints": [{"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})
    wait_until(lambda: emu.get("nodes", "a")["status"]["conditions"], 10)
    make_controller(PowerPolicy(sleep_after_s=600))
    wait_until(lambda: awake(emu, machines, "a"), 15, "a counted awake, uncordoned and untainted")
    assert "joulesched.io/wake-failed" not in emu.get("nodes", "a")["metadata"]["annotations"]


def test_a_cordon_mark_someone_lifted_is_dropped_so_a_later_cordon_is_theirs(emu, machines, kubelets,
                                                                             make_controller):
    add_nodes(emu, machines, ["a"])
    emu.add_pod("web", cpu="100m", node_name="a", owner="ReplicaSet", scheduler_name="default-scheduler")
    # We had cordoned it; an operator uncordoned it (the mark stays on the node).
    emu.patch("nodes", "", "a", {"metadata": {"annotations": {CORDONED_ANNOTATION: "true"}}})
    make_controller(PowerPolicy(sleep_after_s=600))
    wait_until(lambda: CORDONED_ANNOTATION not in emu.get("nodes", "a")["metadata"]["annotations"], 10,
               "the stale mark removed")
    assert not emu.get("nodes", "a")["spec"].get("unschedulable")


def _asleep_since_ten_minutes(emu, machines, node: str) -> None:
    """``node`` put to sleep ten minutes ago by another leader: its machine saved, the node marked so."""
    machines.lookup(node).managedSave(0)
    since = (datetime.now(timezone.utc) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    emu.patch("nodes", "", node, {"metadata": {"annotations": {POWER_STATE_ANNOTATION: "asleep",
                                                               POWER_SINCE_ANNOTATION: since,
                                                               CORDONED_ANNOTATION: "true"}},
                                  "spec": {"unschedulable": True, "taints": [
                                      {"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})


def test_a_new_term_counts_the_last_hours_sleeps_the_nodes_show(emu, machines, kubelets, make_controller):
    """A restarted controller started from an empty hour: with max_sleeps_per_hour 1 and a node put to sleep
    ten minutes ago by the last leader, an idle node must wait."""
    add_nodes(emu, machines, ["a", "b"])
    _asleep_since_ten_minutes(emu, machines, "b")
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2), max_sleeps_per_hour=1)
    time.sleep(2.0)
    assert pstate(emu, "a") == "awake" and not any(a == "sleep" for _, a, _ in ctl.actions)
    assert len(ctl._sleep_cap.started) == 1


def test_the_sleep_cap_is_checked_and_counted_in_one_step(emu):
    cfg = NodePowerConfig(leader_elect=False, max_sleeps_per_hour=1, lease_namespace="default")
    ctl = NodePowerController(api_client_for(emu.url), make_actuator("none", ActuatorOptions()), cfg)
    try:
        ran = []
        assert ctl._start("a", "sleep", ran.append, capped=True)
        assert not ctl._start("b", "sleep", ran.append, capped=True)  # a second caller finds no room left
        wait_until(lambda: ran == ["a"], 5, "a's sleep ran")
    finally:
        ctl._sleep_pool.shutdown()


def test_an_unread_lease_is_no_reference_for_a_renewal(emu, monkeypatch):
    """The Lease read failed once ("" kept as the reference), then read the stale renewTime of a machine that is
    off: that looked like a renewal after the failed sleep, and the node was uncordoned."""
    cfg = NodePowerConfig(leader_elect=False, sleep_timeout_s=1.0, lease_namespace="default")
    ctl = NodePowerController(api_client_for(emu.url), make_actuator("none", ActuatorOptions()), cfg)
    try:
        reads = iter(["", "2026-12-07T10:00:00Z", "2026-12-07T10:00:00Z"])
        monkeypatch.setattr(ctl, "_heartbeat", lambda name: ("", next(reads)))
        ctl._recs["a"] = _NodeRec(sleep_failed_at=ctl.clock() - 10)
        assert [ctl._alive_after_failed_sleep("a") for _ in range(3)] == [False, False, False]
    finally:
        ctl._sleep_pool.shutdown()


def test_a_new_term_forgets_when_nodes_emptied(emu):
    """Frozen while standing by, an old empty_since let a node that ran pods under another leader sleep at once,
    without its sleep_after_s."""
    emu.add_node("a")
    cfg = NodePowerConfig(leader_elect=False, lease_namespace="default", resync_s=0.05)
    ctl = NodePowerController(api_client_for(emu.url), make_actuator("none", ActuatorOptions()), cfg)
    ctl._recs["a"] = _NodeRec(empty_since=ctl.clock() - 3600)
    ctl.start()
    try:
        wait_until(lambda: ctl._leading_since is not None, 5, "leading")
        assert ctl._recs["a"].empty_since is None or ctl._recs["a"].empty_since > ctl._leading_since - 1
    finally:
        ctl.stop()


# ---- addresses ----
def test_an_annotated_bmc_named_the_other_way_from_the_map_is_refused():
    """The map names x's BMC bmc-x.example; a worker's annotation reached it by its IP, inside the allowed CIDR."""
    pol = AddressPolicy.from_options(["redfish=10.0.9.0/24"])
    evil = "redfish://10.0.9.7/redfish/v1/Systems/1"
    out = pol.resolve_all({"x": ("", ""), "m": (evil, "")}, {"x": "redfish://bmc-x.example/redfish/v1/Systems/1"})
    assert out["x"].address is not None and out["m"].address is None
    assert "both by IP address and by host name" in out["m"].refused
    # Named one way throughout, the annotation is used.
    out = pol.resolve_all({"x": ("", ""), "m": (evil, "")}, {"x": "redfish://10.0.9.8/redfish/v1/Systems/1"})
    assert out["m"].address is not None and out["m"].source == "annotation"


# ---- Rufio ----
def test_rufio_power_off_jobs_left_by_another_process_are_withdrawn(emu):
    """After a failover the new leader's actuator knew no Job of the old one's: "withdrawn" while Rufio would still
    run it once back, switching off the node that had been uncordoned and given pods."""
    from joulesched.live.actuators.base import ActionAborted

    _add_machine(emu)
    old = _actuator(emu, "rufio")
    with pytest.raises(ActionAborted):  # Rufio is down: the soft off is never run
        old.sleep(_target("rufio://tink/worker-2", "worker-2", within_s=0.5))
    emu.add_object(JOBS, {"apiVersion": "bmc.tinkerbell.org/v1alpha1", "kind": "Job",  # someone else's: kept
                          "metadata": {"name": "operator-off", "namespace": "tink"},
                          "spec": {"machineRef": {"name": "worker-2", "namespace": "tink"},
                                   "tasks": [{"powerAction": "off"}]}}, "tink")
    new = _actuator(emu, "rufio")
    new.cancel_sleep(_target("rufio://tink/worker-2", "worker-2"))
    assert [j["metadata"]["name"] for j in emu.list(JOBS)] == ["operator-off"]


# ---- second look (a review of the fixes above) ----
def test_a_rufio_wake_goes_on_when_its_jobs_cannot_be_listed(emu, owners):
    """The wake withdraws old power-off Jobs first; a list refused (a Role without `list`, an apiserver hiccup) must
    not keep the pods waiting. Withdrawing a failed sleep still needs the list (the node stays cordoned)."""
    from joulesched.live.actuators.base import ON, ActuatorError

    _add_machine(emu)
    act, t = _actuator(emu, "rufio"), _target("rufio://tink/worker-2", "worker-2")
    owners.append(Owner(rufio(emu)))

    def refused(*args, **kw):
        raise ActuatorError("worker-2: list jobs in tink: HTTP 403 Forbidden")

    act.actuator.objects.list = refused  # (make_actuator's wrapper holds the Rufio actuator)
    act.sleep(t)
    act.wake(t)
    assert act.state(t) == ON
    with pytest.raises(ActuatorError, match="403"):
        act.cancel_sleep(t)


def test_a_failed_wake_of_a_node_without_an_address_is_not_retried_in_a_loop(emu, machines, kubelets,
                                                                          make_controller):
    """A Ready node asleep with wake-failed but no usable power address: the resume started a wake that found no
    target, returned at once, and was started again at the next pass, a hundred times a second."""
    emu.add_node("a")  # no machine: not in the address map
    emu.patch("nodes", "", "a", {"metadata": {"annotations": {
        POWER_STATE_ANNOTATION: "asleep", CORDONED_ANNOTATION: "true",
        "joulesched.io/wake-failed": "2026-12-07T10:00:00Z"}}, "spec": {"unschedulable": True}})
    ctl = make_controller(PowerPolicy(sleep_after_s=600))
    time.sleep(1.0)
    assert not any(a == "wake" for _, a, _ in ctl.actions)


def test_the_last_hours_sleeps_are_counted_once_over_several_terms(emu, machines, kubelets, make_controller):
    add_nodes(emu, machines, ["b"])
    _asleep_since_ten_minutes(emu, machines, "b")
    ctl = make_controller(PowerPolicy(sleep_after_s=600), max_sleeps_per_hour=3)
    wait_until(lambda: len(ctl._sleep_cap.started) == 1, 5, "b's sleep counted")
    for _ in range(2):  # the Lease lost and held again: the same sleep is not counted again
        ctl._seed_cap = True
        wait_until(lambda: not ctl._seed_cap, 5, "a new term's pass")
    assert len(ctl._sleep_cap.started) == 1


def test_an_annotated_bmc_named_as_the_map_names_them_is_used():
    pol = AddressPolicy.from_options(["redfish=bmc-m.example"])
    out = pol.resolve_all({"x": ("", ""), "m": ("redfish://bmc-m.example/redfish/v1/Systems/1", "")},
                          {"x": "redfish://bmc-x.example/redfish/v1/Systems/1"})
    assert out["m"].address is not None
