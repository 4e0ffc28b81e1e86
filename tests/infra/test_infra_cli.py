"""`joulesched infra` through typer's CliRunner: the no-Pulumi message, kvm up/down on libvirt's test driver,
and the provision summary (ansible-runner patched: the real run is tests/infra/test_systemd_target.py)."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import yaml
from typer.testing import CliRunner

from joulesched.infra.provision import HostResult, ProvisionResult
from joulesched.pipelines.cli.infra import app

runner = CliRunner()
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example"


def test_without_pulumi_says_how_to_install_and_exits_2(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    for cmd in (["up", "--stack", "cluster", "--yes"], ["preview", "--stack", "kvm"],
                ["destroy", "--stack", "aws", "--yes"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, r.output
        assert "get.pulumi.com" in r.output and "Traceback" not in r.output


def test_unknown_stack_is_rejected(monkeypatch, tmp_path):
    fake = tmp_path / "pulumi"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    r = runner.invoke(app, ["preview", "--stack", "gcp"])
    assert r.exit_code == 2 and "no Pulumi.gcp.yaml" in r.output and "cluster" in r.output


def test_provision_prints_a_summary(monkeypatch, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    seen = {}

    def fake(inventory, **kw):
        seen.update(kw, inventory=inventory)
        return ProvisionResult(0, "successful", [HostResult("h1", ok=10, changed=3), HostResult("h2", ok=9)])

    monkeypatch.setattr("joulesched.infra.provision.provision", fake)
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--limit", "h1"])
    assert r.exit_code == 0, r.output
    assert "changed=3 failed=0" in r.output and "h2" in r.output and seen["limit"] == "h1"


def test_provision_failure_exits_1(monkeypatch, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    monkeypatch.setattr("joulesched.infra.provision.provision", lambda inventory, **kw: ProvisionResult(
        2, "failed", [HostResult("h1", ok=3, failed=1)], stdout="TASK [x] fatal: boom"))
    r = runner.invoke(app, ["provision", "--inventory", str(inv)])
    assert r.exit_code == 1 and "provisioning failed" in r.output and "boom" in r.output


def test_provision_json_is_one_document_on_stdout(monkeypatch, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")

    def fake(inventory, **kw):
        print("PLAY [power_hosts] ***")  # what ansible-runner streams with --verbose: on stderr under --json
        return ProvisionResult(0, "successful", [HostResult("h1", ok=10, changed=3, skipped=2), HostResult("h2", ok=9)])

    monkeypatch.setattr("joulesched.infra.provision.provision", fake)
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--json", "--verbose"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {
        "inventory": str(inv), "status": "successful", "rc": 0, "succeeded": True, "changed": 3, "failed": 0,
        "hosts": [{"host": "h1", "ok": 10, "changed": 3, "failed": 0, "unreachable": 0, "skipped": 2},
                  {"host": "h2", "ok": 9, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0}]}
    assert "PLAY [power_hosts]" in r.stderr


def test_provision_json_of_a_failed_run_exits_1_with_the_counts(monkeypatch, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    monkeypatch.setattr("joulesched.infra.provision.provision", lambda inventory, **kw: ProvisionResult(
        4, "failed", [HostResult("h1", ok=3, failed=1), HostResult("h2", unreachable=1)], stdout="fatal: boom"))
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "failed" and doc["rc"] == 4 and doc["succeeded"] is False and doc["failed"] == 2
    assert [(h["host"], h["failed"], h["unreachable"]) for h in doc["hosts"]] == [("h1", 1, 0), ("h2", 0, 1)]
    assert "boom" in r.stderr and "provisioning failed (ansible rc 4)" in r.stderr


def test_provision_missing_inventory(tmp_path):
    r = runner.invoke(app, ["provision", "--inventory", str(tmp_path / "nope.yml")])
    assert r.exit_code == 2 and "does not exist" in r.output


@pytest.mark.skipif(shutil.which("qemu-img") is None or shutil.which("cloud-localds") is None,
                    reason="needs qemu-img (qemu-utils) and cloud-localds (cloud-image-utils)")
def test_kvm_up_and_down_on_the_libvirt_test_driver(tmp_path):
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python not installed")
    pytest.importorskip("cryptography", reason="infra extra not installed")
    keep = libvirt.open("test:///default")  # the test driver forgets domains when no connection is open
    try:
        base = tmp_path / "base.raw"
        base.write_bytes(b"\0" * 1024 * 1024)
        cfg = tmp_path / "kvm.yaml"
        cfg.write_text(yaml.safe_dump({"config": {
            "joulesched:libvirtUri": "test:///default", "joulesched:baseImage": str(base),
            "joulesched:poolDir": str(tmp_path / "pool"), "joulesched:virtType": "qemu",
            "joulesched:workers": "1", "joulesched:diskGib": "3", "joulesched:memoryMib": "1800"}}))
        pub = tmp_path / "id.pub"
        pub.write_text(KEY + "\n")
        # The test driver runs no guest: write the master's serial console as QEMU would, once it exists.
        ca_hash = "sha256:" + "c4" * 32
        console = tmp_path / "pool" / "jst-master" / "console.log"

        def master_prints():
            deadline = time.monotonic() + 30
            while not console.parent.is_dir() and time.monotonic() < deadline:
                time.sleep(0.05)
            console.write_text(f"JOULESCHED-CA-CERT-HASH {ca_hash}\n")

        t = threading.Thread(target=master_prints)
        t.start()
        r = runner.invoke(app, ["kvm", "up", "--config", str(cfg), "--ssh-public-key", str(pub), "--prefix", "jst"])
        t.join()
        assert r.exit_code == 0, r.output
        assert sorted(d.name() for d in keep.listAllDomains() if d.name().startswith("jst-")) == \
            ["jst-master", "jst-worker-0"]
        assert "192.168.122.10" in r.output and ca_hash in r.output
        seed = tmp_path / "pool" / "jst-worker-0" / "seed.img"
        assert ca_hash.encode() in seed.read_bytes()  # the worker pins the CA the master made
        r = runner.invoke(app, ["kvm", "down", "--config", str(cfg), "--prefix", "jst"])
        assert r.exit_code == 0 and "removed 2 guest(s)" in r.output, r.output
        assert not [d for d in keep.listAllDomains() if d.name().startswith("jst-")]
        assert not (tmp_path / "pool" / "jst-master").exists()
    finally:
        keep.close()


def test_kvm_up_config_errors_are_one_red_line(tmp_path):
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text(yaml.safe_dump({"config": {"joulesched:virtType": "xen"}}))
    r = runner.invoke(app, ["kvm", "up", "--config", str(cfg)])
    assert r.exit_code == 2
    assert "sshPublicKey is required" in r.output and "virtType must be one of" in r.output


def _kvm_files(tmp_path, base, pool):
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text(yaml.safe_dump({"config": {
        "joulesched:libvirtUri": "test:///default", "joulesched:baseImage": str(base),
        "joulesched:poolDir": str(pool), "joulesched:virtType": "qemu", "joulesched:workers": "0"}}))
    pub = tmp_path / "id.pub"
    pub.write_text(KEY + "\n")
    return cfg, pub


def test_kvm_up_without_its_base_image_exits_2_and_creates_nothing(tmp_path):
    base, pool = tmp_path / "no-such.qcow2", tmp_path / "images" / "pool"
    cfg, pub = _kvm_files(tmp_path, base, pool)
    r = runner.invoke(app, ["kvm", "up", "--config", str(cfg), "--ssh-public-key", str(pub), "--prefix", "jsb"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == (f"error: --config {cfg}: baseImage {base} does not exist (download a cloud image "
                                "there, or set joulesched:baseImage to one)")
    assert not (tmp_path / "images").exists()


def test_kvm_up_refuses_the_system_driver_to_a_user_and_creates_nothing(monkeypatch, tmp_path):
    """Under qemu:///system QEMU runs as libvirt's user, and a user's 0700 guest folder shuts it out: only root
    can hand the folder over. Bad input, said before anything is made."""
    base, pool = tmp_path / "base.raw", tmp_path / "images" / "pool"
    base.write_bytes(b"\0" * 1024)
    cfg, pub = _kvm_files(tmp_path, base, pool)
    values = yaml.safe_load(cfg.read_text())
    values["config"]["joulesched:libvirtUri"] = "qemu:///system"
    cfg.write_text(yaml.safe_dump(values))
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    r = runner.invoke(app, ["kvm", "up", "--config", str(cfg), "--ssh-public-key", str(pub), "--prefix", "jsu"])
    assert r.exit_code == 2, r.output
    assert "run as root, or use qemu:///session" in " ".join(r.output.split()), r.output
    assert not (tmp_path / "images").exists()


def test_a_failed_kvm_up_leaves_no_pool_dir_it_created(monkeypatch, tmp_path):
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python not installed")
    pytest.importorskip("cryptography", reason="infra extra not installed")
    from joulesched.infra.libvirt_guests import GuestError

    def no_overlay(base, overlay, size_gib):
        raise GuestError("qemu-img create failed: no space left on device")

    monkeypatch.setattr("joulesched.infra.libvirt_guests.make_overlay", no_overlay)
    base, pool = tmp_path / "base.raw", tmp_path / "images" / "pool"
    base.write_bytes(b"\0" * 1024)
    cfg, pub = _kvm_files(tmp_path, base, pool)
    keep = libvirt.open("test:///default")
    try:
        r = runner.invoke(app, ["kvm", "up", "--config", str(cfg), "--ssh-public-key", str(pub), "--prefix", "jsf"])
        assert r.exit_code == 1 and "no space left on device" in r.stderr, r.output
        assert not (tmp_path / "images").exists()  # poolDir and its parent: both made by this run
        pool.mkdir(parents=True)  # a folder that was there before stays, as empty as it was
        r = runner.invoke(app, ["kvm", "up", "--config", str(cfg), "--ssh-public-key", str(pub), "--prefix", "jsf"])
        assert r.exit_code == 1, r.output
        assert pool.is_dir() and not any(pool.iterdir())
    finally:
        keep.close()


def test_kvm_down_removes_only_the_guests_up_names(tmp_path):
    """`down` used to take any prefix and every guest named <prefix>-worker-*: a hand-made guest called
    jst-worker-old went with the cluster's, and `--prefix ''` fell back to the config's prefix."""
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed")
    cfg = tmp_path / "kvm.yaml"
    cfg.write_text(yaml.safe_dump({"config": {"joulesched:libvirtUri": "test:///default",
                                              "joulesched:poolDir": str(tmp_path / "pool")}}))
    for bad, needle in (("", "--prefix must be a DNS label, got ''"), ("../x", "got '../x'")):
        r = runner.invoke(app, ["kvm", "down", "--config", str(cfg), "--prefix", bad])
        assert r.exit_code == 2 and needle in r.output, r.output
    cfg.write_text(yaml.safe_dump({"config": {"joulesched:libvirtUri": "test:///default",
                                              "joulesched:namePrefix": "Bad_Prefix"}}))
    r = runner.invoke(app, ["kvm", "down", "--config", str(cfg)])
    assert r.exit_code == 2 and "joulesched:namePrefix in" in r.output and "'Bad_Prefix'" in r.output, r.output
    # The test driver keeps its domains while one connection to it stays open.
    keep = libvirt.open("test:///default")
    try:
        xml = "<domain type='test'><name>{}</name><memory>1024</memory><os><type>hvm</type></os></domain>"
        for name in ("jst-master", "jst-worker-0", "jst-worker-12", "jst-worker-old", "jst-worker-01"):
            keep.defineXML(xml.format(name))
        cfg.write_text(yaml.safe_dump({"config": {"joulesched:libvirtUri": "test:///default",
                                                  "joulesched:poolDir": str(tmp_path / "pool")}}))
        r = runner.invoke(app, ["kvm", "down", "--config", str(cfg), "--prefix", "jst"])
        assert r.exit_code == 0 and "removed 3 guest(s)" in r.output, r.output
        left = sorted(d.name() for d in keep.listAllDomains() if d.name().startswith("jst-"))
        assert left == ["jst-worker-01", "jst-worker-old"]
    finally:
        keep.close()


class _Stack:
    """What `infra up|preview|destroy` calls on an Automation API stack, recording the operations run."""

    def __init__(self):
        self.ran: list[str] = []

    def __getattr__(self, op):
        def run(**kw):
            self.ran.append(op)
        return run


@pytest.fixture()
def stack_dir(monkeypatch, tmp_path):
    stack = _Stack()
    monkeypatch.setattr("joulesched.pipelines.cli.infra.REPO", tmp_path)
    monkeypatch.setattr("joulesched.infra.stack.open_stack", lambda name, work_dir: stack)
    return tmp_path, stack


def test_a_stack_config_the_program_would_refuse_exits_2_before_pulumi_runs(stack_dir):
    d, stack = stack_dir
    (d / "Pulumi.kvm.yaml").write_text("config:\n  joulesched:target: kvm\n  joulesched:workers: many\n")
    for op in ("up", "preview"):
        r = runner.invoke(app, [op, "--stack", "kvm", "--yes"] if op == "up" else [op, "--stack", "kvm"])
        assert r.exit_code == 2, r.output
        assert "Pulumi.kvm.yaml" in r.output and "workers must be an integer" in r.output
        assert "pulumi config set --stack kvm sshPublicKey" in r.output and "Traceback" not in r.output
    (d / "Pulumi.kvm.yaml").write_text(f"config:\n  joulesched:target: kvm\n  joulesched:sshPublicKey: {KEY}\n"
                                       "  joulesched:baseImage: /i.qcow2\n  joulesched:wokers: '3'\n"
                                       "  aws:region: eu-west-1\n")  # another namespace's key is Pulumi's
    r = runner.invoke(app, ["preview", "--stack", "kvm"])
    assert r.exit_code == 2 and "joulesched:wokers is not a setting of target kvm (a typo?)" in r.output, r.output
    assert "aws:region" not in r.output
    (d / "Pulumi.kvm.yaml").write_text("config: [1, 2]\n")
    r = runner.invoke(app, ["up", "--stack", "kvm", "--yes"])
    assert r.exit_code == 2 and "config: must be a mapping" in r.output
    assert stack.ran == []
    r = runner.invoke(app, ["destroy", "--stack", "kvm", "--yes"])  # runs no program: the config is not its input
    assert r.exit_code == 0, r.output
    assert stack.ran == ["destroy"]


def test_a_valid_stack_config_runs_pulumi(stack_dir):
    d, stack = stack_dir
    (d / "Pulumi.kvm.yaml").write_text(f"config:\n  joulesched:target: kvm\n  joulesched:sshPublicKey: {KEY}\n"
                                       "  joulesched:baseImage: /images/debian.qcow2\n")
    (d / "Pulumi.secret.yaml").write_text("config:\n  joulesched:target: kvm\n"
                                          "  joulesched:sshPublicKey:\n    secure: AAABAOpaque\n")
    for name in ("kvm", "secret"):  # a secret cannot be read here: the program's own check has it
        r = runner.invoke(app, ["preview", "--stack", name])
        assert r.exit_code == 0, r.output
    assert stack.ran == ["preview", "preview"]


def test_an_aws_stack_without_its_region_exits_2_before_pulumi_runs(stack_dir):
    """The program reads aws:region itself: without it `infra up --stack aws` failed inside Pulumi (exit 1)."""
    d, stack = stack_dir
    head = (f"config:\n  joulesched:target: aws\n  joulesched:sshPublicKey: {KEY}\n"
            "  joulesched:sshCidr: 203.0.113.7/32\n  joulesched:ami: ami-0123456789abcdef0\n")
    for region, said in (("", "aws:region is required"), ("  aws:region: Frankfurt\n", "got 'Frankfurt'")):
        (d / "Pulumi.aws.yaml").write_text(head + region)
        r = runner.invoke(app, ["preview", "--stack", "aws"])
        assert r.exit_code == 2 and said in r.output and "pulumi config set --stack aws aws:region" in r.output, r.output
    assert stack.ran == []
    (d / "Pulumi.aws.yaml").write_text(head + "  aws:region: eu-central-1\n")
    assert runner.invoke(app, ["preview", "--stack", "aws"]).exit_code == 0 and stack.ran == ["preview"]


@pytest.mark.parametrize("target, setting, said", [
    ("kvm", "libvirtUri: qemu+tcp://host/system", "libvirtUri: the tcp transport sends the libvirt session"),
    ("kvm", "libvirtUri: qemu+tls://host/system?no_verify=1", "libvirtUri: no_verify=1 skips checking"),
    # Reviews: the guests' files are local, whatever libvirtd the URI names; kubeadm's preflight minimum; user-mode
    # guests are all 10.0.2.15 (the default is one worker)
    ("kvm", "libvirtUri: qemu+ssh://root@host/system", "run on the libvirt host: qemu:///system or qemu:///session"),
    ("kvm", "vcpus: '1'", "vcpus 1: every guest runs kubeadm"),
    ("kvm", "memoryMib: '1024'", "memoryMib 1024: every guest runs kubeadm"),
    ("kvm", "network: user", "network user supports one guest only (workers: 0)"),
    ("aws", "ami: not-an-ami", "ami must be an AMI id"),
    ("aws", "instanceType: 't3.medium; x'", "instanceType must be an EC2 instance type"),
    ("cluster", "workloadImagePrefix: Registry.Example.com/Bad Prefix", "workloadImagePrefix 'Registry.Example.com"),
    # A review: the kvm stack's default pod network (192.168.0.0/16) held its guests' 192.168.122.0/24
    ("kvm", "podNetworkCidr: 192.168.0.0/16", "podNetworkCidr 192.168.0.0/16 overlaps joulesched:subnet"),
    ("aws", "cni: flannel", None),  # with the default pod network: flannel's own
    ("aws", "podNetworkCidr: 10.32.0.0/16", None),  # calico takes any
])
def test_stack_settings_the_program_would_pass_on_unchecked_are_refused(stack_dir, target, setting, said: str | None):
    """A libvirt URI that skips TLS or host-key checks (the node power actuator already refused them), and
    settings that would only fail at AWS or in the cluster, are named before Pulumi runs."""
    d, stack = stack_dir
    base = {"kvm": {"joulesched:sshPublicKey": KEY, "joulesched:baseImage": "/i.qcow2"},
            "aws": {"joulesched:sshPublicKey": KEY, "joulesched:sshCidr": "203.0.113.7/32",
                    "joulesched:ami": "ami-0123456789abcdef0", "aws:region": "eu-central-1"},
            "cluster": {"joulesched:image": "registry.example.com/joulesched:0.1.0"}}[target]
    key, _, value = setting.partition(": ")
    values = {"joulesched:target": target, **base, f"joulesched:{key}": yaml.safe_load(value)}
    (d / "Pulumi.s.yaml").write_text(yaml.safe_dump({"config": values}))
    r = runner.invoke(app, ["preview", "--stack", "s"])
    if said is None:  # a setting that must pass
        assert r.exit_code == 0 and stack.ran == ["preview"], r.output
        return
    assert r.exit_code == 2 and said in r.output, r.output
    assert stack.ran == []


def test_flannel_needs_its_manifests_pod_network(stack_dir):
    """The pinned flannel manifest is applied unchanged: its net-conf.json says 10.244.0.0/16, so any other
    pod network would give nodes pod ranges flannel does not route."""
    d, stack = stack_dir
    values = {"joulesched:target": "aws", "joulesched:sshPublicKey": KEY, "joulesched:sshCidr": "203.0.113.7/32",
              "joulesched:ami": "ami-0123456789abcdef0", "aws:region": "eu-central-1", "joulesched:cni": "flannel",
              "joulesched:podNetworkCidr": "10.32.0.0/16"}
    (d / "Pulumi.s.yaml").write_text(yaml.safe_dump({"config": values}))
    r = runner.invoke(app, ["preview", "--stack", "s"])
    assert r.exit_code == 2 and "flannel's manifest uses 10.244.0.0/16" in r.output, r.output
    assert stack.ran == []


@pytest.mark.parametrize("kind, value, ok", [
    ("instance", "t3.medium", True), ("instance", "m7i-flex.large", True), ("instance", "u-6tb1.metal", True),
    ("instance", "m7i.metal-24xl", True), ("instance", "t3.medium; x", False), ("instance", "t3", False),
    ("region", "eu-central-1", True), ("region", "us-gov-west-1", True), ("region", "eusc-de-east-1", True),
    ("region", "Frankfurt", False), ("region", "eu-central", False),
])
def test_the_aws_name_checks_take_real_names(kind, value, ok):
    from joulesched.infra.config import AWS_REGION, INSTANCE_TYPE

    assert bool((INSTANCE_TYPE if kind == "instance" else AWS_REGION).match(value)) is ok
