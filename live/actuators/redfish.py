"""Redfish (bare metal BMCs) with the ``sushy`` client: sleep = ``GracefulShutdown``, then ``ForceOff`` if the
system is still on after ``graceful_timeout_s`` (when allowed); wake = ``On``.

Address ``redfish://HOST[:PORT]/redfish/v1/Systems/ID`` (HTTPS, certificates verified against the system
store or ``ca_bundle``) or ``redfish+http://...`` for a BMC on a management network without TLS. The login
comes from the credentials file, by node or HOST[:PORT].

Bounded: every request has a connect timeout of ``connect_timeout_s`` and a read timeout of at most
``request_timeout_s`` (less when the action's deadline is nearer), sushy retries a failed connection once
(not its default three times, 2 s apart, and ten times on a 5xx), and every request and every poll is
preceded by the action's checkpoint (its deadline, the controller's Lease). A BMC that never answers costs
one action one deadline."""

from __future__ import annotations

import time

import sushy

from joulesched.live.actuators.base import (OFF, ON, TRANSITIONING, UNKNOWN, ActuatorError, Target, after_power_off,
                                            marked)
from joulesched.live.actuators.credentials import Credentials


class RedfishActuator:
    name = "redfish"

    def __init__(self, credentials: Credentials | None = None, *, ca_bundle: str | None = None,
                 force_off: bool = True, graceful_timeout_s: float = 120.0, poll_s: float = 1.0,
                 timeout_s: float = 30.0, connect_timeout_s: float = 5.0, request_timeout_s: float = 15.0,
                 allow_http: bool = False) -> None:
        self.allow_http = allow_http
        self.credentials = credentials or Credentials()
        self.verify: bool | str = ca_bundle or True  # never False: a BMC's certificate is always checked
        self.force_off, self.graceful_timeout_s, self.poll_s, self.timeout_s = (force_off, graceful_timeout_s,
                                                                                poll_s, timeout_s)
        self.connect_timeout_s, self.request_timeout_s = connect_timeout_s, request_timeout_s

    def _system(self, target: Target):
        a = target.address
        proto = "http" if a.scheme == "redfish+http" else "https"
        if proto == "http" and not self.allow_http:
            raise ActuatorError(f"{target.node}: redfish+http would send the BMC login unencrypted "
                                "(--allow-redfish-http allows it)")
        login = self.credentials.login(target)
        target.checkpoint()
        read = target.budget(self.request_timeout_s)
        try:
            root = sushy.Sushy(f"{proto}://{a.host}/redfish/v1", username=login.username if login else None,
                               password=login.password if login else None, verify=self.verify,
                               server_side_retries=1, server_side_retries_delay=1, read_timeout=read,
                               connect_timeout=min(self.connect_timeout_s, read))
            return root.get_system("/" + a.path)
        except sushy.exceptions.SushyError as e:
            raise ActuatorError(f"{target.node}: Redfish {proto}://{a.host}/{a.path}: {_why(e)}") from None
        except Exception as e:  # connection refused, TLS failure
            raise ActuatorError(f"{target.node}: Redfish {proto}://{a.host}: {type(e).__name__}") from None

    def _wait(self, target: Target, system, want: sushy.PowerState, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            target.checkpoint()
            system.refresh(force=True)
            if system.power_state == want:
                return True
            if time.monotonic() >= deadline:
                return False
            target.pause(self.poll_s)

    @staticmethod
    def _allowed(system) -> set:
        """The ResetType values the system offers (its ``ResetType@Redfish.AllowableValues``; sushy gives every
        value where the BMC lists none)."""
        try:
            return set(system.get_allowed_reset_system_values())
        except sushy.exceptions.SushyError:
            return set(sushy.ResetType)

    def sleep(self, target: Target) -> None:
        system = self._system(target)
        try:
            if system.power_state == sushy.PowerState.OFF:
                return
            allowed = self._allowed(system)
            # A graceful off the system offers: GracefulShutdown, else a press of the power button (an ACPI
            # shutdown); a BMC offering neither is switched off hard only where that is allowed (a review: some
            # firmware has no GracefulShutdown, sushy refused it before sending, and no sleep ever worked).
            soft = next((r for r in (sushy.ResetType.GRACEFUL_SHUTDOWN, sushy.ResetType.PUSH_POWER_BUTTON)
                         if r in allowed), None)
            if soft is None:
                if not self.force_off or sushy.ResetType.FORCE_OFF not in allowed:
                    raise ActuatorError(f"{target.node}: the BMC offers no graceful power-off (its ResetTypes: "
                                        f"{', '.join(sorted(r.value for r in allowed)) or 'none'})"
                                        + ("" if self.force_off else " and ForceOff is not allowed"))
                target.checkpoint()
                target.before_force()
                soft = sushy.ResetType.FORCE_OFF
            target.checkpoint()
            system.reset_system(soft)
        except sushy.exceptions.ConnectionError as e:  # no answer (a read timing out): it may have been done
            raise marked(ActuatorError(f"{target.node}: Redfish power off: {_why(e)}")) from None
        except sushy.exceptions.SushyError as e:  # an HTTP error: the BMC answered, and refused
            raise ActuatorError(f"{target.node}: Redfish power off: {_why(e)}") from None
        # Accepted: the OS may be shutting down while the BMC still reads On, whatever fails from here on.
        with after_power_off():
            try:
                if self._wait(target, system, sushy.PowerState.OFF, self.graceful_timeout_s):
                    return
                if soft == sushy.ResetType.FORCE_OFF:
                    raise ActuatorError(f"{target.node}: still on {self.graceful_timeout_s:g} s after ForceOff")
                if not self.force_off:
                    raise ActuatorError(f"{target.node}: still on {self.graceful_timeout_s:g} s after "
                                        f"{soft.value} (ForceOff is not allowed)")
                if sushy.ResetType.FORCE_OFF not in allowed:
                    raise ActuatorError(f"{target.node}: still on {self.graceful_timeout_s:g} s after {soft.value}, "
                                        "and the BMC offers no ForceOff")
                target.checkpoint()  # a new leader may have woken the node meanwhile: never ForceOff for it
                target.before_force()  # nor for a pod that landed on it since the last check
                system.reset_system(sushy.ResetType.FORCE_OFF)
                if not self._wait(target, system, sushy.PowerState.OFF, self.timeout_s):
                    raise ActuatorError(f"{target.node}: still on {self.timeout_s:g} s after ForceOff")
            except sushy.exceptions.SushyError as e:
                raise ActuatorError(f"{target.node}: Redfish power off: {_why(e)}") from None

    def wake(self, target: Target) -> None:
        system = self._system(target)
        try:
            if system.power_state in (sushy.PowerState.ON, sushy.PowerState.POWERING_ON):
                return
            allowed = self._allowed(system)
            on = next((r for r in (sushy.ResetType.ON, sushy.ResetType.FORCE_ON, sushy.ResetType.PUSH_POWER_BUTTON)
                       if r in allowed), None)
            if on is None:
                raise ActuatorError(f"{target.node}: the BMC offers no power-on (its ResetTypes: "
                                    f"{', '.join(sorted(r.value for r in allowed)) or 'none'})")
            target.checkpoint()
            system.reset_system(on)
        except sushy.exceptions.SushyError as e:
            raise ActuatorError(f"{target.node}: Redfish power on: {_why(e)}") from None

    def state(self, target: Target) -> str:
        system = self._system(target)
        ps = system.power_state
        return {sushy.PowerState.ON: ON, sushy.PowerState.OFF: OFF, sushy.PowerState.POWERING_ON: TRANSITIONING,
                sushy.PowerState.POWERING_OFF: TRANSITIONING}.get(ps, UNKNOWN)


def _why(e: Exception) -> str:
    """The error's kind and HTTP status only: the BMC's own text is remote content (it may echo what it was
    sent, or carry markup) and goes to DEBUG logs, never to an Event."""
    code = getattr(e, "status_code", None)
    return f"{type(e).__name__}" + (f" (HTTP {code})" if code else "")
