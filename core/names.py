"""Kubernetes' syntax for names and labels, checked in one place (namespaces, name prefixes, label keys and
values). Every pattern is matched whole (``fullmatch``, ASCII only): a ``$`` anchor would let a trailing newline
through, and Kubernetes takes none."""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", re.ASCII)


def is_dns_label(value: str, max_len: int = 63) -> bool:
    """An RFC 1123 label of at most ``max_len`` characters: lowercase letters, digits and '-', a letter or digit
    at both ends (a namespace, a Service's name)."""
    return len(value) <= max_len and _DNS_LABEL.fullmatch(value) is not None


def is_label_key(key: str) -> bool:
    """``[prefix/]name``: a name of at most 63 characters, a prefix that is a DNS subdomain of at most 253."""
    prefix, slash, name = key.rpartition("/")
    if _LABEL_NAME.fullmatch(name) is None:
        return False
    return not slash or (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix) is not None)


def is_label_value(value: str) -> bool:
    """At most 63 characters of letters, digits, '-', '_' and '.', alphanumeric at both ends; or empty."""
    return _LABEL_VALUE.fullmatch(value) is not None


_HOST_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_HOST_LABEL_UNDERSCORE = r"[a-z0-9](?:[-_a-z0-9]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*", re.ASCII)
_HOST_NAME_UNDERSCORE = re.compile(rf"{_HOST_LABEL_UNDERSCORE}(?:\.{_HOST_LABEL_UNDERSCORE})*", re.ASCII)


def is_host_name(name: str, *, underscore: bool = False) -> bool:
    """A host name as RFC 1123 has it, case-insensitive, one trailing dot allowed: at most 253 characters of
    dot-separated labels of letters, digits and '-', none starting or ending with '-'. ``underscore``: '_'
    inside a label too (Docker Compose service names, SRV-style names, which resolvers look up)."""
    name = name.lower().removesuffix(".")
    pattern = _HOST_NAME_UNDERSCORE if underscore else _HOST_NAME
    return 0 < len(name) <= 253 and pattern.fullmatch(name) is not None


_RAY_ADDRESS = re.compile(r"(?:ray://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})\Z")


def check_ray_address(address: str | None, option: str = "--ray-address") -> str | None:
    """``address`` if Ray can be given it (``auto``, ``local``, ``HOST:PORT`` or ``ray://HOST:PORT``, the port in
    1..65535), None if none was given; else :class:`UsageError` before any work (Ray's own error comes after the
    workloads are built, as a traceback)."""
    from joulesched.core.errors import UsageError

    if address is None or address in ("auto", "local"):
        return address
    m = _RAY_ADDRESS.match(address.strip())
    if not m or not 1 <= int(m["port"]) <= 65535:
        raise UsageError(f"{option} {address!r}: expected auto, local, HOST:PORT or ray://HOST:PORT")
    return address.strip()
