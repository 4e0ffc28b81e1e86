"""Metal3: the Bare Metal Operator owns the BMC; joulesched sets the host's desired power state.

Address ``metal3://NAMESPACE/NAME`` names a ``BareMetalHost`` (metal3.io/v1alpha1). Sleep = merge-patch
``spec.online: false``, then wait (polling, within the action's deadline) until the operator reports
``status.poweredOn: false``; wake = ``spec.online: true``, returned once the patch is accepted (the controller
then waits for the node's heartbeat). State = ``status.poweredOn``, ``transitioning`` while it differs from
``spec.online``. A host the operator does not manage (``status.operationalStatus: detached``) or reports a
power-management error for is refused with the operator's own words.

RBAC: ``get`` and ``patch`` on ``baremetalhosts`` in the hosts' namespace (deploy/kustomize's bare-metal
Metal3 component).
"""

from __future__ import annotations

import time

from joulesched.live.actuators.base import OFF, ON, TRANSITIONING, UNKNOWN, ActuatorError, Target
from joulesched.live.actuators.delegate import CustomObjects

PLURAL = "baremetalhosts"


class Metal3Actuator:
    name = "metal3"

    def __init__(self, *, api_client=None, kubeconfig: str | None = None, context: str | None = None,
                 poll_s: float = 2.0, request_timeout_s: float = 15.0, timeout_s: float = 600.0) -> None:
        self.hosts = CustomObjects("metal3.io", "v1alpha1", api_client=api_client, kubeconfig=kubeconfig,
                                   context=context, request_timeout_s=request_timeout_s)
        self.poll_s, self.timeout_s = poll_s, timeout_s

    def _host(self, target: Target) -> dict:
        host = self.hosts.get(target, PLURAL, target.address.path)
        status = host.get("status") or {}
        if status.get("operationalStatus") == "detached":
            raise ActuatorError(f"{target.node}: BareMetalHost {target.address.host}/{target.address.path} is "
                                "detached: the Bare Metal Operator does not manage its power")
        if status.get("errorType") == "power management error":
            raise ActuatorError(f"{target.node}: BareMetalHost {target.address.host}/{target.address.path}: "
                                f"{str(status.get('errorMessage') or 'power management error')[:200]}")
        return host

    def _online(self, target: Target, online: bool) -> None:
        self._host(target)  # exists, managed, no power error
        self.hosts.patch(target, PLURAL, target.address.path, {"spec": {"online": online}})

    def sleep(self, target: Target) -> None:
        self._online(target, False)
        give_up = time.monotonic() + self.timeout_s
        while (st := self.state(target)) != OFF:
            if time.monotonic() > give_up:
                raise ActuatorError(f"{target.node}: BareMetalHost {target.address.host}/{target.address.path} "
                                    f"still {st} {self.timeout_s:.0f} s after spec.online was set false")
            target.pause(self.poll_s)  # raises ActionAborted at the action's deadline

    def wake(self, target: Target) -> None:
        self._online(target, True)

    def cancel_sleep(self, target: Target) -> None:
        """Withdraw a power-off asked for by a sleep that failed (the machine kept running): ``spec.online: false``
        left standing would have the operator switch the machine off whenever it gets to it, pods and all."""
        self.hosts.patch(target, PLURAL, target.address.path, {"spec": {"online": True}})

    def state(self, target: Target) -> str:
        host = self._host(target)
        powered = (host.get("status") or {}).get("poweredOn")
        if not isinstance(powered, bool):
            return UNKNOWN
        online = (host.get("spec") or {}).get("online")
        if isinstance(online, bool) and online != powered:
            return TRANSITIONING
        return ON if powered else OFF
