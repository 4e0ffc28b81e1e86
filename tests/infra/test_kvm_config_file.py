"""`joulesched infra kvm up|down --config FILE` with a stack file that is not YAML or not a mapping: one line
naming the file and exit 2, never a traceback (typer's CliRunner)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli.infra import app

runner = CliRunner()


@pytest.mark.parametrize("command", [["kvm", "up"], ["kvm", "down"]])
@pytest.mark.parametrize("text, message", [
    ("config:\n  joulesched:workers: [1,\n", "not a readable YAML stack file: while parsing"),
    ("- joulesched:workers: 1\n", "the top level must be a mapping with a config: block, not a list"),
    ("config: [joulesched:workers]\n", "config: must be a mapping of settings, not a list"),
    ("config:\n  joulesched:workers: 1\n  joulesched:workers: 2\n",
     "not a readable YAML stack file: key 'joulesched:workers' is given twice (lines 2 and 3)"),
])
def test_a_bad_stack_file_exits_2_naming_it(tmp_path, command, text, message):
    _bad_stack_file(tmp_path, command, text, f"--config {tmp_path / 'kvm.yaml'}: {message}")


@pytest.mark.parametrize("command", [["kvm", "up"], ["kvm", "down"]])
def test_a_folder_given_as_the_stack_file_is_named_as_one(tmp_path, command):
    r = runner.invoke(app, [*command, "--config", str(tmp_path)])  # it said "does not exist" (a review)
    assert r.exit_code == 2 and "is a directory, not a Pulumi stack file" in r.output, r.output


@pytest.mark.parametrize("command", [["kvm", "up"], ["kvm", "down"]])
def test_a_key_yaml_reads_as_a_number_is_named_not_a_traceback(tmp_path, command):
    _bad_stack_file(tmp_path, command, "config: {1: x}\n", "1 is not a setting name (a key YAML reads as int")


def _bad_stack_file(tmp_path, command, text, message):
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text(text)
    r = runner.invoke(app, [*command, "--config", str(cfg)])
    assert r.exit_code == 2, (r.output, r.exception)
    assert message in " ".join(r.output.split()), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_a_missing_setting_is_named_with_how_to_give_it_here_not_with_pulumi(tmp_path):
    # `infra kvm up` runs without Pulumi: the fix for a missing key is an option or the stack file.
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text("config:\n  joulesched:target: kvm\n")
    r = runner.invoke(app, ["kvm", "up", "--config", str(cfg)])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "pulumi config set" not in text, text
    assert "sshPublicKey is required: pass --ssh-public-key" in text
    assert f"baseImage is required: set joulesched:baseImage in {cfg}" in text


@pytest.mark.parametrize("subnet, first, workers, needle", [
    ("10.0.0.0/29", 10, 1, "has no room for the master and 1 worker(s) from joulesched:firstHost 10"),  # IndexError
    ("10.0.0.0/28", 14, 1, "the last host address is 10.0.0.14"),  # the worker got the broadcast .15
    ("fd00::/120", 10, 1, "IPv4 only"),  # crashed the Pulumi program's SSH targets
])
def test_a_subnet_without_room_for_the_guests_is_refused(subnet, first, workers, needle):
    from joulesched.infra.config import DictReader, InfraConfigError, load

    values = {"target": "kvm", "sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example",
              "baseImage": "/x.qcow2", "network": "default", "subnet": subnet, "firstHost": str(first),
              "workers": str(workers)}
    with pytest.raises(InfraConfigError, match=re.escape(needle)):
        load(DictReader(values))
    values["firstHost"] = "2"
    if ":" not in subnet:
        assert load(DictReader(values)).kvm.first_host == 2  # the same subnet from .2 fits


def test_a_failure_or_ctrl_c_after_the_first_guest_removes_every_guest_made(tmp_path, monkeypatch):
    """Only GuestError and the CA wait's timeout were undone: a libvirt error on a worker, a tool's timeout or
    Ctrl-C in the 30-minute CA wait left the master running, its seed (the bootstrap token) in the pool."""
    import joulesched.infra.cloudinit as cloudinit
    import joulesched.infra.libvirt_guests as guests

    base = tmp_path / "base.qcow2"
    base.write_bytes(b"")
    pub = tmp_path / "id.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example\n")
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text(f"config: {{joulesched:baseImage: {base}, joulesched:poolDir: {tmp_path / 'pool'}, "
                   "joulesched:workers: '1', joulesched:libvirtUri: 'test:///default'}\n")
    made, removed = [], []

    def create(spec):
        if made:
            raise guests.GuestError("w: libvirt: cannot allocate memory")
        made.append(spec.name)
        return guests.GuestInfo(spec.name, "uuid", "d", "s", "c", "qemu", 0)

    monkeypatch.setattr(guests, "create_guest", create)
    monkeypatch.setattr(guests, "delete_guest", lambda uri, name, pool: removed.append(name))
    monkeypatch.setattr(guests, "domain_active", lambda uri, name: True)
    monkeypatch.setattr(cloudinit, "wait_for_ca_hash", lambda *a, **k: "sha256:" + "ab" * 32)
    args = ["kvm", "up", "--config", str(cfg), "--ssh-public-key", str(pub)]
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and "cannot allocate memory" in r.output, r.output
    assert removed == ["joulesched-master"]

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    made.clear()
    removed.clear()
    monkeypatch.setattr(cloudinit, "wait_for_ca_hash", interrupted)
    r = runner.invoke(app, args)
    assert r.exit_code == 130 and removed == ["joulesched-master"]


def test_a_tool_that_runs_past_its_timeout_is_a_guest_error(monkeypatch):
    import subprocess

    import joulesched.infra.libvirt_guests as guests

    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw.get("timeout"))

    monkeypatch.setattr(subprocess, "run", slow)
    with pytest.raises(guests.GuestError, match="cloud-localds ran past 300 s"):
        guests._run(["cloud-localds", "seed.img"], "the seed image")


def _kvm(**settings):
    from joulesched.infra.config import DictReader, load

    values = {"target": "kvm", "sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example",
              "baseImage": "/x.qcow2", **settings}
    return load(DictReader(values))


@pytest.mark.parametrize("settings, needle", [
    # kubeadm's preflight (NumCPU, Mem) fails on such a guest: the master never made a CA and the stack only
    # failed when the 30-minute CA wait ran out
    ({"vcpus": "1"}, "joulesched:vcpus 1: every guest runs kubeadm, whose preflight refuses fewer than 2 CPUs"),
    ({"memoryMib": "1024"}, "joulesched:memoryMib 1024: every guest runs kubeadm"),
    ({"memoryMib": "1799"}, "give 1800 or more"),
])
def test_a_guest_too_small_for_kubeadm_is_refused(settings, needle):
    from joulesched.infra.config import InfraConfigError

    with pytest.raises(InfraConfigError, match=re.escape(needle)):
        _kvm(**settings)


def test_the_smallest_guest_kubeadm_takes_is_accepted():
    k = _kvm(vcpus="2", memoryMib="1800").kvm
    assert (k.vcpus, k.memory_mib) == (2, 1800)


@pytest.mark.parametrize("uri", ["qemu+ssh://root@host.example/system", "qemu://host.example/system",
                                 "qemu+tls://host.example/system", "qemu+ssh://host.example/session",
                                 "qemu+tcp:///system", "qemu+ext:///system?command=/bin/x",
                                 "qemu+libssh2://u@h/system"])
def test_a_remote_libvirt_uri_is_refused(uri):
    """Disks, seeds and the console log are files this process makes and polls in poolDir, here: a remote
    libvirtd passed validation and then looked for them on its own machine."""
    from joulesched.infra.config import InfraConfigError

    with pytest.raises(InfraConfigError, match=re.escape(
            "run on the libvirt host: qemu:///system or qemu:///session")) as e:
        _kvm(libvirtUri=uri)
    assert "root@" not in str(e.value)  # the URI (and a user in it) is not repeated


@pytest.mark.parametrize("uri", ["qemu:///system", "qemu:///session", "qemu+unix:///system", "test:///default"])
def test_a_local_libvirt_uri_is_accepted(uri):
    assert _kvm(libvirtUri=uri).kvm.uri == uri


def test_user_networking_takes_the_master_alone():
    """Every QEMU user-mode guest is 10.0.2.15 behind its own NAT: workers were accepted and joined nothing."""
    from joulesched.infra.config import InfraConfigError

    with pytest.raises(InfraConfigError, match=re.escape("network user supports one guest only (workers: 0), "
                                                         "got workers 1")):
        _kvm(network="user", workers="1")
    assert _kvm(network="user", workers="0").kvm.workers == 0
    assert _kvm(network="default", workers="2").kvm.workers == 2
