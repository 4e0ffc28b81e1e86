"""Power actuators of the node power controller, one module each, behind the protocol in :mod:`.base`.

:func:`make_actuator` builds one by name (modules are imported only when used, so a missing optional library
only matters to the actuator that needs it). ``auto`` dispatches on each node's address scheme.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from dataclasses import dataclass, field

from joulesched.live.actuators.base import ActuatorError, AddressError, Target
from joulesched.live.actuators.credentials import Credentials

#: name -> module:class, and the options each takes from :class:`ActuatorOptions`.
ACTUATORS = {
    "none": "joulesched.live.actuators.none:NoneActuator",
    "libvirt": "joulesched.live.actuators.libvirt:LibvirtActuator",
    "redfish": "joulesched.live.actuators.redfish:RedfishActuator",
    "ipmi": "joulesched.live.actuators.ipmi:IpmiActuator",
    "wol": "joulesched.live.actuators.wol:WolActuator",
    "aws": "joulesched.live.actuators.aws:AwsActuator",
    "metal3": "joulesched.live.actuators.metal3:Metal3Actuator",
    "rufio": "joulesched.live.actuators.rufio:RufioActuator",
}
NAMES = ("auto", *ACTUATORS)


@dataclass
class ActuatorOptions:
    """Settings the actuators share; each takes the ones it needs.

    :param libvirt_uri: libvirt connection URI. :param credentials: BMC logins (Redfish, IPMI).
    :param redfish_ca: CA bundle for BMC certificates. :param force_off: allow a hard power-off when a graceful
        one does not finish in ``graceful_timeout_s``. :param ssh_key, known_hosts, ssh_user, suspend_command:
        the Wake-on-LAN actuator's SSH side. :param aws_region, aws_endpoint: EC2.
    :param allow_redfish_http: accept ``redfish+http://`` (the BMC login travels unencrypted); off by default.
    :param allow_libvirt_insecure: accept a ``libvirt_uri`` that is unencrypted (``+tcp``) or skips checking the
        peer (``no_verify=1``, ``known_hosts_verify=ignore``); off by default, such a URI is then bad input.
    :param connect_timeout_s, request_timeout_s: bounds of each request to a BMC (the action's deadline may
        cut them shorter).
    :param kube_api, kubeconfig, kube_context: the Kubernetes API of the metal3 and rufio actuators (an
        ``ApiClient``; else one made from the kubeconfig, else the in-cluster service account).
    """

    libvirt_uri: str = "qemu:///system"
    credentials: Credentials = field(default_factory=Credentials)
    redfish_ca: str | None = None
    force_off: bool = True
    graceful_timeout_s: float = 120.0
    poll_s: float = 1.0
    ssh_key: str | None = None
    known_hosts: str | None = None
    ssh_user: str = "root"
    suspend_command: str = "systemctl suspend"
    aws_region: str | None = None
    aws_endpoint: str | None = None
    allow_redfish_http: bool = False
    allow_libvirt_insecure: bool = False
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 15.0
    kube_api: object = None
    kubeconfig: str | None = None
    kube_context: str | None = None

    def __post_init__(self) -> None:
        from joulesched.live.actuators.libvirt import check_uri

        # At startup, whichever actuator is used: a typo here would otherwise surface at the first sleep or wake,
        # hours later, as that action's failure.
        if not self.libvirt_uri.strip():
            raise AddressError("--libvirt-uri is empty")
        check_uri(self.libvirt_uri, self.allow_libvirt_insecure)
        for option, path in (("--redfish-ca", self.redfish_ca), ("--ssh-key", self.ssh_key),
                             ("--known-hosts", self.known_hosts)):
            if path is not None and not os.path.isfile(path):
                raise AddressError(f"{option} {path}: no such file")
            if path is not None and not os.access(path, os.R_OK):
                raise AddressError(f"{option} {path}: not readable")
        for option, text in (("--ssh-user", self.ssh_user), ("--suspend-command", self.suspend_command)):
            if not text.strip():
                raise AddressError(f"{option} is empty")
        if self.aws_region is not None and not self.aws_region.strip():
            raise AddressError("--aws-region is empty")
        if self.aws_endpoint is not None and not re.match(r"https?://[^/\s]+", self.aws_endpoint):
            raise AddressError(f"--aws-endpoint {self.aws_endpoint!r}: expected an http(s):// URL")


def _build(name: str, o: ActuatorOptions):
    mod, cls = ACTUATORS[name].split(":")
    try:
        klass = getattr(importlib.import_module(mod), cls)
    except ImportError as e:
        raise ActuatorError(f"actuator {name!r} needs a library that is not installed ({e.name}); "
                            "pip install 'joulesched[node-power]'") from None
    kw = {"none": {}, "libvirt": dict(uri=o.libvirt_uri, allow_insecure=o.allow_libvirt_insecure),
          "redfish": dict(credentials=o.credentials, ca_bundle=o.redfish_ca, force_off=o.force_off,
                          graceful_timeout_s=o.graceful_timeout_s, poll_s=o.poll_s, allow_http=o.allow_redfish_http,
                          connect_timeout_s=o.connect_timeout_s, request_timeout_s=o.request_timeout_s),
          "ipmi": dict(credentials=o.credentials, force_off=o.force_off, graceful_timeout_s=o.graceful_timeout_s,
                       poll_s=o.poll_s),
          "wol": dict(key_file=o.ssh_key, known_hosts=o.known_hosts, user=o.ssh_user,
                      suspend_command=o.suspend_command, timeout_s=o.request_timeout_s),
          "aws": dict(region=o.aws_region, endpoint_url=o.aws_endpoint, poll_s=o.poll_s,
                      connect_timeout_s=o.connect_timeout_s, request_timeout_s=o.request_timeout_s),
          "metal3": dict(api_client=o.kube_api, kubeconfig=o.kubeconfig, context=o.kube_context, poll_s=o.poll_s,
                         request_timeout_s=o.request_timeout_s),
          "rufio": dict(api_client=o.kube_api, kubeconfig=o.kubeconfig, context=o.kube_context,
                        force_off=o.force_off, graceful_timeout_s=o.graceful_timeout_s, poll_s=o.poll_s,
                        request_timeout_s=o.request_timeout_s)}[name]
    return klass(**kw)


class AutoActuator:
    """Dispatches each node to the actuator of its address's scheme, built on first use."""

    name = "auto"

    def __init__(self, options: ActuatorOptions) -> None:
        self.options = options
        self._built: dict[str, object] = {}
        self._lock = threading.Lock()

    def _for(self, target: Target):
        name = target.address.actuator
        with self._lock:
            if name not in self._built:
                self._built[name] = _build(name, self.options)
            return self._built[name]

    def sleep(self, target: Target) -> None:
        self._for(target).sleep(target)

    def wake(self, target: Target) -> None:
        self._for(target).wake(target)

    def state(self, target: Target) -> str:
        return self._for(target).state(target)

    def cancel_sleep(self, target: Target) -> None:
        _cancel_sleep(self._for(target), target)


