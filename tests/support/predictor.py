"""A lifetime-aware policy whose online predictor has already seen some pods end: the hand-worked tests' start."""

from __future__ import annotations

import numpy as np

from joulesched.agent.registry import make_policy


def taught_policy(spec: str, st, lives: dict):
    """``spec`` built and reset on ``st``, its predictor taught ``lives`` (meta -> finished lifetimes, seconds);
    returns (policy, predictor)."""
    pol = make_policy(spec)
    pol.reset(st, np.random.default_rng(0))
    pred = pol.feed.predictor
    for meta, ls in lives.items():
        for life in ls:
            pred.model.observe(pred.kid_of(meta), life)
    return pol, pred
