"""A sleep that fails after the machine accepted its power-off: the machine may still be going down (an OS
shutting down reads "on" at its BMC until it is off), so the controller must not take that "on" as proof that
it kept running and uncordon it for pods that would then die with it. Each actuator marks the errors raised
after its power-off request (``off_requested``); errors before it stay unmarked (a refused request switched
nothing)."""

from __future__ import annotations

import pytest

from joulesched.cluster.nodepower import ASLEEP_TAINT, PowerPolicy
from joulesched.live.actuators.base import ON, ActuatorError, Target, after_power_off, off_requested, parse_address
from tests.live.conftest import wait_until
from tests.live.test_node_power import add_nodes, events, kubelets, machines, make_controller, pstate  # noqa: F401


class _OffThenError:
    """GracefulShutdown accepted, then a poll of the BMC fails; the OS is shutting down and the BMC reads On."""

    name = "redfish"

    def __init__(self, marked: bool) -> None:
        self.marked = marked

    def sleep(self, target) -> None:
        if self.marked:
            with after_power_off():
                raise ActuatorError(f"{target.node}: Redfish power off: ConnectionError")
        raise ActuatorError(f"{target.node}: Redfish power off: BadRequestError (HTTP 400)")

    def wake(self, target) -> None:
        pass

    def state(self, target) -> str:
        return ON


@pytest.mark.parametrize("marked", [True, False])
def test_a_sleep_failing_after_an_accepted_power_off_keeps_the_node_cordoned(emu, machines, kubelets,
                                                                             make_controller, marked):
    add_nodes(emu, machines, ["a"])
    ctl = make_controller(PowerPolicy(sleep_after_s=0.1), start=False, retry_initial_s=30.0, retry_max_s=30.0)
    ctl.actuator = _OffThenError(marked)
    ctl.start()
    # The node is patched before the Event is posted: what it holds now is what the failure left.
    wait_until(lambda: events(emu, "NodeSleepFailed"), 10, "a NodeSleepFailed event")
    node = emu.get("nodes", "a")
    tainted = any(t["key"] == ASLEEP_TAINT for t in node["spec"].get("taints") or [])
    if marked:  # going down, maybe: no pod may land on it
        assert pstate(emu, "a") == "sleeping" and node["spec"].get("unschedulable") is True and tainted
        assert "kept cordoned" in events(emu, "NodeSleepFailed")[0]["message"]
    else:  # refused before anything was switched: "on" is the truth, the node goes back to work
        assert pstate(emu, "a") == "awake" and not node["spec"].get("unschedulable") and not tainted


def _target(addr: str) -> Target:
    return Target("n1", parse_address(addr))


class _FakeSystem:
    def __init__(self, reset: str) -> None:
        import sushy

        self.power_state = sushy.PowerState.ON
        self.reset = reset

    def get_allowed_reset_system_values(self) -> set:
        import sushy

        return set(sushy.ResetType)

    def reset_system(self, kind) -> None:
        import sushy

        if self.reset == "refused":  # an HTTP error: the BMC answered
            raise sushy.exceptions.SushyError("refused")
        if self.reset == "lost":  # accepted, and the answer timed out
            raise sushy.exceptions.ConnectionError(url="https://bmc/redfish/v1/Systems/1", error="ReadTimeout")

    def refresh(self, force=False) -> None:
        import sushy

        raise sushy.exceptions.SushyError("BMC busy")


@pytest.mark.parametrize("reset, marked", [("accepted", True), ("refused", False), ("lost", True)])
def test_redfish_marks_the_errors_after_a_shutdown_it_may_have_done(monkeypatch, reset, marked):
    """A refused GracefulShutdown switched nothing off; an accepted one, or one whose answer was lost, may have."""
    pytest.importorskip("sushy")
    from joulesched.live.actuators import redfish

    system = _FakeSystem(reset)
    monkeypatch.setattr(redfish.sushy, "Sushy", lambda *a, **kw: type("Root", (), {
        "get_system": lambda self, path: system})())
    with pytest.raises(ActuatorError) as e:
        redfish.RedfishActuator(poll_s=0.01).sleep(_target("redfish://bmc/redfish/v1/Systems/1"))
    assert off_requested(e.value) is marked


