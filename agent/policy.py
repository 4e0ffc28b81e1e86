"""The Policy seam: given the cluster and a pod, pick a feasible node. Selected by name from the CLI.

A policy spec is ``NAME``, ``NAME:key=value,key=value`` (options), or ``NAME=PATH`` (a model file, e.g.
``dqn=models/small.pt``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from cluster.state import ClusterState, PodRequest


class PolicyError(ValueError):
    """An unknown policy name, a bad option, or a model file that cannot be used."""


@runtime_checkable
class Policy(Protocol):
    """Anything that places pods.

    ``reset`` is called once per run with the run's seeded generator (all randomness must come from it);
    ``choose`` returns the index of a node where ``mask`` is True.
    """

    name: str

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None: ...

    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray) -> int: ...


_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register(name: str) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    def deco(factory: Callable[..., Policy]) -> Callable[..., Policy]:
        _REGISTRY[name] = factory
        return factory
    return deco


def _lazy(module: str, attr: str) -> Callable[..., Policy]:
    """A factory that imports its module on first use (the DQN pulls in torch, which most runs never need)."""

    def factory(**kw: object) -> Policy:
        import importlib

        return getattr(importlib.import_module(module), attr)(**kw)

    return factory


def _load_builtin() -> None:
    # Imported for their @register side effects; kept lazy so `agent.policy` stays import-light.
    import agent.baselines  # noqa: F401

    _REGISTRY.setdefault("dqn", _lazy("agent.dqn_policy", "DQNPolicy"))


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


BASELINES = ["default-k8s", "most-allocated", "requested-to-capacity-ratio", "target-load-packing", "peaks",
             "energy-greedy", "round-robin", "random"]


def parse_spec(spec: str) -> tuple[str, dict[str, str], str | None]:
    """Split ``NAME[:k=v,...]`` or ``NAME=PATH`` into (name, options, path)."""
    spec = spec.strip()
    if not spec:
        raise PolicyError("empty policy name")
    name, path, opts = spec, None, {}
    if ":" in spec and ("=" not in spec or spec.index(":") < spec.index("=")):
        name, rest = spec.split(":", 1)
        for item in filter(None, rest.split(",")):
            if "=" not in item:
                raise PolicyError(f"policy {name!r}: option {item!r} must be key=value")
            k, v = item.split("=", 1)
            opts[k.strip()] = v.strip()
    elif "=" in spec:
        name, path = spec.split("=", 1)
        if not path:
            raise PolicyError(f"policy {name!r}: empty model path")
    return name.strip(), opts, path


def make_policy(spec: str) -> Policy:
    """Build a policy from its spec; raises :class:`PolicyError` with the known names on a typo."""
    name, opts, path = parse_spec(spec)
    _load_builtin()
    if name not in _REGISTRY:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    try:
        pol = _REGISTRY[name](path=path, **opts) if path is not None else _REGISTRY[name](**opts)
    except TypeError as e:
        raise PolicyError(f"policy {name!r}: bad option ({e})") from None
    pol.name = spec
    return pol
