"""Cloud-init templates: rendered documents parse, carry what the guests need, and pass `cloud-init schema`."""

from __future__ import annotations

import shutil

import pytest
import yaml

pytest.importorskip("cryptography", reason="infra extra not installed: pip install -e '.[infra]'")

from joulesched.infra.cloudinit import (
    ca_hash_from_console,
    host_keys_from_console,
    render_kube_node,
    render_meta_data,
    render_network_config,
    render_power_host,
    validate,
)
from joulesched.infra.config import CNI_PINS, KubeadmConfig
from joulesched.infra.pki import ca_cert_hash, generate

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example"
HAS_CLOUD_INIT = shutil.which("cloud-init") is not None


@pytest.fixture(scope="module")
def pki():
    return generate()


def _docs(pki):
    master = render_kube_node(role="master", hostname="js-master", ssh_authorized_keys=[KEY],
                              kubeadm=KubeadmConfig(), token=pki.token, advertise_address="192.168.122.10")
    aws_master = render_kube_node(role="master", hostname="js-master", ssh_authorized_keys=[KEY],
                                  kubeadm=KubeadmConfig(cni="flannel"), token=pki.token, ca_cert_pem=pki.ca_cert_pem,
                                  ca_key_parameter="/js/kubeadm/ca-key", aws_region="eu-central-1")
    worker = render_kube_node(role="worker", hostname="js-worker-0", ssh_authorized_keys=[KEY],
                              kubeadm=KubeadmConfig(cni="flannel"), token=pki.token,
                              ca_cert_hash=pki.ca_cert_hash, master_address="192.168.122.10")
    host = render_power_host(hostname="js-host", ssh_authorized_keys=[KEY])
    return {"master": master, "aws-master": aws_master, "worker": worker, "host": host}


#: Where the master's runcmd marks a successful `kubeadm init` (infra/cloud-init/kube-node.yaml.j2).
INIT_MARKER = "/run/joulesched-kubeadm-init.ok"


def _init_command(runcmd: list) -> list[str]:
    """The runcmd item running `kubeadm init`: ``sh -c 'if kubeadm init "$@"; then touch MARKER; ...' NAME ARGS``."""
    (cmd,) = [c for c in runcmd if isinstance(c, list) and "kubeadm init" in " ".join(c[:3])]
    return cmd


def _kubeadm_init(runcmd: list) -> list[str]:
    """The master's `kubeadm init` argv, as kubeadm gets it."""
    cmd = _init_command(runcmd)
    return cmd if cmd[0] == "kubeadm" else ["kubeadm", "init", *cmd[4:]]


def test_documents_are_cloud_config(pki):
    for name, doc in _docs(pki).items():
        assert doc.startswith("#cloud-config\n"), name
        assert yaml.safe_load(doc)["locale"] == "C.UTF-8", name


def test_master_makes_its_own_ca_and_prints_only_its_hash(pki):
    d = yaml.safe_load(_docs(pki)["master"])
    paths = {f["path"] for f in d["write_files"]}
    assert not any(p.startswith("/etc/kubernetes/pki/") for p in paths)  # kubeadm init makes the CA itself
    init = _kubeadm_init(d["runcmd"])
    assert init[init.index("--token") + 1] == pki.token and "--pod-network-cidr" in init
    assert "JOULESCHED-CA-CERT-HASH" in " ".join(" ".join(c) for c in d["runcmd"] if isinstance(c, list))
    assert "containerd" in d["packages"] and "python3-boto3" not in d["packages"]


