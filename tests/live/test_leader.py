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


class _SlowLeaseStore:
    """One Lease in memory, read and written by electors on one fake clock; a read can take ``delay`` seconds,
    during which ``meanwhile`` runs (another replica's round)."""

    def __init__(self, now: list[float]) -> None:
        self.now, self.lease, self.rv = now, None, 0

    def client(self):
        import json
        import types

        from kubernetes.client.exceptions import ApiException

        store = self

        class Coord:
            delay, meanwhile = 0.0, None

            def read_namespaced_lease(self, name, ns, **kw):
                t_answer = store.now[0] + self.delay
                if self.meanwhile is not None:
                    self.meanwhile()
                store.now[0] = max(store.now[0], t_answer)
                if store.lease is None:
                    raise ApiException(status=404)
                return types.SimpleNamespace(data=json.dumps(store.lease).encode())

            def _write(self, body, expect_rv):
                if (store.lease or {}).get("metadata", {}).get("resourceVersion") != expect_rv:
                    raise ApiException(status=409)
                store.rv += 1
                body["metadata"]["resourceVersion"] = str(store.rv)
                store.lease = body
                return types.SimpleNamespace(data=json.dumps(body).encode())

            def create_namespaced_lease(self, ns, body, **kw):
                return self._write(body, None)

            def replace_namespaced_lease(self, name, ns, body, **kw):
                return self._write(body, body["metadata"].get("resourceVersion"))

        return Coord()


def test_a_rivals_slow_read_does_not_shorten_the_leaders_term():
    """A rival timed the lease it read from when its read began: a read that started before the leader's last
    renewal and was answered after it made that renewal look older than it was, and the rival took over while
    the leader still led (a review: 0.5 s of two leaders)."""
    import types

    now = [0.0]
    store = _SlowLeaseStore(now)

    def elector(identity: str) -> LeaderElector:
        e = LeaderElector(types.SimpleNamespace(), "ns", "l", identity=identity, clock=lambda: now[0])
        e.coord = store.client()
        return e

    a, b = elector("a"), elector("b")
    assert a.try_acquire_or_renew()
    now[0] = 2.0
    assert not b.try_acquire_or_renew()
    now[0] = 3.0
    b.coord.delay = 6.0  # b's read starts at 3 and is answered at 9, with a's renewal of 8.5 in it

    def a_renews() -> None:
        now[0] = 8.5
        assert a.try_acquire_or_renew()

    b.coord.meanwhile = a_renews
    assert not b.try_acquire_or_renew()
    b.coord.delay, b.coord.meanwhile = 0.0, None
    a_ends = a.leading_until()  # a is partitioned from here on: it leads until its renew deadline
    while now[0] < a_ends + 0.01:
        assert not b.try_acquire_or_renew(), f"b took over at {now[0]} while a led until {a_ends}"
        now[0] += 0.25
