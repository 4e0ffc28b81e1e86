"""Machines behind the emulated cluster, for the node power controller's tests.

Each emulated node is backed by a libvirt domain of libvirt's in-process test driver (``test:///default``:
real libvirt API semantics, ``managedSave`` and ``create`` included, and no VM), driven by the real libvirt
actuator. What no apiserver emulator has is a kubelet, so :class:`Kubelets` plays the nodes' kubelets: a node
reports ``Ready=True`` once its machine has been on for ``boot_s``, and ``Unknown`` once it is off, as a real
node does when its kubelet stops posting status. The kubelets are the mock part; say so in tests that use them.

Without libvirt-python (it compiles against libvirt-dev, installed by ``make test``) the fixtures skip.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.support.kube_emulator import KubeEmulator

DOMAIN_XML = ("<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
              "<os><type>hvm</type></os></domain>")


def libvirt_test_conn():
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed (make test builds it against "
                                                    "libvirt-dev); the node power e2e tests need it")
    libvirt.registerErrorHandler(lambda *_: None, None)
    return libvirt.open("test:///default")


class Machines:
    """Test-driver domains, one per node, named uniquely per test (the test driver is shared in a process)."""

    def __init__(self) -> None:
        self.conn = libvirt_test_conn()
        self.tag = uuid.uuid4().hex[:6]
        self.domains: dict[str, str] = {}
        #: node -> power address: the operator's address map for these machines (the controller's --addresses).
        self.addresses: dict[str, str] = {}

    def domain(self, node: str) -> str:
        return self.domains.setdefault(node, f"{node}-{self.tag}")

    def add(self, node: str, running: bool = True) -> str:
        name = self.domain(node)
        dom = self.conn.defineXML(DOMAIN_XML.format(name=name))
        if running:
            dom.create()
        self.addresses[node] = f"libvirt:///{name}"
        return self.addresses[node]

    def lookup(self, node: str):
        return self.conn.lookupByName(self.domains[node])

    def running(self, node: str) -> bool:
        return bool(self.lookup(node).isActive())

    def saved(self, node: str) -> bool:
        d = self.lookup(node)
        return not d.isActive() and bool(d.hasManagedSaveImage(0))

    def remove(self, node: str) -> None:
        import libvirt

        try:
            d = self.lookup(node)
        except libvirt.libvirtError:
            return
        if d.isActive():
            d.destroy()
        d.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)

    def close(self) -> None:
        for node in list(self.domains):
            self.remove(node)
        self.conn.close()


class Kubelets:
    """Emulated kubelets: node Ready follows its machine (see the module docstring), and a running, booted
    node renews its Lease in ``kube-node-lease`` every ``lease_s``, as a kubelet does (the heartbeat the node
    power controller waits for after a wake)."""

    def __init__(self, emu: KubeEmulator, machines: Machines, boot_s: float = 0.05, period_s: float = 0.02,
                 lease_s: float = 0.2) -> None:
        self.emu, self.machines, self.boot_s, self.period_s, self.lease_s = emu, machines, boot_s, period_s, lease_s
        self._renewed: dict[str, float] = {}
        self._on_since: dict[str, float] = {}
        self._ready: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelets", daemon=True)
        #: (monotonic time, node, ready) of every Ready change the kubelets reported.
        self.log: list[tuple[float, str, bool]] = []

    def start(self) -> "Kubelets":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        import libvirt

        while not self._stop.is_set():
            now = time.monotonic()
            for node in list(self.machines.domains):
                try:
                    on = self.machines.running(node)
                except libvirt.libvirtError:
                    on = False  # no machine at all
                if on:  # a machine already on when first seen has booted long ago
                    self._on_since.setdefault(node, now if node in self._ready else -1e9)
                else:
                    self._on_since.pop(node, None)
                ready = on and now - self._on_since[node] >= self.boot_s
                if self._ready.get(node) != ready and self.emu.get("nodes", node) is not None:
                    self.emu.set_node_ready(node, ready)
                    self._ready[node] = ready
                    self.log.append((now, node, ready))
                if ready and now - self._renewed.get(node, -1e9) >= self.lease_s:
                    self.emu.renew_node_lease(node)
                    self._renewed[node] = now
            self._stop.wait(self.period_s)
