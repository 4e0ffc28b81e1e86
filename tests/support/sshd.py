"""A real OpenSSH server on loopback for tests of the host-side (fabric) pipeline steps.

``sshd_server(workdir)`` starts Debian's ``/usr/sbin/sshd -D -E LOG -f CONFIG`` on 127.0.0.1 at a free port,
with a host key and a client key that ssh-keygen makes for this run only (no key material lives in the repo),
key authentication only (no passwords, no keyboard-interactive, no PAM), and a known_hosts file pinning the
host key. It logs at DEBUG1 to a file (with -e the sessions' stderr would carry debug lines), so a test can see
every authentication method a client tried. It is always stopped when the ``with`` block ends.

sshd needs root (it switches to the logged-in user and uses privilege separation) and the openssh-server
package (in the Makefile's APT_PACKAGES); without either, the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import free_port, stop_process, wait_for

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without its privilege separation directory


@dataclass(frozen=True)
class Sshd:
    port: int
    user: str
    client_key: Path      # private key whose public half is in authorized_keys
    host_key_pub: Path    # the server's public host key
    known_hosts: Path     # one line: [127.0.0.1]:PORT <host key>
    log: Path             # sshd's own log (-E, LogLevel DEBUG1: every authentication method tried)

    address: str = "127.0.0.1"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def keygen(path: Path, comment: str = "joulesched-test") -> Path:
    """A fresh ed25519 key pair at ``path`` and ``path``.pub (no passphrase); returns ``path``."""
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    return path


def known_hosts_line(address: str, port: int, pub: Path) -> str:
    """A known_hosts line for ``pub`` as OpenSSH writes it for a non-22 port: ``[addr]:port type key``."""
    key_type, key_b64 = pub.read_text().split()[:2]
    return f"[{address}]:{port} {key_type} {key_b64}\n"


def require_sshd() -> None:
    """Skip the calling test unless a real sshd can be started here."""
    if not os.path.exists(SSHD):
        pytest.skip(f"{SSHD} is missing: install openssh-server (make apt) to run the SSH tests")
    if shutil.which(SSH_KEYGEN) is None:
        pytest.skip("ssh-keygen is missing: install openssh-client to run the SSH tests")
    if os.geteuid() != 0:
        pytest.skip("a real sshd needs root (it switches users and uses privilege separation); CI runs as root")


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


@contextlib.contextmanager
def sshd_server(workdir: Path, extra_config: str = "") -> Iterator[Sshd]:
    """Run a real sshd on 127.0.0.1 for the ``with`` block. ``extra_config`` lines are appended to its
    sshd_config (e.g. ``SetEnv PATH=/nowhere`` for a host whose PATH lacks a tool)."""
    require_sshd()
    workdir.mkdir(parents=True, exist_ok=True)
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    host_key = keygen(workdir / "ssh_host_ed25519_key", "joulesched-test-host")
    client_key = keygen(workdir / "client_ed25519", "joulesched-test-client")
    authorized = workdir / "authorized_keys"
    authorized.write_text((workdir / "client_ed25519.pub").read_text())
    authorized.chmod(0o600)
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {host_key}\nPidFile none\n"
        f"AuthorizedKeysFile {authorized}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitEmptyPasswords no\nUsePAM no\nPermitRootLogin prohibit-password\n"
        # The work dir sits under /tmp, which is world-writable: StrictModes would refuse authorized_keys there.
        "StrictModes no\n"
        "Subsystem sftp internal-sftp\n"  # fabric's get/put speak SFTP
        "LogLevel DEBUG1\n"
        + extra_config + ("\n" if extra_config and not extra_config.endswith("\n") else ""))
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"sshd rejects its test config: {check.stderr.strip()}")
    log_path, out_path = workdir / "sshd.log", workdir / "sshd.out"
    out = open(out_path, "wb")  # what sshd prints before its log is open
    # -E, not -e: at DEBUG1 a session's child would also copy its debug lines into the command's stderr.
    proc = subprocess.Popen([SSHD, "-D", "-E", str(log_path), "-f", str(config)], stdout=out,
                            stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                said = out_path.read_text() + (log_path.read_text() if log_path.exists() else "")
                raise RuntimeError(f"sshd exited with {proc.returncode}: {said[-2000:]}")
            return _banner(port)

        wait_for(up, 20, f"sshd on 127.0.0.1:{port}", interval=0.1)
        known = workdir / "known_hosts"
        known.write_text(known_hosts_line("127.0.0.1", port, workdir / "ssh_host_ed25519_key.pub"))
        yield Sshd(port=port, user="root", client_key=client_key,
                   host_key_pub=workdir / "ssh_host_ed25519_key.pub", known_hosts=known, log=log_path)
    finally:
        stop_process(proc, timeout=10)
        out.close()
