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