def test_kube_nodes_keep_command_output_and_so_the_token_off_the_serial_console(pki):
    """`kubeadm init` prints the join command with the bootstrap token; cloud-init's default output tees every
    command's output to the console, which is the KVM guest's console.log and EC2's GetConsoleOutput."""
    for name in ("master", "aws-master", "worker"):
        out = yaml.safe_load(_docs(pki)[name])["output"]
        assert out == {"all": ">> /var/log/cloud-init-output.log"}, (name, out)  # no "| tee": not the console


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI (the guests' image has it)")
def test_the_ca_hash_line_prints_the_cas_hash_and_nothing_without_a_ca(pki, tmp_path):
    # runcmd goes on after a failed `kubeadm init`: the line must then print nothing (it printed the hash of no
    # bytes, and the workers were pinned to a CA that does not exist). Run as the guest runs it, on paths here.
    import subprocess

    d = yaml.safe_load(_docs(pki)["master"])
    (line,) = [c[2] for c in d["runcmd"] if c[:2] == ["sh", "-c"] and "JOULESCHED-CA-CERT-HASH" in c[2]]
    ca, console, marker = tmp_path / "ca.crt", tmp_path / "console", tmp_path / "init.ok"
    line = (line.replace("/etc/kubernetes/pki/ca.crt", str(ca)).replace("/dev/console", str(console))
            .replace(INIT_MARKER, str(marker)))
    marker.touch()  # kubeadm init succeeded (see the next test), yet no CA file
    r = subprocess.run(["sh", "-c", line], capture_output=True, text=True)
    assert r.returncode != 0 and "JOULESCHED-CA-CERT-HASH" not in r.stdout and not console.exists()
    ca.write_text(pki.ca_cert_pem)
    r = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert ca_hash_from_console(r.stdout) == pki.ca_cert_hash == ca_hash_from_console(console.read_text())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI (the guests' image has it)")
@pytest.mark.parametrize("init_rc", [1, 0])
def test_the_ca_hash_is_printed_only_after_kubeadm_init_succeeded(pki, tmp_path, init_rc):
    """kubeadm writes ca.crt early in its certs phase: a failed init (a preflight error, an API server that never
    came up) leaves one, and a hash printed from it creates workers that can never join. The master's two runcmd
    lines run here as the guest runs them, in order, with a stand-in kubeadm that writes the CA and exits init_rc."""
    import os
    import subprocess

    d = yaml.safe_load(_docs(pki)["master"])
    cmds = [c for c in d["runcmd"] if isinstance(c, list)]
    init, args = _init_command(cmds), _kubeadm_init(cmds)[1:]
    (line,) = [c for c in cmds if c[:2] == ["sh", "-c"] and "JOULESCHED-CA-CERT-HASH" in c[2]]
    ca, console, marker = tmp_path / "ca.crt", tmp_path / "console", tmp_path / "init.ok"
    where = {"/etc/kubernetes/pki/ca.crt": str(ca), "/dev/console": str(console), INIT_MARKER: str(marker)}
    init, line = list(init), list(line)
    for old, new in where.items():
        init, line[2] = [a.replace(old, new) for a in init], line[2].replace(old, new)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ca.with_name("pem").write_text(pki.ca_cert_pem)
    (bin_dir / "kubeadm").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncp {tmp_path}/pem {ca}\n'
                                     f"exit {init_rc}\n")
    (bin_dir / "kubeadm").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(init, capture_output=True, text=True, env=env)
    assert r.returncode == init_rc and ca.read_text() == pki.ca_cert_pem
    # every argument reached kubeadm as written, none through the shell
    assert (tmp_path / "args").read_text().split() == args
    if init_rc:  # said on the console, which the host's error quotes (kubeadm's own output is not)
        assert console.read_text() == ("joulesched: kubeadm init failed (exit 1); its output is in "
                                       "/var/log/cloud-init-output.log\n")
    r = subprocess.run(line, capture_output=True, text=True, env=env)
    if init_rc:
        assert r.returncode != 0 and "JOULESCHED-CA-CERT-HASH" not in r.stdout + console.read_text()
    else:
        assert ca_hash_from_console(console.read_text()) == pki.ca_cert_hash == ca_hash_from_console(r.stdout)


@pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg (the guests install it)")
@pytest.mark.parametrize("keys, pinned, ok", [("good", "good", True), ("good", "real", False),
                                              ("good+other", "good", False), ("other", "good", False)])
def test_the_kubernetes_apt_key_is_used_only_with_its_pinned_fingerprint(pki, tmp_path, keys, pinned, ok):
    """The Release.key was trusted as downloaded: the guests' runcmd line now dearmors it into the keyring apt reads
    only when its one primary key has the pinned fingerprint (a second key beside it is refused too). Run as the
    guest runs it, with a stand-in curl serving the key file."""
    import os
    import subprocess

    from joulesched.infra.config import KUBERNETES_APT_KEY_FINGERPRINT
    from tests.infra.kube_node_kit import gpg_public_key

    made = {n: gpg_public_key(tmp_path, n) for n in ("good", "other")}
    served = tmp_path / "Release.key"
    served.write_bytes(b"".join(made[n][0] for n in keys.split("+")))
    fpr = made["good"][1] if pinned == "good" else KUBERNETES_APT_KEY_FINGERPRINT
    d = yaml.safe_load(render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                                        token=pki.token, apt_key_fingerprint=fpr))
    (line,) = [c for c in d["runcmd"] if isinstance(c, list) and "Release.key" in " ".join(c)]
    keyring, console = tmp_path / "kubernetes-apt-keyring.gpg", tmp_path / "console"
    script = (line[2].replace("/etc/apt/keyrings/kubernetes-apt-keyring.gpg", str(keyring))
              .replace("/dev/console", str(console)))
    assert "https://pkgs.k8s.io/core:/stable:/v1.30/deb/Release.key" in script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(f'#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\ncp {served} "$2"\n')
    (bin_dir / "curl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GNUPGHOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir(mode=0o700)
    r = subprocess.run(line[:2] + [script], capture_output=True, text=True, env=env, timeout=60)
    if ok:
        assert r.returncode == 0, r.stderr
        listed = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(keyring)], capture_output=True,
                                text=True, env=env, check=True).stdout
        assert f"fpr:::::::::{fpr}:" in listed and not keyring.read_bytes().startswith(b"-----")  # dearmored
    else:
        assert r.returncode != 0 and not keyring.exists()
        assert console.read_text() == ("joulesched: no pkgs.k8s.io signing key: its download failed, or its "
                                       f"fingerprint is not {fpr}\n")


