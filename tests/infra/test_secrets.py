"""Secrets stay out of everything we render: no private key in any user-data, seed or manifest, the aws
master fetches the CA key from SSM (tested against moto's server, the real fetch script over real HTTP), and
seeds are private files.

moto stands in for AWS (no account here); the script is the exact file the master's user-data installs, run
with the real boto3 client against moto on loopback.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("pulumi_kubernetes", reason="infra extra not installed: pip install -e '.[infra]'")

from joulesched.infra.cloudinit import render_kube_node, render_power_host  # noqa: E402
from joulesched.infra.config import KubeadmConfig  # noqa: E402
from joulesched.infra.pki import generate  # noqa: E402
from tests.infra.pulumi_harness import DYNAMIC, REPO, run_main, stack_config  # noqa: E402
from tests.support.procs import free_port  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example"
# Header of any PEM private key (RSA, EC, OpenSSH, PKCS#8, encrypted), assembled so scanners skip this file.
PRIVATE = "PRIVATE " + "KEY-----"


def key_material(key_pems: list[str]) -> list[bytes]:
    """What a leak of these keys looks like in a document: the PEM header, each base64 line of their bodies,
    and the whole PEM base64-encoded (cloud-init's `encoding: b64`)."""
    needles = [PRIVATE.encode()]
    for pem in key_pems:
        needles += [ln.encode() for ln in pem.splitlines() if ln and not ln.startswith("-----") and len(ln) > 20]
        needles.append(base64.b64encode(pem.encode())[:40])
    return needles


def assert_clean(name: str, data: bytes, needles: list[bytes]) -> None:
    hits = [n[:30] for n in needles if n in data]
    assert not hits, f"{name} carries key material: {hits}"


@pytest.fixture(scope="module")
def kvm():
    return run_main(stack_config("kvm", sshPublicKey=KEY))


@pytest.fixture(scope="module")
def aws():
    pytest.importorskip("pulumi_aws", reason="pulumi-aws not installed (pip install -e '.[infra-aws]')")
    return run_main(stack_config("aws", sshPublicKey=KEY, sshCidr="203.0.113.7/32"))


@pytest.fixture(scope="module")
def cluster():
    return run_main(stack_config("cluster"))


def _stack_keys(*recs) -> list[str]:
    return [r.outputs["ca_key_pem"] for rec in recs for r in rec.of_type(DYNAMIC)
            if "common_name" in r.inputs and r.outputs.get("ca_key_pem")]


def test_no_key_material_in_any_user_data_seed_or_manifest(kvm, aws, cluster, tmp_path):
    """Before: the master's user-data (kvm and aws alike) carried the cluster CA key in write_files."""
    keys = _stack_keys(kvm, aws) + [generate().ca_key_pem]
    assert len(keys) >= 2, "the aws stack must still make a CA (its key goes to SSM)"
    needles = key_material(keys)
    docs: dict[str, bytes] = {}
    for r in kvm.of_type(DYNAMIC):
        if "user_data" in r.inputs:
            for part in ("user_data", "meta_data", "network_config"):
                docs[f"kvm {r.inputs['name']} {part}"] = r.inputs[part].encode()
    for r in aws.of_type("aws:ec2/instance:Instance"):
        docs[f"aws {r.inputs['tags']['Name']} userData"] = r.inputs["userData"].encode()
    assert len([d for d in docs if "user" in d.lower()]) == 6
    pki = generate()
    docs["master (kubeadm makes the CA)"] = render_kube_node(
        role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(), token=pki.token).encode()
    docs["power host"] = render_power_host(hostname="h", ssh_authorized_keys=[KEY]).encode()
    # Every manifest: deploy/kubernetes, the workload apps, and every resource of the cluster stack.
    for f in sorted((REPO / "deploy").rglob("*")):
        if f.is_file():
            docs[str(f.relative_to(REPO))] = f.read_bytes()
    from joulesched.workloads.manifests import APPS, render_yaml

    for app in APPS:
        docs[f"workload {app}"] = render_yaml(app).encode()
    for r in cluster.resources:
        docs[f"cluster {r.typ} {r.name}"] = json.dumps(r.inputs, default=str).encode()
    # Seeds: the real images the kvm guests boot from.
    if shutil.which("cloud-localds") or shutil.which("genisoimage"):
        from joulesched.infra.libvirt_guests import make_seed

        for r in kvm.of_type(DYNAMIC):
            if "user_data" in r.inputs:
                seed = tmp_path / f"{r.inputs['name']}.img"
                make_seed(seed, user_data=r.inputs["user_data"], meta_data=r.inputs["meta_data"],
                          network_config=r.inputs["network_config"])
                data = seed.read_bytes()
                assert b"kubeadm" in data  # the document is really in there, uncompressed
                docs[f"seed {seed.name}"] = data
    for name, data in docs.items():
        assert_clean(name, data, needles)


def test_the_grep_catches_a_key():
    pki = generate()
    doc = render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                           token=pki.token)
    with pytest.raises(AssertionError, match="key material"):
        leaky = doc + pki.ca_key_pem.replace("-----BEGIN", "x")  # even without the PEM header
        assert_clean("leaky", leaky.encode(), key_material([pki.ca_key_pem]))


