"""The cluster target under Pulumi mocks: resource graph, images, hostPaths, capabilities, RBAC."""

from __future__ import annotations

import pytest

pytest.importorskip("pulumi_kubernetes", reason="infra extra not installed: pip install -e '.[infra]'")

from joulesched.infra.config import InfraConfigError  # noqa: E402
from tests.infra.pulumi_harness import run_main, stack_config  # noqa: E402

DS = "kubernetes:apps/v1:DaemonSet"
DEP = "kubernetes:apps/v1:Deployment"


@pytest.fixture(scope="module")
def rec():
    return run_main(stack_config("cluster"))


def _pod(r):
    return r.inputs["spec"]["template"]["spec"]


def test_components_have_their_own_type_tokens(rec):
    types = {r.typ for r in rec.resources}
    for token in ("joulesched:targets:Cluster", "joulesched:cluster:PowerExporter", "joulesched:cluster:NodeExporter",
                  "joulesched:cluster:Monitoring", "joulesched:cluster:Workloads", "joulesched:cluster:Scheduler"):
        assert token in types, token


HOST_AGENTS = {"joulesched-power-exporter", "joulesched-node-exporter"}


def test_namespaces_and_everything_in_them(rec):
    """The exporters (host access) alone in a privileged namespace; everything else under PSA restricted.
    Before: one namespace, enforce=privileged, shared by the exporter, the scheduler and the workloads."""
    ns = {n.inputs["metadata"]["name"]: n.inputs["metadata"]["labels"]
          for n in rec.of_type("kubernetes:core/v1:Namespace")}
    assert set(ns) == {"joulesched", "joulesched-power"}
    assert ns["joulesched"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["joulesched-power"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for r in rec.resources:
        if r.typ.startswith("kubernetes:") and r.typ.split(":")[-1] not in ("Namespace", "ClusterRole",
                                                                             "ClusterRoleBinding"):
            meta = r.inputs["metadata"]
            if meta["name"] in HOST_AGENTS:
                assert meta["namespace"] == "joulesched-power", r.name
            elif r.typ.endswith(("Role", "RoleBinding")) and meta["name"] == "joulesched-prometheus":
                assert meta["namespace"] in ns, r.name  # pod discovery in both namespaces, nowhere else
            else:
                assert meta["namespace"] == "joulesched", r.name


def test_restricted_namespace_holds_only_restricted_pods(rec):
    """What PSA `restricted` checks, on every pod template in the restricted namespace."""
    for r in rec.of_type(DEP) + rec.of_type(DS):
        if r.inputs["metadata"]["namespace"] != "joulesched":
            continue
        pod = _pod(r)
        assert not any(pod.get(k) for k in ("hostPID", "hostNetwork", "hostIPC")), r.name
        assert not any("hostPath" in v for v in pod.get("volumes", [])), r.name
        assert pod["securityContext"]["runAsNonRoot"] is True, r.name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", r.name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], r.name
            assert "add" not in sc["capabilities"] and not sc.get("privileged"), r.name


def test_network_policies_guard_the_scheduler_and_exporter_ports(rec):
    pols = {(p.inputs["metadata"]["namespace"], p.inputs["metadata"]["name"]): p.inputs["spec"]
            for p in rec.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")}
    expect = {("joulesched-power", "joulesched-power-exporter"): 9102,
              ("joulesched-power", "joulesched-node-exporter"): 9100, ("joulesched", "joulesched-scheduler"): 10259}
    assert set(pols) == set(expect)
    for key, port in expect.items():
        spec = pols[key]
        assert spec["policyTypes"] == ["Ingress"] and spec["podSelector"]["matchLabels"], key
        (rule,) = spec["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": port}], key
        for peer in rule["from"]:
            names = peer["podSelector"]["matchExpressions"][0]["values"]
            assert set(names) <= {"prometheus", "joulesched-prometheus"} and "ipBlock" not in peer, key
            # the stack's Prometheus namespace, named: a pod's labels alone are whoever created it's choice
            assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "joulesched"}, key


@pytest.mark.parametrize("name", ["joulesched-power-exporter", "joulesched-node-exporter"])
def test_exporters_have_no_host_pid_and_no_token(rec, name):
    """Both read the host's /proc through a read-only hostPath mount: neither needs the host's PID namespace."""
    pod = _pod(rec.by_k8s_name(DS, name))
    assert "hostPID" not in pod and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"


def test_image_references_accept_digests():
    digest = "sha256:" + "0f" * 32
    rec = run_main(stack_config("cluster", image=f"registry.example.com/joulesched/joulesched@{digest}",
                                prometheusImage=f"quay.io/prometheus/prometheus:v2.53.2@{digest}",
                                workloadImages={"cpu": f"registry.example.com/joulesched/cpu@{digest}"}))
    sched = _pod(rec.by_k8s_name(DEP, "joulesched"))["containers"][0]
    assert sched["image"] == f"registry.example.com/joulesched/joulesched@{digest}"
    assert _pod(rec.by_k8s_name(DS, "joulesched-power-exporter"))["containers"][0]["image"] == sched["image"]
    assert _pod(rec.by_k8s_name(DEP, "joulesched-cpu"))["containers"][0]["image"].endswith(f"/cpu@{digest}")
    assert _pod(rec.by_k8s_name(DEP, "joulesched-memory"))["containers"][0]["image"].endswith("/memory:latest")
    with pytest.raises(InfraConfigError) as e:
        run_main(stack_config("cluster", image="registry.example.com/js@sha256:abc",
                              workloadImages={"cpu": "Bad Image", "gpu": "x:1"}, workloadTag="sha256:" + "0" * 64))
    text = str(e.value)
    assert "joulesched:image: 'registry.example.com/js@sha256:abc' is not an image reference" in text
    assert "workloadImages.cpu" in text and "unknown app 'gpu'" in text and "workloadTag must be a tag" in text


def test_power_exporter_daemonset_hostpaths_and_no_capabilities(rec):
    ds = rec.by_k8s_name(DS, "joulesched-power-exporter")
    pod = _pod(ds)
    paths = {v["hostPath"]["path"] for v in pod["volumes"]}
    # /sys whole: the powercap class's zones are links into /sys/devices (a review: a mount of the class alone
    # left them dangling, and the exporter fell back to the model on every real host)
    assert paths == {"/sys", "/proc"}, f"{ds.name}: {paths}"
    assert {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]} == {"/host/sys", "/host/proc"}
    c = pod["containers"][0]
    assert c["image"] == "registry.example.com/joulesched/joulesched:0.1.0", ds.name
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}, f"{ds.name}: powercap needs no capability"
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert all(m["readOnly"] for m in c["volumeMounts"]), ds.name
    assert c["args"][:4] == ["power", "exporter", "--listen", "0.0.0.0:9102"]
    assert "--powercap-root" in c["args"] and "/host/sys/class/powercap" in c["args"]
    assert "privileged" not in sc


