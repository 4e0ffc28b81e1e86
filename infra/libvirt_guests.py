"""Guests through libvirt-python: a qcow2 overlay on a base image, a NoCloud seed, and a domain.

The same functions back the Pulumi dynamic provider (`infra.dynamic.LibvirtGuest`) and `joulesched infra kvm
up|down`, which needs no Pulumi. Files live in `pool_dir/<name>/`; `delete_guest` removes the domain and them.
That folder is 0700 and the seed 0600: a seed holds the bootstrap token, and never a private key
(infra/cloud-init/). Under qemu:///session QEMU runs as this user, who owns the folder; under qemu:///system it
runs as libvirt's QEMU user, so the folder is handed to that user, which only root can do: qemu:///system is
refused to anyone else (:func:`check_connection`).

Networking is either a libvirt network (`<interface type='network'>`) or QEMU user-mode with `restrict=on`
(the guest reaches nothing; only SSH is forwarded, and only to 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from joulesched.core.errors import JouleschedError
from joulesched.core.fsio import atomic_path

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"


class GuestError(JouleschedError, RuntimeError):
    """A guest could not be created or removed; the message says what to install or change."""


@dataclass(frozen=True)
class GuestSpec:
    """Everything that defines one guest; any change means a new guest (Pulumi replaces it).

    :param network: `user` for QEMU user-mode networking (SSH on 127.0.0.1:ssh_port) or a libvirt network name.
    :param virt_type: `kvm`, `qemu` or `auto` (see `resolve_virt_type`).
    :param kernel: boot this kernel directly (with initrd and kernel_cmdline) instead of the disk's bootloader.
    """

    name: str
    uri: str
    base_image: str
    pool_dir: str
    user_data: str
    meta_data: str
    network_config: str = ""
    virt_type: str = "auto"
    memory_mib: int = 2048
    vcpus: int = 2
    disk_gib: int = 20
    network: str = "default"
    ssh_port: int = 0
    kernel: str = ""
    initrd: str = ""
    kernel_cmdline: str = "root=/dev/vda rw console=ttyS0"

    @classmethod
    def from_dict(cls, d: dict) -> "GuestSpec":
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in fields})

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GuestInfo:
    name: str
    uuid: str
    disk: str
    seed: str
    console_log: str
    virt_type: str
    ssh_port: int


def resolve_virt_type(requested: str, *, dev_kvm: str = "/dev/kvm", pvm_module: str = "/sys/module/kvm_pvm") -> str:
    """`kvm` when asked for and usable; `qemu` (TCG) otherwise. `auto` picks kvm only on real hardware KVM.

    /dev/kvm backed by kvm_pvm (a software hypervisor) hangs stock kernels, so it counts as unusable."""
    if requested not in ("auto", "kvm", "qemu"):
        raise ValueError(f"virt_type must be auto, kvm or qemu, got {requested!r}")
    usable = os.path.exists(dev_kvm) and os.access(dev_kvm, os.R_OK | os.W_OK) and not os.path.exists(pvm_module)
    if requested == "kvm" and not usable:
        raise GuestError(f"virt_type kvm asked for, but {dev_kvm} is missing, not writable, or kvm_pvm "
                         f"(which hangs stock kernels); use virt_type qemu")
    if requested == "auto":
        return "kvm" if usable else "qemu"
    return requested


def guest_dir(spec_or_pool: GuestSpec | str, name: str | None = None) -> Path:
    if isinstance(spec_or_pool, GuestSpec):
        return Path(spec_or_pool.pool_dir) / spec_or_pool.name
    return Path(spec_or_pool) / (name or "")


def domain_xml(spec: GuestSpec, *, virt_type: str, disk: Path, seed: Path, console_log: Path) -> str:
    """The libvirt domain XML: no graphics, virtio disk and seed, serial console to a file.

    The CPU is the host's (kvm) or TCG's maximum model (qemu): the default qemu64 lacks SSE4/AVX, and numpy's
    wheels (so the power exporter) die with SIGILL on it."""
    os_extra = ""
    if spec.kernel:
        os_extra = (f"<kernel>{escape(spec.kernel)}</kernel><initrd>{escape(spec.initrd)}</initrd>"
                    f"<cmdline>{escape(spec.kernel_cmdline)}</cmdline>")
    if spec.network == "user":
        if not 1024 <= spec.ssh_port <= 65535:
            raise GuestError(f"{spec.name}: network user needs ssh_port in [1024, 65535], got {spec.ssh_port}")
        nic = ""
        netdev = f"user,id=jsnet0,restrict=on,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22"
        cmdline = (f"<qemu:commandline><qemu:arg value='-netdev'/><qemu:arg value={quoteattr(netdev)}/>"
                   "<qemu:arg value='-device'/>"
                   "<qemu:arg value='virtio-net-pci,netdev=jsnet0,bus=pci.0,addr=0x10'/></qemu:commandline>")
    else:
        nic = (f"<interface type='network'><source network={quoteattr(spec.network)}/>"
               "<model type='virtio'/></interface>")
        cmdline = ""
    return f"""<domain type={quoteattr(virt_type)} xmlns:qemu='{QEMU_NS}'>
  <name>{escape(spec.name)}</name>
  <memory unit='MiB'>{int(spec.memory_mib)}</memory>
  <vcpu>{int(spec.vcpus)}</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>{os_extra}<boot dev='hd'/></os>
  <features><acpi/></features>
  {"<cpu mode='host-passthrough'/>" if virt_type == "kvm" else "<cpu mode='maximum' migratable='off'/>"}
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/><source file={quoteattr(str(disk))}/><target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/><source file={quoteattr(str(seed))}/><target dev='vdb' bus='virtio'/>
      <readonly/>
    </disk>
    {nic}
    <serial type='file'><source path={quoteattr(str(console_log))}/><target port='0'/></serial>
    <console type='file'><source path={quoteattr(str(console_log))}/><target type='serial' port='0'/></console>
  </devices>
  {cmdline}
