"""The kube_node role writes each node's power address (``kube_node_power_address``) into the node power
controller's address map (the ConfigMap joulesched-node-power-addresses, one key per node), which the
controller reads as authoritative: the real playbook, run by ansible-runner, with the real ``kubectl`` against
the in-repo API emulator (no kube-apiserver can run here; see tests/support/kube_emulator.py). The inventory
hosts are local connections standing in for the control plane and the workers."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

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


def _needs_kubectl_and_runner():
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (apt install kubernetes-client)")
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed (pip install -e '.[infra]')")


def _inventory(emu, tmp_path, workers: dict) -> str:
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "ansible_become": False, "kube_node_admin_kubeconfig": emu.kubeconfig(str(tmp_path / "admin.conf"))},
        "children": {"kube_master": {"hosts": {"master-1": {}}}, "kube_workers": {"hosts": workers}}}}))
    return inv


def test_workers_power_addresses_go_to_the_map_and_a_second_run_changes_nothing(emu, tmp_path):
    _needs_kubectl_and_runner()
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


@pytest.mark.parametrize("existing", [None, {"worker-1": "ipmi://bmc-worker-1:623"}, {"worker-7": "ipmi://bmc-7"}])
def test_a_check_run_reads_the_map_and_writes_nothing(emu, tmp_path, existing):
    """`--check` skipped the read-only `kubectl get` (a command task), and every later task failed on its missing
    result: a dry run failed on any host with a power address. The read runs in check mode; nothing is written,
    and the refusals still apply."""
    _needs_kubectl_and_runner()
    from joulesched.infra.provision import provision

    if existing is not None:
        emu.add_object("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": MAP[1], "namespace": MAP[0]}, "data": dict(existing)},
                       namespace=MAP[0])
    inv = _inventory(emu, tmp_path, {"worker-1": {"kube_node_power_address": "ipmi://bmc-worker-1:623"}})
    r = provision(inv, tags="kube_node_power_address", check=True, timeout_s=300)
    assert r.succeeded, r.stdout[-4000:]
    cm = emu.get("configmaps", MAP[1], MAP[0])
    assert (cm and cm["data"]) == existing  # not created, not patched
    assert emu.get("namespaces", MAP[0]) is None
    refused = _inventory(emu, tmp_path, {"worker-1": {"kube_node_power_address": "ipmi://bmc-7"}})
    r = provision(refused, tags="kube_node_power_address", check=True, timeout_s=300)
    assert r.succeeded is (existing is None), r.stdout[-4000:]  # the map gives bmc-7 to worker-7 already


def test_the_node_name_comes_from_the_inventory_not_the_hosts_own_hostname(emu, tmp_path):
    """No kube_node_name given: the key is the inventory name, lower-cased (the host here reports another)."""
    _needs_kubectl_and_runner()
    from joulesched.infra.provision import provision

    inv = _inventory(emu, tmp_path, {"Worker-4": {"kube_node_power_address": "ipmi://bmc-worker-4:623"}})
    r = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert r.succeeded, r.stdout[-4000:]
    assert emu.get("configmaps", MAP[1], MAP[0])["data"] == {"worker-4": "ipmi://bmc-worker-4:623"}


@pytest.mark.parametrize("existing, message", [
    ({"worker-1": "ipmi://bmc-old:623"}, "refusing to overwrite the power address of node worker-1"),
    ({"worker-9": "ipmi://bmc-worker-1:623"}, "refusing to map ipmi://bmc-worker-1:623 to node worker-1"),
    # The same machine spelled otherwise (case, the default port left out): the controller's rule, not strings.
    ({"worker-9": "ipmi://BMC-Worker-1"}, "already maps it to worker-9"),
    ({"worker-1": "ipmi://bmc-old", "worker-9": "IPMI://bmc-worker-1:623/"}, "refusing to overwrite"),
])
def test_an_entry_is_never_overwritten_nor_a_machine_given_to_a_second_node(emu, tmp_path, existing, message):
    """The map decides which machine the controller switches off: a run that would move an entry, or point a
    second node at a machine already in the map, fails and leaves the map as it was."""
    _needs_kubectl_and_runner()
    from joulesched.infra.provision import provision

    emu.add_object("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": MAP[1], "namespace": MAP[0]}, "data": dict(existing)},
                   namespace=MAP[0])
    inv = _inventory(emu, tmp_path, {"worker-1": {"kube_node_power_address": "ipmi://bmc-worker-1:623"}})
    r = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert not r.succeeded and message in " ".join(r.stdout.split()), r.stdout[-4000:]
    assert emu.get("configmaps", MAP[1], MAP[0])["data"] == existing


@pytest.mark.parametrize("second", ["ipmi://bmc-1:623", "ipmi://BMC-1"])
def test_one_address_for_two_hosts_of_a_run_is_refused_before_anything_is_written(emu, tmp_path, second):
    _needs_kubectl_and_runner()
    from joulesched.infra.provision import provision

    inv = _inventory(emu, tmp_path, {"worker-1": {"kube_node_power_address": "ipmi://bmc-1:623"},
                                     "worker-2": {"kube_node_power_address": second}})
    r = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert not r.succeeded and "all have kube_node_power_address" in " ".join(r.stdout.split()), r.stdout[-4000:]
    assert emu.get("configmaps", MAP[1], MAP[0]) is None


def test_the_same_machine_spelled_otherwise_is_no_move_and_a_malformed_address_is_refused(emu, tmp_path):
    _needs_kubectl_and_runner()
    from joulesched.infra.provision import provision

    emu.add_object("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": MAP[1], "namespace": MAP[0]},
                                  "data": {"worker-1": "ipmi://BMC-Worker-1"}}, namespace=MAP[0])
    inv = _inventory(emu, tmp_path, {"worker-1": {"kube_node_power_address": "ipmi://bmc-worker-1:623"}})
    r = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert r.succeeded, r.stdout[-4000:]
    assert emu.get("configmaps", MAP[1], MAP[0])["data"] == {"worker-1": "ipmi://bmc-worker-1:623"}
    inv = _inventory(emu, tmp_path, {"worker-2": {"kube_node_power_address": "ipmi//bmc-2"}})
    r = provision(inv, tags="kube_node_power_address", timeout_s=300)
    assert not r.succeeded and "kube_node_power_address of worker-2" in " ".join(r.stdout.split()), r.stdout[-4000:]
    assert emu.get("configmaps", MAP[1], MAP[0])["data"] == {"worker-1": "ipmi://bmc-worker-1:623"}


#: kubectl, but creating or patching a ConfigMap in a namespace that does not exist fails as the apiserver's
#: NamespaceLifecycle admission makes it fail (the in-repo API emulator stores objects in any namespace, and
#: serves namespaces as a list only).
FAKE_KUBECTL = """#!{python}
import subprocess, sys
REAL = {real!r}
args = sys.argv[1:]
ns = args[args.index("--namespace") + 1] if "--namespace" in args else ""
if ns and "configmap" in args and ("create" in args or "patch" in args):
    kubeconfig = args[args.index("--kubeconfig") + 1]
    names = subprocess.run([REAL, "--kubeconfig", kubeconfig, "get", "namespaces", "--output", "name"],
                           capture_output=True, text=True, check=True).stdout.split()
    if f"namespace/{{ns}}" not in names:
        verb = "create" if "create" in args else "patch"
        sys.exit(f'error: failed to {{verb}} configmap: namespaces "{{ns}}" not found')
