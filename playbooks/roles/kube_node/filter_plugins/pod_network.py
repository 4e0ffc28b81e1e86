"""kube_node's filter: which of a host's IPv4 networks a pod network CIDR overlaps (Python's ipaddress, no
netaddr: ansible.utils.ipaddr needs a library the hosts may lack)."""

from __future__ import annotations

import ipaddress

from ansible.errors import AnsibleFilterError


#: Interfaces the cluster's own networking makes (a node already set up has them inside the pod network).
CNI_PREFIXES = ("cni", "flannel", "cali", "tunl", "vxlan", "cilium", "weave", "kube-", "veth", "lxc")


def pod_network_clashes(cidr: str, facts: dict) -> list[str]:
    """``iface address/prefix`` of every host network ``cidr`` overlaps (a pod routed there would reach the LAN,
    not the pod); a dual-stack ``v4,v6`` CIDR is checked on its IPv4 part, and the CNI's own interfaces are left
    out (a re-run on a set-up node found flannel's cni0 there). Raises AnsibleFilterError for a CIDR with no
    IPv4 network."""
    parts = [p.strip() for p in str(cidr).split(",") if p.strip()]
    try:
        nets = [ipaddress.ip_network(p, strict=True) for p in parts]
    except ValueError as e:
        raise AnsibleFilterError(f"kube_node_pod_network_cidr {cidr!r} is no network: {e}") from None
    v4 = [n for n in nets if n.version == 4]
    if not v4:
        raise AnsibleFilterError(f"kube_node_pod_network_cidr {cidr!r} is no IPv4 network")
    pods = v4[0]
    out = []
    for iface in facts.get("interfaces", []):
        if str(iface).startswith(CNI_PREFIXES):
            continue
        nic = facts.get(str(iface).replace("-", "_"), {}) or {}
        for addr in [nic.get("ipv4") or {}] + list(nic.get("ipv4_secondaries") or []):
            if not addr.get("address") or not addr.get("netmask"):
                continue
            net = ipaddress.IPv4Network(f"{addr['address']}/{addr['netmask']}", strict=False)
            if net.overlaps(pods) and not net.is_loopback:
                out.append(f"{iface} {addr['address']}/{net.prefixlen}")
    return out


class FilterModule:
    def filters(self):
        return {"pod_network_clashes": pod_network_clashes}
