"""Batches (``ServeConfig.batch``): several decisions in a row under one hold of the cache lock make the same
choices as one pod at a time, release the lock when nothing is ready, and end at HOLD_MAX_S."""

from __future__ import annotations

import time

import numpy as np

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.live.scheduler import HOLD_MAX_S, Scheduler, ServeConfig
from tests.live.conftest import FAST, wait_until
from tests.support.kube_emulator import KubeEmulator

N_PODS = 40


def _batch_sizes(s: Scheduler) -> dict[float, float]:
    """The batch histogram's cumulative bucket counts, by upper bound."""
    out = {}
    for m in s.registry.collect():
        if m.name == "joulesched_scheduling_batch_size":
            for smp in m.samples:
                if smp.name.endswith("_bucket"):
                    out[float(smp.labels["le"])] = smp.value
                elif smp.name.endswith("_count"):
                    out["count"] = smp.value
                elif smp.name.endswith("_sum"):
                    out["sum"] = smp.value
    return out


def _place(batch: int, policy="most-allocated", bind_workers: int = 4):
    """Nodes of different sizes and N_PODS pods of different sizes, all pending before the scheduler starts
    (so they are decided in the order the list gave them); returns the placements, the batch histogram, and
    whether the lock was free once the queue was empty."""
    emu = KubeEmulator().start()
    try:
        for i, cpu in enumerate([2, 3, 4, 2, 6, 3]):
            emu.add_node(f"n{i}", cpu=str(cpu), memory="16Gi")
        for k in range(N_PODS):
            emu.add_pod(f"p{k:02d}", cpu=f"{100 + 50 * (k * 7 % 9)}m", memory="128Mi")
        pol = make_policy(policy) if isinstance(policy, str) else policy
        cfg = ServeConfig(**{**FAST, "leader_elect": False, "lease_namespace": "default", "batch": batch,
                             "bind_workers": bind_workers})
        s = Scheduler(KubeCache(api_client_for(emu.url)), pol, cfg).start()
        try:
            wait_until(lambda: len(emu.bindings) == N_PODS, timeout=30, what="every pod bound")
            wait_until(lambda: s.pending() == 0, what="empty queue")
            time.sleep(0.1)
            free = s.cache.lock.acquire(timeout=1.0)
            if free:
                s.cache.lock.release()
            return {b[1]: b[3] for b in emu.bindings}, _batch_sizes(s), free
        finally:
            s.stop()
    finally:
        emu.stop()


def test_batched_decisions_are_the_one_at_a_time_decisions():
    one, h1, free1 = _place(batch=1)
    many, h8, free8 = _place(batch=8)
    assert len(one) == len(many) == N_PODS
    assert many == one  # each decision saw every earlier assumption, batched or not
    assert h1.get("count", 0) == 0  # batch=1: the lock is taken per pod, no holds
    # batch=8: every decision of a hold is counted, and the first hold (all pods ready, four free binding
    # slots) made more than one
    assert h8["sum"] == N_PODS
    assert h8[1.0] < h8["count"]
    assert h8[8.0] == h8["count"]  # never more than batch
    assert free1 and free8  # released once nothing was ready


class _Slow:
    """most-allocated, 4 ms per decision."""

    name = "slow"

    def __init__(self) -> None:
        self.inner = make_policy("most-allocated")

    def reset(self, state, rng) -> None:
        self.inner.reset(state, rng)

    def choose(self, state, pod, mask) -> int:
        time.sleep(0.004)
        return self.inner.choose(state, pod, mask)


def test_a_hold_ends_at_hold_max_s():
    placed, h, free = _place(batch=64, policy=_Slow(), bind_workers=64)
    assert len(placed) == N_PODS and free
    # a hold goes on only while it is younger than HOLD_MAX_S: at 4 ms a decision, at most
    # HOLD_MAX_S / 4 ms + 1 of them (sleep overshoots, never undershoots)
    most = int(np.floor(HOLD_MAX_S / 0.004)) + 1
    assert h[4.0] == h["count"] and most <= 4, (h, most)
    assert h["sum"] == N_PODS and h["count"] >= N_PODS / most
