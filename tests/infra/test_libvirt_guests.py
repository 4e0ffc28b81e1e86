"""The libvirt code on libvirt's `test:///default` driver: real overlay and seed files, a defined domain, and
the dynamic provider's create/delete. No libvirtd needed."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from joulesched.infra.libvirt_guests import (
    GuestError,
    GuestSpec,
    create_guest,
    delete_guest,
    domain_xml,
    list_guests,
    resolve_virt_type,
)

libvirt = pytest.importorskip("libvirt", reason="libvirt-python not installed (pip install -e '.[infra-libvirt]')")
need_tools = pytest.mark.skipif(
    shutil.which("qemu-img") is None or not (shutil.which("cloud-localds") or shutil.which("genisoimage")),
    reason="needs qemu-img (qemu-utils) and cloud-localds (cloud-image-utils) or genisoimage")


@pytest.fixture(autouse=True)
def test_driver():
    """test:///default keeps its domains only while some connection to it is open; hold one for the test."""
    conn = libvirt.open("test:///default")
    yield conn
    conn.close()


@pytest.fixture
def base(tmp_path):
    img = tmp_path / "base.raw"
    img.write_bytes(b"\0" * 1024 * 1024)
    return img


def _spec(tmp_path, base, **kw) -> GuestSpec:
    d = dict(name="js-test-guest", uri="test:///default", base_image=str(base), pool_dir=str(tmp_path / "pool"),
             user_data="#cloud-config\nlocale: C.UTF-8\n", meta_data="instance-id: x\n", virt_type="qemu",
             memory_mib=512, vcpus=1, disk_gib=3, network="user", ssh_port=2299)
    d.update(kw)
    return GuestSpec(**d)


def test_resolve_virt_type(tmp_path):
    kvm = tmp_path / "kvm"
    kvm.write_text("")
    pvm = tmp_path / "kvm_pvm"
    assert resolve_virt_type("qemu", dev_kvm=str(kvm), pvm_module=str(pvm)) == "qemu"
    assert resolve_virt_type("auto", dev_kvm=str(kvm), pvm_module=str(pvm)) == "kvm"
    pvm.mkdir()  # kvm_pvm loaded: /dev/kvm exists but hangs stock kernels
    assert resolve_virt_type("auto", dev_kvm=str(kvm), pvm_module=str(pvm)) == "qemu"
    with pytest.raises(GuestError, match="use virt_type qemu"):
        resolve_virt_type("kvm", dev_kvm=str(kvm), pvm_module=str(pvm))
    with pytest.raises(ValueError):
        resolve_virt_type("xen")


def test_domain_xml_user_network_is_restricted_and_loopback_only(tmp_path, base):
    x = domain_xml(_spec(tmp_path, base, kernel="/k", initrd="/i"), virt_type="qemu", disk=tmp_path / "d",
                   seed=tmp_path / "s", console_log=tmp_path / "c")
    root = ET.fromstring(x)
    assert root.get("type") == "qemu"
    assert root.find("devices/graphics") is None and root.find("devices/interface") is None
    args = [a.get("value") for a in root.iter("{http://libvirt.org/schemas/domain/qemu/1.0}arg")]
    netdev = args[args.index("-netdev") + 1]
    assert "restrict=on" in netdev and "hostfwd=tcp:127.0.0.1:2299-:22" in netdev
    assert root.find("os/kernel").text == "/k"
    assert root.find("cpu").get("mode") == "maximum"  # qemu64 lacks the SSE4/AVX numpy's wheels need


def test_domain_xml_libvirt_network(tmp_path, base):
    root = ET.fromstring(domain_xml(_spec(tmp_path, base, network="default"), virt_type="kvm",
                                    disk=tmp_path / "d", seed=tmp_path / "s", console_log=tmp_path / "c"))
    assert root.find("devices/interface/source").get("network") == "default"
    assert not list(root.iter("{http://libvirt.org/schemas/domain/qemu/1.0}arg"))
    assert root.find("cpu").get("mode") == "host-passthrough"


@need_tools
def test_create_and_delete_guest(tmp_path, base):
    spec = _spec(tmp_path, base)
    info = create_guest(spec)
    try:
        assert list_guests("test:///default", "js-test-") == ["js-test-guest"]
        out = subprocess.run(["qemu-img", "info", info.disk], capture_output=True, text=True, check=True).stdout
        assert "backing file: " + str(base) in out and "virtual size: 3 GiB" in out
        with open(info.seed, "rb") as f:
            assert b"cidata" in f.read(64 * 1024).lower()
        with pytest.raises(GuestError, match="already exists"):
            create_guest(spec)
    finally:
        assert delete_guest(spec.uri, spec.name, spec.pool_dir)
    assert list_guests("test:///default", "js-test-") == []
    assert not (tmp_path / "pool" / "js-test-guest").exists()
    assert delete_guest(spec.uri, spec.name, spec.pool_dir) is False  # idempotent


@need_tools
def test_guest_files_are_private(tmp_path, base):
    import stat

    spec = _spec(tmp_path, base)
    info = create_guest(spec)
    try:
        d = tmp_path / "pool" / "js-test-guest"
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert stat.S_IMODE((d / "seed.img").stat().st_mode) == 0o600
        assert info.seed == str(d / "seed.img")
    finally:
        delete_guest(spec.uri, spec.name, spec.pool_dir)


