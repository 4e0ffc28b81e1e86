"""``none``: cordon and taint only, no power change (for clusters whose autoscaler removes empty nodes)."""

from __future__ import annotations

from joulesched.live.actuators.base import UNKNOWN, Target


class NoneActuator:
    name = "none"

    def sleep(self, target: Target) -> None:
        """Nothing to switch off: the node stays cordoned and tainted until it is woken."""

    def wake(self, target: Target) -> None:
        """Nothing to switch on."""

    def state(self, target: Target) -> str:
        return UNKNOWN
