"""IPMI 2.0 (lanplus) with ``pyghmi``: sleep = chassis soft off (``shutdown``), then hard ``off`` after
``graceful_timeout_s`` when allowed; wake = ``on``. Address ``ipmi://HOST[:PORT]`` (623 by default); the login
comes from the credentials file, by node or HOST[:PORT].

One session per BMC is kept and reused (pyghmi keeps sessions per BMC in the process, and a second
``Command`` to a BMC while the first is open does not log in again cleanly); a call that fails on it drops it
and is tried once more on a fresh one. At most ``max_sessions`` are kept (least recently used dropped), and
every request and poll is preceded by the action's checkpoint (deadline, Lease)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from pyghmi import exceptions as ipmi_exc
from pyghmi.ipmi import command

from joulesched.live.actuators.base import OFF, ON, UNKNOWN, ActuatorError, Target, after_power_off, marked, split_host
from joulesched.live.actuators.credentials import Credentials


class IpmiActuator:
    name = "ipmi"

    def __init__(self, credentials: Credentials | None = None, *, force_off: bool = True,
                 graceful_timeout_s: float = 120.0, poll_s: float = 1.0, max_sessions: int = 64) -> None:
        self.credentials = credentials or Credentials()
        self.force_off, self.graceful_timeout_s, self.poll_s = force_off, graceful_timeout_s, poll_s
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, command.Command] = OrderedDict()
        self._lock = threading.Lock()
        self._host_locks: dict[str, threading.Lock] = {}  # one per BMC host seen (as many as the nodes')

    def _cmd(self, target: Target, fresh: bool = False) -> command.Command:
        host = target.address.host
        bmc, port = split_host(host)  # [v6]:port too
        login = self.credentials.login(target)
        if login is None:
            raise ActuatorError(f"{target.node}: no IPMI login for {host} in the credentials file")
        target.checkpoint()
        # One lock per BMC for the login (seconds against a silent one), the shared one only for the table: a
        # dead BMC must not hold up every other node's action past its deadline (a review: 5 s per dead BMC).
        with self._lock:
            host_lock = self._host_locks.setdefault(host, threading.Lock())
        with host_lock:
            with self._lock:
                if fresh:
                    self._sessions.pop(host, None)
                c = self._sessions.get(host)
            if c is None:
                target.checkpoint()
                try:
                    c = command.Command(bmc=bmc, userid=login.username, password=login.password,
                                        port=int(port or 623))
                except (ipmi_exc.IpmiException, OSError) as e:
                    raise ActuatorError(f"{target.node}: IPMI {host}: {type(e).__name__}") from None
            with self._lock:
                self._sessions[host] = c
                self._sessions.move_to_end(host)
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
            return c

    def _power(self, c: command.Command) -> str:
        return c.get_power().get("powerstate", "")

    def _session(self, target: Target) -> command.Command:
        """The BMC's session, checked with a status read; a broken one is replaced once."""
        c = self._cmd(target)
        try:
            self._power(c)
            return c
        except ipmi_exc.IpmiException:
            return self._cmd(target, fresh=True)

    def sleep(self, target: Target) -> None:
        try:
            c = self._session(target)
            if self._power(c) == "off":
                return
            target.checkpoint()
        except ipmi_exc.IpmiException as e:
            raise ActuatorError(f"{target.node}: IPMI power off: {type(e).__name__}") from None
        try:
            c.set_power("shutdown")
        except ipmi_exc.IpmiException as e:
            # pyghmi does not tell a request the BMC never answered (done or not) from one it refused: taken as
            # possibly done, so the node stays cordoned until its kubelet is seen to outlive the sleep.
            raise marked(ActuatorError(f"{target.node}: IPMI power off: {type(e).__name__}")) from None
        # Accepted: the OS may be shutting down while the BMC still reads on, whatever fails from here on.
        with after_power_off():
            try:
                deadline = time.monotonic() + self.graceful_timeout_s
                while True:
                    target.checkpoint()
                    if self._power(c) == "off":
                        break
                    if time.monotonic() >= deadline:
                        if not self.force_off:
                            raise ActuatorError(f"{target.node}: still on {self.graceful_timeout_s:g} s after a "
                                                "soft off (hard off is not allowed)")
                        target.checkpoint()  # never a hard off once another replica leads
                        target.before_force()  # nor under a pod that landed on the node since the last check
                        # (at least 1 s: a wait of 0 returns at once, and an unconfirmed off read as done)
                        c.set_power("off", wait=max(1, int(target.budget(30))))
                        break
                    target.pause(self.poll_s)
            except ipmi_exc.IpmiException as e:
                raise ActuatorError(f"{target.node}: IPMI power off: {type(e).__name__}") from None

    def wake(self, target: Target) -> None:
        try:
            c = self._session(target)
            if self._power(c) != "on":
                target.checkpoint()
                c.set_power("on")
        except ipmi_exc.IpmiException as e:
            raise ActuatorError(f"{target.node}: IPMI power on: {type(e).__name__}") from None

    def state(self, target: Target) -> str:
        try:
            return {"on": ON, "off": OFF}.get(self._power(self._session(target)), UNKNOWN)
        except ipmi_exc.IpmiException as e:
            raise ActuatorError(f"{target.node}: IPMI power status: {type(e).__name__}") from None
