"""The kvm and aws targets under Pulumi mocks: guests, seeds, PKI wiring, security group, config validation."""

from __future__ import annotations

import pytest

pytest.importorskip("pulumi_kubernetes", reason="infra extra not installed: pip install -e '.[infra]'")
import yaml  # noqa: E402

from joulesched.infra.config import InfraConfigError  # noqa: E402
from tests.infra.pulumi_harness import DYNAMIC, MASTER_CA_HASH, run_main, stack_config  # noqa: E402

# The start of a private key, assembled so that secret scanners do not flag the test.
FAKE_KEY_HEADER = "-----BEGIN OPENSSH " + "PRIVATE KEY-----"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pulumi_aws deprecation notices
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example"


def _guests(rec):
    return {r.inputs["name"]: r.inputs for r in rec.of_type(DYNAMIC) if "user_data" in r.inputs}


@pytest.fixture(scope="module")
def kvm():
    return run_main(stack_config("kvm", sshPublicKey=KEY))


def test_kvm_graph(kvm):
    assert len(kvm.of_type("joulesched:targets:Kvm")) == 1
    assert set(_guests(kvm)) == {"joulesched-master", "joulesched-worker-0", "joulesched-worker-1"}
    pki = [r for r in kvm.of_type(DYNAMIC) if "common_name" in r.inputs]
    assert len(pki) == 1


def test_kvm_guest_properties(kvm):
    g = _guests(kvm)
    m = g["joulesched-master"]
    assert m["uri"] == "qemu:///system" and m["virt_type"] == "auto" and m["memory_mib"] == 4096
    assert m["base_image"].endswith(".qcow2") and m["network"] == "default"
    ud = yaml.safe_load(m["user_data"])
    assert any(c[:2] == ["sh", "-c"] and "kubeadm init \"$@\"" in c[2] for c in ud["runcmd"])
    net = yaml.safe_load(m["network_config"])
    assert net["ethernets"]["primary"]["addresses"] == ["192.168.122.10/24"]
    w = yaml.safe_load(g["joulesched-worker-1"]["user_data"])
    join = next(c for c in w["runcmd"] if c[:2] == ["kubeadm", "join"])
    assert join[2] == "192.168.122.10:6443"
    assert yaml.safe_load(g["joulesched-worker-1"]["network_config"])["ethernets"]["primary"]["addresses"] == \
        ["192.168.122.12/24"]
    # One CA for the whole cluster, made by the master's kubeadm init: no seed carries a CA file, and the
    # workers pin the hash the master's guest resource read from its console.
    assert not any(f["path"].startswith("/etc/kubernetes/pki") for f in ud["write_files"] + w["write_files"])
    assert join[join.index("--discovery-token-ca-cert-hash") + 1] == MASTER_CA_HASH
    assert m["wait_ca_hash_s"] > 0 and g["joulesched-worker-1"]["wait_ca_hash_s"] == 0
    assert kvm.exports["ca_cert_hash"] is not None


def test_kvm_user_network_and_direct_kernel_boot():
    rec = run_main(stack_config("kvm", sshPublicKey=KEY, network="user", workers="0", virtType="qemu",
                                kernel="/boot/vmlinuz", initrd="/boot/initrd.img"))
    (m,) = _guests(rec).values()
    assert m["network"] == "user" and m["ssh_port"] == 2222 and m["network_config"] == ""
    assert m["kernel"] == "/boot/vmlinuz" and m["virt_type"] == "qemu"
    # the pipeline's SSH targets: the forwarded loopback port, the cloud-init admin user
    assert rec.exports["hosts"] == [{"name": "joulesched-master", "address": "127.0.0.1", "port": 2222,
                                     "user": "joulesched"}]


def test_kvm_hosts_output_on_a_libvirt_network(kvm):
    from joulesched.infra.stack import environment

    hosts = environment("kvm", {"hosts": kvm.exports["hosts"]}).hosts
    assert [(h.name, h.address, h.port, h.user) for h in hosts] == [
        ("joulesched-master", "192.168.122.10", 22, "joulesched"),
        ("joulesched-worker-0", "192.168.122.11", 22, "joulesched"),
        ("joulesched-worker-1", "192.168.122.12", 22, "joulesched")]


@pytest.mark.parametrize("extra, message", [
    ({}, "joulesched:sshPublicKey is required"),
    ({"sshPublicKey": FAKE_KEY_HEADER}, "looks like a private key"),
    ({"sshPublicKey": KEY, "virtType": "xen"}, "virtType must be one of auto, kvm, qemu"),
    ({"sshPublicKey": KEY, "kernel": "/boot/vmlinuz"}, "kernel and joulesched:initrd go together"),
    ({"sshPublicKey": KEY, "subnet": "10.0.0.1/24"}, "subnet"),
])
def test_kvm_config_errors(extra, message):
    with pytest.raises(InfraConfigError, match=message):
        run_main(stack_config("kvm", **extra))


def test_unknown_or_missing_target():
    with pytest.raises(InfraConfigError, match="joulesched:target is required"):
        run_main({})
    with pytest.raises(InfraConfigError, match="target must be one of cluster, kvm, aws"):
        run_main({"joulesched:target": "gcp"})


# ------------------------------------------------------------------------------------------------------ aws
@pytest.fixture(scope="module")
def aws_rec():
    pytest.importorskip("pulumi_aws", reason="pulumi-aws not installed (pip install -e '.[infra-aws]')")
    return run_main(stack_config("aws", sshPublicKey=KEY, sshCidr="203.0.113.7/32"))


