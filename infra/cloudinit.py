"""Render the cloud-init NoCloud documents in infra/cloud-init/ (the kvm and aws targets, and test guests).

Templates use StrictUndefined and JSON-quote every value, so a missing variable is an error and a value can
never break the YAML. `validate` runs `cloud-init schema` when the binary exists.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import jinja2

from joulesched.core.errors import JouleschedError
from joulesched.infra.config import GPG_FINGERPRINT, KUBERNETES_APT_KEY_FINGERPRINT, KubeadmConfig

TEMPLATES = Path(__file__).resolve().parent / "cloud-init"
ADMIN_USER = "joulesched"

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, autoescape=False)


def _render(template: str, **values) -> str:
    return _env.get_template(template).render(**values)


FETCH_CA_KEY = TEMPLATES / "fetch-ca-key.py"
#: The line a master prints on its serial console once kubeadm made (or loaded) the CA: public, the pin.
CA_HASH_MARKER = "JOULESCHED-CA-CERT-HASH "
_CA_HASH = re.compile(re.escape(CA_HASH_MARKER) + r"(sha256:[0-9a-f]{64})\b")


def render_kube_node(*, role: str, hostname: str, ssh_authorized_keys: list[str], kubeadm: KubeadmConfig,
                     token: str, ca_cert_pem: str = "", ca_key_parameter: str = "", aws_region: str = "",
                     ca_cert_hash: str = "", master_address: str = "", advertise_address: str = "",
                     apt_key_fingerprint: str = KUBERNETES_APT_KEY_FINGERPRINT) -> str:
    """user-data for a kubeadm master or worker. No private key ever goes in.

    The pkgs.k8s.io Release.key is installed only when its one primary key has ``apt_key_fingerprint``.

    A master either lets ``kubeadm init`` make the cluster CA (the default; its hash appears on the serial
    console, see :func:`ca_hash_from_console`), or, given ``ca_cert_pem`` with ``ca_key_parameter`` and
    ``aws_region``, fetches that CA's key from SSM Parameter Store through its instance role before init.
    A worker needs the CA's hash (``sha256:...``) and the master's address."""
    if role not in ("master", "worker"):
        raise ValueError(f"role must be master or worker, got {role!r}")
    if role == "master" and bool(ca_cert_pem) != bool(ca_key_parameter and aws_region):
        raise ValueError("a master given a CA certificate needs ca_key_parameter and aws_region (its key comes "
                         "from SSM), and one without lets kubeadm make the CA")
    if "PRIVATE KEY" in ca_cert_pem:
        raise ValueError("ca_cert_pem holds a private key; user-data must never carry one")
    if role == "worker" and not (ca_cert_hash.startswith("sha256:") and master_address):
        raise ValueError("a worker needs ca_cert_hash (sha256:...) and master_address")
    if not GPG_FINGERPRINT.match(apt_key_fingerprint):
        raise ValueError(f"apt_key_fingerprint must be 40 upper-case hex digits, got {apt_key_fingerprint!r}")
    cni_url, cni_sha256 = kubeadm.cni_manifest()
    return _render("kube-node.yaml.j2", role=role, hostname=hostname, admin_user=ADMIN_USER,
                   ssh_authorized_keys=ssh_authorized_keys, kubernetes_minor=kubeadm.kubernetes_minor,
                   pod_network_cidr=kubeadm.pod_network_cidr, cni=kubeadm.cni, cni_url=cni_url,
                   cni_sha256=cni_sha256, token=token, ca_cert_pem=ca_cert_pem if role == "master" else "",
                   ca_key_parameter=ca_key_parameter if role == "master" else "", aws_region=aws_region,
                   fetch_ca_key_script=FETCH_CA_KEY.read_text(), ca_cert_hash=ca_cert_hash,
                   master_address=master_address, advertise_address=advertise_address,
                   apt_key_fingerprint=apt_key_fingerprint)


#: SHA-256 of no bytes: what the console line reads when the CA's key could not be read (a failed init).
EMPTY_SHA256 = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def ca_hash_from_console(text: str) -> str | None:
    """The CA hash a master printed on its serial console (:data:`CA_HASH_MARKER`), or None if not yet (the
    hash of nothing, which a failed ``kubeadm init`` printed before, is not a CA's)."""
    for m in _CA_HASH.finditer(text):
        if m.group(1) != EMPTY_SHA256:
            return m.group(1)
    return None


_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-_])")  # terminal control sequences (colours, cursor moves)