</domain>
"""


def _run(argv: list[str], what: str, umask: int = -1) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=300, umask=umask)
    except FileNotFoundError:
        raise GuestError(f"{what}: {argv[0]} not found") from None
    except subprocess.CalledProcessError as e:
        raise GuestError(f"{what} failed ({' '.join(argv)}): {e.stderr.strip()[-2000:]}") from None
    except subprocess.TimeoutExpired:
        raise GuestError(f"{what}: {argv[0]} ran past 300 s") from None


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def make_seed(seed: Path, *, user_data: str, meta_data: str, network_config: str = "") -> None:
    """Write a NoCloud seed image (volume label cidata) with cloud-localds, or genisoimage if that is missing.

    The seed and its sources are 0600 (the sources in a 0700 temporary folder, the tools run with umask 077);
    the image is built under a unique temporary name beside ``seed`` and renamed into place."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        _write_private(t / "user-data", user_data)
        _write_private(t / "meta-data", meta_data)
        files = ["user-data", "meta-data"]
        if network_config:
            _write_private(t / "network-config", network_config)
            files.append("network-config")
        with atomic_path(seed, 0o600) as out:  # a unique private temporary name beside the seed, then a rename
            if shutil.which("cloud-localds"):
                argv = ["cloud-localds"]
                if network_config:
                    argv += ["--network-config", str(t / "network-config")]
                _run([*argv, str(out), str(t / "user-data"), str(t / "meta-data")], "cloud-localds", umask=0o077)
            elif shutil.which("genisoimage"):
                _run(["genisoimage", "-quiet", "-output", str(out), "-volid", "cidata", "-joliet", "-rock",
                      *[str(t / f) for f in files]], "genisoimage", umask=0o077)
            else:
                raise GuestError("no seed tool: apt-get install cloud-image-utils (cloud-localds) or genisoimage")


def _system_driver(uri: str) -> bool:
    """Whether ``uri`` is libvirt's system QEMU driver on this machine (qemu:///system, qemu+unix:///system)."""
    from urllib.parse import urlsplit

    u = urlsplit(uri)
    return u.scheme.partition("+")[0] == "qemu" and not u.netloc and u.path.rstrip("/") == "/system"


def check_connection(uri: str) -> None:
    """Refuse qemu:///system to anyone but root: QEMU then runs as libvirt's QEMU user, and the guest folder
    (0700, see :func:`private_dir`) would stay this user's, so QEMU could not open the disk, seed or console log
    in it; only root can hand the folder over."""
    if _system_driver(uri) and os.geteuid() != 0:
        raise GuestError(f"{uri}: libvirt's QEMU runs guests as its own user there, and only root can give it the "
                         "private guest folders: run as root, or use qemu:///session (QEMU runs as you)")


