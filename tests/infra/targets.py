"""Real targets for the Ansible roles: a dockerd of our own (no bridge, no NAT) running a Debian systemd
container imported from a debootstrap tarball. Everything is torn down by the context managers, even on failure.

The tarball is cached outside the repository in $JOULESCHED_CACHE_DIR (default /var/cache/joulesched).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.procs import cache_lock, private_dockerd, stop_process

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("JOULESCHED_CACHE_DIR", "/var/cache/joulesched"))
BUILD_SCRIPT = REPO / "scripts" / "infra" / "build-systemd-image.sh"
# Named after the build script's bytes: a changed package list builds a new image instead of reusing a stale one.
SYSTEMD_TAR = CACHE / f"systemd-bookworm-{hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:10]}.tar"
IMAGE = "joulesched/systemd-target:bookworm"


def why_not_docker() -> str | None:
    if os.environ.get("JOULESCHED_INFRA_E2E") == "0":
        return "JOULESCHED_INFRA_E2E=0"
    if os.geteuid() != 0:
        return "needs root (dockerd, debootstrap)"
    for exe, pkg in (("dockerd", "docker.io"), ("docker", "docker.io")):
        if shutil.which(exe) is None:
            return f"{exe} not installed (apt-get install {pkg})"
    if not SYSTEMD_TAR.is_file() and shutil.which("debootstrap") is None:
        return f"no cached {SYSTEMD_TAR} and no debootstrap to build it (apt-get install debootstrap)"
    if not Path("/sys/fs/cgroup").is_dir():
        return "no /sys/fs/cgroup for a systemd container"
    return None


def ensure_systemd_tar(timeout_s: int = 900) -> Path:
    with cache_lock(SYSTEMD_TAR):  # built once when test workers ask at the same time
        if not SYSTEMD_TAR.is_file():
            subprocess.run([str(BUILD_SCRIPT), str(SYSTEMD_TAR)], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=timeout_s)
            for stale in CACHE.glob("systemd-bookworm*.tar"):  # images of earlier build scripts: a GB each
                if stale != SYSTEMD_TAR:
                    stale.unlink(missing_ok=True)
    return SYSTEMD_TAR


def dockerd(start_timeout_s: float = 90):
    """Start a private dockerd (no bridge, no iptables, no masquerade); yield an env with DOCKER_HOST."""
    return private_dockerd(start_timeout_s, prefix="jsi-")


def docker(env: dict[str, str], *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {r.stderr.strip()[-1500:]}")
    return r


@contextlib.contextmanager
def systemd_container(env: dict[str, str], name: str, boot_timeout_s: float = 120) -> Iterator[str]:
    """Run the systemd image as `name` with loopback-only networking; yield once systemd has booted."""
    if docker(env, "image", "inspect", IMAGE, check=False).returncode != 0:
        docker(env, "import", "--change", 'CMD ["/sbin/init"]', str(ensure_systemd_tar()), IMAGE, timeout=600)
    docker(env, "run", "-d", "--name", name, "--hostname", name, "--network", "none",
           "--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined",
           "--tmpfs", "/run", "--tmpfs", "/run/lock", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--cgroupns=host",
           "--stop-signal", "SIGRTMIN+3", IMAGE, "/sbin/init")
    try:
        deadline = time.monotonic() + boot_timeout_s
        while True:
            r = docker(env, "exec", name, "systemctl", "is-system-running", check=False, timeout=30)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"systemd in {name} did not finish booting (state {state!r})")
            time.sleep(1)
        yield name
    finally:
        docker(env, "rm", "-f", name, check=False, timeout=120)


def why_not_libvirtd() -> str | None:
    for exe in ("libvirtd", "virtlogd"):
        if shutil.which(exe) is None:
            return f"{exe} not installed (apt-get install libvirt-daemon libvirt-daemon-driver-qemu)"
    if os.geteuid() != 0:
        return "libvirtd needs root"
    if Path("/run/libvirt/libvirt-sock").exists():
        return "a libvirtd is already running here; not starting a second one"
    if importlib.util.find_spec("libvirt") is None:
        return "libvirt-python not installed (pip install -e '.[infra-libvirt]')"
    return None


@contextlib.contextmanager
def libvirtd(start_timeout_s: float = 60) -> Iterator[str]:
    """Start virtlogd and libvirtd by hand (no systemd here); yield the qemu:///system URI; stop both after.

    The QEMU driver needs the libvirt-qemu system user, which is created when missing. No libvirt network is
    defined, so nothing gets a bridge; guests use QEMU user-mode networking only."""
    import libvirt

    if subprocess.run(["getent", "passwd", "libvirt-qemu"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "libvirt-qemu"],
                       check=True, timeout=60)
    d = Path(tempfile.mkdtemp(prefix="jsl-"))
    procs = []
    try:
        for exe in ("virtlogd", "libvirtd"):
            log = open(d / f"{exe}.log", "wb")
            procs.append(subprocess.Popen([exe], stdout=log, stderr=log))
            log.close()
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                libvirt.open("qemu:///system").close()
                break
            except libvirt.libvirtError:
                if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    raise RuntimeError("libvirtd did not start: "
                                       + (d / "libvirtd.log").read_text(errors="replace")[-1500:])
                time.sleep(0.5)
        yield "qemu:///system"
    finally:
        for p in reversed(procs):
            stop_process(p, timeout=30)
        shutil.rmtree(d, ignore_errors=True)
