"""The `cluster` target: joulesched on an existing Kubernetes cluster (or minikube) through pulumi-kubernetes.

One ComponentResource per unit, each with its own type token, children parented to it:

- `PowerExporter`  the joulesched power exporter DaemonSet (hostPath powercap and /proc, no capabilities unless
                   the MSR meter is asked for)
- `NodeExporter`   prometheus node-exporter DaemonSet
- `Monitoring`     Prometheus: our own Deployment (`manifests`) or kube-prometheus-stack (`helm`)
- `Workloads`      the blocker and test apps, from the same manifests `joulesched workload` renders
- `Scheduler`      `joulesched serve` and its least-privilege RBAC, from deploy/kubernetes/ (not forked)
- `ClusterTarget`  the namespaces and all of the above

Two namespaces: the power and node exporters need the host (hostPath, and uid 0 to read ``energy_uj``), which
only the ``privileged`` Pod Security level admits, so they live in ``<namespace>-power`` and nothing else does;
everything else (scheduler, Prometheus, workloads) runs in ``<namespace>`` under ``restricted``. NetworkPolicies
let only Prometheus reach the exporters' and the scheduler's ports.
"""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s
import yaml

from joulesched.infra.config import ClusterConfig, PowerExporterConfig

PART_OF = "joulesched"
POWER_METRICS_PATH = "/metrics"

# Pod and container security contexts shared by everything that does not need more.
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": f"joulesched-{component}", "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/component": component}


def _meta(name: str, namespace: str, labels: dict[str, str], **extra) -> dict:
    return {"name": name, "namespace": namespace, "labels": labels, **extra}


#: Pods that scrape: our Prometheus, or kube-prometheus-stack's.
PROMETHEUS_NAMES = ["joulesched-prometheus", "prometheus"]


def scrape_only_policy(name: str, namespace: pulumi.Input[str], labels: dict[str, str], port: int,
                       prometheus_namespace: str, opts: pulumi.ResourceOptions):
    """A NetworkPolicy isolating the pods named ``labels``: only Prometheus pods in ``prometheus_namespace`` reach
    ``port`` (kubelet probes come from the node, which NetworkPolicies always allow)."""
    return k8s.networking.v1.NetworkPolicy(
        name, metadata=_meta(labels["app.kubernetes.io/name"], namespace, labels),
        spec={"podSelector": {"matchLabels": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]}},
              "policyTypes": ["Ingress"],
              "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                  "kubernetes.io/metadata.name": prometheus_namespace}},
                  "podSelector": {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                                        "values": PROMETHEUS_NAMES}]}}],
                  "ports": [{"protocol": "TCP", "port": port}]}]},
        opts=opts)


