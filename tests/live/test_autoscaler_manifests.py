"""deploy/kubernetes/autoscaler-provider.yaml: schema-valid (offline), least privilege yet every call of the node
power controller it runs granted (read from the code), the node power Lease shared with node-power, mTLS files
mounted from a Secret, a hardened non-root pod on the control plane, arguments the command accepts, and the
autoscaler's cloud-config keys."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import kubernetes.client as k8s
import pytest
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
                     # a pending pod's local PV decides which node a wake is for (live/nodepower.py _pv_terms)
                     (("",), ("persistentvolumeclaims", "persistentvolumes")): ["get"],
                     # --consolidate (a node-power option the provider takes too): PDB-honouring evictions
                     (("",), ("pods/eviction",)): ["create"],
                     (("policy",), ("poddisruptionbudgets",)): ["list"],
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


ROOT = Path(__file__).resolve().parents[2]
#: What the provider's process runs: the cache's informers, the node power controller (wake, sleep, consolidation
#: passes), its DaemonSet check, leader election and the provider's own node reads and patches.
RUNS = ("cluster/kube/cache.py", "live/nodepower.py", "live/daemonsets.py", "live/leader.py", "live/autoscaler.py")
APIS = (k8s.CoreV1Api, k8s.PolicyV1Api, k8s.AppsV1Api, k8s.CoordinationV1Api)
HTTP_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def _request(name):
    """(HTTP method, path template) of the Kubernetes client method ``name``; None where no API class has it."""
    for api in APIS:
        fn = getattr(api, f"_{name}_serialize", None)
        if fn is not None:
            (got,) = re.findall(r"method='(\w+)',\s*resource_path='([^']+)'", inspect.getsource(fn))
            return got
    return None


def _needs():
    """Every (group, resource, verb) the code in RUNS asks of the apiserver, from the client methods it names (a
    list function an Informer is given is also watched)."""
    needs = set()
    for rel in RUNS:
        src = (ROOT / rel).read_text()
        watched = set(re.findall(r"Informer\(\s*\"\w+\",\s*self\.\w+\.(\w+)", src))
        for name in set(re.findall(r"\.((?:list|read|create|patch|replace|delete)_\w+)\b", src)):
            req = _request(name)
            if req is None:  # not the Kubernetes client's (read_text, delete_nodes, ...)
                continue
            method, path = req
            m = re.match(r"/api/v1/|/apis/([^/]+)/[^/]+/", path)
            segs = path[m.end():].split("/")
            if segs[:2] == ["namespaces", "{namespace}"]:
                segs = segs[2:]
            named = segs[1:2] == ["{name}"]
            resource = "/".join([segs[0]] + segs[2:3])  # a subresource: pods/eviction
            verb = HTTP_VERBS.get(method) or ("get" if named else "list")
            needs.add((m.group(1) or "", resource, verb))
            if name in watched:
                needs.add((m.group(1) or "", resource, "watch"))
    return needs


@pytest.mark.parametrize("manifest, account", [("autoscaler-provider.yaml", "joulesched-autoscaler-provider"),
                                               ("node-power.yaml", "joulesched-node-power")])
def test_every_api_call_of_the_controller_it_runs_is_granted(manifest, account):
    # The provider runs the whole node power controller (node_power(**options)); a call its role lacks gets a 403
    # the controller swallows (an unreadable PV: a pod waits on a sleeping node), so no other test would see it.
    docs = manifest_docs(manifest)
    bound = {b["roleRef"]["name"] for b in docs if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and {"kind": "ServiceAccount", "name": account, "namespace": "joulesched"} in b["subjects"]}
    rules = [r for d in docs if d["kind"] in ("ClusterRole", "Role") and d["metadata"]["name"] in bound
             for r in d["rules"]]
    needs = _needs()
    assert {("", "nodes", "watch"), ("", "persistentvolumes", "get"), ("", "pods/eviction", "create")} <= needs
    missing = sorted(n for n in needs if not any(n[0] in r["apiGroups"] and n[1] in r["resources"]
                                                 and n[2] in r["verbs"] for r in rules))
    assert missing == []


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
