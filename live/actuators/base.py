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

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

from joulesched.core.errors import JouleschedError, UsageError

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


def redact(text: str) -> str:
    """``text`` with the user-info of a URL (``user:password@``) replaced by ``<redacted>@``."""
    u = urlsplit(text or "")
    if u.username is None and u.password is None:
        return text
    return text.replace(u.netloc, "<redacted>@" + u.netloc.rsplit("@", 1)[-1], 1)


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
    """``libvirt:///vm-1`` -> PowerAddress("libvirt", "", "vm-1"). Raises :class:`AddressError`."""
    text = (text or "").strip()
    if text == "none":
        return PowerAddress("none", raw=text)
    try:
        u = urlsplit(text)
    except ValueError as e:
        raise AddressError(f"power address {redact(text)!r}: {e}") from None
    shown = redact(text)
    if u.scheme not in SCHEMES:
        raise AddressError(f"power address {shown!r}: unknown scheme {u.scheme!r}; known: {', '.join(SCHEMES)}")
    if u.username is not None or u.password is not None:
        raise AddressError(f"power address {shown!r}: credentials do not belong in an address (they would show "
                           "in `kubectl get node -o yaml`); put them in the credentials file")
    text = shown
    addr = PowerAddress(u.scheme, u.netloc, u.path.lstrip("/"), dict(parse_qsl(u.query)), text)
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