def qemu_user(uri: str) -> pwd.struct_passwd | None:
    """The account libvirt's system QEMU driver runs guests as (Debian: libvirt-qemu, Fedora: qemu), when this
    process is root on a qemu:///system connection; None otherwise (a session's QEMU is this user)."""
    if not _system_driver(uri) or os.geteuid() != 0:
        return None
    for name in ("libvirt-qemu", "qemu"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


def private_dir(d: Path, uri: str) -> None:
    """Create ``d`` 0700, owned by the user QEMU runs as (libvirt relabels the disk files themselves)."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    d.chmod(0o700)
    user = qemu_user(uri)
    if user is not None:
        os.chown(d, user.pw_uid, user.pw_gid)


def make_overlay(base: Path, overlay: Path, size_gib: int) -> None:
    """A qcow2 overlay backed by `base` (qcow2 or raw, detected), grown to size_gib when that is larger."""
    if not base.is_file():
        raise GuestError(f"base image {base} does not exist")
    info = json.loads(_run(["qemu-img", "info", "--output=json", str(base)], "qemu-img info").stdout)
    fmt = info.get("format", "raw")
    size = max(int(info.get("virtual-size", 0)), size_gib * 1024**3)
    _run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", fmt, "-b", str(base.resolve()), str(overlay),
          str(size)], "qemu-img create")


def _open(uri: str):
    try:
        import libvirt
    except ImportError:
        raise GuestError("libvirt-python is not installed: pip install -e '.[infra-libvirt]' "
                         "(building it needs apt packages pkg-config and libvirt-dev)") from None
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors arrive as exceptions; no stderr noise
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise GuestError(f"cannot connect to {uri}: {e}; is libvirtd running?") from None


def create_guest(spec: GuestSpec) -> GuestInfo:
    """Define and start the guest; on any failure remove what was made. Refuses to overwrite a domain."""
    import libvirt

    check_connection(spec.uri)  # before anything is made
    virt_type = resolve_virt_type(spec.virt_type)
    conn = _open(spec.uri)
    try:
        try:
            conn.lookupByName(spec.name)
            raise GuestError(f"a domain named {spec.name} already exists on {spec.uri}; "
                             f"remove it first (joulesched infra kvm down)")
        except libvirt.libvirtError:
            pass
        d = guest_dir(spec)
        try:
            private_dir(d, spec.uri)
        except OSError as e:  # a poolDir under a file, or one this user may not create
            raise GuestError(f"cannot make {d}: {e.strerror or e} (joulesched:poolDir)") from None
        disk, seed, log = d / "disk.qcow2", d / "seed.img", d / "console.log"
        dom = None
        try:
            make_overlay(Path(spec.base_image), disk, spec.disk_gib)
            make_seed(seed, user_data=spec.user_data, meta_data=spec.meta_data,
                      network_config=spec.network_config)
            dom = conn.defineXML(domain_xml(spec, virt_type=virt_type, disk=disk, seed=seed, console_log=log))
            dom.create()
            return GuestInfo(spec.name, dom.UUIDString(), str(disk), str(seed), str(log), virt_type,
                             spec.ssh_port)
        except BaseException as e:
            if dom is not None:
                _remove_domain(dom)
            shutil.rmtree(d, ignore_errors=True)
            if isinstance(e, libvirt.libvirtError):  # "cannot allocate memory" and the like: one line
                raise GuestError(f"{spec.name}: libvirt: {e}") from None
            raise
    finally:
        conn.close()


def _remove_domain(dom) -> None:
    import libvirt

    try:
        if dom.isActive():
            dom.destroy()
    except libvirt.libvirtError:
        pass
    try:
        dom.undefine()
    except libvirt.libvirtError:
        pass


def delete_guest(uri: str, name: str, pool_dir: str) -> bool:
    """Stop and undefine the domain and remove its files. Returns whether a domain existed. Idempotent."""
    import libvirt

    conn = _open(uri)
    try:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            dom = None
        if dom is not None:
            _remove_domain(dom)
    finally:
        conn.close()
    shutil.rmtree(guest_dir(pool_dir, name), ignore_errors=True)
    return dom is not None


def domain_active(uri: str, name: str) -> bool:
    """Whether the domain ``name`` exists and runs (False when libvirt cannot be reached)."""
    import libvirt

    try:
        conn = _open(uri)
    except GuestError:
        return False
    try:
        return bool(conn.lookupByName(name).isActive())
    except libvirt.libvirtError:
        return False
    finally:
        conn.close()


def list_guests(uri: str, prefix: str) -> list[str]:
    conn = _open(uri)
    try:
        return sorted(d.name() for d in conn.listAllDomains() if d.name().startswith(prefix))
    finally:
        conn.close()
