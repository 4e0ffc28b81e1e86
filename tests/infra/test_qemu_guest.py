"""A real VM: a Debian guest under QEMU (TCG; /dev/kvm here is kvm_pvm, which hangs stock kernels), booted with a
NoCloud seed rendered from infra/cloud-init/power-host.yaml.j2, reached over SSH on a 127.0.0.1 forwarded port
with a per-run client key. The guest makes its own host keys on first boot and prints their public halves on the
serial console; the client pins those (StrictHostKeyChecking=yes), so no host private key is in the seed. The site
playbook configures it (air-gapped: wheelhouse + preinstalled packages), a second run must change nothing, then
testinfra checks it over SSH.

Runs by default (CI included): about 19 minutes of TCG on one core (measured 2026-12-02 on 2 cores),
+3 minutes the first time to build the guest image, which is cached in $JOULESCHED_CACHE_DIR/guest
(scripts/infra/build-guest-image.sh; rebuilt when that script changes). It is marked ``heavy``:
`make test PYTEST_JOBS=2` starts it first, on one worker, while the other runs the rest of the suite
(tests/conftest.py). JOULESCHED_INFRA_E2E=0 skips it, saying so. The guest boots through our libvirt code on a
libvirtd that the test starts and stops (virtlogd too), or through plain QEMU where libvirtd cannot start here;
JOULESCHED_INFRA_BOOT=libvirt|qemu forces one. Every daemon and the guest are stopped even when a step fails; a
failure message carries the tail of the guest's serial console, and the logs are kept under pytest's basetemp.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.infra import targets
from tests.support.procs import free_port, stop_process

# A last resort over the whole module (first test: image build when cold, boot, both converges); every step
# below has its own, smaller bound that fails first with a message saying which step it was.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(3600)]
HERE = Path(__file__).resolve().parent
GUEST = targets.CACHE / "guest"
BUILD = targets.REPO / "scripts" / "infra" / "build-guest-image.sh"
NAME = "js-guest"
# The converge's bound leaves room for the other worker's load on the second core (a hang guard, not a speed check).
IMAGE_BUILD_S, SSH_S, CLOUD_INIT_S, CONVERGE_S, RECONVERGE_S, TESTINFRA_S = 1200, 420, 420, 1800, 900, 600


def _why_not() -> str | None:
    if os.environ.get("JOULESCHED_INFRA_E2E") == "0":
        return "JOULESCHED_INFRA_E2E=0: the QEMU guest test (about 7 min of TCG) is turned off"
    for exe, pkg in (("qemu-system-x86_64", "qemu-system-x86"), ("qemu-img", "qemu-utils"),
                     ("cloud-localds", "cloud-image-utils"), ("ssh", "openssh-client"),
                     ("ssh-keygen", "openssh-client")):
        if shutil.which(exe) is None:
            return f"{exe} not installed (apt-get install {pkg})"
    if not _image_current() and (os.geteuid() != 0 or shutil.which("debootstrap") is None):
        return f"no current guest image in {GUEST} and no root+debootstrap to build it"
    return None


def _build_stamp() -> str:
    """The image is a function of its build script: a changed script means a rebuild, never a stale cache."""
    return hashlib.sha256(BUILD.read_bytes()).hexdigest()


def _image_current() -> bool:
    stamp = GUEST / "build.sha256"
    return ((GUEST / "rootfs.raw").is_file() and stamp.is_file()
            and stamp.read_text().strip() == _build_stamp())


def _ensure_image() -> None:
    if _image_current():
        return
    t0 = time.monotonic()
    try:
        subprocess.run([str(BUILD), str(GUEST)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=IMAGE_BUILD_S)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"building the guest image failed ({BUILD} {GUEST}): {e.stderr[-3000:]}")
    except subprocess.TimeoutExpired:
        pytest.fail(f"building the guest image took over {IMAGE_BUILD_S} s ({BUILD} {GUEST})")
    (GUEST / "build.sha256").write_text(_build_stamp() + "\n")
    print(f"\nguest image built in {time.monotonic() - t0:.0f}s")


def _boot_mode() -> str:
    """libvirt (our create_guest through a libvirtd started here) where that works, else plain QEMU.
    JOULESCHED_INFRA_BOOT=libvirt|qemu forces one."""
    forced = os.environ.get("JOULESCHED_INFRA_BOOT", "auto")
    if forced in ("libvirt", "qemu"):
        return forced
    return "qemu" if targets.why_not_libvirtd() else "libvirt"


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as e:
        return f"({path} unreadable: {e})"


def _pid_alive_as(pid: int, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _qemu_user_may_open_kvm() -> None:
    """Let libvirt's QEMU user open /dev/kvm (the kvm group), as packaged libvirt setups do; here we create that
    user ourselves, without libvirt-daemon-system. libvirt probes QEMU's capabilities with /dev/kvm present, then checks that
    device as the QEMU user; when that user cannot open it, every lookup finds the cached capabilities outdated
    and probes again: about 50 s per guest instead of under 1. The guest still gets TCG (domain type qemu)."""
    if not Path("/dev/kvm").exists() or subprocess.run(["getent", "group", "kvm"], capture_output=True).returncode:
        return
    if subprocess.run(["getent", "passwd", "libvirt-qemu"], capture_output=True).returncode:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--groups", "kvm",
                        "libvirt-qemu"], check=True, timeout=60)
    elif "kvm" not in subprocess.run(["id", "-nG", "libvirt-qemu"], capture_output=True, text=True).stdout.split():
        subprocess.run(["usermod", "--append", "--groups", "kvm", "libvirt-qemu"], check=True, timeout=60)


@contextlib.contextmanager
def _libvirt_guest(d: Path, port: int, user_data: str):
    """The guest through infra.libvirt_guests (the code `joulesched infra kvm up` and Pulumi use), on a libvirtd
    and virtlogd of our own; yields a callable telling whether the guest still runs."""
    import libvirt

    from joulesched.infra.cloudinit import render_meta_data
    from joulesched.infra.libvirt_guests import GuestSpec, create_guest, delete_guest

    _qemu_user_may_open_kvm()
    with targets.libvirtd() as uri:
        spec = GuestSpec(name=NAME, uri=uri, base_image=str(GUEST / "rootfs.raw"), pool_dir=str(d / "pool"),
                         user_data=user_data, meta_data=render_meta_data(hostname=NAME, user_data=user_data),
                         virt_type="qemu", memory_mib=1536, vcpus=1, disk_gib=4, network="user", ssh_port=port,
                         kernel=str(GUEST / "vmlinuz"), initrd=str(GUEST / "initrd.img"))
        (d / "pool").mkdir(mode=0o755)
        delete_guest(uri, NAME, spec.pool_dir)  # a domain left defined by a run that was killed outright
        pid = None
        try:
            create_guest(spec)
            with contextlib.suppress(OSError, ValueError):
                pid = int(Path(f"/run/libvirt/qemu/{NAME}.pid").read_text())

            def alive() -> bool:
                try:
                    conn = libvirt.open(uri)
                except libvirt.libvirtError:
                    return False
                try:
                    return bool(conn.lookupByName(NAME).isActive())
                except libvirt.libvirtError:
                    return False
                finally:
                    conn.close()

            alive.uri = uri  # the node power test drives this domain through the libvirt actuator
            yield alive
        finally:
            delete_guest(uri, NAME, spec.pool_dir)
            # libvirt runs QEMU detached from libvirtd: make sure it did go, before libvirtd itself stops.
            if pid is not None and _pid_alive_as(pid, f"guest={NAME}"):
                os.kill(pid, 9)


@contextlib.contextmanager
def _qemu_guest(d: Path, port: int, user_data: str, log: Path):
    """The same guest under plain qemu-system-x86_64, a child of this process; yields `alive`."""
    from joulesched.infra.cloudinit import render_meta_data
    from joulesched.infra.libvirt_guests import make_overlay, make_seed

    make_seed(d / "seed.img", user_data=user_data, meta_data=render_meta_data(hostname=NAME, user_data=user_data))
    make_overlay(GUEST / "rootfs.raw", d / "disk.qcow2", 4)
    with open(d / "qemu.stderr", "wb") as err:
        # -cpu max: the default qemu64 model lacks the SSE4/AVX numpy's wheels need (the exporter dies with SIGILL).
        proc = subprocess.Popen([
            "qemu-system-x86_64", "-accel", "tcg,tb-size=256", "-cpu", "max", "-m", "1536", "-smp", "1",
            "-kernel", str(GUEST / "vmlinuz"), "-initrd", str(GUEST / "initrd.img"),
            "-append", "root=/dev/vda rw console=ttyS0",
            "-drive", f"file={d / 'disk.qcow2'},if=virtio,format=qcow2",
            "-drive", f"file={d / 'seed.img'},if=virtio,format=raw,readonly=on",
            "-nic", f"user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
            "-display", "none", "-serial", f"file:{log}", "-no-reboot"],
            stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield lambda: proc.poll() is None
    finally:
        stop_process(proc, timeout=30)


def _keygen(path: Path) -> tuple[str, str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "joulesched-test", "-f", str(path)],
                   check=True, timeout=30)
    return path.read_text(), path.with_suffix(".pub").read_text().strip()


class Guest:
    """A running guest: how to reach it, where its serial console goes, and a failure message with its tail."""

    def __init__(self, d: Path, port: int, log: Path, boot: str, alive):
        self.dir, self.port, self.log, self.boot, self.alive = d, port, log, boot, alive
        self.ssh_opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                         "-o", f"UserKnownHostsFile={d / 'known_hosts'}", "-o", "ConnectTimeout=5"]
        self.inventory = d / "hosts.yml"
        self.timings: dict[str, float] = {}

    def ssh(self, *cmd: str, timeout: float) -> subprocess.CompletedProcess:
        from joulesched.infra.cloudinit import ADMIN_USER

        return subprocess.run(["ssh", *self.ssh_opts, "-i", str(self.dir / "client"), "-p", str(self.port),
                               f"{ADMIN_USER}@127.0.0.1", *cmd], capture_output=True, text=True, timeout=timeout)

    def why(self, msg: str) -> str:
        state = "running" if self.alive() else "NOT RUNNING"
        return f"{msg}\n--- guest ({self.boot}, {state}) serial console, last lines ({self.log}) ---\n{_tail(self.log)}"

    def pin_host_key(self) -> None:
        """known_hosts from the host keys cloud-init printed on the serial console (keys_to_console)."""
        from joulesched.infra.cloudinit import host_keys_from_console

        t0 = time.monotonic()
        while True:
            keys = host_keys_from_console(_tail(self.log, 10**7))
            if keys:
                break
            if not self.alive():
                pytest.fail(self.why("the guest stopped before printing its host keys"))
            if time.monotonic() - t0 > SSH_S + CLOUD_INIT_S:
                pytest.fail(self.why(f"no host keys on the serial console after {SSH_S + CLOUD_INIT_S} s"))
            time.sleep(2)
        (self.dir / "known_hosts").write_text("".join(f"[127.0.0.1]:{self.port} {k}\n" for k in keys))
        self.timings["host keys"] = time.monotonic() - t0

    def wait_ready(self) -> None:
        """SSH with the pinned host key and our key, then cloud-init finished without errors.

        Polls `cloud-init status` with short connections: cloud-init restarts sshd after SSH first answers
        (set-passwords), so a single long `--wait` over one connection can be cut, or refused, mid-way."""
        t0, ssh_up, last = time.monotonic(), None, "no answer yet"
        while True:
            try:
                r = self.ssh("cloud-init", "status", timeout=30)
                last = f"rc {r.returncode}: {(r.stdout + r.stderr).strip()[-500:]}"
            except subprocess.TimeoutExpired:
                r, last = None, "ssh timed out after 30 s"
            if r is not None and r.returncode != 255:  # 255: ssh itself failed (refused, reset, key)
                if ssh_up is None:
                    ssh_up = time.monotonic()
                    self.timings["ssh"] = ssh_up - t0
                status = r.stdout.partition("status:")[2].split()[:1]
                if r.returncode == 0 and status == ["done"]:
                    break
                if r.returncode != 0 or status in (["error"], ["disabled"]):
                    detail = self.ssh("sudo", "tail", "-n", "60", "/var/log/cloud-init.log", timeout=60)
                    pytest.fail(self.why(f"cloud-init failed in the guest ({last}):\n{detail.stdout}"))
            if not self.alive():
                pytest.fail(self.why(f"the guest stopped (last ssh: {last})"))
            if ssh_up is None and time.monotonic() - t0 > SSH_S:
                pytest.fail(self.why(f"no SSH with the pinned host key after {SSH_S} s (last: {last})"))
            if ssh_up is not None and time.monotonic() - ssh_up > CLOUD_INIT_S:
                pytest.fail(self.why(f"cloud-init not done {CLOUD_INIT_S} s after SSH answered (last: {last})"))
            time.sleep(3)
        self.timings["ready"] = time.monotonic() - t0


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    why = _why_not()
    if why:
        pytest.skip(why)
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed (pip install -e '.[infra]')")
    from joulesched.infra.cloudinit import ADMIN_USER, render_power_host
    from joulesched.infra.wheelhouse import archive_wheelhouse, build_wheelhouse

    _ensure_image()
    wheelhouse = targets.CACHE / "wheelhouse"
    build_wheelhouse(wheelhouse)
    # The archive form: one copy instead of several module runs per wheel, minutes under TCG. (The container
    # test installs from the directory form.)
    archive = archive_wheelhouse(wheelhouse, targets.CACHE / "wheelhouse.tar")
    d = Path(tempfile.mkdtemp(prefix="js-qemu-"))
    d.chmod(0o755)  # with libvirt, QEMU runs as libvirt-qemu and must reach the guest's files
    kept = tmp_path_factory.mktemp("qemu-guest-logs")
    stack = contextlib.ExitStack()
    log = None
    try:
        _, client_pub = _keygen(d / "client")
        port = free_port()
        user_data = render_power_host(hostname=NAME, ssh_authorized_keys=[client_pub])
        boot = _boot_mode()
        t0 = time.monotonic()
        if boot == "libvirt":
            log = d / "pool" / NAME / "console.log"
            alive = stack.enter_context(_libvirt_guest(d, port, user_data))
        else:
            log = d / "console.log"
            alive = stack.enter_context(_qemu_guest(d, port, user_data, log))
        g = Guest(d, port, log, boot, alive)
        g.pin_host_key()
        g.wait_ready()
        g.timings["boot"] = time.monotonic() - t0
        g.inventory.write_text(yaml.safe_dump({"all": {"children": {"power_hosts": {"hosts": {NAME: {
            "ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": ADMIN_USER,
            "ansible_ssh_private_key_file": str(d / "client"), "ansible_become": True,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={d / 'known_hosts'}",
            # One ssh exec per task instead of five (mkdir, sftp, chmod, run, rm): about a third off under TCG.
            "ansible_pipelining": True,
            "power_exporter_install_mode": "wheelhouse", "power_exporter_wheelhouse_src": str(archive),
            "power_exporter_apt_update_cache": False, "node_exporter_apt_update_cache": False}}}}}}))
        yield g
    finally:
        if log is not None and log.exists():
            shutil.copy2(log, kept / "console.log")
        stack.close()
        if (d / "qemu.stderr").exists():
            shutil.copy2(d / "qemu.stderr", kept / "qemu.stderr")
        shutil.rmtree(d, ignore_errors=True)


def _changed_tasks(stdout: str) -> list[str]:
    """The tasks an ansible-playbook run reported `changed` for (its default stdout callback)."""
    task, out = "", []
    for line in stdout.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed:"):
            out.append(task)
    return out


def _provision(guest: Guest, what: str, timeout_s: int):
    from joulesched.infra.provision import provision

    t0 = time.monotonic()
    r = provision(guest.inventory, timeout_s=timeout_s)
    guest.timings[what] = time.monotonic() - t0
    if r.status == "timeout":
        pytest.fail(guest.why(f"{what}: ansible-playbook did not finish in {timeout_s} s:\n{r.stdout[-4000:]}"))
    return r


@pytest.fixture(scope="module")
def converged(guest):
    first = _provision(guest, "converge", CONVERGE_S)
    assert first.succeeded, guest.why(f"first converge failed:\n{first.stdout[-6000:]}")
    second = _provision(guest, "second run", RECONVERGE_S)
    return first, second


def test_converge_passes(converged):
    first, _ = converged
    assert first.changed > 0 and first.failed == 0


def test_second_run_changes_nothing(guest, converged):
    _, second = converged
    assert second.succeeded, guest.why(f"second run failed:\n{second.stdout[-6000:]}")
    assert second.changed == 0, (f"the second run changed {second.changed} task(s): {_changed_tasks(second.stdout)}"
                                 f"\n{second.stdout[-6000:]}")


def test_testinfra_passes_over_ssh(guest, converged):
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.monotonic()
    try:
        t = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                            str(HERE / "test_power_host.py"), "--hosts=ansible://all",
                            f"--ansible-inventory={guest.inventory}"],
                           env=env, capture_output=True, text=True, timeout=TESTINFRA_S, cwd=str(targets.REPO))
    except subprocess.TimeoutExpired:
        pytest.fail(guest.why(f"testinfra did not finish in {TESTINFRA_S} s"))
    guest.timings["testinfra"] = time.monotonic() - t0
    print("\nqemu guest (" + guest.boot + "): "
          + ", ".join(f"{k} {v:.0f}s" for k, v in guest.timings.items()))
    assert t.returncode == 0, guest.why(f"testinfra failed:\n{t.stdout[-6000:]}{t.stderr[-2000:]}")
    assert " passed" in t.stdout and " failed" not in t.stdout, t.stdout[-3000:]


def test_a_different_host_key_is_refused(guest):
    """The pinning is real: the same inventory with another key in known_hosts never reaches the guest. No
    ControlPath, so no connection left open by the runs above is reused; a tag that matches no task, so a
    connection that wrongly succeeded would only gather facts."""
    from joulesched.infra.provision import provision

    _, other_pub = _keygen(guest.dir / "other-hostkey")
    known = guest.dir / "known_hosts.other"
    known.write_text(f"[127.0.0.1]:{guest.port} {' '.join(other_pub.split()[:2])}\n")
    inv = yaml.safe_load(guest.inventory.read_text())
    inv["all"]["children"]["power_hosts"]["hosts"][NAME]["ansible_ssh_common_args"] = (
        f"-o ControlPath=none -o StrictHostKeyChecking=yes -o UserKnownHostsFile={known}")
    other = guest.dir / "hosts.other-key.yml"
    other.write_text(yaml.safe_dump(inv))
    r = provision(other, tags="joulesched_no_such_tag", timeout_s=300)
    assert not r.succeeded and "Host key verification failed" in r.stdout, r.stdout[-3000:]


def _vm_joules(port: int) -> float:
    """The guest's attributed energy counter on the host's power exporter (0 before its first sample)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("joulesched_vm_joules_total{") and f'vm_name="{NAME}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_libvirt_actuator_saves_and_restores_the_guest_and_its_draw_falls(guest):
    """The node power controller's libvirt actuator on the real guest: sleep = managedSave (RAM to disk, QEMU
    gone), wake = create (the saved image restored). The same boot answers SSH again with its pinned host key
    (boot_id unchanged: restored, not rebooted). On the host, the power exporter (model meter; Kepler-style
    attribution to the guest's qemu process) shows the guest's energy rising while it runs, flat while it
    sleeps, rising again once restored."""
    if guest.boot != "libvirt":
        pytest.skip("managedSave needs the guest under libvirt; it was booted with plain QEMU here "
                    f"({targets.why_not_libvirtd() or 'JOULESCHED_INFRA_BOOT=qemu'})")
    from joulesched.live.actuators import ActuatorOptions, make_actuator
    from joulesched.live.actuators.base import OFF, ON, Target, parse_address
    from joulesched.power.exporter import Exporter
    from joulesched.power.model import DEFAULT_CURVE, ModelMeter
    from joulesched.power.monitor import PowerMonitor

    act = make_actuator("libvirt", ActuatorOptions(libvirt_uri=guest.alive.uri))
    node = Target(NAME, parse_address(f"libvirt:///{NAME}"))
    boot_id = guest.ssh("cat", "/proc/sys/kernel/random/boot_id", timeout=60).stdout.strip()
    assert boot_id and act.state(node) == ON
    exp = Exporter(PowerMonitor(ModelMeter(DEFAULT_CURVE)), port=0, interval_s=0.5).start()
    try:
        def rise(seconds: float) -> float:
            a = _vm_joules(exp.port)
            time.sleep(seconds)
            return _vm_joules(exp.port) - a

        time.sleep(1.5)  # two samples: the qemu process is known to the monitor
        running = rise(4)
        t0 = time.monotonic()
        act.sleep(node)
        guest.timings["managedSave"] = time.monotonic() - t0
        assert act.state(node) == OFF and not guest.alive()
        time.sleep(1.5)  # the last sample of the running process is in
        asleep = rise(4)
        t0 = time.monotonic()
        act.wake(node)
        guest.timings["restore"] = time.monotonic() - t0
        assert act.state(node) == ON
        deadline, r = time.monotonic() + SSH_S, None
        while time.monotonic() < deadline:
            r = guest.ssh("cat", "/proc/sys/kernel/random/boot_id", timeout=30)
            if r.returncode == 0:
                break
            time.sleep(2)
        assert r is not None and r.returncode == 0, guest.why(f"no SSH after the restore: {r and r.stderr}")
        assert r.stdout.strip() == boot_id  # the same boot, restored from its saved memory
        time.sleep(1.5)
        restored = rise(4)
    finally:
        exp.stop()
    print(f"\nguest energy over 4 s: running {running:.2f} J, asleep {asleep:.2f} J, restored {restored:.2f} J; "
          f"managedSave {guest.timings['managedSave']:.0f}s, restore {guest.timings['restore']:.0f}s")
    assert running > 0 and restored > 0
    assert asleep == 0.0  # no qemu process: nothing is attributed to the guest while it sleeps