def console_tail(console_log: str | Path, lines: int = 40, max_chars: int = 4000) -> str:
    """The last ``lines`` lines of a serial console log (at most ``max_chars``), terminal escapes and control
    characters removed, for an error message; a note when there is none."""
    try:
        text = Path(console_log).read_text(errors="replace")
    except OSError as e:
        return f"(no serial console log: {e.strerror or e})"
    text = _ESCAPES.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = "".join(ch for ch in text if ch in "\n\t" or ch.isprintable())
    tail = "\n".join(line.rstrip() for line in text.strip().splitlines()[-lines:])[-max_chars:]
    return tail or "(the serial console log is empty)"


def wait_for_ca_hash(console_log: str | Path, timeout_s: float, alive=lambda: True, poll_s: float = 1.0) -> str:
    """Poll a master's serial console log until it prints the CA hash; :class:`CaHashTimeout` when the guest
    stops or the time runs out, its message ending with the tail of the console (:func:`console_tail`): the
    caller then deletes the guest, console log included, so the message is where the reason survives.

    The console is the guest's own output, written by QEMU on the host: only public values come back this way
    (command output, the bootstrap token's included, goes to a log inside the guest; infra/cloud-init/).
    """
    import time

    deadline = time.monotonic() + timeout_s
    path = Path(console_log)
    while True:
        try:
            found = ca_hash_from_console(path.read_text(errors="replace"))
        except OSError:
            found = None
        if found:
            return found
        if not alive():
            raise CaHashTimeout("the master stopped before printing its CA hash; the end of its serial console:\n"
                                + console_tail(path))
        if time.monotonic() > deadline:
            raise CaHashTimeout(f"the master printed no CA hash within {timeout_s:.0f} s (kubeadm init failed, or "
                                "is still running); the end of its serial console:\n" + console_tail(path))
        time.sleep(poll_s)


def render_power_host(*, hostname: str, ssh_authorized_keys: list[str]) -> str:
    """user-data for a bare host Ansible configures. The host makes its own SSH host keys on first boot and
    prints the public halves on its serial console, where a client reads them to pin the host
    (:func:`host_keys_from_console`); no host private key is ever in user-data."""
    return _render("power-host.yaml.j2", hostname=hostname, admin_user=ADMIN_USER,
                   ssh_authorized_keys=ssh_authorized_keys)


_HOST_KEYS = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S)
_PUBKEY = re.compile(r"\b(ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa) ([A-Za-z0-9+/]+={0,3})")


def host_keys_from_console(text: str) -> list[str]:
    """``["ssh-ed25519 AAAA...", ...]``: the host public keys cloud-init printed on the serial console (its
    keys_to_console module), for a known_hosts file; empty until the block has been printed."""
    m = _HOST_KEYS.search(text.replace("\r", ""))
    return [f"{t} {b}" for t, b in _PUBKEY.findall(m.group(1))] if m else []


def render_meta_data(*, hostname: str, user_data: str) -> str:
    """meta-data; the instance-id follows the user-data, so a changed seed is applied on next boot."""
    digest = hashlib.sha256(user_data.encode()).hexdigest()[:12]
    return _render("meta-data.j2", instance_id=f"{hostname}-{digest}", hostname=hostname)


def render_network_config(*, address: str, gateway: str, dns: str) -> str:
    return _render("network-config.j2", address=address, gateway=gateway, dns=dns)


class SchemaUnavailable(JouleschedError, RuntimeError):
    pass


class CaHashTimeout(JouleschedError, RuntimeError):
    """A master never printed its CA hash on the console (kubeadm init failed, or is still running)."""


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
