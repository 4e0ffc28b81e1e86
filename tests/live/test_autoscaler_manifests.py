"""deploy/kubernetes/autoscaler-provider.yaml: schema-valid (offline), least privilege (no eviction: the
autoscaler drains), the node power Lease shared with node-power, mTLS files mounted from a Secret, a hardened
non-root pod on the control plane, arguments the command accepts, and the autoscaler's cloud-config keys."""

from __future__ import annotations

import typer
import yaml

from joulesched.pipelines.cli.autoscaler import autoscaler_provider
from tests.support.manifests import manifest_docs, only, validate_strict

DOCS = manifest_docs("autoscaler-provider.yaml")


def _one(kind, namespace="joulesched"):
    return only(DOCS, kind, namespace)


def test_schema_valid():
    validate_strict(DOCS)


def test_rbac_is_what_the_provider_uses_and_the_lease_is_node_powers():
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in _one("ClusterRole")["rules"]}
    assert rules == {(("",), ("nodes",)): ["get", "list", "patch", "watch"],
                     (("",), ("pods",)): ["get", "list", "watch"],
                     (("",), ("events",)): ["create"],
                     (("apps",), ("daemonsets",)): ["get"]}  # its last check before a sleep (live/daemonsets.py)
    # Node heartbeats are read in kube-node-lease only, not every Lease of the cluster.
    beats = _one("Role", "kube-node-lease")
    assert beats["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]
    binding = _one("RoleBinding", "kube-node-lease")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": beats["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "joulesched-autoscaler-provider",
                                    "namespace": "joulesched"}]
    named = [r for r in _one("Role")["rules"] if "resourceNames" in r]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["joulesched-node-power"], "verbs": ["get", "update"]}]


def test_pod_is_hardened_serves_mtls_and_takes_only_known_options():
    spec = _one("Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] and "node-role.kubernetes.io/control-plane" in spec["nodeSelector"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    args = dict(a.split("=", 1) for a in c["args"][1:])
    assert c["args"][0] == "autoscaler-provider"
    assert {"--tls-cert", "--tls-key", "--client-ca"} <= set(args)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args["--tls-key"].startswith(mounts["tls"] + "/")
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in spec["volumes"]}["tls"] == "joulesched-autoscaler-tls"
    app = typer.Typer()
    app.command()(autoscaler_provider)
    known = {o for p in typer.main.get_command(app).params for o in p.opts}
    assert set(args) <= known, set(args) - known


def test_the_autoscalers_cloud_config_and_the_groups_load(tmp_path):
    from joulesched.live.autoscaler import load_provider_config

    cloud = yaml.safe_load(_one("ConfigMap", "kube-system")["data"]["cloud-config"])
    assert set(cloud) == {"address", "cert", "key", "cacert"}  # the keys externalgrpc's README documents
    assert cloud["address"].endswith(":8086")
    cm = _one("ConfigMap")
    (tmp_path / "c.yaml").write_text(cm["data"]["config.yaml"])
    assert [g.id for g in load_provider_config(tmp_path / "c.yaml").groups] == ["general", "gpu"]
    policy = _one("NetworkPolicy")
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [8086, 10262]
