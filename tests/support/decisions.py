"""Run a policy in the twin up to a time and read back every pod's node: the honesty tests' probe (a decision made
before time T must not move when durations the run has not seen by T change)."""

from __future__ import annotations

import numpy as np

from joulesched.agent.runner import run_policy
from joulesched.cluster.twin import Twin


def decisions(twin: Twin, policy, seed: int, until: float = float("inf")) -> list[int]:
    """Each pod's node after run_policy's loop has decided every pod arriving before ``until``."""
    if until == float("inf"):
        run_policy(twin, policy, seed)
        return list(twin.pod_node)
    rng = np.random.default_rng(seed)
    policy.attach(twin)
    twin.begin()
    policy.reset(twin.state, rng)
    while (d := twin.next_decision()) is not None and twin.now < until:
        twin.bind(d, policy.choose(d.state, d.pod, d.mask, meta=d.meta) if getattr(policy, "uses_meta", False)
                  else policy.choose(d.state, d.pod, d.mask))
    policy.detach(twin)
    return list(twin.pod_node)


def drive(twin: Twin, spec: str, n: int, seed: int = 0) -> None:
    """Begin ``twin`` and bind its first ``n`` decisions as policy ``spec`` chooses (reset on each new state): a run
    to a point, for tests that then look at what an observer or a planner made of it."""
    from joulesched.agent.policy import decide
    from joulesched.agent.registry import make_policy

    policy, rng, st = make_policy(spec), np.random.default_rng(seed), None
    twin.begin()
    for _ in range(n):
        d = twin.next_decision()
        if d.state is not st:
            st = d.state
            policy.reset(st, rng)
        twin.bind(d, decide(policy, st, d.pod, d.mask))


def unseen_durations(wl, twin: Twin, cut: int = 500, min_running: int = 10):
    """For the honesty tests, after a full run of ``twin`` on ``wl``: (cut time T, durations with every pod arriving
    from T on shuffled and the pods still running at T made 3x longer, so they still end after T, the mask of
    pods arriving before T). A policy that reads no duration before it is seen decides those pods alike."""
    t_cut = float(wl.submit_s[cut])
    start, end = np.asarray(twin.pod_start), np.asarray(twin.pod_end)
    running = (wl.submit_s < t_cut) & (start < t_cut) & (end > t_cut)
    assert running.sum() > min_running, "too few pods run across the cut for the test to mean anything"
    dur = wl.duration_s.copy()
    future = wl.submit_s >= t_cut
    dur[future] = np.random.default_rng(0).permutation(dur[future])
    dur[running] *= 3.0
    return t_cut, dur, wl.submit_s < t_cut