@pytest.mark.parametrize("landed", [True, False])
def test_redfish_asks_before_a_forceoff_whether_a_pod_landed(monkeypatch, landed):
    """A review: up to the graceful timeout passes between the last pod check and ForceOff; a pod bound since (by
    spec.nodeName, or tolerating every taint) died with the machine. The target's before_force is asked first:
    a pod there stops the hard off, and the error is marked (the graceful shutdown was accepted)."""
    sushy = pytest.importorskip("sushy")
    from joulesched.live.actuators import redfish
    from joulesched.live.actuators.base import ActionAborted

    class StaysOn:
        power_state = sushy.PowerState.ON
        resets: list = []

        def get_allowed_reset_system_values(self) -> set:
            return set(sushy.ResetType)

        def reset_system(self, kind) -> None:
            self.resets.append(kind)
            if kind == sushy.ResetType.FORCE_OFF:
                self.power_state = sushy.PowerState.OFF

        def refresh(self, force=False) -> None:
            pass

    system = StaysOn()
    monkeypatch.setattr(redfish.sushy, "Sushy", lambda *a, **kw: type("Root", (), {
        "get_system": lambda self, path: system})())

    def before_force() -> None:
        if landed:
            raise ActionAborted("n1: pod default/web landed on it: no hard power-off")

    target = Target("n1", parse_address("redfish://bmc/redfish/v1/Systems/1"), before_force=before_force)
    act = redfish.RedfishActuator(poll_s=0.01, graceful_timeout_s=0.05)
    if landed:
        with pytest.raises(ActionAborted) as e:
            act.sleep(target)
        assert off_requested(e.value) and sushy.ResetType.FORCE_OFF not in system.resets
    else:
        act.sleep(target)
        assert system.resets[-1] == sushy.ResetType.FORCE_OFF


@pytest.mark.parametrize("fails, marked", [("before", False), ("shutdown", True), ("after", True)])
def test_ipmi_marks_the_errors_from_its_soft_off_request_on(monkeypatch, fails, marked):
    """An error before the soft off is sent is no power-off. One from the request itself is taken as possibly
    done: pyghmi does not tell a BMC that refused from one whose answer was lost. One after it, certainly."""
    pytest.importorskip("pyghmi")
    from pyghmi import exceptions as ipmi_exc

    from joulesched.live.actuators import ipmi
    from joulesched.live.actuators.credentials import Credentials, Login

    class Cmd:
        reads = 0

        def __init__(self, **kw) -> None:
            pass

        def get_power(self):
            Cmd.reads += 1
            # the session check and the first read answer; then a poll after the soft off fails
            if Cmd.reads > (1 if fails == "before" else 2):
                raise ipmi_exc.IpmiException("timeout")
            return {"powerstate": "on"}

        def set_power(self, state, wait=False):
            if fails == "shutdown":
                raise ipmi_exc.IpmiException("insufficient privilege")

    monkeypatch.setattr(ipmi.command, "Command", Cmd)
    act = ipmi.IpmiActuator(Credentials(Login("u", "p")), poll_s=0.01)
    with pytest.raises(ActuatorError) as e:
        act.sleep(Target("n1", parse_address("ipmi://10.0.0.5"), source="map"))
    assert off_requested(e.value) is marked


def test_rufio_marks_errors_once_its_power_off_job_exists():
    from joulesched.live.actuators.rufio import RufioActuator

    class Objects:
        def __init__(self) -> None:
            self.created: list[str] = []

        def get(self, target, plural, name):
            if plural == "machines":
                return {"status": {"powerState": "on"}}
            raise ActuatorError(f"{target.node}: get jobs: HTTP 503 Service Unavailable")

        def create(self, target, plural, body):
            self.created.append(body["spec"]["tasks"][0]["powerAction"])
            return {"metadata": {"name": "j1"}}

        def delete(self, target, plural, name):
            pass

    act = RufioActuator(api_client=object(), poll_s=0.01)
    act.objects = Objects()
    with pytest.raises(ActuatorError) as e:
        act.sleep(_target("rufio://ns/m1"))
    assert act.objects.created == ["soft"] and off_requested(e.value)


