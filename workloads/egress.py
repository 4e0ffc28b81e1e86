"""Where a network blocker may send its stream: an allow-list of hosts, checked at /start and again at connect.

An unauthenticated ``POST /start`` names ``net_target``, so without a limit anyone who reaches a blocker could
point up to 100 Gbit/s for an hour at any address, the cloud metadata service included. Two checks:

1. **At /start**, the URL's host must match the allow-list (:data:`DEFAULT_ALLOW`: loopback and in-cluster
   service names). A pattern is an IP network (``10.0.0.0/8``, ``::1``), an exact host name (``sink``) or a
   suffix (``*.svc``, which matches ``a.svc`` and ``a.b.svc``, not ``svc``). Names match case-insensitively,
   without a trailing dot. IP literals must fall in an allowed network; names must match a name pattern.
2. **At every connect**, the name is resolved once and the stream goes to that address only if no resolved
   address is link-local (169.254.0.0/16 and fe80::/10, where every cloud's metadata service lives),
   unspecified, multicast or broadcast, or the AWS IPv6 metadata address: so a permitted name that resolves
   (or is re-pointed by DNS) to the metadata service is still refused. These are never allowed, whatever the
   list says.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from urllib.parse import SplitResult, urlsplit

import psutil

from joulesched.core.errors import UsageError
from joulesched.core.net import url_port
from joulesched.core.names import is_host_name

#: Loopback, and Kubernetes service names (``svc.ns.svc`` and ``svc.ns.svc.cluster.local``).
DEFAULT_ALLOW = ("127.0.0.0/8", "::1/128", "localhost", "*.svc", "*.svc.cluster.local")
#: Never a stream target: metadata services, "this host", multicast, broadcast.
DENIED = tuple(ipaddress.ip_network(n) for n in (
    "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "::/128", "224.0.0.0/4", "ff00::/8", "255.255.255.255/32",
    "fd00:ec2::254/128"))

Resolver = Callable[[str, int], list[str]]

def _is_hostname(name: str) -> bool:
    # '_' inside a label too: Docker Compose service names and SRV-style names, which resolvers look up.
    return is_host_name(name, underscore=True)


class EgressError(UsageError):
    """A stream target the allow-list (or the hard deny list) refuses; the message says which rule."""


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def denied(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return any(ip in net for net in DENIED if net.version == ip.version)


def _port(parts: SplitResult) -> int:
    """The URL's port (the scheme's default when none is given); EgressError for one outside 1..65535."""
    try:
        port = url_port(parts)
    except ValueError as e:
        raise EgressError(f"net_target {parts.geturl()!r}: {e}") from None
    return port or (443 if parts.scheme == "https" else 80)


def local_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """This host's interface addresses: where a server bound to 0.0.0.0 or :: answers."""
    found = {_ip(a.address) for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family in (socket.AF_INET, socket.AF_INET6)}
    return {ip for ip in found if ip is not None}


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise OSError(f"cannot resolve {host}: {e.strerror}") from None
    return [info[4][0] for info in infos]


class NetAllow:
    """A parsed allow-list (see the module docstring); raises EgressError for a pattern it cannot read."""

    def __init__(self, patterns: Iterable[str] = DEFAULT_ALLOW, resolver: Resolver = system_resolver,
                 what: str = "net allow-list") -> None:
        """``what`` names the list in errors (the CLI passes its option, ``--net-allow``)."""
        self.patterns = tuple(p.strip() for p in patterns if p.strip())
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self.names: set[str] = set()
        self.suffixes: list[str] = []
        self.resolver = resolver
        for p in self.patterns:
            if p.startswith("*."):
                rest = p[2:].lower().rstrip(".")
                if not _is_hostname(rest):
                    raise EgressError(f"{what}: bad suffix pattern {p!r} (expected *.example, a host name after "
                                      "'*.')")
                self.suffixes.append("." + rest)
                continue
            try:
                self.networks.append(ipaddress.ip_network(p, strict=False))
                continue
            except ValueError:
                pass
            name = p.lower().rstrip(".")
            if not _is_hostname(name):
                raise EgressError(f"{what}: {p!r} is neither an IP network (10.0.0.0/8, ::1), an RFC 1123 host name "
                                  "(letters, digits, '-' and dots) nor *.suffix")
            self.names.add(name)

    def describe(self) -> str:
        return ", ".join(self.patterns) or "(empty: no stream target allowed)"

    def check_url(self, url: str) -> str:
        """The URL's host when the allow-list permits it; EgressError saying why not otherwise."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EgressError("net_target must be an http:// or https:// URL with a host")
        _port(parts)
        host = parts.hostname.rstrip(".").lower()
        ip = _ip(host)
        if ip is not None:
            if denied(ip):
                raise EgressError(f"net_target {host} is a link-local, metadata, multicast or unspecified "
                                  "address; streams never go there")
            if not any(ip in net for net in self.networks if net.version == ip.version):
                raise EgressError(f"net_target {host} is not in the allow-list ({self.describe()}); "
                                  "start the blocker with --net-allow to add it")
            return host
        if host in self.names or any(host.endswith(s) for s in self.suffixes):
            return host
        raise EgressError(f"net_target host {host!r} is not in the allow-list ({self.describe()}); "
                          "start the blocker with --net-allow to add it")

    def resolve(self, url: str) -> str:
        """The one address to connect to for ``url``: checked again by name, then every resolved address
        against the deny list. Raises EgressError (refused) or OSError (does not resolve)."""
        host = self.check_url(url)
        port = _port(urlsplit(url))
        addrs = [a for a in self.resolver(host, port)]
        if not addrs:
            raise OSError(f"{host} resolves to no address")
        bad = [a for a in addrs if (ip := _ip(a)) is None or denied(ip)]
        if bad:
            raise EgressError(f"net_target {host} resolves to {bad[0]}, a link-local, metadata, multicast or "
                              "unspecified address; refused")
        return addrs[0]

    def is_self(self, url: str, host: str, port: int) -> bool:
        """Whether ``url`` reaches the server listening on ``host``:``port`` (an IP address; this app's own): the
        same port, and an address that listener takes, its own or, bound to 0.0.0.0 or ::, any loopback or local
        one. Names are resolved (``localhost``); one that does not resolve reaches nothing, so not this app."""
        own = _ip(host)
        parts = urlsplit(url)
        if own is None or _port(parts) != port or not parts.hostname:
            return False
        name = parts.hostname.rstrip(".").lower()
        try:
            found = [name] if _ip(name) is not None else self.resolver(name, port)
        except OSError:
            return False
        addrs = {ip for a in found if (ip := _ip(a)) is not None}
        if own.is_unspecified:
            return any(a.is_loopback or a.is_unspecified for a in addrs) or bool(addrs & local_addresses())
        return own in addrs
