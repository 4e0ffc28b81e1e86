"""kube_node's filter: which of a host's IPv4 networks a pod network CIDR overlaps (Python's ipaddress, no
netaddr: ansible.utils.ipaddr needs a library the hosts may lack)."""

from __future__ import annotations

import ipaddress

from ansible.errors import AnsibleFilterError


def pod_network_clashes(cidr: str, facts: dict) -> list[str]:
    """``iface address/prefix`` of every host network ``cidr`` overlaps (a pod routed there would reach the LAN,
    not the pod). Raises AnsibleFilterError for a CIDR that is no IPv4 network."""
    try:
        pods = ipaddress.IPv4Network(str(cidr), strict=True)
    except ValueError as e:
        raise AnsibleFilterError(f"kube_node_pod_network_cidr {cidr!r} is no IPv4 network: {e}") from None
    out = []
    for iface in facts.get("interfaces", []):
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
