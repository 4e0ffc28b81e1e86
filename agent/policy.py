"""The Policy seam: given the cluster and a pod, pick a feasible node. The optional Scorer explains why.

A policy is any object with a ``name``, ``reset(state, rng)`` and ``choose(state, pod, mask) -> node``. It may
also score nodes (``scorer``): kube's plugin scores, marginal watts, a DQN's advantages. ``explain`` and the
extender read those scores through :class:`Scorer`, so they never need to know which policy they hold. A
policy that only picks sets ``scorer = None``; :class:`PolicyBase` gives that default.

Policies are built from a spec (``NAME``, ``NAME:key=value,...`` or ``NAME=PATH``) by
:func:`joulesched.agent.registry.make_policy`; third-party ones register under the ``joulesched.policies``
entry-point group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from joulesched.cluster.state import ClusterState, PodRequest
from joulesched.core.errors import UsageError


class PolicyError(UsageError):
    """An unknown policy name, a bad option, or a model file that cannot be used."""


@dataclass(frozen=True)
class NodeScores:
    """What a policy thinks of the candidate nodes ``idx`` (indices into the ClusterState).

    ``plugins`` maps a score's name to ``(weight, per-candidate values)``; ``total`` is what the policy
    maximises (higher is better), aligned with ``idx``. ``rule`` says how the plugins make the total: ``sum``,
    total = sum of weight x value (a weight of 0: shown, not part of it); ``lexicographic``, candidates compared
    plugin by plugin in the listed order, lower first where the weight is negative and higher first where it is
    positive, and total = -rank (0 for the best). ``features`` optionally names the inputs behind each
    candidate's score (a learned policy's top features), as ``[{"name", "value", "contribution"}, ...]`` per
    candidate.
    """

    idx: np.ndarray
    plugins: dict[str, tuple[float, np.ndarray]]
    total: np.ndarray
    features: list[list[dict]] | None = None
    rule: str = "sum"
    note: str = ""  # how to read the plugins, where the rule alone does not say (explain prints it)


class Scorer(Protocol):
    """Per-node, per-plugin scores for one pod, as kube-scheduler-simulator shows them. The scorer of a policy
    whose ``uses_meta`` is true is called with the pod's metadata too (``meta=``; explain and the extender do),
    so that the scores shown are the ones its ``choose`` reads."""

    def node_scores(self, state: ClusterState, pod: PodRequest, idx: np.ndarray) -> NodeScores: ...


class Policy(Protocol):
    """Anything that places pods.

    ``reset`` is called before the first decision on a cluster (and again whenever a live cluster's node set
    changes) with the run's seeded generator: all randomness must come from it. ``choose`` returns the index
    of a node where ``mask`` is True. ``scorer`` is the policy's :class:`Scorer`, or None if it only picks.
    """

    name: str
    scorer: Scorer | None

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None: ...

    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray) -> int: ...


def decide(policy: Policy, state: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> int:
    """``policy.choose``, handed the pod's metadata where the policy reads it (``uses_meta``: lifetime-aware's
    predictor); for the loops outside run_policy, which binds the choice once for its hot loop."""
    if getattr(policy, "uses_meta", False):
        return int(policy.choose(state, pod, mask, meta=meta))
    return int(policy.choose(state, pod, mask))


class PolicyBase:
    """Optional base class with the protocol's defaults: no scorer, a reset that keeps the generator.

    ``family`` and ``summary`` are the metadata ``joulesched policies`` shows for a third-party policy (our
    own policies carry theirs in the registry table).
    """

    name: str = "policy"
    family: ClassVar[str] = "third-party"
    scorer: Scorer | None = None
    rng: np.random.Generator

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        self.rng = rng

    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray) -> int:
        raise NotImplementedError


def parse_spec(spec: str) -> tuple[str, dict[str, str], str | None]:
    """Split ``NAME[:k=v,...]`` or ``NAME=PATH[:k=v,...]`` into (name, options, path)."""
    spec = spec.strip()
    if not spec:
        raise PolicyError("empty policy name")
    name, path, opts = spec, None, {}
    if ":" in spec and ("=" not in spec or spec.index(":") < spec.index("=")):
        name, rest = spec.split(":", 1)
        if not rest.strip():
            raise PolicyError(f"policy {name.strip()!r}: ':' must be followed by key=value options")
        opts = _options(name, rest)
    elif "=" in spec:
        name, path = spec.split("=", 1)
        head, sep, tail = path.rpartition(":")
        if sep and re.match(r"\s*[A-Za-z_][\w-]*\s*=", tail):  # dqn=models/v2.pt:sample=auto
            path, opts = head, _options(name, tail)
        path = path.strip()
        if not path:
            raise PolicyError(f"policy {name!r}: empty model path")
    name = name.strip()
    if not name:
        raise PolicyError(f"policy spec {spec!r} has no name")
    return name, opts, path


def _options(name: str, rest: str) -> dict[str, str]:
    opts = {}
    for item in rest.split(","):
        if "=" not in item:
            raise PolicyError(f"policy {name!r}: option {item.strip()!r} must be key=value")
        k, v = item.split("=", 1)
        if not k.strip():
            raise PolicyError(f"policy {name!r}: option {item.strip()!r} has no key")
        if k.strip() in opts:  # the last would silently win
            raise PolicyError(f"policy {name.strip()!r}: option {k.strip()!r} is given twice")
        opts[k.strip()] = v.strip()
    return opts


def canonical_spec(spec: str) -> str:
    """The spec as results name it: ``NAME``, ``NAME:k=v,...`` or ``NAME=PATH``, without stray spaces."""
    name, opts, path = parse_spec(spec)
    if path is not None:
        return f"{name}={path}" + (":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")
    return f"{name}:" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else name