def test_msr_makes_the_exporter_privileged_with_dev_cpu():
    """A hostPath of /dev/cpu does not let an unprivileged container open /dev/cpu/N/msr (runc allows only its
    default devices), CAP_SYS_RAWIO or not (a review: msr was unreadable, and auto fell back to the model)."""
    rec = run_main(stack_config("cluster", powerExporterMsr="true"))
    pod = _pod(rec.by_k8s_name(DS, "joulesched-power-exporter"))
    c = pod["containers"][0]
    assert c["securityContext"]["privileged"] is True
    assert {v["hostPath"]["path"] for v in pod["volumes"]} == {"/sys", "/proc", "/dev/cpu"}
    assert "--dev-root" in c["args"]


def test_node_exporter_runs_unprivileged(rec):
    ds = rec.by_k8s_name(DS, "joulesched-node-exporter")
    pod = _pod(ds)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["image"].startswith("quay.io/prometheus/node-exporter:")
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_scheduler_rbac_is_least_privilege(rec):
    cr = rec.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    assert len(cr) == 1
    rules = cr[0].inputs["rules"]
    verbs = {(res, v) for r in rules for res in r["resources"] for v in r["verbs"]}
    assert ("pods/binding", "create") in verbs and ("nodes", "list") in verbs
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules), cr[0].name
    assert not any(v in ("delete", "update", "patch") for res, v in verbs if res in ("pods", "nodes")), verbs
    assert not any("secrets" in r["resources"] for r in rules)
    role = rec.by_k8s_name("kubernetes:rbac.authorization.k8s.io/v1:Role", "joulesched-leader-election")
    assert role.inputs["metadata"]["namespace"] == "joulesched"
    named = [r for r in role.inputs["rules"] if "update" in r["verbs"]]
    assert named and named[0]["resourceNames"] == ["joulesched"], "only its own Lease may be updated"
    crb = rec.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")[0]
    assert crb.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "joulesched", "namespace": "joulesched"}]