class _RufioObjects:
    """Rufio's objects as the actuator sees them: a Machine that reads on; Jobs kept by name."""

    def __init__(self, soft: str = "", lose_create: bool = False) -> None:
        self.soft, self.lose_create = soft, lose_create
        self.jobs: dict[str, dict] = {}
        self.deleted: list[str] = []

    def get(self, target, plural, name, missing_ok=False):
        if plural == "machines":
            return {"status": {"powerState": "on"}}
        return self.jobs.get(name, {})

    def create(self, target, plural, body):
        from joulesched.live.actuators.base import NoAnswer

        job = {**body, "status": {"conditions": [{"type": "Failed", "status": "True", "message": "no soft off"}]}
                                  if self.soft == "Failed" else {}}
        self.jobs[body["metadata"]["name"]] = job
        if self.lose_create:  # made, and the answer lost
            raise NoAnswer(f"{target.node}: create jobs: ReadTimeoutError")
        return job

    def list(self, target, plural, label_selector=""):
        return list(self.jobs.values())

    def delete(self, target, plural, name, missing_ok=False):
        self.deleted.append(name)
        self.jobs.pop(name, None)


def test_rufio_a_soft_off_rufio_reports_failed_is_no_power_off():
    """Rufio ran the Job and the BMC refused: nothing was switched off, so the node may be uncordoned."""
    from joulesched.live.actuators.rufio import RufioActuator

    act = RufioActuator(api_client=object(), poll_s=0.01, force_off=False)
    act.objects = _RufioObjects(soft="Failed")
    with pytest.raises(ActuatorError, match="no soft off") as e:
        act.sleep(_target("rufio://ns/m1"))
    assert not off_requested(e.value)


def test_rufio_a_power_off_job_whose_create_went_unanswered_is_marked_and_withdrawn():
    """The create made the Job and its answer was lost: Rufio may run it, so the error is marked, and the
    Job's name, chosen before the create, lets cancel_sleep delete it."""
    from joulesched.live.actuators.rufio import RufioActuator

    act = RufioActuator(api_client=object(), poll_s=0.01)
    act.objects = objs = _RufioObjects(lose_create=True)
    t = _target("rufio://ns/m1")
    with pytest.raises(ActuatorError) as e:
        act.sleep(t)
    (name,) = objs.jobs
    assert off_requested(e.value) and name.startswith("joulesched-n1-soft-")
    act.cancel_sleep(t)
    assert objs.deleted == [name] and objs.jobs == {}


def test_rufio_a_refused_hard_off_after_a_soft_off_that_may_run_is_marked():
    """The soft off's Job was made and not run within the graceful timeout; the hard off's create is refused (a
    429): the soft Job may still run, so the error is marked (a review: it read as "not sent", the controller saw
    the machine on and uncordoned it, and Rufio later ran the soft off under the new pods)."""
    from joulesched.live.actuators.rufio import RufioActuator

    class Refusing(_RufioObjects):
        def create(self, target, plural, body):
            if body["spec"]["tasks"][0]["powerAction"] == "off":
                raise ActuatorError(f"{target.node}: create jobs in ns: HTTP 429 Too Many Requests")
            return super().create(target, plural, body)

    act = RufioActuator(api_client=object(), poll_s=0.01, graceful_timeout_s=0.05)
    act.objects = objs = Refusing()
    t = _target("rufio://ns/m1")
    with pytest.raises(ActuatorError, match="429") as e:
        act.sleep(t)
    assert off_requested(e.value)
    (soft,) = objs.jobs
    act.cancel_sleep(t)  # what the controller does before it uncordons a node whose sleep failed
    assert objs.deleted == [soft]


@pytest.mark.parametrize("stop, marked", [("accepted", True), ("refused", False), ("lost", True)])
def test_aws_marks_the_errors_after_a_stop_it_may_have_done(monkeypatch, stop, marked):
    """A stop EC2 refused (ClientError) switched nothing off; an accepted one, or one whose answer never came
    (botocore's ReadTimeoutError), may have."""
    pytest.importorskip("boto3")
    from botocore.exceptions import ClientError, ReadTimeoutError

    from joulesched.live.actuators.aws import AwsActuator

    class Ec2:
        def __init__(self) -> None:
            self.described = 0

        def describe_instances(self, InstanceIds):
            self.described += 1
            if self.described > 1:  # throttled while polling, after the stop was accepted
                raise ClientError({"Error": {"Code": "RequestLimitExceeded"}}, "DescribeInstances")
            return {"Reservations": [{"Instances": [{"State": {"Name": "running"}}]}]}

        def stop_instances(self, InstanceIds, Hibernate):
            if stop == "refused":
                raise ClientError({"Error": {"Code": "UnauthorizedOperation"}}, "StopInstances")
            if stop == "lost":
                raise ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    act = AwsActuator(region="us-east-1", poll_s=0.01)
    ec2 = Ec2()
    monkeypatch.setattr(act, "_ec2", lambda target: ec2)
    with pytest.raises(ActuatorError) as e:
        act.sleep(_target("aws://i-0123456789abcdef0"))
    assert off_requested(e.value) is marked


