"""Wake-on-LAN plus SSH: sleep = ``systemctl suspend`` on the host over SSH (keys only, host keys pinned, the
project's :mod:`joulesched.infra.remote`); wake = the magic packet (``wakeonlan``) to the host's MAC.

Address ``wol://AA:BB:CC:DD:EE:FF?ssh=HOST[:PORT]&user=USER&broadcast=ADDR&port=9``: ``ssh`` is where to run
the suspend (default: the node's name), ``broadcast`` and ``port`` where the packet goes (255.255.255.255:9)."""

from __future__ import annotations

import shlex
from pathlib import Path

import wakeonlan

from joulesched.infra import remote
from joulesched.live.actuators.base import MAC, UNKNOWN, ActuatorError, Target, split_host


class WolActuator:
    name = "wol"

    def __init__(self, *, key_file: str | None = None, known_hosts: str | None = None, user: str = "root",
                 suspend_command: str = "systemctl suspend", timeout_s: float = 30.0) -> None:
        self.key_file = Path(key_file) if key_file else None
        self.known_hosts = Path(known_hosts) if known_hosts else None
        self.user, self.timeout_s = user, timeout_s
        self.suspend_argv = shlex.split(suspend_command)
        if not self.suspend_argv:
            raise ActuatorError("the suspend command must not be empty")

    @staticmethod
    def mac(target: Target) -> str:
        mac = target.address.host
        if not MAC.fullmatch(mac):
            raise ActuatorError(f"{target.node}: {mac!r} is not a MAC address (wol://AA:BB:CC:DD:EE:FF)")
        return mac

    def _spec(self, target: Target) -> remote.HostSpec:
        host, port = split_host(target.address.params.get("ssh") or target.node)  # [v6]:port too
        return remote.HostSpec(name=target.node, address=host, port=int(port or 22),
                               user=target.address.params.get("user") or self.user, key_file=self.key_file)

    def sleep(self, target: Target) -> None:
        self.mac(target)  # a node we could not wake again must not be put to sleep
        target.checkpoint()
        budget = target.budget(self.timeout_s)
        try:
            with remote.connect(self._spec(target), self.known_hosts, allow_agent=False, timeout=budget) as conn:
                target.checkpoint()
                remote.run(conn, self.suspend_argv, timeout=target.budget(self.timeout_s))
        except remote.RemoteError as e:
            raise ActuatorError(f"{target.node}: suspend over SSH: {e}") from None

    def wake(self, target: Target) -> None:
        p = target.address.params
        target.checkpoint()
        try:
            wakeonlan.wake(self.mac(target), host=p.get("broadcast", "255.255.255.255"), port=int(p.get("port", 9)))
        except (OSError, ValueError) as e:
            raise ActuatorError(f"{target.node}: Wake-on-LAN packet: {e}") from None

    def state(self, target: Target) -> str:
        return UNKNOWN  # a suspended host answers nothing: the node's Ready condition tells