def test_scheduler_is_the_live_scheduler_from_deploy(rec):
    dep = rec.by_k8s_name(DEP, "joulesched")
    pod = _pod(dep)
    c = pod["containers"][0]
    assert pod["serviceAccountName"] == "joulesched" and dep.inputs["spec"]["replicas"] == 2
    assert c["image"] == "registry.example.com/joulesched/joulesched:0.1.0"
    assert c["args"][0] == "serve"
    for arg in ("--scheduler-name=joulesched", "--policy=default-k8s", "--lease-namespace=joulesched",
                "--prometheus=http://joulesched-prometheus.joulesched.svc:9090"):
        assert c["args"].count(arg) == 1, (arg, c["args"])
    assert len([a for a in c["args"] if a.startswith("--policy=")]) == 1
    # No node power controller in this stack: the scheduler is not told that nodes sleep (a review: its policy
    # weighed a sleep saving and a wake delay no node had)
    assert not [a for a in c["args"] if a.startswith(("--node-sleep-watts", "--node-wake-s"))], c["args"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    rec.by_k8s_name("kubernetes:core/v1:ConfigMap", "joulesched-power-profiles")


def test_scheduler_name_and_policy_follow_config():
    rec = run_main(stack_config("cluster", schedulerName="green", schedulerPolicy="dqn=/models/a.safetensors",
                                prometheus="none", prometheusUrl="http://prom.monitoring.svc:9090"))
    c = _pod(rec.by_k8s_name(DEP, "joulesched"))["containers"][0]
    assert "--scheduler-name=green" in c["args"] and "--policy=dqn=/models/a.safetensors" in c["args"]
    assert "--prometheus=http://prom.monitoring.svc:9090" in c["args"]
    role = rec.by_k8s_name("kubernetes:rbac.authorization.k8s.io/v1:Role", "joulesched-leader-election")
    assert [r for r in role.inputs["rules"] if "update" in r["verbs"]][0]["resourceNames"] == ["green"]
    for r in rec.of_type(DEP):
        if r.inputs["metadata"]["labels"].get("app.kubernetes.io/component") in ("blocker", "testapp"):
            assert _pod(r)["schedulerName"] == "green", r.name


def test_workloads_use_the_joulesched_scheduler(rec):
    apps = {r.inputs["metadata"]["name"]: r for r in rec.of_type(DEP)
            if r.inputs["metadata"]["labels"].get("app.kubernetes.io/component") in ("blocker", "testapp")}
    assert set(apps) == {f"joulesched-{a}" for a in ("cpu", "memory", "disk", "network", "testapp")}
    for name, r in apps.items():
        assert _pod(r)["schedulerName"] == "joulesched", name
        assert _pod(r)["containers"][0]["image"] == f"registry.example.com/joulesched/{name.split('-', 1)[1]}:latest"


def test_prometheus_manifests_mode(rec):
    dep = rec.by_k8s_name(DEP, "joulesched-prometheus")
    assert _pod(dep)["containers"][0]["image"].startswith("quay.io/prometheus/prometheus:")
    cm = rec.by_k8s_name("kubernetes:core/v1:ConfigMap", "joulesched-prometheus")
    assert "kubernetes_sd_configs" in cm.inputs["data"]["prometheus.yml"]
    assert not rec.of_type("kubernetes:helm.sh/v3:Release")


def test_prometheus_helm_mode():
    rec = run_main(stack_config("cluster", prometheus="helm"))
    rel = rec.of_type("kubernetes:helm.sh/v3:Release")
    assert len(rel) == 1 and rel[0].inputs["chart"] == "kube-prometheus-stack"
    assert rel[0].inputs["repositoryOpts"]["repo"].startswith("https://")
    assert rel[0].inputs["values"]["nodeExporter"]["enabled"] is False
    assert not [r for r in rec.of_type(DEP) if r.inputs["metadata"]["name"] == "joulesched-prometheus"]


def test_missing_image_is_a_clear_error():
    cfg = stack_config("cluster")
    del cfg["joulesched:image"]
    with pytest.raises(InfraConfigError, match=r"joulesched:image is required: pulumi config set image"):
        run_main(cfg)


def test_every_problem_is_reported_at_once():
    cfg = stack_config("cluster", namespace="Not_A_Label", prometheus="grafana", apps=["cpu", "nope"])
    with pytest.raises(InfraConfigError) as e:
        run_main(cfg)
    assert len(e.value.problems) == 3, e.value.problems


def test_stack_outputs_tell_the_pipeline_where_things_are(rec):
    """`joulesched pipeline --stack cluster` reads these (infra/stack.py interprets them)."""
    from joulesched.infra.stack import environment

    assert rec.exports["prometheus_url"] == "http://joulesched-prometheus.joulesched.svc:9090"
    assert rec.exports["target_url"] == "http://testapp.joulesched.svc:8080/work?ms=20"
    env = environment("cluster", {k: rec.exports[k] for k in ("prometheus_url", "target_url")})
    assert env.prometheus_url == rec.exports["prometheus_url"] and env.target_url == rec.exports["target_url"]
    assert env.kubeconfig is None and env.hosts == ()


def test_helm_mode_without_a_url_exports_no_prometheus():
    r = run_main(stack_config("cluster", prometheus="helm", kubeContext="lab"))
    assert "prometheus_url" not in r.exports and r.exports["kube_context"] == "lab"