def test_aws_instances_share_the_kubeadm_cloud_init(aws_rec):
    inst = {r.inputs["tags"]["Name"]: r.inputs for r in aws_rec.of_type("aws:ec2/instance:Instance")}
    assert set(inst) == {"joulesched-master", "joulesched-worker-0", "joulesched-worker-1"}
    m = yaml.safe_load(inst["joulesched-master"]["userData"])
    assert any(c[:2] == ["sh", "-c"] and "kubeadm init \"$@\"" in c[2] for c in m["runcmd"])
    w = yaml.safe_load(inst["joulesched-worker-0"]["userData"])
    join = next(c for c in w["runcmd"] if c[:2] == ["kubeadm", "join"])
    assert join[2] == "10.0.1.10:6443"  # the master's private IP, through an Output
    for i in inst.values():
        assert i["metadataOptions"] == {"httpEndpoint": "enabled", "httpTokens": "required",
                                        "httpPutResponseHopLimit": 1}
    assert inst["joulesched-master"]["rootBlockDevice"]["encrypted"] is True


def test_aws_ca_key_goes_through_ssm_and_the_master_role_only(aws_rec):
    import json

    (param,) = aws_rec.of_type("aws:ssm/parameter:Parameter")
    (pki,) = [r for r in aws_rec.of_type(DYNAMIC) if "common_name" in r.inputs]
    from pulumi.runtime import rpc

    value = param.inputs["value"]  # a secret in the state: the key never appears in plain text there
    assert value[rpc._special_sig_key] == rpc._special_secret_sig and value["value"] == pki.outputs["ca_key_pem"]
    assert param.inputs["type"] == "SecureString"
    # per stack (the harness's is "test"): two stacks with one namePrefix in an account shared "/joulesched/..."
    assert param.inputs["name"] == "/joulesched/test/kubeadm/ca-key"
    (policy,) = aws_rec.of_type("aws:iam/rolePolicy:RolePolicy")
    stmts = json.loads(policy.inputs["policy"])["Statement"]
    assert [s["Action"] for s in stmts] == [["ssm:GetParameter"], ["kms:Decrypt"]]
    assert stmts[0]["Resource"] == "arn:aws:ssm:eu-central-1:123456789012:parameter/joulesched/test/kubeadm/ca-key"
    assert stmts[1]["Condition"] == {"StringEquals": {"kms:ViaService": "ssm.eu-central-1.amazonaws.com"}}
    inst = {r.inputs["tags"]["Name"]: r.inputs for r in aws_rec.of_type("aws:ec2/instance:Instance")}
    assert inst["joulesched-master"].get("iamInstanceProfile")
    assert not inst["joulesched-worker-0"].get("iamInstanceProfile")  # workers read nothing
    m = yaml.safe_load(inst["joulesched-master"]["userData"])
    fetch = next(c for c in m["runcmd"] if isinstance(c, list) and c[0].endswith("joulesched-fetch-ca-key"))
    assert fetch[fetch.index("--region") + 1] == "eu-central-1"
    assert fetch[fetch.index("--parameter") + 1] == param.inputs["name"]  # the master reads what the role may
    w = yaml.safe_load(inst["joulesched-worker-0"]["userData"])
    join = next(c for c in w["runcmd"] if c[:2] == ["kubeadm", "join"])
    assert join[join.index("--discovery-token-ca-cert-hash") + 1] == pki.outputs["ca_cert_hash"]


def test_two_stacks_with_one_name_prefix_get_their_own_ca_key_parameter():
    pytest.importorskip("pulumi_aws", reason="pulumi-aws not installed (pip install -e '.[infra-aws]')")
    from joulesched.infra.aws import ca_key_parameter_name

    assert ca_key_parameter_name("joulesched", "aws") != ca_key_parameter_name("joulesched", "aws-eu")


def test_aws_ssh_only_from_the_operator(aws_rec):
    (sg,) = aws_rec.of_type("aws:ec2/securityGroup:SecurityGroup")
    ssh = [r for r in sg.inputs["ingress"] if r["fromPort"] == 22]
    assert ssh[0]["cidrBlocks"] == ["203.0.113.7/32"]
    assert all("0.0.0.0/0" not in r.get("cidrBlocks", []) for r in sg.inputs["ingress"])


@pytest.mark.parametrize("cidr, message", [
    ("0.0.0.0/0", "must not open SSH to the whole internet"),
    ("0.0.0.0/1", "must not open SSH to the whole internet"),  # half of it
    ("2001:db8::/64", "IPv4 only"),
])
def test_aws_refuses_ssh_from_everywhere(cidr, message):
    pytest.importorskip("pulumi_aws", reason="pulumi-aws not installed")
    with pytest.raises(InfraConfigError, match=message):
        run_main(stack_config("aws", sshPublicKey=KEY, sshCidr=cidr))


def test_aws_key_pair_name_is_completed_by_aws(aws_rec):
    # A fixed name made a changed key fail (the new pair is created before the old is deleted) and collided
    # between stacks sharing a namePrefix in one account.
    (kp,) = aws_rec.of_type("aws:ec2/keyPair:KeyPair")
    assert "keyName" not in kp.inputs and kp.inputs["keyNamePrefix"].endswith("-key-")
    assert kp.inputs["tags"]["app.kubernetes.io/part-of"] == "joulesched"
