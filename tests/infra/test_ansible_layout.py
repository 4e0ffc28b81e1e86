"""The roles keep the prometheus-community/ansible shape, and the whole tree is ansible-lint clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "playbooks" / "roles"
ROLE_NAMES = ("power_exporter", "node_exporter", "prometheus", "kube_node", "jmeter")
VENV_BIN = Path(sys.executable).parent


def _tool(name: str) -> str | None:
    exe = VENV_BIN / name
    return str(exe) if exe.exists() else shutil.which(name)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_role_layout(role):
    r = ROLES / role
    main = yaml.safe_load((r / "tasks" / "main.yml").read_text())
    assert main[0]["name"] == "Preflight", f"{role}: main.yml starts with the preflight asserts"
    for step in main:
        assert step.get("tags"), f"{role}: step {step['name']!r} has no tag, so it cannot run alone"
    assert (r / "tasks" / "preflight.yml").is_file()
    assert any("ansible.builtin.assert" in t for t in yaml.safe_load((r / "tasks" / "preflight.yml").read_text()))
    defaults = yaml.safe_load((r / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((r / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for key in defaults:
        assert key.startswith(role + "_"), f"{role}: default {key} lacks the role prefix"
        assert key in spec and spec[key].get("description") and spec[key].get("type"), \
            f"{role}: {key} is not described in meta/argument_specs.yml"
    if (r / "vars" / "main.yml").is_file():
        for key in yaml.safe_load((r / "vars" / "main.yml").read_text()):
            assert key.startswith(f"_{role}_"), f"{role}: internal var {key} needs the _{role}_ prefix"
    for tpl in (r / "templates").glob("*.j2") if (r / "templates").is_dir() else []:
        assert tpl.read_text().startswith("{{ ansible_managed | comment }}"), f"{tpl}: no managed-file marker"


def test_power_exporter_ships_the_unit_from_deploy_unchanged():
    files = ROLES / "power_exporter" / "files"
    for name in ("joulesched-power-exporter.service", "joulesched-power.sysusers.conf"):
        assert (files / name).resolve() == (REPO / "deploy" / "systemd" / name).resolve(), name


def test_syntax_check():
    exe = _tool("ansible-playbook")
    if exe is None:
        pytest.skip("ansible-core not installed (pip install -e '.[infra]')")
    r = subprocess.run([exe, "-i", str(REPO / "inventory" / "hosts.yml"), str(REPO / "playbooks" / "site.yml"),
                        "--syntax-check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ansible_lint_production_profile():
    exe = _tool("ansible-lint")
    if exe is None:
        pytest.skip("ansible-lint not installed (pip install -e '.[infra]')")
    r = subprocess.run([exe, "--profile", "production", "--offline", "--nocolor", "playbooks", "inventory"],
                       capture_output=True, text=True, timeout=600, cwd=REPO,
                       env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(Path.home())})
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]



@pytest.mark.parametrize("role", ["node_exporter", "prometheus"])
def test_a_package_that_starts_on_every_interface_is_restarted_on_our_settings_at_once(role):
    # Debian's prometheus packages listen on every interface until their /etc/default file and drop-in take
    # effect: the restart must come right after configuring, not at the end of the play.
    tasks = yaml.safe_load((ROLES / role / "tasks" / "configure.yml").read_text())
    assert tasks[-1].get("ansible.builtin.meta") == "flush_handlers"
    assert any(t.get("notify") for t in tasks[:-1])


@pytest.mark.parametrize("install_dir, ok", [("/opt/joulesched", True), ("/srv/joulesched-2.0_a", True),
                                             ("/opt/joule sched", False), ("opt/joulesched", False),
                                             ("/opt/../etc", False)])
def test_the_power_exporter_install_dir_must_be_a_path_systemd_takes_as_written(tmp_path, install_dir, ok):
    """The drop-in's ExecStart names the install dir unquoted: with a space systemd ran "/opt/joule". The
    preflight's own assert, run by ansible-playbook on this host."""
    exe = _tool("ansible-playbook")
    if exe is None:
        pytest.skip("ansible-core not installed (pip install -e '.[infra]')")
    tasks = yaml.safe_load((ROLES / "power_exporter" / "tasks" / "preflight.yml").read_text())
    (task,) = [t for t in tasks if t["name"].startswith("Assert the install dir")]
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": [task]}]))
    r = subprocess.run([exe, "-i", "localhost,", str(play), "-e", yaml.safe_dump(
        {"power_exporter_install_dir": install_dir}, default_flow_style=True).strip()],
        capture_output=True, text=True, timeout=300, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    assert (r.returncode == 0) is ok, r.stdout + r.stderr
    if not ok:
        assert "power_exporter_install_dir must be an absolute path" in r.stdout, r.stdout


@pytest.mark.parametrize("wanted, mode, ok", [("HOST", "wheelhouse", True), ("3.99", "wheelhouse", False),
                                               ("3.99", "index", False), ("3.99", "none", True)])
def test_the_power_exporter_refuses_a_host_whose_python_is_not_the_wheelhouses(tmp_path, wanted, mode, ok):
    """A wheelhouse holds wheels for one Python (numpy's are per version): a host on another python3 failed deep in
    pip install. The preflight's two tasks, run by ansible-playbook on this host; HOST is this host's python3."""
    exe = _tool("ansible-playbook")
    if exe is None or shutil.which("python3") is None:
        pytest.skip("needs ansible-core (pip install -e '.[infra]') and a python3 on PATH")
    host = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    tasks = yaml.safe_load((ROLES / "power_exporter" / "tasks" / "preflight.yml").read_text())
    chosen = [t for t in tasks if "python3" in t["name"]]
    assert len(chosen) == 2
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": chosen}]))
    r = subprocess.run([exe, "-i", "localhost,", str(play), "--check", "-e", json.dumps(
        {"power_exporter_python_version": host if wanted == "HOST" else wanted, "power_exporter_install_mode": mode,
         "ansible_python_interpreter": sys.executable})],
        capture_output=True, text=True, timeout=300, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    assert (r.returncode == 0) is ok, r.stdout + r.stderr
    if not ok:  # --check too: the version is read, not skipped
        assert f"this host's python3 is {host}, but the wheelhouse's wheels are for Python 3.99" in r.stdout, r.stdout


@pytest.mark.parametrize("keys, pinned, ok", [("good", "good", True), ("good", "real", False),
                                              ("good+other", "good", False), ("other", "good", False)])
def test_the_kube_node_role_trusts_only_the_pinned_kubernetes_apt_key(tmp_path, keys, pinned, ok):
    """The role put pkgs.k8s.io's Release.key where apt reads it as downloaded. Its check, run by ansible-playbook
    on this host against keys made here: the one pinned primary key passes; another, or a second beside it, not."""
    from joulesched.infra.config import KUBERNETES_APT_KEY_FINGERPRINT
    from tests.infra.kube_node_kit import gpg_public_key

    exe = _tool("ansible-playbook")
    if exe is None or shutil.which("gpg") is None:
        pytest.skip("needs ansible-core (pip install -e '.[infra]') and gpg")
    made = {n: gpg_public_key(tmp_path, n) for n in ("good", "other")}
    download = tmp_path / "Release.key"
    download.write_bytes(b"".join(made[n][0] for n in keys.split("+")))
    fpr = made["good"][1] if pinned == "good" else KUBERNETES_APT_KEY_FINGERPRINT
    tasks = yaml.safe_load((ROLES / "kube_node" / "tasks" / "install.yml").read_text())
    chosen = [t for t in tasks if t["name"] in ("Read the signing key's fingerprint",
                                                 "Refuse a signing key with another fingerprint")]
    assert len(chosen) == 2
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": chosen}]))
    (tmp_path / "gnupg").mkdir(mode=0o700)
    r = subprocess.run([exe, "-i", "localhost,", str(play), "-e", json.dumps(
        {"_kube_node_key_download": str(download), "kube_node_apt_repo": True, "kube_node_apt_key_fingerprint": fpr,
         "_kube_node_key_fetched": {"changed": False}, "ansible_python_interpreter": sys.executable})],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "GNUPGHOME": str(tmp_path / "gnupg")})
    assert (r.returncode == 0) is ok, r.stdout + r.stderr
    if not ok:
        assert f"not {fpr} (kube_node_apt_key_fingerprint): not trusted" in " ".join(r.stdout.split()), r.stdout


@pytest.mark.parametrize("cidr, cni, ok, words", [
    ("10.244.0.0/16", "flannel", True, ""),
    ("HOST/16", "calico", False, "overlaps this host's network"),  # the host's own network
    ("172.31.0.0/16", "calico", True, ""),
    ("172.31.0.0/16", "flannel", False, "flannel's manifest routes 10.244.0.0/16"),
    ("10.244.0.1/16", "calico", False, "is no network"),  # host bits set
    ("172.31.0.0/16,fd00:10:244::/56", "calico", True, ""),  # dual-stack: its IPv4 part is checked
])
def test_the_pod_network_must_be_apart_from_the_hosts(tmp_path, cidr, cni, ok, words):
    """kubeadm was given a pod network that could hold the hosts' own LAN (a 192.168 default on a 192.168 LAN):
    pods were routed onto it. The role's preflight asserts, run by ansible-playbook on this host with its
    facts."""
    import ipaddress
    import socket

    exe = _tool("ansible-playbook")
    if exe is None:
        pytest.skip("ansible-core not installed (pip install -e '.[infra]')")
    if cidr.startswith("HOST"):  # this host's first non-loopback IPv4 address's /16
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route's source address is chosen
            addr = s.getsockname()[0]
        cidr = str(ipaddress.IPv4Network(f"{addr}/16", strict=False))
    tasks = yaml.safe_load((ROLES / "kube_node" / "tasks" / "preflight.yml").read_text())
    chosen = [t for t in tasks if "pod network" in t["name"] or "flannel" in t["name"]]
    assert len(chosen) == 2
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": True,
                                     "gather_subset": ["network"], "tasks": chosen}]))
    r = subprocess.run([exe, "-i", "localhost,", str(play), "-e", json.dumps(
        {"kube_node_pod_network_cidr": cidr, "kube_node_cni": cni, "ansible_python_interpreter": sys.executable})],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_FILTER_PLUGINS": str(ROLES / "kube_node" / "filter_plugins")})
    assert (r.returncode == 0) is ok, r.stdout + r.stderr
    if not ok:
        assert words in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_cni_interfaces_of_a_node_already_set_up_are_not_host_networks():
    """A re-run of the (idempotent) role on a node flannel set up failed: its cni0 sits inside 10.244.0.0/16."""
    import importlib.util

    pytest.importorskip("ansible", reason="ansible-core not installed (pip install -e '.[infra]')")
    spec = importlib.util.spec_from_file_location(
        "pod_network", ROLES / "kube_node" / "filter_plugins" / "pod_network.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    facts = {"interfaces": ["lo", "eth0", "cni0", "flannel.1"],
             "lo": {"ipv4": {"address": "127.0.0.1", "netmask": "255.0.0.0"}},
             "eth0": {"ipv4": {"address": "192.168.1.5", "netmask": "255.255.255.0"}},
             "cni0": {"ipv4": {"address": "10.244.0.1", "netmask": "255.255.255.0"}},
             "flannel_1": {"ipv4": {"address": "10.244.0.0", "netmask": "255.255.255.255"}}}
    assert mod.pod_network_clashes("10.244.0.0/16", facts) == []
    assert mod.pod_network_clashes("192.168.0.0/16", facts) == ["eth0 192.168.1.5/24"]
