"""libvirt (KVM guests): sleep = ``virDomainManagedSave`` (RAM to disk, domain stopped), wake =
``virDomainCreate`` (restores the saved image). Address ``libvirt:///DOMAIN``; the connection URI is an option
(``qemu:///system`` by default; ``test:///default`` is libvirt's in-process test driver)."""

from __future__ import annotations

import threading

from joulesched.live.actuators.base import OFF, ON, TRANSITIONING, ActuatorError, Target

try:
    import libvirt
except ImportError:  # libvirt-python compiles against libvirt-dev; without it this actuator says so when built
    libvirt = None


class LibvirtActuator:
    name = "libvirt"

    def __init__(self, uri: str = "qemu:///system") -> None:
        if libvirt is None:
            raise ActuatorError("the libvirt actuator needs libvirt-python (pip install 'joulesched[node-power]' "
                                "with libvirt-dev installed)")
        self.uri = uri
        self._conn = None
        self._lock = threading.Lock()
        libvirt.registerErrorHandler(lambda *_: None, None)  # errors are raised, not also printed to stderr

    def _domain(self, target: Target):
        target.checkpoint()
        with self._lock:
            try:
                if self._conn is None or not self._conn.isAlive():
                    self._conn = libvirt.open(self.uri)
                return self._conn.lookupByName(target.address.path)
            except libvirt.libvirtError as e:
                raise ActuatorError(f"{target.node}: libvirt {self.uri} domain {target.address.path}: "
                                    f"{e.get_error_message()}") from None

    def sleep(self, target: Target) -> None:
        dom = self._domain(target)
        try:
            if not dom.isActive():
                return  # already saved or off
            dom.managedSave(0)
        except libvirt.libvirtError as e:
            raise ActuatorError(f"{target.node}: managedSave of {target.address.path}: "
                                f"{e.get_error_message()}") from None

    def wake(self, target: Target) -> None:
        dom = self._domain(target)
        try:
            if dom.isActive():
                return
            dom.create()  # with a managed save image this restores it
        except libvirt.libvirtError as e:
            raise ActuatorError(f"{target.node}: start of {target.address.path}: {e.get_error_message()}") from None

    def state(self, target: Target) -> str:
        dom = self._domain(target)
        try:
            st = dom.state()[0]
        except libvirt.libvirtError as e:
            raise ActuatorError(f"{target.node}: state of {target.address.path}: {e.get_error_message()}") from None
        if st == libvirt.VIR_DOMAIN_RUNNING:
            return ON
        if st in (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_PMSUSPENDED, libvirt.VIR_DOMAIN_CRASHED):
            return OFF
        return TRANSITIONING

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except libvirt.libvirtError:
                    pass
                self._conn = None