class PowerExporter(pulumi.ComponentResource):
    """The power exporter on every node, with the narrowest privileges that still read RAPL.

    Root inside the container only so it can read `energy_uj` (root-only since Linux 5.10); every capability is
    dropped, so it can read what root owns and nothing else: no CAP_DAC_OVERRIDE, no ptrace, no raw I/O. Two
    read-only hostPaths (/sys, and /proc, which lists the host's processes whatever the pod's PID namespace,
    so no hostPID), no ServiceAccount token, a read-only root filesystem, seccomp RuntimeDefault, and only
    Prometheus may connect. The whole of /sys, not /sys/class/powercap alone: each zone there is a relative link
    into /sys/devices, which a mount of the class folder alone leaves dangling (no zone is found, and `--meter
    auto` falls back to the model). `msr=True` makes the container privileged, with /dev/cpu: a hostPath of a
    device node does not let a container open it (only runc's default devices are allowed), CAP_SYS_RAWIO or
    not; the host must have loaded the `msr` module.
    """

    def __init__(self, name: str, *, namespace: pulumi.Input[str], cfg: PowerExporterConfig,
                 prometheus_namespace: str = "joulesched", opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:cluster:PowerExporter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        labels = _labels("power-exporter")
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-sa", metadata=_meta("joulesched-power-exporter", namespace, labels),
            automount_service_account_token=False, opts=child)
        volumes = [
            {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}},
            {"name": "proc", "hostPath": {"path": "/proc", "type": "Directory"}},
        ]
        mounts = [
            {"name": "sys", "mountPath": "/host/sys", "readOnly": True},
            {"name": "proc", "mountPath": "/host/proc", "readOnly": True},
        ]
        args = ["power", "exporter", "--listen", f"0.0.0.0:{cfg.port}", "--interval", str(cfg.interval_s),
                "--powercap-root", "/host/sys/class/powercap", "--proc-root", "/host/proc"]
        security: dict = {**RESTRICTED_CONTAINER, "runAsUser": 0, "runAsNonRoot": False,
                          "capabilities": {"drop": ["ALL"]}}
        if cfg.msr:
            volumes.append({"name": "dev-cpu", "hostPath": {"path": "/dev/cpu", "type": "Directory"}})
            mounts.append({"name": "dev-cpu", "mountPath": "/host/dev/cpu", "readOnly": True})
            args += ["--dev-root", "/host/dev"]
            # Opening /dev/cpu/N/msr needs the device allowed in the container's cgroup: privileged only.
            security = {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True}
        self.daemonset = k8s.apps.v1.DaemonSet(
            f"{name}-ds",
            metadata=_meta("joulesched-power-exporter", namespace, labels),
            spec={
                "selector": {"matchLabels": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]}},
                "template": {
                    "metadata": {"labels": labels, "annotations": {
                        "prometheus.io/scrape": "true", "prometheus.io/port": str(cfg.port),
                        "prometheus.io/path": POWER_METRICS_PATH}},
                    "spec": {
                        "serviceAccountName": "joulesched-power-exporter",
                        "automountServiceAccountToken": False,
                        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "exporter",
                            "image": cfg.image,
                            "command": ["joulesched"],
                            "args": args,
                            "ports": [{"name": "metrics", "containerPort": cfg.port}],
                            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                          "limits": {"memory": "256Mi"}},
                            "securityContext": security,
                            "volumeMounts": mounts,
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"},
                                               "periodSeconds": 10},
                        }],
                        "volumes": volumes,
                    },
                },
            },
            opts=child)
        self.service = k8s.core.v1.Service(
            f"{name}-svc",
            metadata=_meta("joulesched-power-exporter", namespace, labels),
            spec={"clusterIP": "None", "selector": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]},
                  "ports": [{"name": "metrics", "port": cfg.port, "targetPort": "metrics"}]},
            opts=child)
        self.network_policy = scrape_only_policy(f"{name}-netpol", namespace, labels, cfg.port, prometheus_namespace,
                                                 child)
        self.register_outputs({"daemonset": self.daemonset.metadata["name"]})


class NodeExporter(pulumi.ComponentResource):
    def __init__(self, name: str, *, namespace: pulumi.Input[str], image: str, prometheus_namespace: str = "joulesched",
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:cluster:NodeExporter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        labels = _labels("node-exporter")
        self.daemonset = k8s.apps.v1.DaemonSet(
            f"{name}-ds",
            metadata=_meta("joulesched-node-exporter", namespace, labels),
            spec={
                "selector": {"matchLabels": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]}},
                "template": {
                    "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true",
                                                                   "prometheus.io/port": "9100"}},
                    "spec": {
                        # No hostPID: node_exporter reads the host's processes through /host/proc (--path.procfs).
                        "automountServiceAccountToken": False,
                        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "node-exporter",
                            "image": image,
                            "args": ["--path.procfs=/host/proc", "--path.sysfs=/host/sys",
                                     "--path.rootfs=/host/root", "--web.listen-address=:9100"],
                            "ports": [{"name": "metrics", "containerPort": 9100}],
                            "resources": {"requests": {"cpu": "20m", "memory": "32Mi"},
                                          "limits": {"memory": "128Mi"}},
                            "securityContext": RESTRICTED_CONTAINER,
                            "volumeMounts": [
                                {"name": "proc", "mountPath": "/host/proc", "readOnly": True},
                                {"name": "sys", "mountPath": "/host/sys", "readOnly": True},
                                {"name": "root", "mountPath": "/host/root", "readOnly": True,
                                 "mountPropagation": "HostToContainer"},
                            ],
                        }],
                        "volumes": [{"name": "proc", "hostPath": {"path": "/proc"}},
                                    {"name": "sys", "hostPath": {"path": "/sys"}},
                                    {"name": "root", "hostPath": {"path": "/"}}],
                    },
                },
            },
            opts=child)
        self.network_policy = scrape_only_policy(f"{name}-netpol", namespace, labels, 9100, prometheus_namespace,
                                                 child)
        self.register_outputs({"daemonset": self.daemonset.metadata["name"]})