def test_qemu_user_only_for_root_on_the_system_driver(monkeypatch):
    from joulesched.infra.libvirt_guests import qemu_user

    assert qemu_user("test:///default") is None and qemu_user("qemu:///session") is None
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert qemu_user("qemu:///system") is None


@pytest.mark.parametrize("uri", ["qemu:///system", "qemu+unix:///system", "qemu:///system?socket=/run/x"])
def test_the_system_driver_is_refused_to_a_user_before_anything_is_made(monkeypatch, tmp_path, base, uri):
    """Under qemu:///system QEMU runs as libvirt's QEMU user; a user's guest folder is 0700 and stays theirs (only
    root can hand it over), so QEMU could not open the disk in it. The docs said the folder was QEMU's."""
    from joulesched.infra.libvirt_guests import check_connection

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(GuestError, match=r"run as root, or use qemu:///session"):
        create_guest(_spec(tmp_path, base, uri=uri))
    assert not (tmp_path / "pool").exists()
    for fine in ("qemu:///session", "test:///default"):
        check_connection(fine)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    check_connection(uri)  # root hands the folder to the QEMU user (qemu_user)


def test_without_libvirt_python_the_hint_names_its_extra(monkeypatch):
    import sys

    from joulesched.infra.libvirt_guests import _open

    monkeypatch.setitem(sys.modules, "libvirt", None)  # import libvirt raises ImportError
    with pytest.raises(GuestError, match=re.escape("pip install -e '.[infra-libvirt]'")):
        _open("qemu:///session")


@need_tools
def test_a_master_that_printed_no_ca_hash_is_removed_and_its_console_is_in_the_error(tmp_path, base):
    """The error said "see <console.log>", a file in the guest's folder, which the provider deletes with the guest:
    the end of the console is in the message instead."""
    pytest.importorskip("pulumi", reason="infra extra not installed")
    import threading
    import time

    from joulesched.infra.cloudinit import CaHashTimeout
    from joulesched.infra.dynamic import LibvirtGuestProvider

    console = tmp_path / "pool" / "js-test-guest" / "console.log"

    def guest_prints():
        deadline = time.monotonic() + 20
        while not console.parent.is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        console.write_text("[  3.1] systemd[1]: Started cloud-final.service\r\n"
                           "joulesched: kubeadm init failed (exit 1); its output is in "
                           "/var/log/cloud-init-output.log\r\n")

    t = threading.Thread(target=guest_prints)
    t.start()
    with pytest.raises(CaHashTimeout) as e:
        LibvirtGuestProvider().create({**_spec(tmp_path, base).to_dict(), "wait_ca_hash_s": 1})
    t.join()
    assert "no CA hash within 1 s" in str(e.value) and "see " not in str(e.value)
    assert str(e.value).endswith("Started cloud-final.service\njoulesched: kubeadm init failed (exit 1); its output "
                                 "is in /var/log/cloud-init-output.log")
    assert not console.parent.exists() and list_guests("test:///default", "js-test-") == []


@need_tools
def test_dynamic_provider_waits_for_the_masters_ca_hash(tmp_path, base):
    """A master's resource is created once the guest printed its CA hash on the serial console; the console
    file is written here as QEMU would write the guest's output (the test driver runs no guest)."""
    pytest.importorskip("pulumi", reason="infra extra not installed")
    import threading
    import time

    from joulesched.infra.cloudinit import CaHashTimeout
    from joulesched.infra.dynamic import LibvirtGuestProvider

    h = "sha256:" + "ab" * 32
    console = tmp_path / "pool" / "js-test-guest" / "console.log"

    def guest_prints():
        deadline = time.monotonic() + 20
        while not console.parent.is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        console.write_text(f"[ 99.0] cloud-init[1]: JOULESCHED-CA-CERT-HASH {h}\r\n")

    t = threading.Thread(target=guest_prints)
    t.start()
    p = LibvirtGuestProvider()
    res = p.create({**_spec(tmp_path, base).to_dict(), "wait_ca_hash_s": 20})
    t.join()
    try:
        assert res.outs["ca_cert_hash"] == h
    finally:
        p.delete(res.id, res.outs)
    with pytest.raises(CaHashTimeout, match="no CA hash within 1 s"):
        p.create({**_spec(tmp_path, base).to_dict(), "wait_ca_hash_s": 1})
    assert list_guests("test:///default", "js-test-") == []  # a master that never printed is removed


@need_tools
def test_failed_create_leaves_nothing(tmp_path):
    spec = _spec(tmp_path, tmp_path / "missing.qcow2")
    with pytest.raises(GuestError, match="does not exist"):
        create_guest(spec)
    assert not (tmp_path / "pool" / "js-test-guest").exists()
    assert list_guests("test:///default", "js-test-") == []


@need_tools
def test_dynamic_provider_create_diff_delete(tmp_path, base):
    pytest.importorskip("pulumi", reason="infra extra not installed")
    from joulesched.infra.dynamic import LibvirtGuestProvider

    p = LibvirtGuestProvider()
    props = _spec(tmp_path, base).to_dict()
    res = p.create(props)
    try:
        assert res.outs["resolved_virt_type"] == "qemu" and res.outs["uuid"]
        d = p.diff(res.id, res.outs, {**props, "memory_mib": 1024})
        assert d.changes and d.replaces == ["memory_mib"]
        assert not p.diff(res.id, res.outs, props).changes
    finally:
        p.delete(res.id, res.outs)
    assert list_guests("test:///default", "js-test-") == []
