"""Twin parity: the node power decision core driven by the twin and driven by the live controller (on the API
emulator, with our scheduler, libvirt's test driver and emulated kubelets; no kube-apiserver can run here) on
the same workload gives the same sequence of sleeps and wakes, each within the informer's latency of the
twin's time.

The workload is small and its choices unambiguous (most-allocated over nodes of different sizes: no ties, so
no tie-break draws): three nodes sleep, two pods that fit no awake node wake two of them, and they sleep again.
Twin seconds are real seconds; a node's wake_s is its emulated boot time."""

from __future__ import annotations

import threading
import time

import pytest

from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.twin import Twin
from tests.helpers import scenario, workload
from tests.live.conftest import wait_until
from tests.live.test_node_power import CTL_FAST
from tests.support.machines import Kubelets, Machines

SLEEP_AFTER, WAKE = 1.0, 0.3
NODES = [("s", 2000), ("m", 3000), ("l", 4000)]
PODS = [(0.0, 2.5, 1500), (0.5, 2.5, 1500), (5.0, 1.0, 3500), (5.5, 1.0, 1000)]  # submit, duration, cpu
TOLERANCE_S = 0.6  # informer and reconcile latency, the settle pause, one kubelet poll


def twin_sequence() -> list[tuple[float, str, str]]:
    sc = scenario([{"name_prefix": p, "cpu_m": c, "memory_mib": 8192} for p, c in NODES], duration_s=9,
                  idle={"mode": "sleep", "sleep_after_s": SLEEP_AFTER, "sleep_watts": 5, "wake_s": WAKE})
    tw = Twin(sc, workload(*[(t, d, c, 100, c) for t, d, c in PODS]), record=True)
    run_policy(tw, make_policy("most-allocated"), 0)
    names = tw.state.names
    return [(t, kind, names[i]) for t, kind, i in tw.power_log if t <= 9]


def test_the_twin_sequence_is_the_one_worked_out_by_hand():
    assert [(round(t, 2), k, n) for t, k, n in twin_sequence()] == [
        (1.0, "sleep", "l-0"), (3.5, "sleep", "s-0"), (4.0, "sleep", "m-0"),
        (5.0, "wake", "l-0"), (5.5, "wake", "s-0"), (7.3, "sleep", "l-0"), (7.8, "sleep", "s-0")]


@pytest.mark.slow
def test_twin_and_live_controller_make_the_same_sleep_and_wake_sequence(emu, make_scheduler):
    from joulesched.cluster.kube.client import api_client_for
    from joulesched.cluster.nodepower import PowerPolicy
    from joulesched.live.actuators import ActuatorOptions, make_actuator
    from joulesched.live.nodepower import NodePowerConfig, NodePowerController

    expected = twin_sequence()
    machines = Machines()
    kubelets = Kubelets(emu, machines, boot_s=WAKE)
    ctl = None
    try:
        for prefix, cpu in NODES:
            machines.add(f"{prefix}-0")  # its address goes to the operator's map
            emu.add_node(f"{prefix}-0", cpu=f"{cpu}m", memory="8Gi")
        kubelets.start()
        make_scheduler("most-allocated", node_wait_poll_s=0.02)
        ctl = NodePowerController(api_client_for(emu.url),
                                  make_actuator("libvirt", ActuatorOptions(libvirt_uri="test:///default")),
                                  NodePowerConfig(policy=PowerPolicy(sleep_after_s=SLEEP_AFTER),
                                                  **{**CTL_FAST, "leader_elect": False, "settle_s": 0.05,
                                                     "addresses": machines.addresses}))
        ctl.start()
        wait_until(lambda: ctl.synced, 10)
        t0 = time.monotonic()
        stop = threading.Event()

        def drive() -> None:
            """Create each pod at its submit time; its kubelet ends it `duration` after it was bound."""
            ends: dict[str, float] = {}
            k = 0
            while not stop.is_set():
                now = time.monotonic() - t0
                while k < len(PODS) and PODS[k][0] <= now:
                    emu.add_pod(f"p{k}", cpu=f"{PODS[k][2]}m", memory="100Mi")
                    k += 1
                for ns, name, _uid, _node, tb in list(emu.bindings):
                    if name not in ends:
                        ends[name] = tb - t0 + PODS[int(name[1:])][1]
                for name, te in list(ends.items()):
                    if te is not None and now >= te:
                        emu.set_pod_phase("default", name, "Succeeded")
                        ends[name] = None
                stop.wait(0.005)

        th = threading.Thread(target=drive)
        th.start()
        try:
            wait_until(lambda: len(ctl.actions) >= len(expected), 15, "the whole sequence")
            time.sleep(0.5)
        finally:
            stop.set()
            th.join(5)
        live = [(t - t0, a, n) for t, a, n in ctl.actions]
        assert [(a, n) for _, a, n in live] == [(k, n) for _, k, n in expected]
        for (tl, a, n), (tt, _, _) in zip(live, expected):
            assert tt - 0.05 <= tl <= tt + TOLERANCE_S, f"{a} {n}: live {tl:.2f} s, twin {tt:.2f} s"
    finally:
        if ctl is not None:
            ctl.stop()
        kubelets.stop()
        machines.close()
