"""deploy/kubernetes/node-power.yaml: schema-valid (kubernetes-validate, offline), least privilege (exactly
the rules the controller uses), its own Lease only, a hardened non-root pod, arguments the CLI accepts, a
ValidatingAdmissionPolicy (its CEL evaluated with cel-python) that stops kubelets from writing the power
annotations, and egress limited to DNS, the apiserver and the BMC network."""

from __future__ import annotations

import typer

from joulesched.pipelines.cli.live import node_power
from tests.support.manifests import manifest_docs, only, validate_strict

DOCS = manifest_docs("node-power.yaml")


def _one(kind, namespace=None):
    return only(DOCS, kind, namespace)


def test_schema_valid():
    validate_strict(DOCS)


def test_cluster_role_is_exactly_what_the_controller_uses():
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in _one("ClusterRole")["rules"]}
    assert rules == {
        (("",), ("nodes",)): ["get", "list", "patch", "watch"],
        (("",), ("pods",)): ["list", "watch"],
        (("",), ("pods/eviction",)): ["create"],
        (("policy",), ("poddisruptionbudgets",)): ["list"],
        (("",), ("events",)): ["create"],
        (("",), ("persistentvolumeclaims", "persistentvolumes")): ["get"],
        (("apps",), ("daemonsets",)): ["get"],
    }
    crb = _one("ClusterRoleBinding")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "joulesched-node-power", "namespace": "joulesched"}]


def test_lease_access_is_its_own_lease_and_node_heartbeats_are_only_read():
    beats = _one("Role", "kube-node-lease")
    assert beats["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]
    role = _one("Role", "joulesched")
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


def _admission(request: dict, obj: dict, old: dict | None):
    """The policy's verdict on one request: None (not matched), True (admitted), False (denied)."""
    import celpy

    spec = _one("ValidatingAdmissionPolicy")["spec"]
    env = celpy.Environment()

    def ev(expr, variables):
        act = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
               "oldObject": celpy.json_to_cel(old),
               "variables": celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})}
        return env.program(env.compile(expr)).evaluate(act)

    resource = request.get("resource", "nodes") + (f"/{request['subResource']}" if request.get("subResource") else "")
    if not any(request["operation"] in r["operations"] and resource in r["resources"]
               for r in spec["matchConstraints"]["resourceRules"]):
        return None
    if not all(ev(m["expression"], {}) for m in spec["matchConditions"]):
        return None
    variables: dict = {}
    for v in spec["variables"]:
        variables[v["name"]] = ev(v["expression"], variables)
    return all(bool(ev(v["expression"], variables)) for v in spec["validations"])


KUBELET = {"operation": "UPDATE", "userInfo": {"username": "system:node:n1",
                                               "groups": ["system:nodes", "system:authenticated"]}}


def test_kubelets_cannot_write_the_power_annotations():
    old = {"metadata": {"name": "n1", "annotations": {"joulesched.io/power": "ipmi://10.0.9.8",
                                                      "node.alpha.kubernetes.io/ttl": "0"}}}
    same = {"metadata": {"name": "n1", "annotations": {**old["metadata"]["annotations"], "other": "x"}}}
    assert _admission(KUBELET, same, old) is True  # its other annotations are its own business
    for key in ("joulesched.io/power", "joulesched.io/power-state", "joulesched.io/cordoned"):
        bad = {"metadata": {"name": "n1", "annotations": {**old["metadata"]["annotations"], key: "ipmi://10.0.9.9"}}}
        assert _admission(KUBELET, bad, old) is False, key
    gone = {"metadata": {"name": "n1", "annotations": {}}}
    assert _admission(KUBELET, gone, old) is False  # removing it is a change too
    create = {"metadata": {"name": "n1", "annotations": {"joulesched.io/power": "aws://i-1"}}}
    assert _admission({**KUBELET, "operation": "CREATE"}, create, None) is False  # nor at registration
    assert _admission({**KUBELET, "operation": "CREATE"}, {"metadata": {"name": "n1"}}, None) is True
    # Through the status subresource (a kubelet PATCHes its own; the apiserver keeps metadata changed there):
    # the policy did not match it, so a kubelet could set any power annotation that way.
    status = {**KUBELET, "subResource": "status"}
    assert _admission(status, bad, old) is False and _admission(status, same, old) is True
    assert _admission({**KUBELET, "subResource": "proxy"}, bad, old) is None  # no metadata written there
    admin = {"operation": "UPDATE", "userInfo": {"username": "admin", "groups": ["system:masters"]}}
    assert _admission(admin, create, old) is None  # the operator (and the controller) are not matched
    binding = _one("ValidatingAdmissionPolicyBinding")["spec"]
    assert binding == {"policyName": "joulesched-node-power-annotations", "validationActions": ["Deny"]}


def test_egress_is_limited_to_dns_the_apiserver_and_the_bmc_network():
    (pol,) = [d for d in DOCS if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]]
    rules = pol["spec"]["egress"]
    ports = {(p["port"], p["protocol"]) for r in rules for p in r["ports"]}
    assert ports == {(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"), (623, "UDP"), (22, "TCP"), (9, "UDP")}
    assert all("to" in r and r["to"] for r in rules)  # no rule open to everywhere
