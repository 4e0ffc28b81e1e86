"""Addresses as every joulesched daemon and client takes them: listen addresses (``HOST:PORT``, ``[V6]:PORT``),
the ports of http(s) URLs, and libvirt URIs that would skip a check."""

from __future__ import annotations

from typing import Any

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
    """``url`` if it is http(s) with a host and, if any, a port in 1..65535, holds no space or control character,
    and no non-ASCII outside its host (an IDN); else ValueError with a one-line reason naming ``option``."""
    from urllib.parse import urlsplit

    bad = next((c for c in url if c.isspace() or not c.isprintable()), None)
    if bad is not None:  # http.client refuses them only when the request is sent: say so now, naming the option
        raise ValueError(f"{option} {url!r}: {bad!r} cannot be in a URL (percent-encode spaces and control "
                         "characters)")
    try:
        u = urlsplit(url)
    except ValueError as e:  # "Invalid IPv6 URL"
        raise ValueError(f"{option} {url!r}: {e}") from None
    # A host may be an IDN (http.client sends it IDNA-encoded); the rest of the URL must be ASCII.
    rest = "".join((u.scheme, u.path, u.query, u.fragment, u.username or "", u.password or ""))
    bad = next((c for c in rest if not c.isascii()), None)
    if bad is not None:
        raise ValueError(f"{option} {url!r}: {bad!r} cannot be in a URL's path or query (percent-encode it)")
    if u.hostname and not u.hostname.isascii():
        try:
            u.hostname.encode("idna")
        except UnicodeError:
            raise ValueError(f"{option} {url!r}: {u.hostname!r} is not a valid host name") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{option} {url!r}: expected http(s)://HOST[:PORT][/PATH]")
    try:
        url_port(u)
    except ValueError as e:
        raise ValueError(f"{option} {url!r}: {e}") from None
    return url


def url_port(parts: Any) -> int | None:
    """The port of a ``urlsplit`` result, None when none is written; ValueError for one outside 1..65535 or no
    number (urllib raises for those only when asked, and takes 0)."""
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError("the port must be a number in 1..65535")
    return port


def insecure_libvirt_uri(uri: str) -> str | None:
    """Why a libvirt ``uri`` would expose the session or skip checking the peer; ``None`` if it does neither.
    Raises ValueError for a string that is no URI. One rule for the node power actuator and the kvm stack."""
    from urllib.parse import parse_qsl, urlsplit

    u = urlsplit(uri)
    if u.scheme.partition("+")[2].lower() == "tcp":
        return ("the tcp transport sends the libvirt session unencrypted and, by default, unauthenticated "
                "(use +tls or +ssh)")
    for key, value in parse_qsl(u.query, keep_blank_values=True):
        key, value = key.lower(), value.strip()
        if key == "no_verify" and value not in ("0", "+0", "-0"):
            return f"no_verify={value} skips checking the server's certificate or host key"
        if key == "known_hosts_verify" and value.lower() == "ignore":
            return "known_hosts_verify=ignore skips checking the SSH host key"
    return None
