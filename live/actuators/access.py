"""Who decides where power is switched: the operator.

The address map (``--addresses``, a ConfigMap the operator's inventory writes) is authoritative: its entry for
a node is used as given. A node's own annotation ``joulesched.io/power`` (which its kubelet can write:
NodeRestriction does not cover annotations) is used only where the operator's policy allows every endpoint it
names; by default nothing is allowed, so an annotated target nobody listed is never contacted (no TCP
connection, no UDP packet).

Per scheme (``--allow-annotated SCHEME=PATTERN``, repeatable):

========== ====================================================================================================
redfish    BMC hosts: ``HOST``, ``HOST:PORT`` or a CIDR (``10.0.9.0/24``)
ipmi       BMC hosts, as for redfish
wol        the SSH host that runs the suspend *and* the broadcast address of the packet (default 255.255.255.255)
aws        instance ids, or ``*``; and always the node's immutable ``spec.providerID`` must name the same instance
libvirt    domain names, or ``*``; and always the domain must be the node's own name
metal3     namespaces of BareMetalHosts, or ``*``; and always the host must carry the node's own name
rufio      namespaces of Rufio Machines, or ``*``; and always the Machine must carry the node's own name
========== ====================================================================================================

Whatever the source: ``redfish+http`` (a BMC login over plain HTTP) only with ``allow_redfish_http``; an
``aws://`` address must match ``spec.providerID`` where the node has one; and one machine belongs to one node:
an annotation naming a machine the map gives another node, or one that two nodes claim, is refused, however
it is spelled (:func:`machine_keys`: case, IP notation, default ports, trailing slashes; a Wake-on-LAN
machine is also the SSH endpoint that suspends it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from joulesched.core.errors import UsageError
from joulesched.live.actuators.base import AddressError, PowerAddress, parse_address, split_host

ALLOW_SCHEMES = ("redfish", "ipmi", "wol", "aws", "libvirt", "metal3", "rufio")
DEFAULT_BROADCAST = "255.255.255.255"


class AccessError(UsageError):
    """A bad ``--allow-annotated`` pattern or a map entry the policy refuses."""


def host_matches(hostport: str, pattern: str) -> bool:
    """``hostport`` (HOST[:PORT]) against one allow-list entry: a CIDR, an IP or name (any port), or an exact
    HOST:PORT. Names compare case-insensitively; no name is resolved (DNS is not the operator's word)."""
    host, port = split_host(hostport)
    phost, pport = split_host(pattern)
    if "/" in pattern:
        try:
            return ipaddress.ip_address(host) in ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            return False
    if pport and pport != port:
        return False
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(phost)
    except ValueError:
        return host.lower() == phost.lower()


def endpoints(addr: PowerAddress, node: str) -> list[str]:
    """Every network endpoint (HOST[:PORT]) an actuator would contact for ``addr``."""
    if addr.actuator in ("redfish", "ipmi"):
        return [addr.host]
    if addr.actuator == "wol":
        return [addr.params.get("ssh") or node, addr.params.get("broadcast") or DEFAULT_BROADCAST]
    return []


def instance_of(provider_id: str) -> str:
    """The EC2 instance id in ``aws:///us-east-1a/i-0abc...`` ("" for any other provider)."""
    return provider_id.rsplit("/", 1)[-1] if provider_id.startswith("aws://") else ""


#: The port an endpoint has when none is written.
DEFAULT_PORTS = {"ipmi": "623", "redfish": "443", "redfish+http": "80", "ssh": "22"}


def _endpoint(hostport: str, default_port: str) -> str:
    """An endpoint as an identity, spelling aside: lower case, no trailing dot, an IP in its canonical form
    (an IPv4-mapped IPv6 address as the IPv4), the default port written out."""
    host, port = split_host(hostport)
    host = host.rstrip(".").lower()
    try:
        ip = ipaddress.ip_address(host)
        host = str(getattr(ip, "ipv4_mapped", None) or ip)
    except ValueError:
        pass
    return f"{host}:{port or default_port}"


def machine_keys(addr: PowerAddress, node: str) -> tuple[tuple[str, str], ...]:
    """What identifies the machine an address switches (two nodes must never share one), however it is
    written (case, IP notation, a default port written out or not, a trailing slash): a BMC endpoint (and
    Redfish system), Wake-on-LAN's MAC *and* the SSH endpoint that runs the suspend (the machine switched off),
    a libvirt domain, an instance, a Kubernetes object. Ports that differ are different machines (VirtualBMC
    serves one VM per port, a gateway forwards one SSH port per machine)."""
    if addr.actuator == "ipmi":
        return (("ipmi", _endpoint(addr.host, DEFAULT_PORTS["ipmi"])),)
    if addr.actuator == "redfish":
        # The BMC's host and the system's path, whatever port or scheme: one BMC serves a system over HTTPS and
        # plain HTTP alike (a review: redfish+http:// to the map's redfish:// system was another machine).
        path = "/".join(p for p in addr.path.lower().split("/") if p)
        return (("redfish", f"{bmc_host(addr)}/{path}"),)
    if addr.actuator == "wol":
        mac = "".join(c for c in addr.host.lower() if c in "0123456789abcdef")
        return ("wol", mac), ("ssh", _endpoint(addr.params.get("ssh") or node, DEFAULT_PORTS["ssh"]))
    if addr.actuator == "libvirt":
        return (("libvirt", addr.path),)
    if addr.actuator == "aws":
        return (("aws", addr.host),)
    if addr.actuator in ("metal3", "rufio"):
        return ((addr.actuator, f"{addr.host.lower()}/{addr.path}"),)
    if addr.actuator == "none":
        return ()  # cordon only: no machine is ever switched
    return ((addr.scheme, addr.raw),)


def bmc_host(addr: PowerAddress) -> str | None:
    """The BMC's host (canonical, no port) of an IPMI or Redfish address, else None. One BMC serves IPMI and
    Redfish (on several ports) for one machine: the same host under two protocols is one machine."""
    if addr.actuator not in ("ipmi", "redfish"):
        return None
    return _endpoint(addr.host, "0").rsplit(":", 1)[0]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def protocol_clash(entries: Mapping[str, PowerAddress]) -> tuple[str, str, str] | None:
    """Two nodes whose addresses reach one BMC host by different protocols (IPMI and Redfish), as (node, other
    node, host); else None. Applied where a node's own annotation is involved: a real BMC serves both protocols
    for one machine, so an annotation may not reach the map's BMC by the other one. The operator's map may (a
    hypervisor serving VirtualBMC for some guests and sushy-tools for others), as may one protocol on one host
    (VirtualBMC serves a VM per port, sushy-tools a system per path)."""
    seen: dict[str, dict[str, str]] = {}
    for name, a in entries.items():
        host = bmc_host(a)
        if host is None:
            continue
        by_protocol = seen.setdefault(host, {})
        for protocol, other in by_protocol.items():
            if protocol != a.actuator and other != name:
                return name, other, host
        by_protocol.setdefault(a.actuator, name)
    return None


@dataclass(frozen=True)
class Resolved:
    """A node's power address and where it came from (``map`` or ``annotation``); ``address`` None with
    ``refused`` saying why when the node has none that may be used."""

    address: PowerAddress | None
    source: str = ""
    refused: str = ""


@dataclass
class AddressPolicy:
    """The operator's rules for power addresses (see the module docstring)."""

    allow: dict[str, tuple[str, ...]] = field(default_factory=dict)
    allow_redfish_http: bool = False

    @classmethod
    def from_options(cls, patterns: Iterable[str] = (), allow_redfish_http: bool = False) -> "AddressPolicy":
        """From ``SCHEME=PATTERN`` strings; a malformed one raises :class:`AccessError` naming it."""
        allow: dict[str, list[str]] = {}
        for text in patterns:
            scheme, sep, pat = str(text).partition("=")
            scheme, pat = scheme.strip(), pat.strip()
            if not sep or scheme not in ALLOW_SCHEMES or not pat:
                raise AccessError(f"--allow-annotated {text!r}: expected SCHEME=PATTERN with SCHEME one of "
                                  f"{', '.join(ALLOW_SCHEMES)}")
            if "/" in pat and scheme in ("redfish", "ipmi", "wol"):
                try:
                    ipaddress.ip_network(pat, strict=False)
                except ValueError:
                    raise AccessError(f"--allow-annotated {text!r}: {pat!r} is not a CIDR") from None
            allow.setdefault(scheme, []).append(pat)
        return cls({k: tuple(v) for k, v in allow.items()}, allow_redfish_http)

    def check_map_entry(self, node: str, addr: PowerAddress) -> None:
        """What no map entry may do either (raises :class:`AccessError`)."""
        if addr.scheme == "redfish+http" and not self.allow_redfish_http:
            raise AccessError(f"node {node}: redfish+http sends the BMC login unencrypted; use redfish:// "
                              "(HTTPS) or pass --allow-redfish-http")

    def _annotation_refusal(self, node: str, addr: PowerAddress, provider_id: str) -> str:
        pats = self.allow.get(addr.actuator, ())
        if addr.scheme == "none":
            return ""
        if addr.scheme == "redfish+http" and not self.allow_redfish_http:
            return "redfish+http is not allowed (--allow-redfish-http)"
        if addr.actuator == "aws":
            if instance_of(provider_id) != addr.host:
                return "its instance is not the one in the node's spec.providerID"
            return "" if "*" in pats or addr.host in pats else "the instance is not in the aws allow-list"
        if addr.actuator == "libvirt":
            if addr.path != node:
                return "a libvirt domain must be the node's own name (or come from the address map)"
            return "" if "*" in pats or addr.path in pats else "the domain is not in the libvirt allow-list"
        if addr.actuator in ("metal3", "rufio"):  # an object of the BMC's owner, in a namespace
            if addr.path != node:
                return f"a {addr.actuator} object must carry the node's own name (or come from the address map)"
            return "" if "*" in pats or addr.host in pats else f"the namespace is not in the {addr.actuator} allow-list"
        if addr.actuator == "wol" and "user" in addr.params:
            return ("an annotation may not choose the SSH user (the operator's key logs in as it): give user= in "
                    "the address map")
        for ep in endpoints(addr, node):
            if not any(host_matches(ep, p) for p in pats):
                return f"{ep} is not in the {addr.actuator} allow-list"
        return ""

    def resolve_all(self, nodes: Mapping[str, tuple[str, str]], addresses: Mapping[str, str]) -> dict[str, Resolved]:
        """``nodes``: name -> (annotation text, spec.providerID); ``addresses``: the map. The map wins; an
        annotation is used only when allowed and when no other node claims its machine."""
        out: dict[str, Resolved] = {}
        claims: dict[tuple[str, str], list[str]] = {}
        mapped: dict[tuple[str, str], str] = {}
        clash: dict[str, str] = {}
        parsed: dict[str, PowerAddress] = {}
        annotated: dict[str, PowerAddress] = {}
        for name, text in addresses.items():
            try:
                a = parse_address(text)
            except ValueError as e:  # AddressError, or anything a parser below it let through: this node only
                out[name] = Resolved(None, "map", str(e) if isinstance(e, AddressError) else "cannot be parsed")
                continue
            for key in machine_keys(a, name):
                other = mapped.setdefault(key, name)
                if other != name:  # two entries switch one machine: an idle node would switch off the other's
                    clash[name], clash[other] = other, name
            parsed[name] = a
        for name, other in clash.items():
            parsed.pop(name, None)
            out[name] = Resolved(None, "map", f"its address names the same machine as node {other}'s: neither is used")
        map_bmcs: dict[str, dict[str, str]] = {}  # BMC host -> protocol -> a mapped node reaching it so
        for name, a in parsed.items():
            if (host := bmc_host(a)) is not None:
                map_bmcs.setdefault(host, {}).setdefault(a.actuator, name)

        for name, (text, provider_id) in nodes.items():
            if name in parsed:
                a = parsed[name]
                if a.actuator == "aws" and provider_id and instance_of(provider_id) != a.host:
                    out[name] = Resolved(None, "map", "its instance is not the one in the node's spec.providerID")
                elif a.scheme == "redfish+http" and not self.allow_redfish_http:
                    out[name] = Resolved(None, "map", "redfish+http is not allowed (--allow-redfish-http)")
                else:
                    out[name] = Resolved(a, "map")
                continue
            if name in out or not text:
                continue
            try:
                a = parse_address(text)
            except ValueError as e:
                out[name] = Resolved(None, "annotation", str(e) if isinstance(e, AddressError) else "cannot be parsed")
                continue
            why = self._annotation_refusal(name, a, provider_id)
            keys = machine_keys(a, name)
            owner = next((mapped[k] for k in keys if mapped.get(k, name) != name), None)
            if owner is None and (host := bmc_host(a)) is not None:
                # the map's BMC reached by the other protocol (a review: ipmi:// to a BMC the map reaches by
                # redfish:// switched the map's node off)
                owner = next((n for proto, n in map_bmcs.get(host, {}).items()
                              if proto != a.actuator and n != name), None)
            if not why and owner is not None:
                why = f"the address map gives that machine to node {owner}"
            if why:
                out[name] = Resolved(None, "annotation", why)
                continue
            for key in keys:
                claims.setdefault(key, []).append(name)
            annotated[name] = a
            out[name] = Resolved(a, "annotation")
        # One BMC named by its address here and by its host name there is one machine under two keys, which no
        # claim check can see (names are not resolved). Where BMCs are named both ways, an annotated BMC might be
        # another node's (a review: a worker's annotation reached the map's bmc-x.example by its IP): refused.
        # The map's way wins: an annotation named the other way is refused (all, where the map names BMCs both
        # ways, or where there is no map entry and the annotations do).
        map_kinds = {_is_ip(h) for h in map_bmcs}
        ann_kinds = {_is_ip(h) for a in annotated.values() if (h := bmc_host(a)) is not None}
        for n, a in list(annotated.items()):
            if (h := bmc_host(a)) is None:
                continue
            if (len(map_kinds) > 1 or (map_kinds and _is_ip(h) not in map_kinds)
                    or (not map_kinds and len(ann_kinds) > 1)):
                annotated.pop(n)
                out[n] = Resolved(None, "annotation", "BMCs are named both by IP address and by host name (in the "
                                  "address map or annotations): this one might be another node's under its other "
                                  "name; name them all as the map does")
        while (found := protocol_clash(annotated)) is not None:  # two annotations: one BMC by two protocols
            claims.setdefault(("bmc", found[2]), []).extend(found[:2])
            for n in found[:2]:
                annotated.pop(n, None)
        for key, names in claims.items():
            if len(set(names)) > 1:
                for n in names:
                    out[n] = Resolved(None, "annotation", f"nodes {', '.join(sorted(set(names)))} claim the same "
                                      "machine")
        return out