def test_the_pinned_kubernetes_apt_key_fingerprint_is_well_formed(pki):
    with pytest.raises(ValueError, match="40 upper-case hex digits"):
        render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                         token=pki.token, apt_key_fingerprint="234654DA9A296436")


def test_aws_master_fetches_the_key_through_its_role(pki):
    d = yaml.safe_load(_docs(pki)["aws-master"])
    files = {f["path"]: f for f in d["write_files"]}
    assert files["/etc/kubernetes/pki/ca.crt"]["content"] == pki.ca_cert_pem
    assert "/etc/kubernetes/pki/ca.key" not in files
    script = files["/usr/local/sbin/joulesched-fetch-ca-key"]
    assert script["permissions"] == "0700" and "get_parameter" in script["content"]
    cmds = [c for c in d["runcmd"] if isinstance(c, list)]
    fetch = next(i for i, c in enumerate(cmds) if c[0] == "/usr/local/sbin/joulesched-fetch-ca-key")
    init = next(i for i, c in enumerate(cmds) if c[:2] == ["sh", "-c"] and "kubeadm init \"$@\"" in c[2])
    assert fetch < init and cmds[fetch][cmds[fetch].index("--parameter") + 1] == "/js/kubeadm/ca-key"
    assert "python3-boto3" in d["packages"]


