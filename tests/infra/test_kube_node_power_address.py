"""The kube_node role writes each node's power address (``kube_node_power_address``) into the node power
controller's address map (the ConfigMap joulesched-node-power-addresses, one key per node), which the
controller reads as authoritative: the real playbook, run by ansible-runner, with the real ``kubectl`` against
the in-repo API emulator (no kube-apiserver can run here; see tests/support/kube_emulator.py). The inventory
hosts are local connections standing in for the control plane and the workers."""

from __future__ import annotations

import shutil
import sys

import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator

ANNOTATION = "joulesched.io/power"
MAP = ("joulesched", "joulesched-node-power-addresses")


@pytest.fixture
def emu():
    e = KubeEmulator().start()
    try:
        yield e
    finally:
        e.stop()


def test_workers_power_addresses_go_to_the_map_and_a_second_run_changes_nothing(emu, tmp_path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (apt install kubernetes-client)")
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed (pip install -e '.[infra]')")
    from joulesched.infra.provision import provision

    emu.add_node("master-1")
    emu.add_node("worker-1")
    emu.add_node("worker-2")
    kubeconfig = emu.kubeconfig(str(tmp_path / "admin.conf"))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "ansible_become": False, "kube_node_admin_kubeconfig": kubeconfig},
        "children": {
            "kube_master": {"hosts": {"master-1": {"kube_node_name": "master-1"}}},
            "kube_workers": {"hosts": {
                "worker-1": {"kube_node_name": "worker-1", "kube_node_power_address": "ipmi://bmc-worker-1:623"},
                "worker-3": {"kube_node_name": "worker-3",
                             "kube_node_power_address": "redfish://bmc-3/redfish/v1/Systems/1"},
                # no address: left alone
                "worker-2": {"kube_node_name": "worker-2"}}},
        }}}))

    first = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert first.succeeded, first.stdout[-4000:]
    cm = emu.get("configmaps", MAP[1], MAP[0])
    assert cm["data"] == {"worker-1": "ipmi://bmc-worker-1:623", "worker-3": "redfish://bmc-3/redfish/v1/Systems/1"}
    # Nothing goes onto the nodes themselves (their kubelets could write the same annotation).
    assert all(ANNOTATION not in (emu.get("nodes", n)["metadata"].get("annotations") or {})
               for n in ("master-1", "worker-1", "worker-2"))
    assert {h.host: h.changed for h in first.hosts}.get("worker-1", 0) >= 1
    # The controller reads the map as the Deployment mounts it: a directory, one file per key.
    from joulesched.live.nodepower import load_addresses

    mount = tmp_path / "addresses"
    mount.mkdir()
    for node, addr in cm["data"].items():
        (mount / node).write_text(addr)
    assert load_addresses(str(mount)) == cm["data"]

    second = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert second.succeeded and second.changed == 0, second.stdout[-4000:]
