"""The kube_node role writes each node's power address (``kube_node_power_address``) onto its Node, as the node
power controller reads it: the real playbook, run by ansible-runner, with the real ``kubectl`` against the
in-repo API emulator (no kube-apiserver can run here; see tests/support/kube_emulator.py). Both inventory hosts
are local connections standing in for the control plane and a worker."""

from __future__ import annotations

import shutil
import sys

import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator

ANNOTATION = "joulesched.io/power"


@pytest.fixture
def emu():
    e = KubeEmulator().start()
    try:
        yield e
    finally:
        e.stop()


def test_workers_are_annotated_with_their_power_address_and_a_second_run_changes_nothing(emu, tmp_path):
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
                # no address: left alone
                "worker-2": {"kube_node_name": "worker-2"}}},
        }}}))

    first = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert first.succeeded, first.stdout[-4000:]
    ann = {n: (emu.get("nodes", n)["metadata"].get("annotations") or {}).get(ANNOTATION)
           for n in ("master-1", "worker-1", "worker-2")}
    assert ann == {"master-1": None, "worker-1": "ipmi://bmc-worker-1:623", "worker-2": None}
    assert {h.host: h.changed for h in first.hosts}.get("worker-1") == 1

    second = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert second.succeeded and second.changed == 0, second.stdout[-4000:]
