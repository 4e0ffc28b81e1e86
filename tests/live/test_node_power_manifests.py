"""deploy/kubernetes/node-power.yaml: schema-valid (kubernetes-validate, offline), least privilege (exactly
the rules the controller uses), its own Lease only, a hardened non-root pod, and arguments the CLI accepts."""

from __future__ import annotations

import typer

from joulesched.pipelines.cli.live import node_power
from tests.support.manifests import manifest_docs, only, validate_strict

DOCS = manifest_docs("node-power.yaml")


def _one(kind):
    return only(DOCS, kind)


def test_schema_valid():
    validate_strict(DOCS)


def test_cluster_role_is_exactly_what_the_controller_uses():
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in _one("ClusterRole")["rules"]}
    assert rules == {
        (("",), ("nodes",)): ["get", "list", "patch", "watch"],
        (("",), ("pods",)): ["get", "list", "watch"],
        (("",), ("pods/eviction",)): ["create"],
        (("policy",), ("poddisruptionbudgets",)): ["get", "list", "watch"],
        (("",), ("events",)): ["create"],
    }
    crb = _one("ClusterRoleBinding")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "joulesched-node-power", "namespace": "joulesched"}]


def test_lease_access_is_its_own_lease():
    role = _one("Role")
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["joulesched-node-power"], "verbs": ["get", "update"]}]
    assert [r["verbs"] for r in role["rules"] if "resourceNames" not in r] == [["create"]]


def test_pod_is_hardened_and_runs_where_it_cannot_put_itself_to_sleep():
    dep = _one("Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "joulesched-node-power" and dep["spec"]["replicas"] >= 2
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert "node-role.kubernetes.io/control-plane" in spec["nodeSelector"]  # control-plane nodes never sleep
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["limits"]["memory"]
    assert not any("password" in a.lower() for a in c["args"])  # no credential on the command line


def test_arguments_are_options_of_the_command():
    (c,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "node-power"
    app = typer.Typer()
    app.command()(node_power)
    known = {o for p in typer.main.get_command(app).params for o in p.opts}
    for a in c["args"][1:]:
        assert a.split("=")[0] in known, a
