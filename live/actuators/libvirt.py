"""libvirt (KVM guests): sleep = ``virDomainManagedSave`` (RAM to disk, domain stopped), wake =
``virDomainCreate`` (restores the saved image). Address ``libvirt:///DOMAIN``; the connection URI is an option
(``qemu:///system`` by default; ``test:///default`` is libvirt's in-process test driver).

No call outlives the action's deadline, and a host that stops answering holds up no other action:

- libvirt's default event loop runs in a daemon thread (registered once per process, before the first connection
  to a libvirt daemon) and each connection has a keepalive (:data:`KEEPALIVE_INTERVAL_S` x
  :data:`KEEPALIVE_COUNT`): a peer that stops answering closes the connection, and the calls on it fail;
- each request (the connect; a domain's lookup with its state, save or start) runs in a worker thread the action
  waits on until its deadline, then gives up with :class:`ActuatorError`, leaving the worker to finish on its
  own; a connect under way is shared by the actions that need it, never started twice;
- the actuator's lock guards only its connection cache, never a call to libvirt.

A URI that carries the session unencrypted (the ``tcp`` transport, e.g. ``qemu+tcp://``) or skips checking the
peer (``no_verify=1``, ``known_hosts_verify=ignore``) is refused (:class:`AddressError`) unless
``allow_insecure`` (``--allow-libvirt-insecure``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from joulesched.core.net import insecure_libvirt_uri
from joulesched.live.actuators.base import (
    OFF,
    ON,
    TRANSITIONING,
    ActuatorError,
    AddressError,
    NoAnswer,
    Target,
    marked,
    redact,
)

try:
    import libvirt
except ImportError:  # libvirt-python compiles against libvirt-dev; without it this actuator says so when built
    libvirt = None

log = logging.getLogger("joulesched.nodepower.libvirt")

#: Keepalive of each connection: a probe every KEEPALIVE_INTERVAL_S seconds of silence, the connection closed
#: after KEEPALIVE_COUNT unanswered ones (a dead peer is noticed within about 20 s).
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
_POLL_S = 0.2  # how often a waiting action checks its Lease

_loop_lock = threading.Lock()
_loop_running = False


def insecure_uri_reason(uri: str) -> str | None:
    """Why ``uri`` would expose the libvirt session or skip checking the peer; ``None`` if it does neither."""
    try:
        return insecure_libvirt_uri(uri)
    except ValueError as e:
        raise AddressError(f"--libvirt-uri: not a URI ({e})") from None


def check_uri(uri: str, allow_insecure: bool = False) -> None:
    """Raise :class:`AddressError` (bad input, exit 2) for an insecure ``uri`` unless ``allow_insecure``."""
    reason = insecure_uri_reason(uri)
    if reason is not None and not allow_insecure:
        raise AddressError(f"--libvirt-uri {redact(uri)!r}: {reason}; pass --allow-libvirt-insecure to accept it")


def _in_process(uri: str) -> bool:
    """The test driver without a transport or host runs inside this process: no daemon, no keepalive."""
    u = urlsplit(uri)
    return u.scheme == "test" and not u.netloc


def _run_event_loop() -> None:
    while True:
        try:
            libvirt.virEventRunDefaultImpl()
        except libvirt.libvirtError as e:
            log.warning("libvirt event loop: %s", e.get_error_message())
            time.sleep(1.0)


def ensure_event_loop() -> None:
    """Register libvirt's default event loop and run it in a daemon thread, once per process. Keepalives need
    it; a connection opened before it has none."""
    global _loop_running
    with _loop_lock:
        if _loop_running:
            return
        try:
            libvirt.virEventRegisterDefaultImpl()
        except libvirt.libvirtError as e:  # another event loop is registered: it serves the keepalives
            log.warning("libvirt event loop not registered: %s", e.get_error_message())
        else:
            threading.Thread(target=_run_event_loop, name="libvirt-event-loop", daemon=True).start()
        _loop_running = True


class _OpenFailed(Exception):
    """libvirt.open failed (its message); each waiting action words it for its own node."""


class _Request:
    """One blocking call in a daemon thread; each waiter gives up at its own deadline."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn,), name=name, daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # handed to the waiters
            self._error = e
        finally:
            self._done.set()

    def result(self, target: Target, what: str, power_off: bool = False) -> Any:
        """The call's value, or its error; given up at the target's deadline. ``power_off``: a call that may
        still switch the machine off once given up (a managedSave waiting for the domain's job lock): the
        error is then marked, since the machine may yet go down (:func:`off_requested`)."""
        while not self._done.wait(max(0.0, min(_POLL_S, target.deadline - time.monotonic()))):
            target.check()
            if time.monotonic() >= target.deadline:
                e = NoAnswer(f"{target.node}: {what}: no answer by the action's deadline (left to finish in the "
                             "background)")
                raise marked(e) if power_off else e
        if isinstance(self._error, ActuatorError):
            raise type(self._error)(str(self._error)) from None  # a fresh one per waiter
        if self._error is not None:
            raise self._error
        return self._value


