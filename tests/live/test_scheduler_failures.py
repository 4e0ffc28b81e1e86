"""What the scheduler does when a part of it fails (a review, 2026-12-07): a policy whose reset raises on a new
cluster shape, and a PodScheduled condition the event recorder drops at once (its queue full)."""

from __future__ import annotations

import pytest

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.live.scheduler import Scheduler, ServeConfig
from tests.live.conftest import wait_until


class _ResetFailsOnce:
    """default-k8s, but its second reset (a new ClusterState: a node was added) raises."""

    name, scorer = "reset-fails-once", None

    def __init__(self) -> None:
        self.inner, self.resets = make_policy("default-k8s"), 0

    def reset(self, st, rng) -> None:
        self.resets += 1
        if self.resets == 2:
            raise ValueError("this policy cannot read the new node")
        self.inner.reset(st, rng)

    def choose(self, st, pod, mask):
        return self.inner.choose(st, pod, mask)


@pytest.fixture
def scheduler(emu):
    made: list[Scheduler] = []

    def make(policy, **kw) -> Scheduler:
        cfg = ServeConfig(leader_elect=False, lease_namespace="default", event_writer="thread", **kw)
        s = Scheduler(KubeCache(api_client_for(emu.url)), policy, cfg)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def _node(emu, pod: str) -> str:
    return emu.get("pods", pod, "default")["spec"].get("nodeName") or ""


def test_a_policy_whose_reset_raises_loses_no_pod_and_holds_no_lock(emu, scheduler):
    """The reset ran outside the loop's error handling: its exception ended the scheduling thread while it held
    the cache's lock, so the informers blocked for good and no pod was bound again."""
    emu.add_node("n1")
    policy = _ResetFailsOnce()
    s = scheduler(policy, backoff_initial_s=0.05, backoff_max_s=0.2).start()
    emu.add_pod("p1", cpu="100m")
    wait_until(lambda: _node(emu, "p1"), 10, "p1 bound")
    emu.add_node("n2")  # a new cluster shape: the next decision resets the policy, which raises once
    wait_until(lambda: "n2" in s.cache.nodes, 10, "n2 in the cache")
    emu.add_pod("p2", cpu="100m")
    emu.add_pod("p3", cpu="100m")
    wait_until(lambda: _node(emu, "p2") and _node(emu, "p3"), 10, "p2 and p3 bound (the reset tried again)")
    assert policy.resets >= 3 and s._loop_thread.is_alive()
    assert s.metrics.attempts.labels("error")._value.get() >= 1
    assert s.cache.lock.acquire(timeout=1.0)
    s.cache.lock.release()


def test_a_condition_the_recorder_drops_at_once_is_written_on_a_later_attempt(emu, scheduler):
    """The drop reset the pod's last failure so that the next attempt writes the condition again, and the line
    after the call set it back: no PodScheduled=False was ever written (cluster-autoscaler scales up for it)."""
    emu.add_node("n1", cpu="1")
    s = scheduler(make_policy("default-k8s"), backoff_initial_s=0.05, backoff_max_s=0.2)
    rec, put, drops = s.recorder, s.recorder._put, []

    def put_dropping_the_first_condition(key, args):
        if key[0] == "condition" and not drops:
            drops.append(key)
            rec._dropped(key, "the recorder's queue is full")  # as _put does on queue.Full
            return
        put(key, args)

    rec._put = put_dropping_the_first_condition
    s.start()
    emu.add_pod("big", cpu="8")

    def condition():
        return [c for c in emu.get("pods", "big", "default")["status"].get("conditions") or []
                if c["type"] == "PodScheduled"]

    wait_until(condition, 10, "a PodScheduled condition on the pod")
    assert drops and condition()[0]["status"] == "False" and condition()[0]["reason"] == "Unschedulable"


def test_a_watch_on_a_connection_that_went_silent_is_opened_again(emu, monkeypatch):
    """A connection that dies without a FIN or RST (the apiserver's host gone, a NAT dropping it) kept the watch
    "open" until the server-side timeout plus 30 s: the cache froze while /healthz stayed green (a review). Now
    a watch silent for WATCH_QUIET_S (90 s, not even a bookmark) is opened again, and counts as stale past it."""
    import socket
    import threading
    import time

    import joulesched.cluster.kube.informer as informer

    monkeypatch.setattr(informer, "WATCH_QUIET_S", 1.0)
    emu.add_node("n1")
    dead: set[int] = set()
    opened: list[int] = []
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)

    def pump(a: socket.socket, b: socket.socket, conn: int) -> None:
        try:
            while d := a.recv(65536):
                if conn not in dead:  # a dead path: bytes vanish, nobody is told
                    b.sendall(d)
        except OSError:
            pass

    def accept() -> None:
        while True:
            try:
                c, _ = lst.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", emu.port))
            opened.append(len(opened))
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=pump, args=(a, b, opened[-1]), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    cache = KubeCache(api_client_for(f"http://127.0.0.1:{lst.getsockname()[1]}"))
    cache.start()
    try:
        assert cache.wait_synced(10)
        wait_until(lambda: cache.node_informer.streaming, 10, "the node watch open")
        # A healthy quiet watch (the emulator sends no bookmarks) is opened again each WATCH_QUIET_S, quietly:
        # never counted as an interrupted one, and never stale meanwhile (a review: stale jumped past the quiet
        # time at each reopen, a /healthz blip)
        worst = 0.0
        t_end = time.monotonic() + 2.5
        while time.monotonic() < t_end:
            worst = max(worst, cache.node_informer.stale_for())
            time.sleep(0.01)
        assert cache.node_informer.resumes == 0 and worst < 0.5, (cache.node_informer.resumes, worst)
        dead.update(opened)  # every connection open now goes silent; new ones work
        emu.add_node("n2")
        t0 = time.monotonic()
        wait_until(lambda: "n2" in cache.nodes, 10, "n2 seen through a watch opened again")
        assert time.monotonic() - t0 < 5
    finally:
        cache.stop()
        lst.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        lst.close()
        acceptor.join(5)


@pytest.mark.parametrize("command, spec", [("serve", "dqn=models/small.pt"), ("serve", "clairvoyant"),
                                           ("extender", "dqn=models/small.pt")])
def test_a_policy_for_the_twin_only_is_refused_before_anything_starts(command, spec):
    """A review: `serve --policy dqn=models/small.pt` started the cache, the Lease and /healthz, then its loop
    thread died on the refusal in attach(): a process that scheduled nothing and looked healthy for 30 s."""
    from typer.testing import CliRunner

    from joulesched.pipelines.cli import app

    r = CliRunner().invoke(app, [command, "--policy", spec, "--kubeconfig", "/nonexistent/kubeconfig"])
    assert r.exit_code == 2 and "runs in the twin only" in r.output, r.output


def test_a_scheduling_loop_that_ends_says_so_in_healthz_at_once(emu, scheduler):
    class Refuses:
        name, scorer = "refuses", None

        def attach(self, backend) -> None:
            from joulesched.agent.policy import PolicyError

            raise PolicyError("this policy cannot run here")

        def reset(self, st, rng) -> None:
            pass

        def choose(self, st, pod, mask):
            return 0

    emu.add_node("n1")
    s = scheduler(Refuses()).start()
    wait_until(lambda: not s._loop_thread.is_alive(), 10, "the loop ended")
    checks = {name: (ok, why) for name, ok, why in s.health_checks()}
    assert checks["scheduling-loop"] == (False, "ended: PolicyError: this policy cannot run here")
