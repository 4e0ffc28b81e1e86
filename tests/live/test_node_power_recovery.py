"""Nothing is stranded (#24): a controller replica SIGKILLed in each intermediate state (``sleeping``, ``waking``,
``draining``), then another started; the node ends awake and schedulable, or asleep, within the bound below,
and a pending pod that fits only on it is bound.

The machine is a real IPMI 2.0 BMC (pyghmi's server, tests/support/power_servers.py) in its own process; the
controllers are processes too (tests/support/nodepower_proc.py), so SIGKILL is real. The node's kubelet is
emulated: Ready follows the BMC's power after ``BOOT_S``, and it renews its node Lease (the mock part).

Bound: the second replica takes the Lease ``LEASE_S`` after the first stopped renewing, waits
``TAKEOVER_GRACE_S``, then resumes the action, which has its own deadline; so the node is settled within
LEASE_S + TAKEOVER_GRACE_S + an action (here 1 + 0.5 + BOOT_S + a few polls): asserted under ``BOUND_S``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from joulesched.cluster.nodepower import ASLEEP_TAINT, POWER_STATE_ANNOTATION
from tests.live.conftest import wait_until
from tests.support.power_servers import ROOT, ipmi_bmc
from tests.support.procs import stop_process

BOOT_S = 1.5
LEASE_S = 1.0
TAKEOVER_GRACE_S = 0.5
BOUND_S = 12.0


class FileKubelet:
    """The node's kubelet: Ready follows the BMC's power file after BOOT_S; a Ready node renews its Lease."""

    def __init__(self, emu, node: str, power: Path) -> None:
        self.emu, self.node, self.power = emu, node, power
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="file-kubelet", daemon=True)

    def __enter__(self) -> "FileKubelet":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        on_since, ready, renewed = None, None, 0.0
        while not self._stop.wait(0.03):
            now = time.monotonic()
            on = self.power.read_text().strip() == "on"
            on_since = (on_since or now) if on else None
            r = on and now - on_since >= BOOT_S
            if r != ready:
                self.emu.set_node_ready(self.node, r)
                ready = r
            if r and now - renewed >= 0.2:
                self.emu.renew_node_lease(self.node)
                renewed = now


class Replica:
    """A controller process (SIGKILL-able)."""

    def __init__(self, tmp: Path, name: str, conf: dict) -> None:
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(conf))
        self.log = open(tmp / f"{name}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.nodepower_proc", str(path)], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=self.log, env={**os.environ})
        line = self.proc.stdout.readline()
        if line.strip() != b"synced":
            raise RuntimeError(f"replica {name} did not start: {(tmp / f'{name}.log').read_text()[-2000:]}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        stop_process(self.proc, timeout=10)
        self.log.close()


def _state(emu, node):
    return (emu.get("nodes", node)["metadata"].get("annotations") or {}).get(POWER_STATE_ANNOTATION, "awake")


def _settled(emu, node, power: Path) -> str:
    """"awake" (schedulable, untainted, machine on), "asleep" (cordoned, tainted, machine off), or ""."""
    obj = emu.get("nodes", node)
    ann = obj["metadata"].get("annotations") or {}
    tainted = any(t.get("key") == ASLEEP_TAINT for t in obj["spec"].get("taints") or [])
    on = power.read_text().strip() == "on"
    if "joulesched.io/power-owner" in ann:
        return ""
    if _state(emu, node) == "awake" and not obj["spec"].get("unschedulable") and not tainted and on:
        return "awake"
    if _state(emu, node) == "asleep" and obj["spec"].get("unschedulable") and tainted and not on:
        return "asleep"
    return ""


@pytest.mark.slow
@pytest.mark.parametrize("state", ["sleeping", "waking", "draining"])
def test_sigkill_in_each_intermediate_state_then_another_replica_settles_the_node(state, emu, tmp_path,
                                                                                 make_scheduler):
    with ipmi_bmc(tmp_path / "bmc") as (host, user, password, power):
        cred = tmp_path / "credentials.yaml"
        cred.write_text(json.dumps({"nodes": {"n1": {"username": user, "password": password}}}))
        cred.chmod(0o600)
        emu.add_node("n1", cpu="4", labels={"kubernetes.io/hostname": "n1"})
        emu.add_node("n2", cpu="4", labels={"kubernetes.io/hostname": "n2"},
                     annotations={"joulesched.io/never-sleep": "true"})  # somewhere for evicted pods to go
        policy = {"sleep_after_s": 0.3}
        config = {"resync_s": 0.1, "settle_s": 2.0, "poll_s": 0.05, "wake_timeout_s": 10.0, "sleep_timeout_s": 10.0,
                  "retry_initial_s": 0.5, "retry_max_s": 1.0, "takeover_grace_s": TAKEOVER_GRACE_S,
                  "lease_duration_s": LEASE_S, "renew_deadline_s": 0.7, "retry_period_s": 0.1,
                  "lease_namespace": "default", "nominate_grace_s": 0.5}
        if state == "waking":  # n1 asleep, its machine off; a pod for it is waiting: the wake starts at once
            power.write_text("off")
            emu.patch("nodes", "", "n1", {"metadata": {"annotations": {POWER_STATE_ANNOTATION: "asleep",
                                                                       "joulesched.io/cordoned": "true"}},
                                          "spec": {"unschedulable": True, "taints": [
                                              {"key": ASLEEP_TAINT, "value": "true", "effect": "NoSchedule"}]}})
            emu.add_pod("p", cpu="100m", node_selector={"kubernetes.io/hostname": "n1"},
                        scheduler_name="default-scheduler")
        if state == "draining":  # n1 holds one movable pod; its eviction is slow, so the drain lasts
            policy.update(consolidate=True, consolidate_interval_s=0.2, restart_s=1)
            emu.add_pod("web", cpu="500m", owner="ReplicaSet")
            emu.bind("default", "web", {"target": {"name": "n1"}}, None)
            emu.faults.add("slow", "create-eviction:pods", times=1, delay_s=3.0)
        conf = {"url": emu.url, "addresses": {"n1": f"ipmi://{host}"}, "credentials": str(cred),
                "policy": policy, "config": config}
        with FileKubelet(emu, "n1", power):
            wait_until(lambda: emu.get("nodes", "n1")["status"]["conditions"], 10)
            a = Replica(tmp_path, "a", {**conf, "config": {**config, "identity": "a"}})
            b = None
            try:
                wait_until(lambda: _state(emu, "n1") == state, 20, f"n1 {state}")
                a.kill()
                killed = time.monotonic()
                assert _state(emu, "n1") == state  # left behind, with its owner
                assert emu.get("nodes", "n1")["metadata"]["annotations"]["joulesched.io/power-owner"] == "a"
                b = Replica(tmp_path, "b", {**conf, "config": {**config, "identity": "b"}})
                end = wait_until(lambda: _settled(emu, "n1", power), BOUND_S, "n1 settled by the second replica")
                took = time.monotonic() - killed
                print(f"killed while {state}: {end} {took:.1f} s after SIGKILL")  # the figure for the record
                assert took < BOUND_S, f"settled after {took:.1f} s"
                assert end == ("awake" if state == "waking" else end)  # a resumed wake ends awake
                # A pod that fits only on n1 is bound there (our scheduler nominates it; the controller wakes it).
                make_scheduler("most-allocated", node_wait_poll_s=0.05)
                if state != "waking":
                    emu.add_pod("p", cpu="100m", node_selector={"kubernetes.io/hostname": "n1"})
                else:
                    emu.bind("default", "p", {"target": {"name": "n1"}}, None)  # as kube-scheduler would now
                wait_until(lambda: emu.get("pods", "p", "default")["spec"].get("nodeName") == "n1", BOUND_S,
                           "p bound to n1")
                assert _settled(emu, "n1", power) == "awake" or _state(emu, "n1") == "awake"
            finally:
                for r in (a, b):
                    if r is not None:
                        r.close()
