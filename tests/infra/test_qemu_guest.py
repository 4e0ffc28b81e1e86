"""A real VM: a Debian guest under QEMU (TCG; /dev/kvm here is kvm_pvm, which hangs stock kernels), booted with a
NoCloud seed rendered from infra/cloud-init/power-host.yaml.j2, reached over SSH on a 127.0.0.1 forwarded port
with a per-run client key and a per-run host key that the client pins (StrictHostKeyChecking=yes). The site
playbook configures it (air-gapped: wheelhouse + preinstalled packages), then testinfra checks it over SSH.

Opt-in, because it takes minutes of TCG CPU: JOULESCHED_INFRA_E2E=1. The guest image is cached in
$JOULESCHED_CACHE_DIR/guest (built by scripts/infra/build-guest-image.sh, about 2-3 minutes once).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.infra import targets
from tests.support.procs import stop_process

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]
HERE = Path(__file__).resolve().parent
GUEST = targets.CACHE / "guest"
BUILD = targets.REPO / "scripts" / "infra" / "build-guest-image.sh"


def _why_not() -> str | None:
    if os.environ.get("JOULESCHED_INFRA_E2E") != "1":
        return "QEMU guest test is opt-in (minutes of TCG CPU): set JOULESCHED_INFRA_E2E=1"
    for exe, pkg in (("qemu-system-x86_64", "qemu-system-x86"), ("qemu-img", "qemu-utils"),
                     ("cloud-localds", "cloud-image-utils"), ("ssh", "openssh-client"),
                     ("ssh-keygen", "openssh-client")):
        if shutil.which(exe) is None:
            return f"{exe} not installed (apt-get install {pkg})"
    if not (GUEST / "rootfs.raw").is_file() and (os.geteuid() != 0 or shutil.which("debootstrap") is None):
        return f"no cached guest image in {GUEST} and no root+debootstrap to build it"
    return None


def _boot_mode() -> str:
    """libvirt (our create_guest through a libvirtd started here) where that works, else plain QEMU.
    JOULESCHED_INFRA_BOOT=libvirt|qemu forces one."""
    forced = os.environ.get("JOULESCHED_INFRA_BOOT", "auto")
    if forced in ("libvirt", "qemu"):
        return forced
    return "qemu" if targets.why_not_libvirtd() else "libvirt"


@contextlib.contextmanager
def _libvirt_guest(d: Path, port: int, user_data: str):
    """The guest through infra.libvirt_guests (the code `joulesched infra kvm up` and Pulumi use)."""
    from infra.cloudinit import render_meta_data
    from infra.libvirt_guests import GuestSpec, create_guest, delete_guest

    with targets.libvirtd() as uri:
        spec = GuestSpec(name="js-guest", uri=uri, base_image=str(GUEST / "rootfs.raw"), pool_dir=str(d / "pool"),
                         user_data=user_data, meta_data=render_meta_data(hostname="js-guest", user_data=user_data),
                         virt_type="qemu", memory_mib=1536, vcpus=1, disk_gib=4, network="user", ssh_port=port,
                         kernel=str(GUEST / "vmlinuz"), initrd=str(GUEST / "initrd.img"))
        (d / "pool").mkdir(mode=0o755)
        try:
            create_guest(spec)
            yield
        finally:
            delete_guest(uri, spec.name, spec.pool_dir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> tuple[str, str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "joulesched-test", "-f", str(path)],
                   check=True, timeout=30)
    return path.read_text(), path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def guest():
    why = _why_not()
    if why:
        pytest.skip(why)
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed")
    # -cpu max: the default qemu64 model lacks the SSE4/AVX that numpy's wheels need (the exporter dies with SIGILL).
    from infra.cloudinit import ADMIN_USER, render_meta_data, render_power_host
    from infra.libvirt_guests import make_overlay, make_seed

    if not (GUEST / "rootfs.raw").is_file():
        subprocess.run([str(BUILD), str(GUEST)], check=True, stdout=subprocess.DEVNULL, timeout=1200)
    d = Path(tempfile.mkdtemp(prefix="js-qemu-"))
    d.chmod(0o755)  # with libvirt, QEMU runs as libvirt-qemu and must reach the guest's files
    proc = None
    stack = contextlib.ExitStack()
    try:
        _, client_pub = _keygen(d / "client")
        host_priv, host_pub = _keygen(d / "hostkey")
        (d / "hostkey").unlink()  # the guest gets it through the seed; the client needs only the public half
        port = _free_port()
        (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}\n")
        user_data = render_power_host(hostname="js-guest", ssh_authorized_keys=[client_pub],
                                      host_key_private=host_priv, host_key_public=host_pub)
        boot = _boot_mode()
        if boot == "libvirt":
            stack.enter_context(_libvirt_guest(d, port, user_data))
            log = d / "pool" / "js-guest" / "console.log"
        else:
            make_seed(d / "seed.img", user_data=user_data,
                      meta_data=render_meta_data(hostname="js-guest", user_data=user_data))
            make_overlay(GUEST / "rootfs.raw", d / "disk.qcow2", 4)
            log = d / "console.log"
            proc = subprocess.Popen([
                "qemu-system-x86_64", "-accel", "tcg,tb-size=256", "-cpu", "max", "-m", "1536", "-smp", "1",
                "-kernel", str(GUEST / "vmlinuz"), "-initrd", str(GUEST / "initrd.img"),
                "-append", "root=/dev/vda rw console=ttyS0",
                "-drive", f"file={d / 'disk.qcow2'},if=virtio,format=qcow2",
                "-drive", f"file={d / 'seed.img'},if=virtio,format=raw,readonly=on",
                "-nic", f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
                "-display", "none", "-serial", f"file:{log}", "-no-reboot"],
                stdout=subprocess.DEVNULL, stderr=open(d / "qemu.stderr", "wb"))
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o", "ConnectTimeout=5", "-i", str(d / "client"),
               "-p", str(port), f"{ADMIN_USER}@127.0.0.1"]
        t0 = time.monotonic()
        while subprocess.run([*ssh, "cloud-init", "status", "--wait"], capture_output=True,
                             timeout=600).returncode != 0:
            if (proc is not None and proc.poll() is not None) or time.monotonic() - t0 > 600:
                pytest.fail(f"guest never accepted our pinned SSH: {log.read_text(errors='replace')[-3000:] if log.exists() else ''}")
            time.sleep(3)
        ready_s = time.monotonic() - t0
        inv = d / "hosts.yml"
        inv.write_text(yaml.safe_dump({"all": {"children": {"power_hosts": {"hosts": {"js-guest": {
            "ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": ADMIN_USER,
            "ansible_ssh_private_key_file": str(d / "client"), "ansible_become": True,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={d / 'known_hosts'}",
            "power_exporter_install_mode": "wheelhouse",
            "power_exporter_wheelhouse_src": str(targets.CACHE / "wheelhouse"),
            "power_exporter_apt_update_cache": False, "node_exporter_apt_update_cache": False}}}}}}))
        yield {"inventory": inv, "ssh": ssh, "ready_s": ready_s, "dir": d, "boot": boot}
    finally:
        stack.close()
        if proc is not None:
            stop_process(proc, timeout=30)
        shutil.rmtree(d, ignore_errors=True)


def test_playbook_then_testinfra_on_a_real_guest(guest):
    from infra.provision import provision
    from infra.wheelhouse import build_wheelhouse

    build_wheelhouse(targets.CACHE / "wheelhouse")
    t0 = time.monotonic()
    r = provision(guest["inventory"], timeout_s=1200)
    converge_s = time.monotonic() - t0
    assert r.succeeded, r.stdout[-6000:]
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.monotonic()
    t = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                        str(HERE / "test_power_host.py"), "--hosts=ansible://all",
                        f"--ansible-inventory={guest['inventory']}"],
                       env=env, capture_output=True, text=True, timeout=900, cwd=str(targets.REPO))
    print(f"\nboot {guest['boot']}: guest ready {guest['ready_s']:.0f}s, converge {converge_s:.0f}s, testinfra {time.monotonic() - t0:.0f}s")
    assert t.returncode == 0, t.stdout[-6000:] + t.stderr[-2000:]