# ---- a power-off left standing is withdrawn before a node that kept running is uncordoned ----
class _OwnerNeverActs:
    """A metal3-like actuator whose owner is down: the sleep's power-off stays asked for, state() cannot say."""

    name = "metal3"

    def __init__(self, emu, cancel_fails: bool) -> None:
        self.emu, self.cancel_fails = emu, cancel_fails
        self.cancels: list[bool] = []  # was the node still cordoned when the power-off was withdrawn

    def sleep(self, target) -> None:
        raise ActuatorError(f"{target.node}: BareMetalHost still on after spec.online was set false")

    def wake(self, target) -> None:
        pass

    def state(self, target) -> str:
        return "transitioning"

    def cancel_sleep(self, target) -> None:
        self.cancels.append(self.emu.get("nodes", target.node)["spec"].get("unschedulable") is True)
        if self.cancel_fails:
            raise ActuatorError(f"{target.node}: patch baremetalhosts: HTTP 503 Service Unavailable")


@pytest.mark.parametrize("cancel_fails", [False, True])
def test_a_node_kept_running_after_a_failed_sleep_has_its_power_off_withdrawn_first(emu, machines, kubelets,
                                                                                   make_controller, cancel_fails):
    add_nodes(emu, machines, ["a", "b"], cpu="4")
    ctl = make_controller(PowerPolicy(sleep_after_s=0.2, min_awake=1), start=False, sleep_timeout_s=1.0,
                          retry_max_s=0.5)
    act = ctl.actuator = _OwnerNeverActs(emu, cancel_fails)
    ctl.start()
    if not cancel_fails:
        wait_until(lambda: any("kept running" in e["message"] for e in events(emu, "NodeSleepFailed")), 15,
                   "the node uncordoned for it kept running")
        assert act.cancels and all(act.cancels)  # withdrawn while it was still cordoned
        return
    wait_until(lambda: len(act.cancels) >= 2, 15, "two roll-backs tried")
    # Never uncordoned while the power-off still stands: the owner would switch it off with its pods.
    assert not any("kept running" in e["message"] for e in events(emu, "NodeSleepFailed"))
    victim = next(n for n in ("a", "b") if pstate(emu, n) == "sleeping")
    assert emu.get("nodes", victim)["spec"].get("unschedulable") is True


def test_metal3_cancel_sleep_sets_the_host_online_again(emu):
    from tests.live.test_delegate_actuators import BMH, _actuator, _add_host, _target

    _add_host(emu, online=False)
    _actuator(emu, "metal3").cancel_sleep(_target("metal3://metal3/worker-1"))  # through OneActuator
    assert emu.get(BMH, "worker-1", "metal3")["spec"]["online"] is True


class _ShuttingDown:
    """A machine whose power-off was accepted and whose OS is still going down: the BMC reads On, wake sends
    nothing (Redfish's wake of a machine that reads On), the kubelet still renews its Lease."""

    name = "redfish"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def sleep(self, target) -> None:
        self.calls.append(("sleep", target.node))

    def wake(self, target) -> None:
        self.calls.append(("wake", target.node))

    def state(self, target) -> str:
        return ON