def test_seed_is_private(tmp_path):
    if not (shutil.which("cloud-localds") or shutil.which("genisoimage")):
        pytest.skip("needs cloud-localds (cloud-image-utils) or genisoimage")
    from joulesched.infra.libvirt_guests import make_seed

    old = os.umask(0o022)
    try:
        make_seed(tmp_path / "seed.img", user_data="#cloud-config\n", meta_data="instance-id: x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "seed.img").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["seed.img"]  # no temporary file left beside it


# ------------------------------------------------------------------------------------------- SSM (moto)
@pytest.fixture(scope="module")
def moto_ssm():
    moto_server = pytest.importorskip("moto.server", reason="moto not installed (pip install -e '.[test]')")
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}
    client = boto3.client("ssm", region_name="eu-central-1", endpoint_url=env["AWS_ENDPOINT_URL"],
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        yield client, env
    finally:
        server.stop()


def _script(tmp_path: Path, pki) -> Path:
    """The fetch script exactly as the aws master's user-data installs it."""
    doc = yaml.safe_load(render_kube_node(
        role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(), token=pki.token,
        ca_cert_pem=pki.ca_cert_pem, ca_key_parameter="/js/kubeadm/ca-key", aws_region="eu-central-1"))
    f = next(f for f in doc["write_files"] if f["path"] == "/usr/local/sbin/joulesched-fetch-ca-key")
    path = tmp_path / "joulesched-fetch-ca-key"
    path.write_text(f["content"])
    return path


def _fetch(script: Path, env: dict, out: Path, parameter: str = "/js/kubeadm/ca-key"):
    return subprocess.run([sys.executable, str(script), "--parameter", parameter, "--region", "eu-central-1",
                           "--out", str(out), "--attempts", "2", "--wait-max", "0.1"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_master_fetches_the_ca_key_from_ssm(moto_ssm, tmp_path):
    client, env = moto_ssm
    pki = generate()
    client.put_parameter(Name="/js/kubeadm/ca-key", Value=pki.ca_key_pem, Type="SecureString", Overwrite=True)
    out = tmp_path / "etc" / "kubernetes" / "pki" / "ca.key"
    r = _fetch(_script(tmp_path, pki), env, out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == pki.ca_key_pem
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and stat.S_IMODE(out.parent.stat().st_mode) == 0o700
    assert [p.name for p in out.parent.iterdir()] == ["ca.key"]
    assert pki.ca_key_pem.splitlines()[1] not in r.stdout + r.stderr  # the key is never printed


def test_fetch_fails_cleanly(moto_ssm, tmp_path):
    client, env = moto_ssm
    pki = generate()
    script = _script(tmp_path, pki)
    out = tmp_path / "pki" / "ca.key"
    r = _fetch(script, env, out, parameter="/js/missing")
    assert r.returncode != 0 and "cannot read SSM parameter /js/missing" in r.stderr and not out.exists()
    client.put_parameter(Name="/js/not-a-key", Value="hello", Type="SecureString", Overwrite=True)
    r = _fetch(script, env, out, parameter="/js/not-a-key")
    assert r.returncode != 0 and "does not hold a PEM private key" in r.stderr and not out.exists()
