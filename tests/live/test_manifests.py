"""deploy/kubernetes: schema-valid (kubernetes-validate, bundled schemas, offline), least privilege, hardened."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
MANIFESTS = ["namespace.yaml", "rbac.yaml", "deployment.yaml", "extender-deployment.yaml", "power-profiles.yaml",
             "networkpolicy.yaml"]


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _all() -> list[dict]:
    return [d for m in MANIFESTS for d in _docs(m)]


@pytest.mark.parametrize("name", MANIFESTS)
def test_kubernetes_validate_strict(name):
    kv = pytest.importorskip("kubernetes_validate")
    for doc in _docs(name):
        kv.validate(doc, "1.30.0", strict=True)


def test_cluster_role_is_least_privilege():
    role = next(d for d in _all() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "joulesched")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("pods",)): ["get", "list", "watch"],
        (("",), ("nodes",)): ["get", "list", "watch"],
        (("",), ("pods/binding",)): ["create"],
        (("",), ("pods/status",)): ["patch"],
        (("",), ("events",)): ["create", "patch"],  # patch: an aggregated Event's count (live/events.py)
    }
    assert all("*" not in str(r) for r in role["rules"])


def test_lease_access_is_one_lease_in_one_namespace():
    role = next(d for d in _all() if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == "joulesched"
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["joulesched"],
                      "verbs": ["get", "update"]}]
    unnamed = [r for r in role["rules"] if "resourceNames" not in r]
    assert [r["verbs"] for r in unnamed] == [["create"]]  # create cannot be limited by name


def test_the_extender_has_its_own_read_only_account():
    """Before: the extender ran as the scheduler's ServiceAccount, so it could bind any pod."""
    dep = next(d for d in _docs("extender-deployment.yaml") if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "joulesched-extender"
    docs = _docs("rbac.yaml")
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "joulesched-extender"]
    (crb,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"
              and {"kind": "ServiceAccount", "name": "joulesched-extender", "namespace": "joulesched"} in d["subjects"]]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == crb["roleRef"]["name"]]
    verbs = {v for r in role["rules"] for v in r["verbs"]}
    assert verbs == {"get", "list", "watch"}, role["rules"]
    assert {res for r in role["rules"] for res in r["resources"]} == {"pods", "nodes"}
    # Nothing else is bound to the extender's account.
    bound = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s["name"] == "joulesched-extender" for s in d["subjects"])]
    assert bound == [crb]


def test_network_policies_open_only_the_ports_they_guard():
    pols = {d["metadata"]["name"]: d["spec"] for d in _docs("networkpolicy.yaml")}
    assert set(pols) == {"joulesched-scheduler", "joulesched-extender"}
    for name, port in (("joulesched-scheduler", 10259), ("joulesched-extender", 8888)):
        spec = pols[name]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == name.split("-")[1]
        assert spec["policyTypes"] == ["Ingress"]
        assert {p["port"] for rule in spec["ingress"] for p in rule["ports"]} == {port}
        for rule in spec["ingress"]:
            for peer in rule["from"]:
                assert peer.get("podSelector") or peer.get("ipBlock", {}).get("cidr") not in ("0.0.0.0/0", None)
                if "podSelector" in peer:  # a pod's labels are its creator's choice: its namespace must be named
                    assert peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], (name, peer)


def test_the_scheduler_is_ready_only_once_synced():
    """The readiness probe asks /readyz (informers synced, the Lease answered), not /healthz (alive)."""
    dep = next(d for d in _docs("deployment.yaml") if d["kind"] == "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_namespace_is_restricted():
    (ns,) = _docs("namespace.yaml")
    labels = ns["metadata"]["labels"]
    assert all(labels[f"pod-security.kubernetes.io/{m}"] == "restricted" for m in ("enforce", "warn", "audit"))


@pytest.mark.parametrize("name", ["deployment.yaml", "extender-deployment.yaml"])
def test_pods_are_hardened(name):
    dep = next(d for d in _docs(name) if d["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == ("joulesched" if name == "deployment.yaml" else "joulesched-extender")
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "add" not in sc["capabilities"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert "hostNetwork" not in spec and "hostPID" not in spec


def test_scheduler_deployment_matches_serve_flags():
    dep = next(d for d in _docs("deployment.yaml") if d["kind"] == "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve" and "--scheduler-name=joulesched" in args
    assert dep["spec"]["replicas"] >= 2  # leader election keeps it to one binder
    # The kustomization deploys the node power controller beside it: the policy is told that nodes sleep.
    assert "node-power.yaml" in yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert "--node-sleep-watts=10" in args


def test_sample_kube_scheduler_configuration():
    """Not a served API type, so kubernetes-validate has no schema: checked against the v1 field names."""
    cfg = yaml.safe_load((DEPLOY / "scheduler-config.yaml").read_text())
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    (ext,) = cfg["extenders"]
    allowed = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
               "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}
    assert set(ext) <= allowed
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert 0 < ext["weight"] and ext["urlPrefix"].startswith("http")
    assert "bindVerb" not in ext  # kube-scheduler keeps binding
