"""The `kvm` target: a kubeadm master and workers as libvirt guests, each with a NoCloud seed from our templates.

`plan_guests` is plain Python (addresses, names, rendered cloud-init) shared with `joulesched infra kvm up`;
`KvmTarget` wraps each planned guest in a `LibvirtGuest` dynamic resource.

No private key goes into a seed: the master's `kubeadm init` makes the cluster CA, and the master prints the
CA's public hash on its serial console. The master's guest resource waits for that line, and the workers'
seeds are rendered from it (`kubeadm join --discovery-token-ca-cert-hash`), so they pin the real CA.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi

from joulesched.infra.cloudinit import render_kube_node, render_meta_data, render_network_config
from joulesched.infra.config import KvmConfig
from joulesched.infra.libvirt_guests import GuestSpec

#: How long the master may take to boot, install kubeadm and print its CA hash (TCG guests are slow).
CA_HASH_TIMEOUT_S = 1800


@dataclass(frozen=True)
class PlannedGuest:
    role: str
    hostname: str
    address: str  # the guest's IP on a libvirt network; "" with user-mode networking
    ssh_port: int  # forwarded 127.0.0.1 port with user-mode networking; 0 otherwise


def plan(prefix: str, cfg: KvmConfig) -> list[PlannedGuest]:
    names = [("master", f"{prefix}-master")] + [("worker", f"{prefix}-worker-{i}") for i in range(cfg.workers)]
    out = []
    net = None if cfg.network == "user" else ipaddress.ip_network(cfg.subnet)
    for i, (role, host) in enumerate(names):
        address = str(net[cfg.first_host + i]) if net is not None else ""
        out.append(PlannedGuest(role, host, address, cfg.ssh_port_base + i if cfg.network == "user" else 0))
    return out


def guest_spec(prefix: str, cfg: KvmConfig, g: PlannedGuest, master: PlannedGuest, token: str,
               ca_cert_hash: str = "") -> GuestSpec:
    """The full GuestSpec of one planned guest, its cloud-init rendered from infra/cloud-init/. A worker needs
    the hash the master printed (:func:`joulesched.infra.cloudinit.wait_for_ca_hash`)."""
    user_data = render_kube_node(
        role=g.role, hostname=g.hostname, ssh_authorized_keys=[cfg.ssh_public_key], kubeadm=cfg.kubeadm,
        token=token, ca_cert_hash=ca_cert_hash if g.role == "worker" else "",
        # No fallback for user-mode networking: there every guest is 10.0.2.15, so its config takes no worker
        # (infra.config refuses one), and a worker without the master's address is refused by the renderer.
        master_address=master.address, advertise_address=g.address if g.role == "master" else "")
    network_config = ""
    if g.address:
        net = ipaddress.ip_network(cfg.subnet)
        network_config = render_network_config(address=f"{g.address}/{net.prefixlen}", gateway=str(net[1]),
                                               dns=str(net[1]))
    return GuestSpec(
        name=g.hostname, uri=cfg.uri, base_image=cfg.base_image, pool_dir=cfg.pool_dir, user_data=user_data,
        meta_data=render_meta_data(hostname=g.hostname, user_data=user_data), network_config=network_config,
        virt_type=cfg.virt_type, memory_mib=cfg.memory_mib, vcpus=cfg.vcpus, disk_gib=cfg.disk_gib,
        network=cfg.network, ssh_port=g.ssh_port, kernel=cfg.kernel or "", initrd=cfg.initrd or "",
        kernel_cmdline=cfg.kernel_cmdline)


def power_addresses(planned: list[PlannedGuest]) -> dict[str, str]:
    """``worker -> libvirt:///DOMAIN``: a guest's domain is named after its hostname, which is its node name. The
    stack exports it; as the node power controller's address map (``--addresses``) it annotates each node. The
    master has none: a control plane is never put to sleep, and a map without it cannot switch it whatever its
    labels say."""
    return {g.hostname: f"libvirt:///{g.hostname}" for g in planned if g.role != "master"}


class KvmTarget(pulumi.ComponentResource):
    """A kubeadm cluster of libvirt guests: one master, `workers` workers."""

    def __init__(self, name: str, prefix: str, cfg: KvmConfig, opts: pulumi.ResourceOptions | None = None):
        super().__init__("joulesched:targets:Kvm", name, None, opts)
        from joulesched.infra.dynamic import KubeadmPki, LibvirtGuest

        child = pulumi.ResourceOptions(parent=self)
        # The bootstrap token only: the CA is made on the master (see the module docstring).
        self.pki = KubeadmPki(f"{name}-pki", common_name=f"{prefix}-kubernetes", with_ca=False, opts=child)
        planned = plan(prefix, cfg)
        master = planned[0]
        self.guests: dict[str, LibvirtGuest] = {}
        for g in planned:
            if g.role == "master":
                spec = self.pki.token.apply(lambda t, g=g: guest_spec(prefix, cfg, g, master, t).to_dict())
                deps, wait = [], CA_HASH_TIMEOUT_S
            else:
                m = self.guests[master.hostname]
                spec = pulumi.Output.all(self.pki.token, m.ca_cert_hash).apply(
                    lambda v, g=g: guest_spec(prefix, cfg, g, master, v[0], v[1]).to_dict())
                deps, wait = [m], 0
            self.guests[g.hostname] = LibvirtGuest(
                f"{name}-{g.hostname}", {k: spec[k] for k in GuestSpec.__dataclass_fields__}, wait_ca_hash_s=wait,
                opts=pulumi.ResourceOptions(parent=self, depends_on=deps,
                                            additional_secret_outputs=["user_data"]))
        #: The CA pin, as the master printed it.
        self.ca_cert_hash = self.guests[master.hostname].ca_cert_hash
        self.addresses = {g.hostname: (g.address or f"127.0.0.1:{g.ssh_port}") for g in planned}
        #: Each node's power address for the node power controller (docs/node-power.md): its libvirt domain.
        self.power_addresses = power_addresses(planned)
        self.register_outputs({"guests": self.addresses, "power_addresses": self.power_addresses})
