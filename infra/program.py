"""Build the resources of one target from a validated StackConfig; `__main__.py` only reads config and exports."""

from __future__ import annotations

import pulumi

from joulesched.infra.cloudinit import ADMIN_USER
from joulesched.infra.config import StackConfig
from joulesched.workloads.manifests import PORT as WORKLOAD_PORT


def _ssh_hosts(addresses: dict[str, str]) -> list[dict]:
    """``hostname -> "ADDR[:PORT]"`` as the ``hosts`` output: SSH targets for the pipeline's host-side steps."""
    hosts = []
    for name, addr in addresses.items():
        host, _, port = addr.rpartition(":") if ":" in addr else (addr, "", "22")
        hosts.append({"name": name, "address": host, "port": int(port), "user": ADMIN_USER})
    return hosts


def build(cfg: StackConfig) -> dict[str, pulumi.Input]:
    """Create the target's ComponentResource; return the stack outputs."""
    if cfg.target == "cluster":
        from joulesched.infra.k8s import ClusterTarget

        t = ClusterTarget(cfg.name_prefix, cfg.cluster)
        outputs = {"namespace": t.namespace.metadata["name"], "scheduler": t.scheduler.deployment.metadata["name"],
                   "power_exporter": t.power_exporter.daemonset.metadata["name"]}
        # What `joulesched pipeline --stack` reads (infra/stack.py). The URLs are in-cluster DNS names: they
        # resolve for a pipeline running in the cluster; from a workstation, --prometheus/--target override them.
        if t.prometheus_url:
            outputs["prometheus_url"] = t.prometheus_url
        if "testapp" in cfg.cluster.apps:
            outputs["target_url"] = f"http://testapp.{cfg.cluster.namespace}.svc:{WORKLOAD_PORT}/work?ms=20"
        if cfg.cluster.kube_context:
            outputs["kube_context"] = cfg.cluster.kube_context
        return outputs
    if cfg.target == "kvm":
        from joulesched.infra.kvm import KvmTarget

        k = KvmTarget(cfg.name_prefix, cfg.name_prefix, cfg.kvm)
        return {"guests": k.addresses, "ca_cert_hash": k.ca_cert_hash, "hosts": _ssh_hosts(k.addresses),
                "power_addresses": k.power_addresses}
    if cfg.target == "aws":
        from joulesched.infra.aws import AwsTarget

        a = AwsTarget(cfg.name_prefix, cfg.name_prefix, cfg.aws)
        return {"master_public_ip": a.master.public_ip, "worker_private_ips": [w.private_ip for w in a.workers]}
    raise ValueError(f"unknown target {cfg.target!r}")