class OneActuator:
    """A single actuator; a node whose address names another refuses (so a typo never drives the wrong BMC)."""

    def __init__(self, actuator) -> None:
        self.actuator = actuator
        self.name = actuator.name

    def _check(self, target: Target) -> None:
        if self.name != "none" and target.address.actuator != self.name:
            raise AddressError(f"{target.node}: its power address is a {target.address.scheme} address, not one "
                               f"for the {self.name} actuator")

    def sleep(self, target: Target) -> None:
        self._check(target)
        self.actuator.sleep(target)

    def wake(self, target: Target) -> None:
        self._check(target)
        self.actuator.wake(target)

    def state(self, target: Target) -> str:
        self._check(target)
        return self.actuator.state(target)

    def cancel_sleep(self, target: Target) -> None:
        self._check(target)
        _cancel_sleep(self.actuator, target)


def _cancel_sleep(actuator, target: Target) -> None:
    """Withdraw the power-off a failed sleep left standing, where the actuator leaves one (a desired state its
    owner acts on later: metal3's ``spec.online``); nothing for the others, whose requests end with the call."""
    cancel = getattr(actuator, "cancel_sleep", None)
    if cancel is not None:
        cancel(target)


def make_actuator(name: str, options: ActuatorOptions | None = None):
    """The actuator called ``name`` (one of :data:`NAMES`). Raises AddressError for an unknown name."""
    o = options or ActuatorOptions()
    if name == "auto":
        return AutoActuator(o)
    if name not in ACTUATORS:
        raise AddressError(f"unknown actuator {name!r}; known: {', '.join(NAMES)}")
    return OneActuator(_build(name, o))
