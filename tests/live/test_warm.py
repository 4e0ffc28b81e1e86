"""A policy's ``warm`` hook (the DQN compiles its decision loops there, agent/fused.py): a live scheduler calls it
on its loop thread before the first decision, with the cache lock free, so the informers never wait for a
compile; the extender before its first request."""

from __future__ import annotations

import threading

import numpy as np

from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.live.extender import Extender
from joulesched.live.scheduler import Scheduler, ServeConfig
from tests.live.conftest import FAST, wait_until


class _Warms:
    """The first feasible node; records the order of its calls and whether the cache lock was free in warm."""

    name = "warms"
    scorer = None

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.cache: KubeCache | None = None
        self.lock_free_in_warm: bool | None = None

    def warm(self) -> None:
        got: list[bool] = []

        def take() -> None:  # another thread (an informer's place): can it take the lock now?
            ok = self.cache.lock.acquire(timeout=5)
            got.append(ok)
            if ok:
                self.cache.lock.release()

        t = threading.Thread(target=take)
        t.start()
        t.join()
        self.lock_free_in_warm = got[0]
        self.calls.append("warm")

    def reset(self, state, rng) -> None:
        self.calls.append("reset")

    def choose(self, state, pod, mask) -> int:
        self.calls.append("choose")
        return int(np.flatnonzero(mask)[0])


def test_serve_warms_the_policy_before_its_first_decision_with_the_lock_free(emu):
    emu.add_node("n0", cpu="4", memory="8Gi")
    emu.add_pod("p0", scheduler_name="joulesched", cpu="100m", memory="64Mi")
    pol = _Warms()
    pol.cache = cache = KubeCache(api_client_for(emu.url))
    s = Scheduler(cache, pol, ServeConfig(**{**FAST, "leader_elect": False, "lease_namespace": "default"})).start()
    try:
        wait_until(lambda: len(emu.bindings) == 1, what="the pod bound")
    finally:
        s.stop()
    assert pol.calls[:3] == ["warm", "reset", "choose"]
    assert pol.calls.count("warm") == 1
    assert pol.lock_free_in_warm is True


def test_the_extender_warms_the_policy_when_it_is_built(emu):
    pol = _Warms()
    pol.cache = cache = KubeCache(api_client_for(emu.url))
    Extender(cache, pol)
    assert pol.calls == ["warm"] and pol.lock_free_in_warm is True
