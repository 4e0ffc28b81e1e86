"""Leader election on a coordination.k8s.io/v1 Lease: one binder at a time, takeover on release or expiry."""

from __future__ import annotations

from joulesched.cluster.kube.client import api_client_for
from joulesched.live.leader import LeaderElector
from tests.live.conftest import wait_until

T = dict(lease_duration_s=0.6, renew_deadline_s=0.4, retry_period_s=0.05)


def test_one_leader_then_takeover_on_release(emu):
    a = LeaderElector(api_client_for(emu.url), "default", "lk", identity="a", **T).start()
    b = LeaderElector(api_client_for(emu.url), "default", "lk", identity="b", **T).start()
    try:
        wait_until(lambda: a.is_leader() or b.is_leader())
        first, second = (a, b) if a.is_leader() else (b, a)
        for _ in range(20):
            assert not (a.is_leader() and b.is_leader())
            wait_until(lambda: True)
        first.stop(release=True)
        wait_until(second.is_leader, timeout=10, what="takeover after release")
        lease = emu.get("leases", "lk", "default")
        assert lease["spec"]["holderIdentity"] == second.identity
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        a.stop()
        b.stop()


def test_leader_steps_down_at_its_renew_deadline(emu):
    a = LeaderElector(api_client_for(emu.url), "default", "lk", identity="a", **T).start()
    try:
        wait_until(a.is_leader)
        emu.faults.add("500", "update:leases", times=-1)  # renewals fail from now on
        wait_until(lambda: not a.is_leader(), timeout=10, what="a stepping down at its renew deadline")
        end = a.terms[-1][1]
        assert abs(end - a._renewed_at - T["renew_deadline_s"]) < 1e-9
    finally:
        emu.faults.clear()
        a.stop()


def test_crashed_leader_is_replaced_after_a_full_lease_duration(emu):
    import time

    a = LeaderElector(api_client_for(emu.url), "default", "lk", identity="a", **T).start()
    wait_until(a.is_leader)
    b = LeaderElector(api_client_for(emu.url), "default", "lk", identity="b", **T).start()
    try:
        wait_until(lambda: b._observed is not None)
        a.stop(release=False)  # a crash: the lease still names a
        t_crash = time.monotonic()
        wait_until(b.is_leader, timeout=10, what="b taking the expired lease")
        assert time.monotonic() - t_crash >= T["lease_duration_s"] - T["renew_deadline_s"]
        assert a.terms[-1][1] <= b.terms[-1][0]  # the terms do not overlap
    finally:
        a.stop()
        b.stop()


def test_conflicting_writes_give_one_winner(emu):
    a = LeaderElector(api_client_for(emu.url), "default", "lk", identity="a", **T)
    b = LeaderElector(api_client_for(emu.url), "default", "lk", identity="b", **T)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False  # held and fresh
    emu.faults.add("409", "update:leases", times=1)
    assert a.try_acquire_or_renew() is False  # a stale resourceVersion is a lost round, not an error
    assert a.try_acquire_or_renew() is True


def test_a_renewal_after_the_renew_deadline_starts_a_new_term(emu):
    # A leader whose renewals stalled past its renew deadline (a long GC pause, a slow apiserver) and then
    # succeed has not led in between: what it began before must not pass the term guard (live/nodepower.py).
    now = [0.0]
    seen: list[bool] = []
    a = LeaderElector(api_client_for(emu.url), "default", "lk", identity="a", clock=lambda: now[0],
                      on_change=seen.append, **T)
    assert a.try_acquire_or_renew() and a.transitions == 1
    now[0] += T["renew_deadline_s"] / 2
    assert a.try_acquire_or_renew() and a.transitions == 1  # in time: the same term
    now[0] += T["renew_deadline_s"] * 2
    assert not a.is_leader()
    assert a.try_acquire_or_renew() and a.is_leader()
    assert a.transitions == 2 and seen == [True, False, True]
    assert len(a.terms) == 2 and a.terms[0][1] <= a.terms[1][0]
