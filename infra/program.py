"""Build the resources of one target from a validated StackConfig; `__main__.py` only reads config and exports."""

from __future__ import annotations

import pulumi

from infra.config import StackConfig


def build(cfg: StackConfig) -> dict[str, pulumi.Input]:
    """Create the target's ComponentResource; return the stack outputs."""
    if cfg.target == "cluster":
        from infra.k8s import ClusterTarget

        t = ClusterTarget(cfg.name_prefix, cfg.cluster)
        return {"namespace": t.namespace.metadata["name"], "scheduler": t.scheduler.deployment.metadata["name"],
                "power_exporter": t.power_exporter.daemonset.metadata["name"]}
    if cfg.target == "kvm":
        from infra.kvm import KvmTarget

        k = KvmTarget(cfg.name_prefix, cfg.name_prefix, cfg.kvm)
        return {"guests": k.addresses, "ca_cert_hash": k.pki.ca_cert_hash}
    if cfg.target == "aws":
        from infra.aws import AwsTarget

        a = AwsTarget(cfg.name_prefix, cfg.name_prefix, cfg.aws)
        return {"master_public_ip": a.master.public_ip, "worker_private_ips": [w.private_ip for w in a.workers]}
    raise ValueError(f"unknown target {cfg.target!r}")
