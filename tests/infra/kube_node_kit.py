"""The kube_node role's test harness: a stand-in ``kubeadm`` that records its arguments (and prints a join command
for ``token create``; with ``kubelet_conf``, ``join`` writes it, as a real join writes the kubelet's config),
and a one-master, one-worker inventory of local connections. No kubeadm or kubelet can run here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

JOIN = "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash sha256:" + "c4" * 32


def stand_in_kubeadm(tmp_path: Path, kubelet_conf: Path | None = None) -> tuple[Path, Path, dict[str, str]]:
    """(inventory, the file the calls are appended to, the env vars that put the stand-in first on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "kubeadm.calls"
    joined = f'[ "$1" = join ] && touch {kubelet_conf}\n' if kubelet_conf is not None else ""
    (bin_dir / "kubeadm").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = token ] && echo "{JOIN}"\n'
                                     f"{joined}exit 0\n")
    (bin_dir / "kubeadm").chmod(0o755)
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "ansible_become": False, "kube_node_cni": "none"},
        "children": {"kube_master": {"hosts": {"Master-1": {}}}, "kube_workers": {"hosts": {"Worker-7": {}}}}}}))
    path = f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"
    return inv, calls, {"PATH": path}


def gpg_public_key(tmp_path: Path, name: str) -> tuple[bytes, str]:
    """(an ASCII-armored public key made here, its fingerprint): a stand-in for a signing key such as
    pkgs.k8s.io's Release.key. ed25519, no passphrase, in a keyring of its own under tmp_path."""
    import subprocess

    home = tmp_path / f"gnupg-{name}"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--batch", "--homedir", str(home)]
    try:
        subprocess.run([*gpg, "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key",
                        f"{name} <{name}@example.invalid>", "ed25519", "sign", "never"],
                       check=True, capture_output=True, timeout=120)
        colons = subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True,
                                timeout=60).stdout
        armored = subprocess.run([*gpg, "--armor", "--export"], check=True, capture_output=True, timeout=60).stdout
    finally:  # key generation started an agent for this keyring
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, timeout=60)
    fpr = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
    return armored, fpr