def prometheus_config(namespace: str | list[str]) -> str:
    """prometheus.yml for the `manifests` mode: scrape annotated pods in our namespaces."""
    namespaces = [namespace] if isinstance(namespace, str) else list(namespace)
    relabel = [
        {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "action": "keep",
         "regex": "true"},
        {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"], "action": "replace",
         "target_label": "__metrics_path__", "regex": "(.+)"},
        {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
         "action": "replace", "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
         "target_label": "__address__"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    doc = {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "scrape_configs": [{
            "job_name": "joulesched-pods",
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": namespaces}}],
            "relabel_configs": relabel,
        }],
    }
    return yaml.safe_dump(doc, sort_keys=False)


class Monitoring(pulumi.ComponentResource):
    """Prometheus. `mode="manifests"`: one Deployment with a read-only ClusterRole for pod discovery.
    `mode="helm"`: kube-prometheus-stack via helm.v3.Release, with its own node-exporter turned off (ours runs)."""

    def __init__(self, name: str, *, namespace: str, mode: str, image: str, chart_version: str,
                 scrape_namespaces: tuple[str, ...] = (), opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:cluster:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        labels = _labels("prometheus")
        scraped = [namespace, *[n for n in scrape_namespaces if n != namespace]]
        if mode == "helm":
            self.release = k8s.helm.v3.Release(
                f"{name}-kps",
                chart="kube-prometheus-stack",
                version=chart_version,
                namespace=namespace,
                repository_opts={"repo": "https://prometheus-community.github.io/helm-charts"},
                values={
                    "nodeExporter": {"enabled": False},
                    "grafana": {"enabled": False},
                    "prometheus": {"prometheusSpec": {
                        "podMonitorSelectorNilUsesHelmValues": False,
                        "additionalScrapeConfigs": yaml.safe_load(prometheus_config(scraped))["scrape_configs"],
                    }},
                },
                opts=child)
            self.register_outputs({"release": self.release.name})
            return
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-sa", metadata=_meta("joulesched-prometheus", namespace, labels), opts=child)
        # Pod discovery, read-only, in each namespace it scrapes (a Role per namespace, no ClusterRole).
        self.roles, self.bindings = [], []
        for k, ns in enumerate(scraped):
            suffix = "" if k == 0 else f"-{ns}"
            self.roles.append(k8s.rbac.v1.Role(
                f"{name}-role{suffix}", metadata=_meta("joulesched-prometheus", ns, labels),
                rules=[{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                        "verbs": ["get", "list", "watch"]}],
                opts=child))
            self.bindings.append(k8s.rbac.v1.RoleBinding(
                f"{name}-rb{suffix}", metadata=_meta("joulesched-prometheus", ns, labels),
                role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "joulesched-prometheus"},
                subjects=[{"kind": "ServiceAccount", "name": "joulesched-prometheus", "namespace": namespace}],
                opts=child))
        self.role, self.binding = self.roles[0], self.bindings[0]
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-cm", metadata=_meta("joulesched-prometheus", namespace, labels),
            data={"prometheus.yml": prometheus_config(scraped)}, opts=child)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deploy",
            metadata=_meta("joulesched-prometheus", namespace, labels),
            spec={
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "joulesched-prometheus",
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "fsGroup": 65534,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": "prometheus",
                            "image": image,
                            "args": ["--config.file=/etc/prometheus/prometheus.yml",
                                     "--storage.tsdb.path=/prometheus", "--storage.tsdb.retention.time=7d"],
                            "ports": [{"name": "web", "containerPort": 9090}],
                            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                          "limits": {"memory": "1Gi"}},
                            "securityContext": RESTRICTED_CONTAINER,
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"},
                                             {"name": "data", "mountPath": "/prometheus"}],
                            "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "web"}},
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": "joulesched-prometheus"}},
                                    {"name": "data", "emptyDir": {}}],
                    },
                },
            },
            opts=child)
        self.service = k8s.core.v1.Service(
            f"{name}-svc", metadata=_meta("joulesched-prometheus", namespace, labels),
            spec={"selector": {"app.kubernetes.io/name": labels["app.kubernetes.io/name"]},
                  "ports": [{"name": "web", "port": 9090, "targetPort": "web"}]},
            opts=child)
        self.register_outputs({"service": self.service.metadata["name"]})


