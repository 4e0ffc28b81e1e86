"""The metal3 and rufio actuators on the API emulator, which serves BareMetalHost (metal3.io/v1alpha1) and
Rufio's Machine and Job (bmc.tinkerbell.org/v1alpha1). A thread in each test plays the owner of the BMCs:
the Bare Metal Operator (status.poweredOn follows spec.online) or Rufio (a Job's power action changes the
Machine's status.powerState and sets the Job's Completed or Failed condition). Last, each drives the node
power controller end to end: an idle node sleeps through its owner's object, a pending pod wakes it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from joulesched.cluster.kube.client import api_client_for
from joulesched.live.actuators import ActuatorOptions, make_actuator
from joulesched.live.actuators.access import AddressPolicy
from joulesched.live.actuators.base import OFF, ON, TRANSITIONING, ActionAborted, ActuatorError, AddressError, \
    Target, parse_address
from tests.live.conftest import wait_until

BMH = "baremetalhosts.metal3.io"
MACHINES, JOBS = "machines.bmc.tinkerbell.org", "jobs.bmc.tinkerbell.org"


class Owner:
    """Runs ``step()`` every 20 ms on its own thread until stopped (the operator behind the custom resources)."""

    def __init__(self, step: Callable[[], None]) -> None:
        self.step, self._stop = step, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.step()

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    made: list[Owner] = []
    yield made
    for o in made:
        o.stop()


def _target(address: str, node: str = "worker-1", within_s: float = 10.0) -> Target:
    return Target(node, parse_address(address), deadline=time.monotonic() + within_s)


def _actuator(emu, name: str, **kw):
    return make_actuator(name, ActuatorOptions(kube_api=api_client_for(emu.url), poll_s=0.02, **kw))


# ---- Metal3 ----
def _add_host(emu, name: str = "worker-1", online: bool = True, **status) -> None:
    emu.add_object(BMH, {"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost", "metadata": {"name": name},
                         "spec": {"online": online, "bmc": {"address": "redfish://10.0.9.7/redfish/v1/Systems/1"}},
                         "status": {"poweredOn": online, "operationalStatus": "OK", **status}}, "metal3")


def bare_metal_operator(emu) -> Callable[[], None]:
    def step():
        for h in emu.list(BMH):
            if h["status"].get("poweredOn") != h["spec"]["online"]:
                emu.patch_status(BMH, "metal3", h["metadata"]["name"],
                                 {"status": {"poweredOn": h["spec"]["online"]}}, strategic=False)
    return step


def test_metal3_sleeps_by_spec_online_and_waits_for_powered_off(emu, owners):
    _add_host(emu)
    act, t = _actuator(emu, "metal3"), _target("metal3://metal3/worker-1")
    assert act.state(t) == ON
    owners.append(Owner(bare_metal_operator(emu)))
    act.sleep(t)
    host = emu.get(BMH, "worker-1", "metal3")
    assert host["spec"]["online"] is False and host["status"]["poweredOn"] is False
    assert host["spec"]["bmc"]["address"].startswith("redfish://")  # a merge patch: the rest is the operator's
    assert act.state(t) == OFF
    act.wake(t)
    assert emu.get(BMH, "worker-1", "metal3")["spec"]["online"] is True
    wait_until(lambda: act.state(t) == ON, what="the operator powering the host on")


def test_metal3_reports_transitioning_and_stops_at_the_deadline(emu):
    _add_host(emu)
    act = _actuator(emu, "metal3")
    with pytest.raises(ActionAborted):  # no operator: poweredOn never follows
        # (1 s: room for the host's read and the patch on a loaded machine, before the deadline runs out)
        act.sleep(_target("metal3://metal3/worker-1", within_s=1.0))
    assert emu.get(BMH, "worker-1", "metal3")["spec"]["online"] is False
    assert act.state(_target("metal3://metal3/worker-1")) == TRANSITIONING


def test_metal3_refuses_missing_detached_and_failing_hosts(emu):
    act = _actuator(emu, "metal3")
    with pytest.raises(ActuatorError, match="HTTP 404"):
        act.sleep(_target("metal3://metal3/nowhere"))
    _add_host(emu, "detached", operationalStatus="detached")
    with pytest.raises(ActuatorError, match="detached"):
        act.wake(_target("metal3://metal3/detached", "detached"))
    _add_host(emu, "broken", errorType="power management error", errorMessage="BMC unreachable")
    with pytest.raises(ActuatorError, match="BMC unreachable"):
        act.sleep(_target("metal3://metal3/broken", "broken"))
    assert emu.get(BMH, "detached", "metal3")["spec"]["online"] is True  # nothing was patched


# ---- Rufio ----
def _add_machine(emu, name: str = "worker-2", power: str = "on") -> None:
    emu.add_object(MACHINES, {"apiVersion": "bmc.tinkerbell.org/v1alpha1", "kind": "Machine",
                              "metadata": {"name": name},
                              "spec": {"connection": {"host": "10.0.9.8", "port": 623,
                                                      "authSecretRef": {"name": "bmc", "namespace": "tink"}}},
                              "status": {"powerState": power}}, "tink")


def rufio(emu, refuse: tuple[str, ...] = ()) -> Callable[[], None]:
    """Rufio's Job controller: runs each new Job's power action (those in ``refuse`` fail)."""
    def step():
        for job in emu.list(JOBS):
            if (job.get("status") or {}).get("conditions"):
                continue
            action = job["spec"]["tasks"][0]["powerAction"]
            ref = job["spec"]["machineRef"]
            if action in refuse:
                cond = {"type": "Failed", "status": "True", "message": f"{action}: not supported by this BMC"}
            else:
                emu.patch_status(MACHINES, ref["namespace"], ref["name"],
                                 {"status": {"powerState": "on" if action == "on" else "off"}}, strategic=False)
                cond = {"type": "Completed", "status": "True"}
            emu.patch_status(JOBS, job["metadata"]["namespace"], job["metadata"]["name"],
                             {"status": {"conditions": [cond]}}, strategic=False)
    return step


def test_rufio_sleeps_with_a_soft_power_job_and_wakes_with_an_on_job(emu, owners):
    _add_machine(emu)
    act, t = _actuator(emu, "rufio"), _target("rufio://tink/worker-2", "worker-2")
    owners.append(Owner(rufio(emu)))
    act.sleep(t)
    assert emu.get(MACHINES, "worker-2", "tink")["status"]["powerState"] == "off" and act.state(t) == OFF
    jobs = [j for _, j in emu.changes(JOBS) if j]
    made = {j["metadata"]["name"]: j for j in jobs}
    assert [j["spec"]["tasks"] for j in made.values()] == [[{"powerAction": "soft"}]]  # graceful, nothing else
    (job,) = made.values()
    assert job["spec"]["machineRef"] == {"name": "worker-2", "namespace": "tink"}
    assert job["metadata"]["name"].startswith("joulesched-worker-2-soft-")
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "joulesched"
    assert emu.list(JOBS) == []  # a completed Job is deleted
    act.wake(t)
    assert act.state(t) == ON
    assert emu.list(JOBS) == []


def test_rufio_falls_back_to_a_hard_off_only_when_allowed(emu, owners):
    _add_machine(emu)
    owners.append(Owner(rufio(emu, refuse=("soft",))))
    with pytest.raises(ActuatorError, match="soft power-off failed: soft: not supported"):
        _actuator(emu, "rufio", force_off=False).sleep(_target("rufio://tink/worker-2", "worker-2"))
    assert emu.get(MACHINES, "worker-2", "tink")["status"]["powerState"] == "on"
    act, t = _actuator(emu, "rufio"), _target("rufio://tink/worker-2", "worker-2")
    act.sleep(t)
    assert act.state(t) == OFF
    left = emu.list(JOBS)  # the failed soft Jobs stay for the operator to read; the hard off was deleted
    assert {j["spec"]["tasks"][0]["powerAction"] for j in left} == {"soft"}
    assert all(j["status"]["conditions"][0]["type"] == "Failed" for j in left) and len(left) == 2


def test_rufio_power_off_jobs_a_sleep_gave_up_on_are_withdrawn(emu, owners):
    """Rufio is down: the sleep's soft Job is never run and the sleep gives up at its deadline. Left there, Rufio
    would run it once back, whatever became of the node: cancel_sleep deletes it, and so does a wake before its
    own Job. A Job that ended is not touched (a failed one stays for the operator to read)."""
    _add_machine(emu)
    act, t = _actuator(emu, "rufio"), _target("rufio://tink/worker-2", "worker-2")
    with pytest.raises(ActionAborted):
        act.sleep(_target("rufio://tink/worker-2", "worker-2", within_s=0.5))
    (job,) = emu.list(JOBS)
    assert job["spec"]["tasks"] == [{"powerAction": "soft"}]
    act.cancel_sleep(t)
    assert emu.list(JOBS) == []
    act.cancel_sleep(t)  # nothing left to withdraw: no request fails
    with pytest.raises(ActionAborted):
        act.sleep(_target("rufio://tink/worker-2", "worker-2", within_s=0.5))
    with pytest.raises(ActionAborted):  # Rufio still down: the wake's own Job waits too
        act.wake(_target("rufio://tink/worker-2", "worker-2", within_s=0.5))
    assert [j["spec"]["tasks"] for j in emu.list(JOBS)] == [[{"powerAction": "on"}]]  # the soft one went first
    act.cancel_sleep(t)  # a power-on Job is no sleep's: it stays
    assert len(emu.list(JOBS)) == 1
    emu.delete(JOBS, "tink", emu.list(JOBS)[0]["metadata"]["name"])
    owners.append(Owner(rufio(emu, refuse=("soft",))))
    refused = _actuator(emu, "rufio", force_off=False)
    with pytest.raises(ActuatorError, match="not supported"):
        refused.sleep(t)
    refused.cancel_sleep(t)
    assert [j["status"]["conditions"][0]["type"] for j in emu.list(JOBS)] == ["Failed"]


def test_rufio_wake_failure_and_missing_machine_are_errors(emu, owners):
    _add_machine(emu, power="off")
    owners.append(Owner(rufio(emu, refuse=("on",))))
    act = _actuator(emu, "rufio")
    with pytest.raises(ActuatorError, match="power-on failed: on: not supported"):
        act.wake(_target("rufio://tink/worker-2", "worker-2"))
    with pytest.raises(ActuatorError, match="HTTP 404"):
        act.state(_target("rufio://tink/nowhere", "nowhere"))


# ---- addresses and who may name them ----
@pytest.mark.parametrize("text", ["metal3://metal3", "rufio:///worker-1", "metal3://ns/a/b"])
def test_object_addresses_need_a_namespace_and_a_name(text):
    with pytest.raises(AddressError, match="NAMESPACE/NAME"):
        parse_address(text)


def test_auto_dispatches_to_the_owner_and_one_actuator_refuses_the_other(emu, owners):
    _add_host(emu)
    owners.append(Owner(bare_metal_operator(emu)))
    auto = _actuator(emu, "auto")
    auto.sleep(_target("metal3://metal3/worker-1"))
    assert emu.get(BMH, "worker-1", "metal3")["status"]["poweredOn"] is False
    with pytest.raises(AddressError, match="not one for the rufio actuator"):
        _actuator(emu, "rufio").sleep(_target("metal3://metal3/worker-1"))


def test_an_annotation_names_only_its_own_object_in_an_allowed_namespace():
    policy = AddressPolicy.from_options(["metal3=metal3", "rufio=*"])
    got = policy.resolve_all({"worker-1": ("metal3://metal3/worker-1", ""),
                              "worker-2": ("metal3://metal3/worker-9", ""),      # another host
                              "worker-3": ("metal3://kube-system/worker-3", ""),  # namespace not allowed
                              "worker-4": ("rufio://tink/worker-4", "")}, {})
    assert got["worker-1"].address is not None and got["worker-4"].address is not None
    assert "own name" in got["worker-2"].refused
    assert "not in the metal3 allow-list" in got["worker-3"].refused
    nothing = AddressPolicy.from_options([]).resolve_all({"worker-1": ("metal3://metal3/worker-1", "")}, {})
    assert nothing["worker-1"].address is None  # by default no annotation is used
    mapped = AddressPolicy.from_options([]).resolve_all({"w": ("", "")}, {"w": "rufio://tink/machine-17"})
    assert mapped["w"].address.path == "machine-17"  # the operator's map may name any object


# ---- through the node power controller ----
OWNERS = {  # actuator -> (address, add the object, the owner's step, is the machine on?, did we ask for on?)
    "metal3": ("metal3://metal3/worker-1", lambda emu: _add_host(emu), bare_metal_operator,
               lambda emu: emu.get(BMH, "worker-1", "metal3")["status"]["poweredOn"],
               lambda emu: emu.get(BMH, "worker-1", "metal3")["spec"]["online"]),
    "rufio": ("rufio://tink/worker-1", lambda emu: _add_machine(emu, "worker-1"), rufio,
              lambda emu: emu.get(MACHINES, "worker-1", "tink")["status"]["powerState"] == "on",
              lambda emu: [j["spec"]["tasks"][0]["powerAction"] for _, j in emu.changes(JOBS) if j][-1] == "on"),
}


@pytest.mark.parametrize("actuator", sorted(OWNERS))
def test_the_controller_sleeps_and_wakes_through_the_owner(emu, owners, actuator):
    """An idle node sleeps through its owner's object and a pending pod wakes it; the owner's thread also plays
    the node's kubelet (Ready and its Lease follow the machine's power)."""
    from joulesched.cluster.nodepower import ASLEEP_TAINT, POWER_STATE_ANNOTATION, PowerPolicy
    from joulesched.live.nodepower import NodePowerConfig, NodePowerController
    from tests.live.test_node_power import CTL_FAST

    address, add, owner, powered, asked_on = OWNERS[actuator]
    emu.add_node("worker-1")
    add(emu)
    operate = owner(emu)

    def operator_and_kubelet():
        operate()
        on = powered(emu)
        ready = [c for c in emu.get("nodes", "worker-1")["status"]["conditions"] if c["type"] == "Ready"]
        if (ready[0]["status"] == "True") != on:
            emu.set_node_ready("worker-1", on)
        if on:
            emu.renew_node_lease("worker-1")

    owners.append(Owner(operator_and_kubelet))
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=0.3, min_awake=0),
                          **{**CTL_FAST, "leader_elect": False, "addresses": {"worker-1": address}})
    ctl = NodePowerController(api_client_for(emu.url), _actuator(emu, actuator), cfg).start()
    try:
        def state():
            return (emu.get("nodes", "worker-1")["metadata"].get("annotations") or {}).get(POWER_STATE_ANNOTATION)

        wait_until(lambda: state() == "asleep", 15, "worker-1 asleep")
        assert not powered(emu)
        emu.add_pod("needs-a-node", cpu="1", scheduler_name="default-scheduler")
        wait_until(lambda: state() == "awake", 15, "worker-1 woken for the pending pod")
        assert powered(emu) and asked_on(emu)
        node = emu.get("nodes", "worker-1")
        assert not node["spec"].get("unschedulable")
        assert not any(t["key"] == ASLEEP_TAINT for t in node["spec"].get("taints") or [])
    finally:
        ctl.stop()
