"""Render the cloud-init NoCloud documents in infra/cloud-init/ (the kvm and aws targets, and test guests).

Templates use StrictUndefined and JSON-quote every value, so a missing variable is an error and a value can
never break the YAML. `validate` runs `cloud-init schema` when the binary exists.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import jinja2

from joulesched.core.errors import JouleschedError
from joulesched.infra.config import KubeadmConfig

TEMPLATES = Path(__file__).resolve().parent / "cloud-init"
ADMIN_USER = "joulesched"

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, autoescape=False)


def _render(template: str, **values) -> str:
    return _env.get_template(template).render(**values)


def render_kube_node(*, role: str, hostname: str, ssh_authorized_keys: list[str], kubeadm: KubeadmConfig,
                     token: str, ca_cert_pem: str, ca_key_pem: str = "", ca_cert_hash: str = "",
                     master_address: str = "", advertise_address: str = "") -> str:
    """user-data for a kubeadm master (`role="master"`, needs the CA key) or worker (needs the CA hash)."""
    if role not in ("master", "worker"):
        raise ValueError(f"role must be master or worker, got {role!r}")
    if role == "master" and not ca_key_pem:
        raise ValueError("a master needs the cluster CA key")
    if role == "worker" and not (ca_cert_hash.startswith("sha256:") and master_address):
        raise ValueError("a worker needs ca_cert_hash (sha256:...) and master_address")
    return _render("kube-node.yaml.j2", role=role, hostname=hostname, admin_user=ADMIN_USER,
                   ssh_authorized_keys=ssh_authorized_keys, kubernetes_minor=kubeadm.kubernetes_minor,
                   pod_network_cidr=kubeadm.pod_network_cidr, cni=kubeadm.cni,
                   calico_version=kubeadm.calico_version, token=token, ca_cert_pem=ca_cert_pem,
                   ca_key_pem=ca_key_pem, ca_cert_hash=ca_cert_hash, master_address=master_address,
                   advertise_address=advertise_address)


def render_power_host(*, hostname: str, ssh_authorized_keys: list[str], host_key_private: str = "",
                      host_key_public: str = "") -> str:
    """user-data for a bare host Ansible configures; pass a per-run ed25519 host key pair to pin it."""
    if bool(host_key_private) != bool(host_key_public):
        raise ValueError("give both halves of the host key or neither")
    return _render("power-host.yaml.j2", hostname=hostname, admin_user=ADMIN_USER,
                   ssh_authorized_keys=ssh_authorized_keys, host_key_private=host_key_private,
                   host_key_public=host_key_public)


def render_meta_data(*, hostname: str, user_data: str) -> str:
    """meta-data; the instance-id follows the user-data, so a changed seed is applied on next boot."""
    digest = hashlib.sha256(user_data.encode()).hexdigest()[:12]
    return _render("meta-data.j2", instance_id=f"{hostname}-{digest}", hostname=hostname)


def render_network_config(*, address: str, gateway: str, dns: str) -> str:
    return _render("network-config.j2", address=address, gateway=gateway, dns=dns)


class SchemaUnavailable(JouleschedError, RuntimeError):
    pass


def validate(user_data: str) -> None:
    """Run `cloud-init schema` on a user-data document; raise ValueError with its report if invalid."""
    exe = shutil.which("cloud-init")
    if exe is None:
        raise SchemaUnavailable("cloud-init is not installed (apt-get install cloud-init)")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(user_data)
        f.flush()
        r = subprocess.run([exe, "schema", "--config-file", f.name, "--annotate"], capture_output=True,
                           text=True, timeout=120)
    # Older cloud-init exits 0 with an annotated "# Errors:" block, so read the report too.
    if r.returncode != 0 or "Errors:" in r.stdout or "Valid cloud-config" not in r.stdout:
        raise ValueError(f"cloud-init schema rejected the document:\n{r.stdout}{r.stderr}")
