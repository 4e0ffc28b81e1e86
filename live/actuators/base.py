"""The actuator protocol: how the node power controller puts one machine to sleep and wakes it.

A node's power address comes from its annotation ``joulesched.io/power`` (or the controller's address map,
a ConfigMap mounted as a file): ``libvirt:///DOMAIN``, ``redfish://HOST[:PORT]/redfish/v1/Systems/ID``
(``redfish+http://`` for a plain-HTTP BMC), ``ipmi://HOST[:PORT]``, ``wol://MAC?ssh=HOST[:PORT]``,
``aws://INSTANCE-ID[?region=R]``, ``metal3://NAMESPACE/BAREMETALHOST`` and ``rufio://NAMESPACE/MACHINE`` (the
BMC's owner switches it, :mod:`joulesched.live.actuators.delegate`), or ``none``. Credentials never travel in the address: they come from a
file (a mounted Secret, :mod:`joulesched.live.actuators.credentials`).

An actuator has three methods, each given a :class:`Target` (the node and its parsed address):
``sleep`` (returns once the machine is off, saved or suspended, or raises :class:`ActuatorError`), ``wake``
(returns once power-on was requested and accepted; the controller then waits for the node to turn Ready),
and ``state`` (``on``, ``off``, ``transitioning`` or ``unknown``).
"""

from __future__ import annotations

import ipaddress
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

from joulesched.core.errors import JouleschedError, UsageError
from joulesched.core.names import is_host_name

ON, OFF, TRANSITIONING, UNKNOWN = "on", "off", "transitioning", "unknown"
SCHEMES = ("libvirt", "redfish", "redfish+http", "ipmi", "wol", "aws", "metal3", "rufio", "none")
#: Schemes whose address is a Kubernetes object, SCHEME://NAMESPACE/NAME.
OBJECT_SCHEMES = ("metal3", "rufio")


class ActuatorError(JouleschedError):
    """A sleep or wake request failed on the machine's management interface (the message says which)."""


class AddressError(UsageError):
    """A power address that cannot be used (unknown scheme, missing part). Its message never carries the
    address's user-info (a password typed into an address must not reach a log or an Event)."""


class ActionAborted(ActuatorError):
    """The action was stopped before its next request: its deadline passed, or this replica lost the Lease."""


class NoAnswer(ActuatorError):
    """A request sent and never answered (a connection cut, a read timing out): whether it was carried out is
    unknown."""


def marked(e: BaseException) -> BaseException:
    """``e`` marked ``off_requested``: a power-off may have been carried out (:func:`off_requested`)."""
    e.off_requested = True
    return e


@contextmanager
def after_power_off() -> Iterator[None]:
    """Around what follows a power-off request the machine accepted, or may have (a request left unanswered is
    marked by the actuator itself, :func:`marked`): an error raised there is marked ``off_requested``. The
    machine may still be going down (an OS shutting down reads "on" until it is off), so a failed sleep's "on"
    is then no proof that it kept running (:func:`off_requested`)."""
    try:
        yield
    except BaseException as e:
        raise marked(e)


def off_requested(e: BaseException) -> bool:
    """Whether the sleep that raised ``e`` had a power-off accepted first (:func:`after_power_off`)."""
    return bool(getattr(e, "off_requested", False))


def redact(text: str) -> str:
    """``text`` with the user-info of a URL (``user:password@``) replaced by ``<redacted>@``. Never raises: it
    is called on addresses that failed to parse too (a node's annotation of ``redfish://[::1``)."""
    try:
        u = urlsplit(text or "")
    except ValueError:
        return re.sub(r"//[^/?#]*@", "//<redacted>@", text or "")
    if u.username is None and u.password is None:
        return text
    return text.replace(u.netloc, "<redacted>@" + u.netloc.rsplit("@", 1)[-1], 1)


def split_host(hostport: str) -> tuple[str, str]:
    """``"10.0.0.5:623"`` -> ("10.0.0.5", "623"); ``"[fe80::1]:623"`` -> ("fe80::1", "623"); a bare IPv6 or
    a host without a port -> (host, "")."""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        return host, rest.lstrip(":")
    if hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
        return host, port
    return hostport, ""


