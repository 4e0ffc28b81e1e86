"""The `aws` target: EC2 instances running the same kubeadm cloud-init as the kvm guests.

Workers get the master's private IP through an Output, so their user-data is rendered after the master exists.
SSH is open only to `sshCidr` (never 0.0.0.0/0); the API server and node traffic only inside the group.

The cluster CA is made here (so workers can pin its hash from the start), but its private key never goes into
user-data, which anyone with ``ec2:DescribeInstanceAttribute`` and any process reaching the metadata service
can read: it is an SSM SecureString that only the master's instance role may read (``ssm:GetParameter`` on that
one parameter), fetched by the master before ``kubeadm init`` (infra/cloud-init/fetch-ca-key.py). The metadata
service is IMDSv2 only, with a hop limit of 1, so containers behind a bridge cannot reach it.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from joulesched.infra.cloudinit import render_kube_node
from joulesched.infra.config import AwsConfig, InfraConfigError

#: IMDSv2 only (a token from a PUT), and the PUT's answer travels one hop: not through a container's bridge.
METADATA_OPTIONS = {"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 1}


def ca_key_parameter_name(prefix: str, stack: str) -> str:
    """The SSM name of the CA key: per stack, not only per namePrefix (SSM names are unique in an account and
    region, and two stacks with one namePrefix there would write, and delete, each other's key). Pulumi stack
    names (letters, digits, -, _ and .) are valid in an SSM name."""
    return f"/{prefix}/{stack}/kubeadm/ca-key"


def master_policy(parameter_arn: str, region: str) -> str:
    """The master role's only permission: read (and decrypt) the one CA key parameter."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadTheClusterCaKey", "Effect": "Allow", "Action": ["ssm:GetParameter"],
         "Resource": parameter_arn},
        {"Sid": "DecryptItThroughSsmOnly", "Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": "*",
         "Condition": {"StringEquals": {"kms:ViaService": f"ssm.{region}.amazonaws.com"}}},
    ]})


class AwsTarget(pulumi.ComponentResource):
    def __init__(self, name: str, prefix: str, cfg: AwsConfig, opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:targets:Aws", name, None, opts)
        from joulesched.infra.dynamic import KubeadmPki

        child = pulumi.ResourceOptions(parent=self)
        region = pulumi.Config("aws").get("region")
        if not region:
            raise InfraConfigError(["aws:region is required: pulumi config set aws:region eu-central-1"])
        self.pki = KubeadmPki(f"{name}-pki", common_name=f"{prefix}-kubernetes", opts=child)
        tags = {"app.kubernetes.io/part-of": "joulesched"}
        parameter = ca_key_parameter_name(prefix, pulumi.get_stack())
        # The master role's policy names this parameter's ARN (below), so it follows the name.
        self.ca_key = aws.ssm.Parameter(
            f"{name}-ca-key", name=parameter, type="SecureString", value=self.pki.ca_key_pem,
            description="joulesched kubeadm cluster CA key (read by the master's instance role only)", tags=tags,
            opts=child)
        self.master_role = aws.iam.Role(
            f"{name}-master-role", description="joulesched kubeadm master: reads the cluster CA key, nothing else",
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            tags=tags, opts=child)
        self.master_role_policy = aws.iam.RolePolicy(
            f"{name}-master-ca-key", role=self.master_role.id,
            policy=self.ca_key.arn.apply(lambda arn: master_policy(arn, region)), opts=child)
        self.master_profile = aws.iam.InstanceProfile(f"{name}-master-profile", role=self.master_role.name,
                                                      opts=child)
        # A name AWS completes (prefix + suffix): a new key replaces the old before it is deleted without a name
        # clash, and two stacks with one namePrefix in an account do not collide.
        self.key_pair = aws.ec2.KeyPair(f"{name}-key", key_name_prefix=f"{prefix}-key-",
                                        public_key=cfg.ssh_public_key, tags=tags, opts=child)
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
        # Only public values and the token go into user-data: never ca_key_pem.
        pki = pulumi.Output.all(self.pki.ca_cert_pem, self.pki.ca_cert_hash, self.pki.token)

        def instance(host: str, user_data: pulumi.Input[str], profile=None, deps=()) -> aws.ec2.Instance:
            return aws.ec2.Instance(
                f"{name}-{host}", ami=cfg.ami, instance_type=cfg.instance_type, key_name=self.key_pair.key_name,
                vpc_security_group_ids=[self.security_group.id], user_data=user_data,
                user_data_replace_on_change=True, iam_instance_profile=profile,
                metadata_options=METADATA_OPTIONS,
                root_block_device={"volume_size": 30, "encrypted": True},
                tags={"Name": host, "joulesched/role": "master" if host.endswith("master") else "worker"},
                opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["user_data"],
                                            depends_on=list(deps)))

        master_host = f"{prefix}-master"
        self.master = instance(master_host, pki.apply(lambda v: render_kube_node(
            role="master", hostname=master_host, ssh_authorized_keys=[cfg.ssh_public_key], kubeadm=cfg.kubeadm,
            token=v[2], ca_cert_pem=v[0], ca_key_parameter=parameter, aws_region=region)),
            # an instance profile's id is its name; the role's permission before the master that uses it (nothing
            # else orders the policy before the instance, whose first boot reads the key with it)
            profile=self.master_profile.id, deps=[self.ca_key, self.master_role_policy])
        self.workers = []
        for i in range(cfg.workers):
            host = f"{prefix}-worker-{i}"
            ud = pulumi.Output.all(pki, self.master.private_ip).apply(lambda a, host=host: render_kube_node(
                role="worker", hostname=host, ssh_authorized_keys=[cfg.ssh_public_key], kubeadm=cfg.kubeadm,
                token=a[0][2], ca_cert_hash=a[0][1], master_address=a[1]))
            self.workers.append(instance(host, ud))
        self.register_outputs({"master_public_ip": self.master.public_ip})