class Workloads(pulumi.ComponentResource):
    """Blockers and test apps: the Deployments and Services of `workloads.manifests.render`, unchanged."""

    def __init__(self, name: str, *, namespace: str, apps: tuple[str, ...], image_prefix: str, tag: str,
                 scheduler_name: str, images: dict[str, str] | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:cluster:Workloads", name, None, opts)
        from joulesched.workloads.manifests import image_of, render

        child = pulumi.ResourceOptions(parent=self)
        self.deployments: dict[str, k8s.apps.v1.Deployment] = {}
        for app in apps:
            # A full reference per app (``repo/app@sha256:...``) wins over prefix and tag.
            image = (images or {}).get(app) or f"{image_prefix}/{image_of(app)}:{tag}"
            dep, svc = render(app, scheduler_name=scheduler_name, namespace=namespace, image=image)
            self.deployments[app] = k8s.apps.v1.Deployment(f"{name}-{app}", metadata=dep["metadata"],
                                                           spec=dep["spec"], opts=child)
            k8s.core.v1.Service(f"{name}-{app}-svc", metadata=svc["metadata"], spec=svc["spec"], opts=child)
        self.register_outputs({"apps": list(apps)})


DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
SCHEDULER_MANIFESTS = ("rbac.yaml", "power-profiles.yaml", "deployment.yaml", "networkpolicy.yaml")
_CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "Namespace"}


def scheduler_manifests(*, namespace: str, image: str, replicas: int, scheduler_name: str, policy: str,
                        prometheus_url: str | None, extra_args: tuple[str, ...] = ()) -> list[dict]:
    """The live scheduler's manifests from deploy/kubernetes/ (the one source of its RBAC and Deployment),
    moved to `namespace`, with our image, replica count, scheduler name, policy and Prometheus."""
    docs = [d for f in SCHEDULER_MANIFESTS for d in yaml.safe_load_all((DEPLOY / f).read_text()) if d
            # The extender (its account and policy) is not part of this stack.
            and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "extender"]
    overrides = {"--scheduler-name": scheduler_name, "--policy": policy, "--lease-namespace": namespace}
    if prometheus_url:
        overrides["--prometheus"] = prometheus_url
    for d in docs:
        if d["kind"] not in _CLUSTER_SCOPED:
            d["metadata"]["namespace"] = namespace
        for subject in d.get("subjects", []):
            subject["namespace"] = namespace
        for rule in d.get("rules", []):
            if rule.get("resources") == ["leases"] and "resourceNames" in rule:
                rule["resourceNames"] = [scheduler_name]  # the Lease is named after the scheduler
        if d["kind"] == "NetworkPolicy":  # Prometheus runs in the stack's namespace, not in `monitoring`
            for rule in d["spec"].get("ingress", []):
                for peer in rule.get("from", []):
                    labels = peer.get("namespaceSelector", {}).get("matchLabels", {})
                    if labels.get("kubernetes.io/metadata.name") == "monitoring":
                        labels["kubernetes.io/metadata.name"] = namespace
        if d["kind"] == "Deployment":
            d["spec"]["replicas"] = replicas
            c = d["spec"]["template"]["spec"]["containers"][0]
            c["image"] = image
            # This stack deploys no node power controller: a scheduler told that nodes sleep would weigh a
            # sleep saving and a wake delay no node has (deployment.yaml's comment: drop it where none runs).
            args = [a for a in c["args"] if a.split("=", 1)[0] not in (*overrides, "--node-sleep-watts",
                                                                          "--node-wake-s")]
            if not prometheus_url:
                args = [a for a in args if not a.startswith("--prometheus=")]
            c["args"] = args + [f"{k}={v}" for k, v in overrides.items()] + list(extra_args)
    return docs


