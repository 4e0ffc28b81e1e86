"""kube_node reruns: a worker that has joined (its kubelet.conf exists) is not joined again and needs no join
command, so `--limit <worker>` (no control-plane play, no join-command fact) succeeds; and no bootstrap token is
minted while every targeted worker has joined. The harness of test_kube_node_join.py: the real playbook through
ansible-runner, local connections, a stand-in ``kubeadm`` that records its arguments (and, on ``join``, writes the
kubelet.conf the role looks for, redirected into tmp_path). Also: containerd's configuration is applied (handlers
flushed) before kubeadm runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.infra.kube_node_kit import stand_in_kubeadm
ROLE = Path(__file__).resolve().parents[2] / "playbooks" / "roles" / "kube_node"


def test_a_joined_worker_rerun_with_limit_joins_nothing_and_mints_no_token(tmp_path):
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed (pip install -e '.[infra]')")
    if os.path.exists("/etc/kubernetes/admin.conf"):
        pytest.skip("this machine is a Kubernetes control plane: init (creates: ...) would not run")
    from joulesched.infra.provision import provision

    kubelet_conf = tmp_path / "kubelet.conf"
    inv, calls, env = stand_in_kubeadm(tmp_path, kubelet_conf)
    kw = dict(tags="kube_node_init,kube_node_join", envvars=env,
              extravars={"_kube_node_kubelet_conf": str(kubelet_conf)}, timeout_s=300)

    r = provision(inv, **kw)
    assert r.succeeded, r.stdout[-4000:]
    first = [c.split()[0] for c in calls.read_text().splitlines()]
    assert first.count("join") == 1 and first.count("token") == 1, first
    assert kubelet_conf.exists()

    calls.write_text("")
    r = provision(inv, limit="Worker-7", **kw)
    assert r.succeeded, r.stdout[-4000:]
    assert calls.read_text() == "", calls.read_text()  # no kubeadm join, no kubeadm token create
    assert r.changed == 0, r.summary()


def test_containerd_is_restarted_with_its_configuration_before_kubeadm_runs():
    tasks = yaml.safe_load((ROLE / "tasks" / "install.yml").read_text())
    conf = next(i for i, t in enumerate(tasks) if "containerd" in str(t.get("ansible.builtin.template", {})))
    assert tasks[conf].get("notify") == "Restart containerd"
    nxt = tasks[conf + 1]
    assert nxt.get("ansible.builtin.meta", nxt.get("meta")) == "flush_handlers", nxt
