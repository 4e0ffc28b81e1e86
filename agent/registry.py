"""Every policy by name: our own in one table, third-party ones through the ``joulesched.policies`` entry points.

The table is lazy: a row names its factory as ``module:attr`` and nothing is imported until a policy is built
(the DQN pulls in torch, which most runs never need). Each row carries the policy's metadata, its ``family``,
and the benchmark's policy sets are derived from it:

* :data:`BASELINES`: every built-in policy that is not learned, in table order;
* :data:`HEURISTICS`: the packing, load-, power-, sleep- and GPU-aware ones, and with :data:`HEURISTIC_VARIANTS` (their
  strongest option variants) :data:`BEST_HEURISTIC_CANDIDATES`, "the best heuristic" every learned policy is
  compared with (reference.md section 7, "Fair baselines");
* :data:`DEFAULT_POLICIES`: every baseline but the GPU-aware ones (:data:`GPU_POLICIES`) and every variant, what
  ``benchmark``, ``sweep``, ``test``, the sim and kube pipelines and ``make demo`` run when no policy is named;
  where a scenario has GPUs, :func:`default_policies` adds the GPU-aware ones and their variants;
* :data:`UPSTREAM_HEURISTICS`: those a kube-scheduler user can deploy today (scheduler-plugins included).

A plugin is one module and one entry point in its own package::

    [project.entry-points."joulesched.policies"]
    my-packer = "my_pkg.packer:MyPacker"

``MyPacker(**options)`` must return a :class:`~joulesched.agent.policy.Policy`; ``joulesched policies`` and
``--policy my-packer:key=value`` then work as for the built-in ones.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from joulesched.agent.policy import Policy, PolicyError, canonical_spec, parse_spec

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "joulesched.policies"

#: Families, in the order the docs list them. "kube-default" is what every ratio is taken against.
FAMILIES = ("kube-default", "packing", "load-aware", "power-aware", "sleep-aware", "gpu-aware", "reference",
            "planner", "clairvoyant", "learned", "third-party")
#: Families that are not baselines: the learned policies, the clairvoyant references (twin only: they read
#: the pods' true lifetimes, which no cluster knows) and the planners (twin only: they play the run forward in a
#: twin of the cluster, seconds per decision; bench/dqn_v2.py runs them beside the learners with --policy).
NOT_BASELINE_FAMILIES = frozenset({"learned", "clairvoyant", "planner"})
HEURISTIC_FAMILIES = frozenset({"packing", "load-aware", "power-aware", "sleep-aware", "gpu-aware"})
UPSTREAM_FAMILIES = frozenset({"packing", "load-aware", "power-aware"})


@dataclass(frozen=True)
class PolicyEntry:
    """One registered policy: its name, where its factory lives, and its metadata."""

    name: str
    target: str
    family: str
    summary: str
    takes_path: bool = False

    def factory(self) -> Callable[..., Policy]:
        """Import and return the factory (a class or function taking the spec's options as keywords)."""
        module, _, attr = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise PolicyError(f"policy {self.name!r}: cannot load {self.target} ({e})") from None

    def options(self) -> dict[str, Any]:
        """The options a spec can give the factory, with their defaults (``path`` is the model file of NAME=PATH)."""
        # As text, as a spec gives them (some factories default to a number, others to its text).
        return {p.name: None if p.default is p.empty or p.default is None else str(p.default)
                for p in _spec_params(self.factory())}

    def description(self) -> str:
        """The factory's docstring as plain text: what ``policies --long`` prints. Sphinx markup is dropped, and
        of its ``:param:`` fields only those a spec can set are kept (``path`` as the MODEL of NAME=MODEL); an
        option of the sleep-aware frame that the docstring leaves out is described as :data:`SHARED_OPTIONS`
        says."""
        factory = self.factory()
        doc = inspect.getdoc(factory) or self.summary
        names = [p.name for p in _spec_params(factory)]
        documented = {n.strip() for m in _PARAM.finditer(doc) for n in m.group(1).split(",")}
        shared = "".join(f"\n:param {n}: {SHARED_OPTIONS[n]}" for n in names
                         if n in SHARED_OPTIONS and n not in documented)
        return plain_doc(doc + shared, {*names, *(("path",) if self.takes_path else ())})


def _builtin(name: str, target: str, family: str, summary: str, *, takes_path: bool = False) -> PolicyEntry:
    return PolicyEntry(name, f"joulesched.agent.{target}", family, summary, takes_path)


#: Our own policies, in the order the benchmark lists them.
BUILTIN: tuple[PolicyEntry, ...] = (
    _builtin("default-k8s", "baselines:DefaultK8s", "kube-default",
             "kube-scheduler's default scoring: LeastAllocated + BalancedAllocation, exact integer formulas"),
    _builtin("most-allocated", "baselines:MostAllocated", "packing",
             "NodeResourcesFit MostAllocated: kube's bin-packing strategy"),
    _builtin("requested-to-capacity-ratio", "baselines:RequestedToCapacityRatio", "packing",
             "NodeResourcesFit RequestedToCapacityRatio with a shape (default: pack)"),
    _builtin("target-load-packing", "baselines:TargetLoadPacking", "load-aware",
             "scheduler-plugins TargetLoadPacking: pack on measured CPU up to a target, then spread"),
    _builtin("peaks", "baselines:Peaks", "power-aware",
             "PEAKS: least power increase under an exponential power model per node"),
    _builtin("energy-greedy", "baselines:EnergyGreedy", "power-aware",
             "least marginal watts on the node's own curve (waking a sleeping node costs its idle draw)"),
    _builtin("awake-first", "sleep_aware:AwakeFirst", "sleep-aware",
             "best fit on requests among awake nodes; wakes the most efficient sleeping node only when none fits"),
    _builtin("pabfd", "sleep_aware:PABFD", "sleep-aware",
             "PABFD (Beloglazov & Buyya 2012): least power increase among awake nodes, the same waking rule"),
    _builtin("lifetime-aware", "lifetime_aware:LifetimeAware", "sleep-aware",
             "NILAS/LAVA-style: least predicted awake time added (online lifetime predictor), then efficiency, "
             "co-location by predicted end, best fit; awake-first's waking rule"),
    _builtin("gpu-random", "gpu_policies:GpuRandom", "gpu-aware",
             "FGD paper's random fit, sleep-aware: a random awake node; wakes the most efficient only when none fits"),
    _builtin("gpu-best-fit", "gpu_policies:GpuBestFit", "gpu-aware",
             "FGD paper's best fit, sleep-aware: least CPU + GPU share left after placement"),
    _builtin("gpu-dot-product", "gpu_policies:GpuDotProduct", "gpu-aware",
             "FGD paper's dot product (Tetris), sleep-aware: least free-vector . request"),
    _builtin("gpu-packing", "gpu_policies:GpuPacking", "gpu-aware",
             "FGD paper's GPU packing, sleep-aware: partly used GPUs, then busy nodes, then idle ones"),
    _builtin("gpu-clustering", "gpu_policies:GpuClustering", "gpu-aware",
             "FGD paper's GPU clustering, sleep-aware: shared-GPU and whole-GPU pods on separate nodes"),
    _builtin("fgd", "gpu_policies:FGD", "gpu-aware",
             "FGD (Weng et al., ATC '23), sleep-aware: least growth of GPU fragmentation"),
    _builtin("gpu-energy", "gpu_policies:GpuEnergy", "gpu-aware",
             "PABFD that knows GPU power: least CPU + GPU watts added among awake nodes, then GPU packing; wakes "
             "the node with the fewest watts per GPU"),
    _builtin("gpu-lifetime-aware", "lifetime_aware:GpuLifetimeAware", "gpu-aware",
             "lifetime-aware on GPU power: least predicted awake time added (CPU + GPU idle), then gpu-energy's keys "
             "and waking rule"),
    _builtin("round-robin", "baselines:RoundRobin", "reference", "the next feasible node, wrapping around"),
    _builtin("random", "baselines:Random", "reference", "a uniformly random feasible node"),
    _builtin("clairvoyant", "clairvoyant:Clairvoyant", "clairvoyant",
             "twin only: lifetime-aware packing on the pods' true lifetimes, or on an oracle of quality r2 (a "
             "reference and a training teacher)"),
    _builtin("optimum", "optimum_teacher:OptimumTeacher", "clairvoyant",
             "twin only: the MIP's best schedule of the run's own workload, re-solved from the run's past when it "
             "leaves it (a training teacher; clairvoyant where the MIP cannot state the run)"),
    _builtin("rollout", "planner:Rollout", "planner",
             "twin only: plays the run forward per candidate node on futures drawn from the run so far "
             "(future=sample) or the workload's generators (future=model), a base heuristic deciding after"),
    _builtin("rollout-oracle", "planner:RolloutOracle", "clairvoyant",
             "twin only: rollout on the run's true future (what planning with a perfect model is worth)"),
    _builtin("dqn", "dqn_policy:DQNPolicy", "learned",
             "the trained Double DQN (dqn=MODEL): greedy on its per-node advantages", takes_path=True),
)


def _params(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return []


def _spec_params(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    """The keyword parameters a spec (``NAME:key=value``) can set: spec values arrive as text, so a parameter
    typed without ``str`` (the DQN's in-memory ``net`` and ``config``) is for code, not for the command line."""
    def takes_text(p: inspect.Parameter) -> bool:
        ann = p.annotation
        if ann is p.empty:
            return True
        if isinstance(ann, str):
            return "str" in re.split(r"[^\w]+", ann)
        return ann is str or str in typing.get_args(ann)

    return [p for p in _params(factory) if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            and p.name not in ("self", "path") and takes_text(p)]


_PARAM = re.compile(r"^:param ([\w, ]+):\s*", re.M)
#: Options every policy of the sleep-aware frame takes (agent/sleep_aware.py), for the docstrings that leave them out.
SHARED_OPTIONS = {
    "headroom": "0 < h <= 1 (default 1): do not fill a node's CPU requests past h of its allocatable while another "
                "awake or sleeping node can take the pod.",
    "empty": "awake (default) or asleep: asleep ranks an awake node without pods with the sleeping ones, by the "
             "wake key, where it would sleep (an empty node is about to sleep: keeping it awake for a pod is a "
             "choice of which node to wake).",
}


def plain_doc(doc: str, keep: set[str]) -> str:
    """``doc`` unwrapped into one paragraph of plain text: roles (:class:`a.b.C`) become their last name,
    ``literals`` lose their backquotes, and ``:param NAMES:`` fields survive only for names in ``keep``
    (as ``name: text``; ``path`` as ``MODEL: text``)."""
    parts = _PARAM.split(doc)
    body, fields = parts[0], list(zip(parts[1::2], parts[2::2]))
    kept = [(names, text) for names, text in fields if {n.strip() for n in names.split(",")} <= keep]
    text = " ".join([body.strip(), *(f"{'MODEL' if n.strip() == 'path' else n.strip()}: {t.strip()}"
                                     for n, t in kept)])
    text = re.sub(r":\w+:`~?(?:[^`]*\.)?([^`.]+)`", r"\1", text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return " ".join(text.split())


def _plugins() -> dict[str, PolicyEntry]:
    """Entry points of the ``joulesched.policies`` group; a plugin never shadows a built-in name."""
    builtin = {e.name for e in BUILTIN}
    out: dict[str, PolicyEntry] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in builtin:
            log.warning("entry point %s = %s ignored: %r is a built-in policy", ep.name, ep.value, ep.name)
            continue
        out[ep.name] = PolicyEntry(ep.name, ep.value, "third-party", f"plugin {ep.value}")
    return out


def entries() -> dict[str, PolicyEntry]:
    """Every policy by name: the built-in table, then the installed plugins."""
    return {**{e.name: e for e in BUILTIN}, **_plugins()}


def policy_names() -> list[str]:
    return sorted(entries())


def entry(name: str) -> PolicyEntry:
    table = entries()
    if name not in table:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


BASELINES: list[str] = [e.name for e in BUILTIN if e.family not in NOT_BASELINE_FAMILIES]
HEURISTICS: tuple[str, ...] = tuple(e.name for e in BUILTIN if e.family in HEURISTIC_FAMILIES)
UPSTREAM_HEURISTICS: tuple[str, ...] = tuple(e.name for e in BUILTIN if e.family in UPSTREAM_FAMILIES)
SLEEP_AWARE_HEURISTICS: tuple[str, ...] = tuple(e.name for e in BUILTIN if e.family == "sleep-aware")
#: Option variants found strongest (docs/PERFORMANCE.md: the headroom table; "Empty nodes ranked as sleeping
#: ones"): every comparison that claims "the best heuristic" runs them too, so the CPU ones are in
#: :data:`DEFAULT_POLICIES` (the GPU ones run where the GPU heuristics do: :func:`default_policies`).
HEURISTIC_VARIANTS: tuple[str, ...] = ("awake-first:fit=efficient", "pabfd:empty=asleep", "lifetime-aware:empty=asleep",
                                       "gpu-energy:empty=asleep", "gpu-lifetime-aware:empty=asleep")
#: The policies "the best heuristic" is the best of: every built-in heuristic and every variant.
BEST_HEURISTIC_CANDIDATES: tuple[str, ...] = tuple(dict.fromkeys((*HEURISTICS, *HEURISTIC_VARIANTS)))
#: The one default policy set: every baseline, then every variant. ``benchmark``, ``sweep`` (a grid without
#: ``policies``), ``test``, the sim and kube pipelines and ``make demo`` (which adds the DQN) run it.
#: The GPU-aware heuristics (the FGD paper's baselines, FGD, ``gpu-energy``, ``gpu-lifetime-aware``) and their
#: variants are best-heuristic candidates that the default set leaves out on CPU clusters, where their GPU keys are
#: all zero and what is left is a CPU rule that was at most 0.05 % better than the default set's best, on 1 of 24
#: cases (docs/PERFORMANCE.md, "The GPU-aware heuristics on CPU clusters"); where some scenario
#: of the run has GPUs the default set is :func:`default_policies` ``(gpus=True)``, on every scenario of the run
#: (one run, one policy list).
GPU_POLICIES: tuple[str, ...] = tuple(e.name for e in BUILTIN if e.family == "gpu-aware")
DEFAULT_POLICIES: tuple[str, ...] = tuple(dict.fromkeys((*(b for b in BASELINES if b not in GPU_POLICIES),
                                                          *(v for v in HEURISTIC_VARIANTS
                                                            if parse_spec(v)[0] not in GPU_POLICIES))))
#: What the default set adds where some scenario has GPUs: every GPU-aware heuristic and variant.
GPU_DEFAULTS: tuple[str, ...] = tuple(dict.fromkeys((*GPU_POLICIES, *(v for v in HEURISTIC_VARIANTS
                                                                       if parse_spec(v)[0] in GPU_POLICIES))))


def default_policies(gpus: bool = False) -> tuple[str, ...]:
    """The default policy set: :data:`DEFAULT_POLICIES`, and with ``gpus`` (some scenario of the run has GPUs)
    :data:`GPU_DEFAULTS` after it, so that "the best heuristic" on a GPU cluster is the best of those that know
    GPUs."""
    return (*DEFAULT_POLICIES, *GPU_DEFAULTS) if gpus else DEFAULT_POLICIES


def family_of(spec: str) -> str:
    """The family of a spec's policy (``most-allocated:balanced=1`` is packing); unknown names are third-party."""
    name = parse_spec(spec)[0]
    return next((e.family for e in BUILTIN if e.name == name), "third-party")


def heuristics_among(specs: Iterable[str]) -> list[str]:
    """The specs of heuristics (:data:`HEURISTIC_FAMILIES`; not default-k8s, the references round-robin and
    random, learned, clairvoyant, planner or third-party policies), in their order: the set "the best heuristic"
    is taken from."""
    return [s for s in specs if family_of(s) in HEURISTIC_FAMILIES]


def _check_options(e: PolicyEntry, factory: Callable[..., Any], opts: dict[str, str]) -> None:
    if any(p.kind == p.VAR_KEYWORD for p in _params(factory)):
        return
    known = [p.name for p in _spec_params(factory)]
    unknown = [k for k in opts if k not in known]
    if unknown:
        have = ", ".join(known) if known else "none"
        raise PolicyError(f"policy {e.name!r}: unknown option {unknown[0]!r}; its options: {have}")


def make_policy(spec: str) -> Policy:
    """Build a policy from its spec; raises :class:`PolicyError` naming the problem (a typo lists the names)."""
    name, opts, path = parse_spec(spec)
    e = entry(name)
    if path is not None and not e.takes_path and e.family != "third-party":
        raise PolicyError(f"policy {name!r} takes no model file (NAME=PATH is for dqn); use {name}:key=value")
    factory = e.factory()
    _check_options(e, factory, opts)
    try:
        pol = factory(path=path, **opts) if path is not None else factory(**opts)
    except TypeError as ex:
        raise PolicyError(f"policy {name!r}: bad option ({ex})") from None
    pol.name = canonical_spec(spec)
    return pol


def refuse_twin_only(policy: object, spec: str) -> None:
    """Raise :class:`PolicyError` for a policy that runs in the twin only (``twin_only``: a schema-1 model, the
    clairvoyant rule), before a cluster run starts anything (its ``attach`` would refuse it only once the
    scheduling loop ran, leaving a process that schedules nothing)."""
    if getattr(policy, "twin_only", False):
        raise PolicyError(f"policy {spec!r} reads what only the twin knows (pods' true end times): it runs in the "
                          "twin only (benchmark, training), not on a cluster; serve a schema-2 or later model "
                          "(models/v2.pt) or a heuristic")