class LibvirtActuator:
    name = "libvirt"

    def __init__(self, uri: str = "qemu:///system", allow_insecure: bool = False) -> None:
        check_uri(uri, allow_insecure)
        if libvirt is None:
            raise ActuatorError("the libvirt actuator needs libvirt-python (pip install 'joulesched[node-power]' "
                                "with libvirt-dev installed)")
        self.uri = uri
        self._conn = None
        self._opening: _Request | None = None
        self._lock = threading.Lock()  # the connection cache only: never held across a call to libvirt
        libvirt.registerErrorHandler(lambda *_: None, None)  # errors are raised, not also printed to stderr
        if not _in_process(uri):
            ensure_event_loop()

    def _open(self):
        try:
            conn = libvirt.open(self.uri)
        except BaseException as e:
            with self._lock:
                self._opening = None  # the next action tries again
            if isinstance(e, libvirt.libvirtError):
                raise _OpenFailed(e.get_error_message()) from None
            raise
        try:
            conn.setKeepAlive(KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT)
        except libvirt.libvirtError as e:  # the in-process test driver has no keepalive
            log.debug("libvirt %s: no keepalive: %s", self.uri, e.get_error_message())
        with self._lock:
            stale, self._conn, self._opening = self._conn, conn, None
        if stale is not None:
            _close_quietly(stale)
        return conn

    def _connection(self, target: Target):
        with self._lock:
            conn = self._conn
        if conn is not None and _alive(conn):
            return conn
        with self._lock:
            if self._conn is not conn and self._conn is not None:  # another action reconnected meanwhile
                return self._conn
            if self._opening is None:
                self._opening = _Request(self._open, f"libvirt-open {self.uri}")
            opening = self._opening
        where = f"libvirt {self.uri} domain {target.address.path}"
        try:
            return opening.result(target, f"{where}: connect")
        except _OpenFailed as e:
            raise ActuatorError(f"{target.node}: {where}: {e}") from None

    def _call(self, target: Target, what: str, fn: Callable[[Any], Any], power_off: bool = False) -> Any:
        """``fn(domain)`` for the target's domain, in a worker, given up at the action's deadline."""
        target.checkpoint()
        conn = self._connection(target)
        target.checkpoint()
        name = target.address.path

        def run():
            try:
                dom = conn.lookupByName(name)
            except libvirt.libvirtError as e:
                raise ActuatorError(f"{target.node}: libvirt {self.uri} domain {name}: "
                                    f"{e.get_error_message()}") from None
            target.checkpoint()  # never sent once the action has given up (its waiter told the controller so)
            try:
                return fn(dom)
            except libvirt.libvirtError as e:
                raise ActuatorError(f"{target.node}: {what} of {name}: {e.get_error_message()}") from None

        return _Request(run, f"libvirt {what} {name}").result(target, f"{what} of {name}", power_off)

    def sleep(self, target: Target) -> None:
        def save(dom) -> None:
            if dom.isActive():  # else already saved or off
                dom.managedSave(0)

        self._call(target, "managedSave", save, power_off=True)

    def wake(self, target: Target) -> None:
        def start(dom) -> None:
            if not dom.isActive():
                dom.create()  # with a managed save image this restores it

        self._call(target, "start", start)

    def state(self, target: Target) -> str:
        st = self._call(target, "state", lambda dom: dom.state()[0])
        if st == libvirt.VIR_DOMAIN_RUNNING:
            return ON
        if st in (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_PMSUSPENDED, libvirt.VIR_DOMAIN_CRASHED):
            return OFF
        return TRANSITIONING

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)


def _alive(conn) -> bool:
    """A local check, no request to the peer (false once a keepalive found the peer gone)."""
    try:
        return conn.isAlive() == 1
    except libvirt.libvirtError:
        return False


def _close_quietly(conn) -> None:
    try:
        conn.close()
    except libvirt.libvirtError:
        pass
