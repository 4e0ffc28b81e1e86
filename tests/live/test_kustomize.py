"""deploy/kustomize: every overlay renders with the real ``kubectl kustomize``, every object is schema-valid
(kubernetes-validate, offline), the pods are non-root and hardened, RBAC is least privilege (the flat
manifests' rules, plus one namespaced Role per delegating actuator), arguments are options of the commands,
and ``kubectl apply`` of each overlay lands every object on the API emulator."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import typer
import yaml

from joulesched.pipelines.cli.live import node_power, serve
from tests.support.kube_emulator import GENERIC, KubeEmulator, generic_key

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
FLAT = ROOT / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
OVERLAYS = sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir() if (p / "kustomization.yaml").exists())
#: The actuator and the exporter's meter each overlay sets.
EXPECTED = {"kind": ("none", "model"), "bare-metal-redfish": ("redfish", "auto"), "bare-metal-metal3": ("metal3", "auto"),
            "bare-metal-rufio": ("rufio", "auto"), "kvm-libvirt": ("libvirt", "model"), "aws": ("aws", "model")}
#: store name of each kind the overlays hold (what `kubectl apply` creates on the emulator).
RESOURCE = {k: generic_key(gv, p) for gv, rows in GENERIC.items() for p, k, _ in rows}

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not found (make test installs it)")


def render(path: Path) -> tuple[str, list[dict]]:
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[str, list[dict]]]:
    return {o: render(KUSTOMIZE / "overlays" / o) for o in OVERLAYS}


def _one(docs, kind, name):
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def _args(docs, kind, name) -> list[str]:
    return _one(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]["args"]


def _options(command) -> set[str]:
    app = typer.Typer()
    app.command()(command)
    return {o for p in typer.main.get_command(app).params for o in p.opts}


def test_every_overlay_of_the_issue_exists():
    assert set(OVERLAYS) == set(EXPECTED)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_are_schema_valid(rendered, overlay):
    kv = pytest.importorskip("kubernetes_validate")
    for doc in rendered[overlay][1]:
        kv.validate(doc, "1.30.0", strict=True)


def test_the_base_is_the_flat_manifests_not_a_copy():
    """The scheduler and node-power objects come from deploy/kubernetes unchanged (the base names that
    directory); only the extender, which has no pod in the base, is left out."""
    _, base = render(KUSTOMIZE / "base")
    _, flat = render(FLAT)
    keep = [d for d in flat if "extender" not in d["metadata"]["name"]]
    for d in keep:
        assert _one(base, d["kind"], d["metadata"]["name"]) == d
    assert not [d for d in base if "extender" in d["metadata"]["name"]]
    exporter = [d for d in yaml.safe_load_all((KUSTOMIZE / "base" / "power-exporter.yaml").read_text()) if d]
    assert len(base) == len(keep) + len(exporter)  # and nothing else


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_sets_its_actuator_and_meter_with_valid_arguments(rendered, overlay):
    docs = rendered[overlay][1]
    actuator, meter = EXPECTED[overlay]
    np_args = _args(docs, "Deployment", "joulesched-node-power")
    assert [a for a in np_args if a.startswith("--actuator")] == [f"--actuator={actuator}"]
    assert np_args[0] == "node-power" and all(a.split("=")[0] in _options(node_power) for a in np_args[1:])
    sched = _args(docs, "Deployment", "joulesched")
    assert sched[0] == "serve" and all(a.split("=")[0] in _options(serve) for a in sched[1:])
    exp = _args(docs, "DaemonSet", "joulesched-power-exporter")
    assert exp[:2] == ["power", "exporter"] and f"--meter={meter}" in exp
    from joulesched.pipelines.cli.power import exporter

    assert all(a.split("=")[0] in _options(exporter) for a in exp[2:])
    assert not any("password" in a.lower() or "secret" in a.lower() for a in np_args + sched + exp)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_non_root_and_hardened(rendered, overlay):
    for d in rendered[overlay][1]:
        if d["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"] == {"drop": ["ALL"]}, (d["metadata"]["name"], sc)
            assert c["resources"]["limits"]["memory"]
        if d["kind"] == "DaemonSet":  # the exporter reads the host, read-only, with no API token
            assert spec["automountServiceAccountToken"] is False
            assert all(m["readOnly"] for m in spec["containers"][0]["volumeMounts"])
            # All of /sys under the powercap root: its zones are links into /sys/devices (a review: a mount of
            # /sys/class/powercap alone left them dangling, and the exporter fell back to the model meter)
            host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
            mounts = {m["mountPath"]: host[m["name"]] for m in spec["containers"][0]["volumeMounts"]}
            assert mounts.get("/host/sys") == "/sys" and "--powercap-root=/host/sys/class/powercap" in \
                spec["containers"][0]["args"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_is_the_flat_manifests_plus_one_namespaced_role_per_owner(rendered, overlay):
    docs = rendered[overlay][1]
    _, flat = render(FLAT)
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        ours = {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}
        assert ours == {d["metadata"]["name"]: d for d in flat if d["kind"] == kind and "extender" not in
                        d["metadata"]["name"]}
    def roles_of(ds):
        return {(d["metadata"]["namespace"], d["metadata"]["name"]): d["rules"] for d in ds if d["kind"] == "Role"}

    roles, flat_roles = roles_of(docs), roles_of(flat)
    assert {k: roles.get(k) for k in flat_roles} == flat_roles  # the flat manifests' Roles, unchanged
    extra = {k: v for k, v in roles.items() if k not in flat_roles}
    expected = {
        "bare-metal-metal3": {("metal3", "joulesched-node-power-metal3"): [
            {"apiGroups": ["metal3.io"], "resources": ["baremetalhosts"], "verbs": ["get", "patch"]}]},
        "bare-metal-rufio": {("tink-system", "joulesched-node-power-rufio"): [
            {"apiGroups": ["bmc.tinkerbell.org"], "resources": ["machines"], "verbs": ["get"]},
            {"apiGroups": ["bmc.tinkerbell.org"], "resources": ["jobs"], "verbs": ["create", "get", "list", "delete"]}]},
    }.get(overlay, {})
    assert extra == expected
    for (ns, name) in expected:
        rb = _one(docs, "RoleBinding", name)
        assert rb["metadata"]["namespace"] == ns
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "joulesched-node-power", "namespace": "joulesched"}]
    assert "*" not in str([d.get("rules") for d in docs if "rules" in d])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubectl_apply_lands_every_object_on_the_emulator(rendered, overlay, tmp_path):
    text, docs = rendered[overlay]
    first_namespaced = min(i for i, d in enumerate(docs) if d["kind"] != "Namespace")
    assert all(d["kind"] == "Namespace" for d in docs[:first_namespaced])  # namespaces are created first
    with KubeEmulator() as emu:
        kubeconfig = emu.kubeconfig(str(tmp_path / "kubeconfig"))
        out = subprocess.run([KUBECTL, "apply", "--kubeconfig", kubeconfig, "--validate=false", "-f", "-"],
                             input=text, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.count(" created") == len(docs)
        for d in docs:
            got = emu.get(RESOURCE[d["kind"]], d["metadata"]["name"], d["metadata"].get("namespace", ""))
            assert got is not None, (d["kind"], d["metadata"]["name"])
            assert got.get("spec") == d.get("spec") and got.get("rules") == d.get("rules")


@pytest.mark.parametrize("overlay, port, cidr", [("kvm-libvirt", 16514, "192.168.122.1/32"), ("aws", 443, "0.0.0.0/0")])
def test_the_node_power_egress_reaches_the_overlays_actuator_and_apiserver(rendered, overlay, port, cidr):
    """A review: the base's egress allowed only the BMC ports and a placeholder apiserver network, so the
    libvirt (TLS, 16514) and EC2 overlays could reach neither their actuator nor the apiserver."""
    egress = _one(rendered[overlay][1], "NetworkPolicy", "joulesched-node-power-egress")["spec"]["egress"]
    reach = {(b["ipBlock"]["cidr"], p["port"]) for r in egress for b in r["to"] if "ipBlock" in b for p in r["ports"]}
    assert (cidr, port) in reach
    apiserver = {"kvm-libvirt": "192.168.122.0/24", "aws": "172.31.0.0/16"}[overlay]
    assert (apiserver, 6443) in reach
