"""Listen addresses as every joulesched daemon takes them: ``HOST:PORT`` or ``[V6]:PORT``."""

from __future__ import annotations

from joulesched.core.errors import UsageError


def parse_listen(listen: str, option: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) to ``(host, port)``; port 0 picks a free one.

    Raises :class:`~joulesched.core.errors.UsageError` (a ValueError) saying what is wrong.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not host:
        raise UsageError(f"{option} {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    host = host.removeprefix("[").removesuffix("]")
    if not host:
        raise UsageError(f"{option} {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{option} {listen!r}: port must be a number from 0 to 65535")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ``::1``: a listener there is reachable from this host only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_http_url(url: str, option: str = "--target") -> str:
    """``url`` if it is http(s) with a host and, if any, a port in 1..65535; else ValueError with a one-line reason
    naming ``option``."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{option} {url!r}: expected http(s)://HOST[:PORT][/PATH]")
    try:
        port = u.port  # urllib raises on a port out of range, or one that is no number, only when asked
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{option} {url!r}: the port must be a number in 1..65535")
    return url