@pytest.mark.parametrize("cni", ["calico", "flannel"])
def test_the_cni_manifest_is_pinned_and_checked_before_apply(pki, cni):
    version, sha = CNI_PINS[cni]
    doc = render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(cni=cni),
                           token=pki.token)
    d = yaml.safe_load(doc)
    assert "latest" not in doc
    files = {f["path"]: f for f in d["write_files"]}
    assert files["/etc/kubernetes/cni.sha256"]["content"] == f"{sha}  /etc/kubernetes/cni.yaml\n"
    cmds = [" ".join(c) for c in d["runcmd"] if isinstance(c, list)]
    fetch = next(i for i, c in enumerate(cmds) if c.startswith("curl") and "/etc/kubernetes/cni.yaml" in c)
    assert f"/{version}/" in cmds[fetch] and "--proto =https" in cmds[fetch]
    apply = next(i for i, c in enumerate(cmds) if "apply -f" in c)
    assert apply > fetch and "sha256sum --check --strict /etc/kubernetes/cni.sha256 && kubectl" in cmds[apply]
    with pytest.raises(ValueError, match="no pinned checksum"):
        KubeadmConfig(cni=cni, calico_version="v3.29.0", flannel_version="v0.26.0").cni_manifest()
    other = KubeadmConfig(cni=cni, calico_version="v3.29.0", flannel_version="v0.26.0", cni_sha256="ab" * 32)
    assert other.cni_manifest()[1] == "ab" * 32


def test_worker_joins_with_a_pinned_ca_and_never_sees_the_key(pki):
    doc = _docs(pki)["worker"]
    d = yaml.safe_load(doc)
    join = next(c for c in d["runcmd"] if c[:2] == ["kubeadm", "join"])
    assert join[2] == "192.168.122.10:6443"
    assert join[join.index("--discovery-token-ca-cert-hash") + 1] == ca_cert_hash(pki.ca_cert_pem)
    assert "PRIVATE KEY" not in doc and "unsafe-skip" not in doc
    # No ca.crt either: `kubeadm join` preflight refuses an existing one, discovery fetches and pins it.
    assert not any(f["path"].startswith("/etc/kubernetes/pki") for f in d["write_files"])


def test_console_parsers():
    h = "sha256:" + "0123456789abcdef" * 4
    console = f"[  12.3] cloud-init[99]: JOULESCHED-CA-CERT-HASH {h}\r\nlogin:"
    assert ca_hash_from_console(console) == h
    assert ca_hash_from_console("JOULESCHED-CA-CERT-HASH sha256:\n") is None
    empty = "JOULESCHED-CA-CERT-HASH sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
    assert ca_hash_from_console(empty) is None  # the hash of no bytes: a failed init, not a CA
    assert ca_hash_from_console(empty + console) == h
    keys = ("-----BEGIN SSH HOST KEY KEYS-----\r\necdsa-sha2-nistp256 AAAAE2Vj= root@h\r\n"
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk root@h\r\n-----END SSH HOST KEY KEYS-----\r\n")
    assert host_keys_from_console("noise\n" + keys) == ["ecdsa-sha2-nistp256 AAAAE2Vj=",
                                                        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk"]
    assert host_keys_from_console(keys[:60]) == []


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
    with pytest.raises(ValueError, match="ca_key_parameter"):
        render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                         token=pki.token, ca_cert_pem=pki.ca_cert_pem)
    with pytest.raises(ValueError, match="private key"):
        render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                         token=pki.token, ca_cert_pem=pki.ca_key_pem, ca_key_parameter="/p", aws_region="r")
    with pytest.raises(TypeError):  # there is no way to pass the key itself any more
        render_kube_node(role="master", hostname="m", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                         token=pki.token, ca_key_pem=pki.ca_key_pem)
    with pytest.raises(ValueError, match="ca_cert_hash"):
        render_kube_node(role="worker", hostname="w", ssh_authorized_keys=[KEY], kubeadm=KubeadmConfig(),
                         token=pki.token, ca_cert_pem=pki.ca_cert_pem)


@pytest.mark.skipif(not HAS_CLOUD_INIT, reason="cloud-init not installed (apt-get install cloud-init); "
                                               "schema validation needs its `cloud-init schema`")
@pytest.mark.parametrize("which", ["master", "aws-master", "worker", "host"])
def test_cloud_init_schema_accepts(pki, which):
    validate(_docs(pki)[which])


@pytest.mark.skipif(not HAS_CLOUD_INIT, reason="cloud-init not installed (apt-get install cloud-init)")
def test_cloud_init_schema_rejects_a_bad_document():
    with pytest.raises(ValueError, match="cloud-init schema rejected"):
        validate("#cloud-config\nssh_genkeytypes: []\nusers: 7\n")