@pytest.mark.parametrize("marked", [True, False])
def test_a_new_leader_treats_a_node_marked_off_requested_as_going_down(emu, marked):
    """A review: after a restart or failover, a node left `sleeping` by a sleep whose power-off was accepted was
    woken at once, uncordoned and marked awake (its kubelet still renewing), and the machine then went off with
    the pods bound to it. The power-off request is marked on the node before it is sent; a new leader treats such
    a node as a sleep that failed unconfirmed from its first sight: awake only once its kubelet outlives the
    sleep's deadline. Unmarked (no power-off was ever asked), the wake goes on as before."""
    import threading
    import time

    from joulesched.cluster.kube.client import api_client_for
    from joulesched.cluster.nodepower import OFF_REQUESTED_ANNOTATION
    from joulesched.live.nodepower import NodePowerConfig, NodePowerController

    emu.add_node("keep", cpu="1", memory="1Gi")  # awake, too small for the pod
    ann = {"joulesched.io/power-state": "sleeping", "joulesched.io/cordoned": "true"}
    if marked:
        ann[OFF_REQUESTED_ANNOTATION] = "2026-12-07T00:00:00Z"
    emu.add_node("a", annotations=ann, unschedulable=True)
    emu.patch("nodes", "", "a", {"spec": {"taints": [{"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})
    stop = threading.Event()

    def kubelet() -> None:
        while not stop.is_set():
            emu.renew_node_lease("a")
            time.sleep(0.05)

    threading.Thread(target=kubelet, daemon=True).start()
    emu.add_pod("p", cpu="2", scheduler_name="default-scheduler")
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=3600, min_awake=0), leader_elect=False, resync_s=0.05,
                          settle_s=0.1, poll_s=0.02, takeover_grace_s=0.2, sleep_timeout_s=300.0,
                          addresses={"a": "redfish://10.0.0.1/redfish/v1/Systems/1"}, lease_namespace="default")
    ctl = NodePowerController(api_client_for(emu.url), _ShuttingDown(), cfg).start()
    try:
        if marked:
            time.sleep(3.0)
            node = emu.get("nodes", "a")
            assert pstate(emu, "a") != "awake" and node["spec"].get("unschedulable") is True
        else:
            wait_until(lambda: pstate(emu, "a") == "awake", 10, "the unmarked node woken")
    finally:
        stop.set()
        ctl.stop()


def test_the_off_request_is_on_the_node_while_the_actuator_is_asked_and_gone_once_asleep(emu, machines, kubelets,
                                                                                         make_controller):
    from joulesched.cluster.nodepower import OFF_REQUESTED_ANNOTATION
    from joulesched.live.actuators.base import OFF

    seen: list[bool] = []

    class Recording:
        name = "redfish"

        def sleep(self, target) -> None:
            seen.append(OFF_REQUESTED_ANNOTATION in (emu.get("nodes", target.node)["metadata"].get("annotations")
                                                     or {}))

        def wake(self, target) -> None:
            pass

        def state(self, target) -> str:
            return OFF

    add_nodes(emu, machines, ["a"])
    ctl = make_controller(PowerPolicy(sleep_after_s=0.1), start=False)
    ctl.actuator = Recording()
    ctl.start()
    wait_until(lambda: pstate(emu, "a") == "asleep", 10, "a asleep")
    assert seen == [True]
    assert OFF_REQUESTED_ANNOTATION not in emu.get("nodes", "a")["metadata"]["annotations"]


@pytest.mark.parametrize("case", ["never-sleep", "control-plane", "own-node"])
def test_a_node_protected_since_its_sleep_began_is_not_switched_off_when_the_sleep_resumes(emu, case):
    """A review: a node left `sleeping` that the operator then protected (never-sleep, a control-plane label,
    the controller's own node) was switched off when the sleep resumed; the checks ran only before a fresh sleep.
    The last check before the actuator now asks the same as may_sleep, on every path."""
    import time

    from joulesched.cluster.kube.client import api_client_for
    from joulesched.live.nodepower import NodePowerConfig, NodePowerController

    ann = {"joulesched.io/power-state": "sleeping", "joulesched.io/cordoned": "true"}
    labels = {"node-role.kubernetes.io/control-plane": ""} if case == "control-plane" else {}
    if case == "never-sleep":
        ann["joulesched.io/never-sleep"] = "true"
    emu.add_node("a", annotations=ann, labels=labels, unschedulable=True)
    emu.patch("nodes", "", "a", {"spec": {"taints": [{"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})
    act = _ShuttingDown()
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=3600), leader_elect=False, resync_s=0.05, settle_s=0.1,
                          poll_s=0.02, addresses={"a": "redfish://10.0.0.1/redfish/v1/Systems/1"},
                          lease_namespace="default", own_node="a" if case == "own-node" else "")
    ctl = NodePowerController(api_client_for(emu.url), act, cfg).start()
    try:
        wait_until(lambda: events(emu, "NodeSleepAborted"), 10, "the resumed sleep aborted")
        time.sleep(0.3)
        assert ("sleep", "a") not in act.calls
        assert "protected" in events(emu, "NodeSleepAborted")[0]["message"]
        assert pstate(emu, "a") == "awake"  # no power-off was ever marked: uncordoned
    finally:
        ctl.stop()


def test_a_resumed_sleep_that_finds_a_pod_keeps_a_node_whose_power_off_may_be_under_way_cordoned(emu):
    """A review: a resumed sleep whose last check found a pod (or could not read the pods) uncordoned the node
    although an earlier power-off might still be taking it down. It stays cordoned until its kubelet outlives the
    sleep's deadline."""
    import time

    from joulesched.cluster.kube.client import api_client_for
    from joulesched.cluster.nodepower import OFF_REQUESTED_ANNOTATION
    from joulesched.live.nodepower import NodePowerConfig, NodePowerController

    ann = {"joulesched.io/power-state": "sleeping", "joulesched.io/cordoned": "true",
           OFF_REQUESTED_ANNOTATION: "2026-12-07T00:00:00Z"}
    emu.add_node("a", annotations=ann, unschedulable=True)
    emu.patch("nodes", "", "a", {"spec": {"taints": [{"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})
    emu.add_pod("web", cpu="100m", owner="ReplicaSet")
    emu.bind("default", "web", {"target": {"name": "a"}}, None)
    act = _ShuttingDown()
    cfg = NodePowerConfig(policy=PowerPolicy(sleep_after_s=3600), leader_elect=False, resync_s=0.05, settle_s=0.1,
                          poll_s=0.02, takeover_grace_s=0.2, sleep_timeout_s=300.0, retry_initial_s=0.2,
                          addresses={"a": "redfish://10.0.0.1/redfish/v1/Systems/1"}, lease_namespace="default")
    ctl = NodePowerController(api_client_for(emu.url), act, cfg).start()
    try:
        wait_until(lambda: events(emu, "NodeSleepAborted"), 10, "the resumed sleep aborted")
        time.sleep(0.5)
        node = emu.get("nodes", "a")
        assert pstate(emu, "a") == "sleeping" and node["spec"].get("unschedulable") is True
        assert "may still be under way" in events(emu, "NodeSleepAborted")[0]["message"]
        assert ("sleep", "a") not in act.calls
    finally:
        ctl.stop()


def test_libvirt_a_save_given_up_at_the_deadline_is_marked_and_one_not_yet_sent_never_is(monkeypatch):
    """A managedSave waiting for the domain's job lock outlives the action's deadline and then runs: the error
    is marked (a review: it read as "not sent", the domain still read running, the node was uncordoned and then
    saved with its new pods). A save whose deadline passed before it was sent is not sent at all."""
    import threading
    import time

    libvirt = pytest.importorskip("libvirt")
    from joulesched.live.actuators.libvirt import LibvirtActuator

    started, release = threading.Event(), threading.Event()
    orig = libvirt.virDomain.managedSave

    def slow(self, flags=0):
        started.set()
        release.wait(5)
        return orig(self, flags)

    monkeypatch.setattr(libvirt.virDomain, "managedSave", slow)
    act = LibvirtActuator("test:///default")
    addr = parse_address("libvirt:///test")
    with pytest.raises(ActuatorError) as e:
        act.sleep(Target("test", addr, deadline=time.monotonic() + 0.3))
    assert started.is_set() and off_requested(e.value)
    release.set()
    t_end = time.monotonic() + 5
    while act.state(Target("test", addr, deadline=time.monotonic() + 5)) != "off" and time.monotonic() < t_end:
        time.sleep(0.02)  # the save given up on runs to its end: the machine goes down after all
    assert act.state(Target("test", addr, deadline=time.monotonic() + 5)) == "off"

    sent = []
    monkeypatch.setattr(libvirt.virDomain, "managedSave", lambda self, flags=0: sent.append(1))
    lookups = threading.Event()
    orig_lookup = libvirt.virConnect.lookupByName

    def slow_lookup(self, name):
        time.sleep(0.4)  # past the deadline before the save is sent
        lookups.set()
        return orig_lookup(self, name)

    fresh = LibvirtActuator("test:///default")
    fresh.wake(Target("test", addr, deadline=time.monotonic() + 5))  # running again (restored from its save)
    monkeypatch.setattr(libvirt.virConnect, "lookupByName", slow_lookup)
    with pytest.raises(ActuatorError):
        fresh.sleep(Target("test", addr, deadline=time.monotonic() + 0.2))
    assert lookups.wait(2)
    time.sleep(0.2)
    assert sent == []
    monkeypatch.setattr(libvirt.virConnect, "lookupByName", orig_lookup)
    fresh.sleep(Target("test", addr, deadline=time.monotonic() + 5))  # in time, it is sent
    assert sent == [1]
