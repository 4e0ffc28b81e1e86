"""The actuator protocol: how the node power controller puts one machine to sleep and wakes it.

A node's power address comes from its annotation ``joulesched.io/power`` (or the controller's address map,
a ConfigMap mounted as a file): ``libvirt:///DOMAIN``, ``redfish://HOST[:PORT]/redfish/v1/Systems/ID``
(``redfish+http://`` for a plain-HTTP BMC), ``ipmi://HOST[:PORT]``, ``wol://MAC?ssh=HOST[:PORT]``,
``aws://INSTANCE-ID[?region=R]``, or ``none``. Credentials never travel in the address: they come from a
file (a mounted Secret, :mod:`joulesched.live.actuators.credentials`).

An actuator has three methods, each given a :class:`Target` (the node and its parsed address):
``sleep`` (returns once the machine is off, saved or suspended, or raises :class:`ActuatorError`), ``wake``
(returns once power-on was requested and accepted; the controller then waits for the node to turn Ready),
and ``state`` (``on``, ``off``, ``transitioning`` or ``unknown``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

from joulesched.core.errors import JouleschedError, UsageError

ON, OFF, TRANSITIONING, UNKNOWN = "on", "off", "transitioning", "unknown"
SCHEMES = ("libvirt", "redfish", "redfish+http", "ipmi", "wol", "aws", "none")


class ActuatorError(JouleschedError):
    """A sleep or wake request failed on the machine's management interface (the message says which)."""


class AddressError(UsageError):
    """A power address that cannot be used (unknown scheme, missing part)."""


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
    u = urlsplit(text)
    if u.scheme not in SCHEMES:
        raise AddressError(f"power address {text!r}: unknown scheme {u.scheme!r}; known: {', '.join(SCHEMES)}")
    if u.username or u.password:
        raise AddressError(f"power address {text!r}: credentials do not belong in an address (they would show "
                           "in `kubectl get node -o yaml`); put them in the credentials file")
    addr = PowerAddress(u.scheme, u.netloc, u.path.lstrip("/"), dict(parse_qsl(u.query)), text)
    need_host = addr.actuator in ("redfish", "ipmi", "wol", "aws")
    if need_host and not addr.host:
        raise AddressError(f"power address {text!r}: needs a host ({addr.scheme}://HOST...)")
    if addr.scheme == "libvirt" and not addr.path:
        raise AddressError(f"power address {text!r}: needs a domain name (libvirt:///DOMAIN)")
    if addr.actuator == "redfish" and not addr.path.startswith("redfish/v1/Systems/"):
        raise AddressError(f"power address {text!r}: needs the system path (redfish://HOST/redfish/v1/Systems/ID)")
    return addr


@dataclass(frozen=True)
class Target:
    """One machine: the node's name and its power address."""

    node: str
    address: PowerAddress


class Actuator(Protocol):
    """Puts machines to sleep and wakes them (see the module docstring)."""

    name: str

    def sleep(self, target: Target) -> None: ...

    def wake(self, target: Target) -> None: ...

    def state(self, target: Target) -> str: ...
