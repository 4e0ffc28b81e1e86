"""The roles keep secrets out of Ansible's output and pin what they download: every task that handles a token
or a key has `no_log: true`, the kube_node role's CNI pins equal the cloud-init ones, and the exporter role
installs only from a hashed lock file, keyed on its hash. (The install itself runs for real in
tests/infra/test_systemd_target.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from joulesched.infra.config import CNI_PINS, KUBERNETES_APT_KEY_FINGERPRINT

ROLES = Path(__file__).resolve().parents[2] / "playbooks" / "roles"
# What a task handling a secret mentions: the bootstrap token, the join command, private keys.
SECRET = re.compile(r"kubeadm\W+(init|join|token)|join_command|private[_ ]key|\bca\.key\b|password|secret",
                    re.I)


def _tasks():
    for f in sorted(ROLES.glob("*/tasks/*.yml")) + sorted(ROLES.glob("*/handlers/*.yml")):
        for task in yaml.safe_load(f.read_text()) or []:
            yield f, task


def test_every_task_handling_a_token_or_key_has_no_log():
    """Before: `kubeadm token create --print-join-command` and the join ran without no_log, so the bootstrap
    token was in every play's output and in ansible-runner's artifacts."""
    flagged = []
    for f, task in _tasks():
        body = {k: v for k, v in task.items() if k not in ("name", "no_log")}
        if SECRET.search(yaml.safe_dump(body)) and task.get("no_log") is not True:
            flagged.append(f"{f.relative_to(ROLES)}: {task.get('name')}")
    assert not flagged, flagged
    named = {t.get("name") for f, t in _tasks() if t.get("no_log") is True}
    assert {"Run kubeadm init", "Make a join command for the workers",
            "Publish the join command to the workers"} <= named


def test_the_role_pins_the_same_cni_manifests_as_cloud_init():
    pins = yaml.safe_load((ROLES / "kube_node" / "vars" / "main.yml").read_text())["_kube_node_cni_pins"]
    assert {k: (v["version"], v["sha256"]) for k, v in pins.items()} == CNI_PINS
    defaults = yaml.safe_load((ROLES / "kube_node" / "defaults" / "main.yml").read_text())
    assert (defaults["kube_node_calico_version"], defaults["kube_node_flannel_version"]) == \
        (CNI_PINS["calico"][0], CNI_PINS["flannel"][0])
    urls = yaml.safe_load((ROLES / "kube_node" / "vars" / "main.yml").read_text())["_kube_node_cni_urls"]
    assert not any("latest" in u for u in urls.values())
    master = yaml.safe_load((ROLES / "kube_node" / "tasks" / "master.yml").read_text())
    get = next(t for t in master if "ansible.builtin.get_url" in t)
    assert get["ansible.builtin.get_url"]["checksum"].startswith("sha256:")
    names = [t["name"] for t in master]
    assert names.index("Refuse a CNI manifest with another checksum") < names.index("Apply the CNI")


def test_the_role_pins_the_same_kubernetes_apt_key_as_cloud_init():
    defaults = yaml.safe_load((ROLES / "kube_node" / "defaults" / "main.yml").read_text())
    assert defaults["kube_node_apt_key_fingerprint"] == KUBERNETES_APT_KEY_FINGERPRINT
    tasks = yaml.safe_load((ROLES / "kube_node" / "tasks" / "install.yml").read_text())
    names = [t["name"] for t in tasks]
    # downloaded aside, checked, and only then put where apt's signed-by reads it
    get = next(t for t in tasks if "ansible.builtin.get_url" in t and "Release.key" in str(t))
    assert get["ansible.builtin.get_url"]["dest"] == "{{ _kube_node_key_download }}"
    assert names.index("Refuse a signing key with another fingerprint") < \
        names.index("Install the pkgs.k8s.io signing key where apt reads it") < \
        names.index("Add the pkgs.k8s.io repository")


def test_the_exporter_installs_from_the_hashed_lock_keyed_on_its_hash():
    tasks = yaml.safe_load((ROLES / "power_exporter" / "tasks" / "install.yml").read_text())
    pips = [t for t in tasks if "/bin/pip" in yaml.safe_dump(t)]
    assert len(pips) == 1, [t["name"] for t in pips]
    (pip,) = pips
    argv = pip["ansible.builtin.command"]["argv"]
    for flag in ("--require-hashes", "--no-deps", "--force-reinstall", "--requirement"):
        assert flag in argv, flag
    assert "joulesched==" not in yaml.safe_dump(tasks)  # never keyed on the version number
    assert "_power_exporter_lock_stat.stat.checksum" in pip["when"] and pip["notify"] == "Restart power exporter"
