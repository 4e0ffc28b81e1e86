"""The `aws` target: EC2 instances running the same kubeadm cloud-init as the kvm guests.

Workers get the master's private IP through an Output, so their user-data is rendered after the master exists.
SSH is open only to `sshCidr` (never 0.0.0.0/0); the API server and node traffic only inside the group.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from joulesched.infra.cloudinit import render_kube_node
from joulesched.infra.config import AwsConfig
from joulesched.infra.pki import KubeadmPki as PkiValues


class AwsTarget(pulumi.ComponentResource):
    def __init__(self, name: str, prefix: str, cfg: AwsConfig, opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:targets:Aws", name, None, opts)
        from joulesched.infra.dynamic import KubeadmPki

        child = pulumi.ResourceOptions(parent=self)
        self.pki = KubeadmPki(f"{name}-pki", common_name=f"{prefix}-kubernetes", opts=child)
        self.key_pair = aws.ec2.KeyPair(f"{name}-key", key_name=f"{prefix}-key", public_key=cfg.ssh_public_key,
                                        opts=child)
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg", description="joulesched kubeadm nodes",
            ingress=[
                {"protocol": "tcp", "from_port": 22, "to_port": 22, "cidr_blocks": [cfg.ssh_cidr],
                 "description": "SSH from the operator"},
                {"protocol": "-1", "from_port": 0, "to_port": 0, "self": True,
                 "description": "node to node (API server, kubelet, CNI)"},
            ],
            egress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": ["0.0.0.0/0"],
                     "description": "packages and images"}],
            tags={"app.kubernetes.io/part-of": "joulesched"},
            opts=child)
        pki = pulumi.Output.all(self.pki.ca_cert_pem, self.pki.ca_key_pem, self.pki.ca_cert_hash, self.pki.token)

        def instance(host: str, user_data: pulumi.Input[str]) -> aws.ec2.Instance:
            return aws.ec2.Instance(
                f"{name}-{host}", ami=cfg.ami, instance_type=cfg.instance_type, key_name=self.key_pair.key_name,
                vpc_security_group_ids=[self.security_group.id], user_data=user_data,
                user_data_replace_on_change=True,
                metadata_options={"http_tokens": "required"},  # IMDSv2 only
                root_block_device={"volume_size": 30, "encrypted": True},
                tags={"Name": host, "joulesched/role": "master" if host.endswith("master") else "worker"},
                opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["user_data"]))

        master_host = f"{prefix}-master"
        self.master = instance(master_host, pki.apply(lambda v: render_kube_node(
            role="master", hostname=master_host, ssh_authorized_keys=[cfg.ssh_public_key], kubeadm=cfg.kubeadm,
            token=PkiValues(*v).token, ca_cert_pem=v[0], ca_key_pem=v[1])))
        self.workers = []
        for i in range(cfg.workers):
            host = f"{prefix}-worker-{i}"
            ud = pulumi.Output.all(pki, self.master.private_ip).apply(lambda a, host=host: render_kube_node(
                role="worker", hostname=host, ssh_authorized_keys=[cfg.ssh_public_key], kubeadm=cfg.kubeadm,
                token=PkiValues(*a[0]).token, ca_cert_pem=a[0][0], ca_cert_hash=a[0][2], master_address=a[1]))
            self.workers.append(instance(host, ud))
        self.register_outputs({"master_public_ip": self.master.public_ip})
