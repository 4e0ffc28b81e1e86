"""Fixtures for the live-scheduling tests: the Kubernetes API emulator (real HTTP, real `kubernetes` client;
no kube-apiserver can run here, see cluster/kube_emulator.py) and schedulers that are always stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.live.scheduler import Scheduler, ServeConfig
from tests.support.kube_emulator import KubeEmulator

FAST = dict(backoff_initial_s=0.02, backoff_max_s=0.2, lease_duration_s=0.6, renew_deadline_s=0.4,
            retry_period_s=0.05, request_timeout_s=5.0)


def wait_until(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def emu() -> Iterator[KubeEmulator]:
    e = KubeEmulator().start()
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture
def make_scheduler(emu: KubeEmulator) -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def make(policy: str = "default-k8s", *, start: bool = True, backend_kw: dict | None = None, **kw) -> Scheduler:
        cfg = ServeConfig(**{**FAST, "leader_elect": False, "lease_namespace": "default", **kw})
        backend = KubeCache(api_client_for(emu.url), **(backend_kw or {}))
        s = Scheduler(backend, make_policy(policy), cfg)
        made.append(s)
        return s.start() if start else s

    yield make
    for s in made:
        s.stop()


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra:
            return
        time.sleep(0.05)
    raise AssertionError(f"threads left running: {[t.name for t in extra]}")