class Scheduler(pulumi.ComponentResource):
    """`joulesched serve` with its least-privilege RBAC, exactly as deploy/kubernetes/ defines them."""

    def __init__(self, name: str, *, manifests: list[dict], opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:cluster:Scheduler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.resources: dict[tuple[str, str], pulumi.CustomResource] = {}
        for d in manifests:
            kind, meta = d["kind"], d["metadata"]
            rname = f"{name}-{kind.lower()}-{meta['name']}"
            if kind == "ServiceAccount":
                r = k8s.core.v1.ServiceAccount(rname, metadata=meta,
                                               automount_service_account_token=d.get("automountServiceAccountToken"),
                                               opts=child)
            elif kind == "ClusterRole":
                r = k8s.rbac.v1.ClusterRole(rname, metadata=meta, rules=d["rules"], opts=child)
            elif kind == "Role":
                r = k8s.rbac.v1.Role(rname, metadata=meta, rules=d["rules"], opts=child)
            elif kind == "ClusterRoleBinding":
                r = k8s.rbac.v1.ClusterRoleBinding(rname, metadata=meta, role_ref=d["roleRef"],
                                                   subjects=d["subjects"], opts=child)
            elif kind == "RoleBinding":
                r = k8s.rbac.v1.RoleBinding(rname, metadata=meta, role_ref=d["roleRef"], subjects=d["subjects"],
                                            opts=child)
            elif kind == "ConfigMap":
                r = k8s.core.v1.ConfigMap(rname, metadata=meta, data=d["data"], opts=child)
            elif kind == "Deployment":
                r = k8s.apps.v1.Deployment(rname, metadata=meta, spec=d["spec"], opts=child)
            elif kind == "NetworkPolicy":
                r = k8s.networking.v1.NetworkPolicy(rname, metadata=meta, spec=d["spec"], opts=child)
            else:
                raise ValueError(f"unexpected {kind} in deploy/kubernetes")
            self.resources[(kind, meta["name"])] = r
        self.deployment = next(r for (k, _), r in self.resources.items() if k == "Deployment")
        self.register_outputs({"deployment": self.deployment.metadata["name"]})


def pod_security(level: str) -> dict[str, str]:
    """Pod Security Admission labels enforcing ``level`` (and warning and auditing at it)."""
    return {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest",
            "pod-security.kubernetes.io/warn": level, "pod-security.kubernetes.io/audit": level}


class ClusterTarget(pulumi.ComponentResource):
    """Everything joulesched runs on an existing cluster, in one namespace."""

    def __init__(self, name: str, cfg: ClusterConfig, opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:targets:Cluster", name, None, opts)
        provider = k8s.Provider(f"{name}-k8s", context=cfg.kube_context, opts=pulumi.ResourceOptions(parent=self)) \
            if cfg.kube_context else None
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        ns, power_ns = cfg.namespace, cfg.power_namespace
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": ns, "labels": {"app.kubernetes.io/part-of": PART_OF,
                                                          **pod_security("restricted")}},
            opts=child)
        # The exporters need host access (hostPath, uid 0 for energy_uj): only `privileged` admits that, so they
        # get a namespace of their own, where nothing else runs; warn and audit still report against baseline.
        self.power_namespace = k8s.core.v1.Namespace(
            f"{name}-power-ns", metadata={"name": power_ns, "labels": {
                "app.kubernetes.io/part-of": PART_OF, **pod_security("privileged"),
                "pod-security.kubernetes.io/warn": "baseline", "pod-security.kubernetes.io/audit": "baseline"}},
            opts=child)
        after_ns = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.namespace]))
        after_power_ns = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            depends_on=[self.namespace, self.power_namespace]))
        self.power_exporter = PowerExporter(f"{name}-power", namespace=power_ns, cfg=cfg.power_exporter,
                                            prometheus_namespace=ns, opts=after_power_ns)
        self.node_exporter = NodeExporter(f"{name}-node", namespace=power_ns, image=cfg.node_exporter_image,
                                          prometheus_namespace=ns, opts=after_power_ns)
        self.monitoring = None
        if cfg.prometheus != "none":
            self.monitoring = Monitoring(f"{name}-mon", namespace=ns, mode=cfg.prometheus,
                                         image=cfg.prometheus_image, chart_version=cfg.helm_chart_version,
                                         scrape_namespaces=(ns, power_ns), opts=after_power_ns)
        prometheus_url = {"manifests": f"http://joulesched-prometheus.{ns}.svc:9090",
                          "helm": cfg.prometheus_url, "none": cfg.prometheus_url}[cfg.prometheus]
        #: Where the scheduler (and `joulesched pipeline --stack`) reads power from, in-cluster DNS.
        self.prometheus_url = prometheus_url
        self.scheduler = Scheduler(f"{name}-sched", manifests=scheduler_manifests(
            namespace=ns, image=cfg.image, replicas=cfg.scheduler_replicas, scheduler_name=cfg.scheduler_name,
            policy=cfg.scheduler_policy, prometheus_url=prometheus_url, extra_args=cfg.scheduler_extra_args),
            opts=after_ns)
        self.workloads = Workloads(f"{name}-apps", namespace=ns, apps=cfg.apps,
                                   image_prefix=cfg.workload_image_prefix, tag=cfg.workload_tag,
                                   scheduler_name=cfg.scheduler_name, images=dict(cfg.workload_images),
                                   opts=after_ns)
        self.register_outputs({"namespace": self.namespace.metadata["name"]})
