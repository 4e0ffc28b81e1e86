"""The kube_node role names each Node from the inventory: ``kubeadm init`` and ``kubeadm join`` both get
``--node-name`` (the inventory name, lower-cased), never the host's own hostname. The real playbook through
ansible-runner, local connections, and a stand-in ``kubeadm`` that records its arguments and prints a join
command (no kubeadm or kubelet can run here)."""

from __future__ import annotations

import os

import pytest

from tests.infra.kube_node_kit import stand_in_kubeadm


def test_init_and_join_name_the_nodes_from_the_inventory(tmp_path):
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed (pip install -e '.[infra]')")
    if os.path.exists("/etc/kubernetes/kubelet.conf") or os.path.exists("/etc/kubernetes/admin.conf"):
        pytest.skip("this machine is a Kubernetes node: init and join (creates: ...) would not run")
    from joulesched.infra.provision import provision

    inv, calls, env = stand_in_kubeadm(tmp_path)
    r = provision(inv, tags="kube_node_init,kube_node_join", envvars=env, timeout_s=300)
    assert r.succeeded, r.stdout[-4000:]
    init, join = (c.split() for c in calls.read_text().splitlines() if c.split()[0] in ("init", "join"))
    assert init[init.index("--node-name") + 1] == "master-1", init
    # init's own bootstrap token, which no worker uses (each gets a fresh 1 h one), lived kubeadm's default 24 h
    assert init[init.index("--token-ttl") + 1] == "1h", init
    assert join[:2] == ["join", "10.0.0.1:6443"] and join[join.index("--node-name") + 1] == "worker-7", join