_PORT = re.compile(r"[1-9][0-9]{0,4}")
#: A MAC address as Wake-on-LAN takes it.
MAC = re.compile(r"[0-9A-Fa-f]{2}(?:[:-][0-9A-Fa-f]{2}){5}")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def hostport_problem(hostport: str) -> str:
    """Why ``hostport`` is not one plain ``HOST[:PORT]`` ("" when it is). One spelling per machine: no
    percent-encoding, a port in 1..65535 without leading zeros, an IP in its standard notation (``010.0.0.5``,
    ``0x0a.0.0.5`` and ``167772165`` name 10.0.0.5 to the C resolver, so they are refused, not compared as
    names)."""
    if "%" in hostport:
        return "percent-encoding (or an IPv6 zone) is not allowed"
    host, port = split_host(hostport)
    if hostport.endswith(":") and not hostport.endswith("::"):
        return "an empty port"
    if port and not (_PORT.fullmatch(port) and int(port) <= 65535):
        return f"port {port!r} is not a number in 1..65535 (written without leading zeros)"
    try:
        ipaddress.ip_address(host)
        return ""
    except ValueError:
        pass
    last = host.rstrip(".").rsplit(".", 1)[-1].lower()
    if not is_host_name(host) or last.isdigit() or last.startswith("0x"):
        return f"{host!r} is neither an IP address in standard notation nor a host name"
    return ""


@dataclass(frozen=True)
class PowerAddress:
    """A parsed power address: ``scheme``, ``host`` (with port, may be empty), ``path`` (without the leading
    slash), ``params`` (the query string)."""

    scheme: str
    host: str = ""
    path: str = ""
    params: dict = field(default_factory=dict)
    raw: str = ""

    @property
    def actuator(self) -> str:
        """The actuator that handles it (``redfish+http`` is served by ``redfish``)."""
        return "redfish" if self.scheme.startswith("redfish") else self.scheme


def parse_address(text: str) -> PowerAddress:
    """``libvirt:///vm-1`` -> PowerAddress("libvirt", "", "vm-1"). Raises :class:`AddressError`, and only it:
    whatever a node writes into its annotation is refused for that node, never an error of the whole pass.

    One machine has one spelling (:func:`hostport_problem`, :func:`_check_parts`): the access policy compares
    machines by their addresses, so spellings a BMC library or resolver would take for the same machine
    (``/Systems/./1``, ``%31``, port ``0623``) are refused rather than told apart."""
    text = (text or "").strip()
    if text == "none":
        return PowerAddress("none", raw=text)
    try:
        u = urlsplit(text)
        query = parse_qsl(u.query, strict_parsing=bool(u.query))
    except ValueError as e:
        raise AddressError(f"power address {redact(text)!r}: {e}") from None
    shown = redact(text)
    if u.scheme not in SCHEMES:
        raise AddressError(f"power address {shown!r}: unknown scheme {u.scheme!r}; known: {', '.join(SCHEMES)}")
    if u.username is not None or u.password is not None:
        raise AddressError(f"power address {shown!r}: credentials do not belong in an address (they would show "
                           "in `kubectl get node -o yaml`); put them in the credentials file")
    text = shown
    if u.fragment:
        raise AddressError(f"power address {text!r}: a fragment (#...) has no meaning here")
    if len({k for k, _ in query}) != len(query):
        raise AddressError(f"power address {text!r}: a parameter is given twice")
    addr = PowerAddress(u.scheme, u.netloc, u.path.lstrip("/"), dict(query), text)
    if (why := _check_parts(addr)):
        raise AddressError(f"power address {text!r}: {why}")
    need_host = addr.actuator in ("redfish", "ipmi", "wol", "aws")
    if need_host and not addr.host:
        raise AddressError(f"power address {text!r}: needs a host ({addr.scheme}://HOST...)")
    if addr.scheme == "libvirt" and not addr.path:
        raise AddressError(f"power address {text!r}: needs a domain name (libvirt:///DOMAIN)")
    if addr.scheme in OBJECT_SCHEMES and not (addr.host and addr.path and "/" not in addr.path):
        raise AddressError(f"power address {text!r}: needs the object ({addr.scheme}://NAMESPACE/NAME)")
    if addr.actuator == "redfish" and not addr.path.startswith("redfish/v1/Systems/"):
        raise AddressError(f"power address {text!r}: needs the system path (redfish://HOST/redfish/v1/Systems/ID)")
    return addr