sys.exit(subprocess.run([REAL, *args]).returncode)
"""


def test_a_power_address_is_written_on_a_fresh_cluster_without_the_namespace(emu, tmp_path: Path):
    """The site playbook's first run on new hosts: kubeadm made the cluster moments ago and nobody has applied
    deploy/kubernetes, so namespace joulesched does not exist. Before, creating the map there failed and with it
    the run (the sample inventory gives node2 an address); now the role makes the namespace as namespace.yaml
    does, Pod Security restricted, and a second run changes nothing."""
    _needs_kubectl_and_runner()
    real = shutil.which("kubectl")
    from joulesched.infra.provision import provision

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "kubectl"
    fake.write_text(FAKE_KUBECTL.format(python=sys.executable, real=real))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    inv = _inventory(emu, tmp_path, {"worker-1": {"kube_node_power_address": "ipmi://bmc-worker-1:623"},
                                     "worker-2": {"kube_node_power_address": "ipmi://bmc-worker-2:623"}})
    assert emu.get("namespaces", MAP[0]) is None

    first = provision(inv, tags="kube_node_power_address", envvars={"PATH": path}, timeout_s=300)
    assert first.succeeded, first.stdout[-4000:]
    assert emu.get("configmaps", MAP[1], MAP[0])["data"] == {"worker-1": "ipmi://bmc-worker-1:623",
                                                             "worker-2": "ipmi://bmc-worker-2:623"}
    labels = emu.get("namespaces", MAP[0])["metadata"]["labels"]
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy/kubernetes/namespace.yaml").read_text())
    assert labels == shipped["metadata"]["labels"]  # as deploy/kubernetes makes it: restricted

    second = provision(inv, tags="kube_node_power_address", envvars={"PATH": path}, timeout_s=300)
    assert second.succeeded and second.changed == 0, second.stdout[-4000:]