#: The query parameters each scheme reads (its actuator's docstring); any other is a typo that would be ignored.
PARAMS = {"wol": ("ssh", "user", "broadcast", "port"), "aws": ("region",)}


def _check_parts(addr: PowerAddress) -> str:
    """Why ``addr``'s host, path or parameters are not one plain spelling of one machine ("" when they are)."""
    if unknown := sorted(set(addr.params) - set(PARAMS.get(addr.actuator, ()))):
        return f"unknown parameter(s) {', '.join(unknown)} for {addr.scheme}"
    if "%" in addr.path:
        return "percent-encoding is not allowed in the path"
    if any(seg in (".", "..") for seg in addr.path.split("/")):
        return "a '.' or '..' path segment is not allowed"
    if addr.actuator in ("redfish", "ipmi") and addr.host and (why := hostport_problem(addr.host)):
        return why
    if addr.actuator == "redfish" and addr.path.startswith("redfish/v1/Systems/") and \
            len([p for p in addr.path.split("/") if p]) != 4:
        return "the system path is redfish/v1/Systems/ID, one segment of ID"
    if addr.actuator == "ipmi" and addr.path.strip("/"):
        return "an IPMI address has no path (ipmi://HOST[:PORT])"
    if addr.actuator == "wol":
        p = addr.params
        if not MAC.fullmatch(addr.host):
            return f"{addr.host!r} is not a MAC address (wol://AA:BB:CC:DD:EE:FF)"
        if "ssh" in p and (why := hostport_problem(p["ssh"])):
            return f"ssh={p['ssh']}: {why}"
        if "broadcast" in p:
            try:
                ipaddress.ip_address(p["broadcast"])
            except ValueError:
                return f"broadcast={p['broadcast']}: not an IP address"
        if "port" in p and not (_PORT.fullmatch(p["port"]) and int(p["port"]) <= 65535):
            return f"port={p['port']}: not a number in 1..65535"
        if "user" in p and not _USER.fullmatch(p["user"]):
            return f"user={p['user']}: not a user name"
    return ""


def _no_check() -> None:
    return None


@dataclass(frozen=True)
class Target:
    """One machine: the node's name and its power address, and the action's context: ``deadline`` (monotonic
    seconds) bounds the whole action, ``check`` raises :class:`ActionAborted` when the action must stop (the
    controller lost its Lease). Actuators call :meth:`checkpoint` before every request to the machine and in
    every wait, and cap each request's timeout with :meth:`budget`."""

    node: str
    address: PowerAddress
    source: str = "map"  # "map" (the operator's) or "annotation" (allowed by the operator's policy)
    deadline: float = field(default=math.inf, compare=False)
    check: Callable[[], None] = field(default=_no_check, compare=False, repr=False)
    #: Called just before a graceful power-off escalates to a hard one (up to its graceful timeout after the last
    #: pod check): raises :class:`ActionAborted` when a workload pod has landed on the node since, so the machine
    #: is not switched off under it (a pod bound by spec.nodeName or tolerating every taint).
    before_force: Callable[[], None] = field(default=_no_check, compare=False, repr=False)

    def checkpoint(self) -> None:
        """Raise :class:`ActionAborted` if the action must not send another request."""
        self.check()
        if time.monotonic() >= self.deadline:
            raise ActionAborted(f"{self.node}: deadline passed")

    def budget(self, cap: float) -> float:
        """Seconds the next request may take: ``cap``, or what is left of the deadline (at least 0.1 s)."""
        return max(0.1, min(cap, self.deadline - time.monotonic()))

    def pause(self, seconds: float) -> None:
        """Wait between polls, never past the deadline; then :meth:`checkpoint`."""
        time.sleep(max(0.0, min(seconds, self.deadline - time.monotonic())))
        self.checkpoint()


class Actuator(Protocol):
    """Puts machines to sleep and wakes them (see the module docstring)."""

    name: str

    def sleep(self, target: Target) -> None: ...

    def wake(self, target: Target) -> None: ...

    def state(self, target: Target) -> str: ...
