"""Sleep-aware heuristics: packers that keep sleeping nodes asleep.

The upstream packers (``most-allocated``, ``energy-greedy``, ``peaks``) wake a sleeping node whenever it scores
best. The two policies here never wake a node while an awake one (on or waking) can take the pod, and when
they must wake one they wake the most efficient: the fewest watts per core at full load
(``peak_watts / cores``), ties toward the larger node. That is the rule a platform engineer gets from
kube-scheduler with MostAllocated plus cluster-autoscaler's scale-down of empty nodes, written as one policy.

* :class:`AwakeFirst`: best fit on requests among awake nodes (the bin-packing "best fit" rule, Johnson 1974;
  as a Kubernetes policy, NodeResourcesFit MostAllocated restricted to awake nodes).
* :class:`PABFD`: Beloglazov and Buyya's Power-Aware Best Fit Decreasing (Concurrency Computat.: Pract. Exper.
  24(13), 2012, Algorithm 1): the awake node whose power rises least, with the same waking rule.

Both read requests, not measured usage, so what they do depends only on what has been bound (a waking node's
pods have not started yet but already hold their requests). Exact ties are broken with the run's generator.
"""

from __future__ import annotations

import numpy as np

from joulesched.agent.policy import NodeScores, PolicyError, Scorer
from joulesched.cluster.state import ASLEEP, ClusterState, PodRequest
from joulesched.power.curves import interp_many

FIT_ORDERS = ("tightest", "efficient")


def _headroom(name: str, value: str | float) -> float:
    try:
        h = float(value)
    except (TypeError, ValueError):
        raise PolicyError(f"policy {name!r}: option headroom={value!r} is not a number") from None
    if not 0.0 < h <= 1.0:
        raise PolicyError(f"policy {name!r}: option headroom={h:g} must be in (0, 1]: the share of a node's "
                          "allocatable CPU its requests may fill")
    return h


#: What an awake node without pods is ranked as (option ``empty``): ``awake``, a candidate of the awake tier by the
#: policy's own keys; or ``asleep``, with the sleeping nodes by the wake key (before a sleeping node of the same
#: key): an empty node is about to sleep, so keeping it awake for a pod is a choice of which node to wake. Only a
#: node that would sleep (``ClusterState.may_sleep``: not protected, in a cluster that sleeps) is ranked so.
EMPTY_RANKS = ("awake", "asleep")


def _empty(name: str, value: str) -> str:
    if value not in EMPTY_RANKS:
        raise PolicyError(f"policy {name!r}: option empty={value!r} is not one of {', '.join(EMPTY_RANKS)}")
    return value


def watts_per_core(st: ClusterState, idx: np.ndarray) -> np.ndarray:
    """Watts per core at full load, the efficiency a sleeping node is woken by (lower is better)."""
    return st.peak_watts[idx] / np.maximum(st.alloc_cpu[idx], 1) * 1000.0


def power_increase(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
    """The CPU-side watts each candidate's curve rises by when ``pod``'s request joins its requests (PABFD's key:
    utilisation is requests over allocatable, kube's non-zero requests)."""
    cap = np.maximum(st.alloc_cpu[idx], 1).astype(np.float64)
    curves = st.curves[idx]
    return interp_many(curves, (st.nz_cpu[idx] + pod.nz_cpu) / cap) - interp_many(curves, st.nz_cpu[idx] / cap)


def free_cpu_share(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
    """The CPU share of each candidate left free after placing ``pod``, by kube's non-zero requests and, as
    MostAllocated caps them, never below 0: the filter admits a best-effort pod (no requests) onto a node whose
    non-zero requests (100m each) already exceed its allocatable, and an unclipped "tightest fit" then chose the
    most over-committed node every time (a review: 581 of 584 best-effort pods, demand 4.8x capacity there)."""
    cpu = np.maximum(st.alloc_cpu[idx], 1).astype(np.float64)
    share = np.maximum(st.alloc_cpu[idx] - st.nz_cpu[idx] - pod.nz_cpu, 0) / cpu
    # A node of no allocatable CPU (a live node reporting 0) is no tight fit: MostAllocated scores such a
    # resource 0, the least packed; read as wholly free (a review: every packer chose it first).
    return np.where(st.alloc_cpu[idx] > 0, share, 1.0)


def free_shares(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CPU and memory shares of each candidate left free after placing ``pod`` (kube's non-zero requests,
    as MostAllocated reads them, capped at 0: :func:`free_cpu_share`): best fit's keys. Full and over-committed
    nodes tie, and the policy's generator draws among them, as kube-scheduler's does."""
    mem = np.maximum(st.alloc_mem[idx], 1).astype(np.float64)
    free_mem = np.maximum(st.alloc_mem[idx] - st.nz_mem[idx] - pod.nz_mem, 0) / mem
    return free_cpu_share(st, pod, idx), np.where(st.alloc_mem[idx] > 0, free_mem, 1.0)


def _rank(keys: list[np.ndarray]) -> np.ndarray:
    """Dense rank of rows under lexicographic order of ``keys`` (first key most significant; 0 = best)."""
    order = np.lexsort(keys[::-1])
    stacked = np.column_stack(keys)[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (stacked[1:] != stacked[:-1]).any(axis=1)
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.cumsum(new) - 1
    return rank


class _SleepAware:
    """Shared frame: tiers (awake within headroom, then sleeping, then awake past headroom), a per-policy key
    inside the tier, the generator for exact ties. :meth:`node_scores` shows the tier and the keys. Every
    sleep- and GPU-aware policy takes ``headroom`` and ``empty`` (:data:`EMPTY_RANKS`: ``empty=asleep`` ranks an
    awake node without pods with the sleeping ones, by the wake key)."""

    name = "sleep-aware"
    #: What :meth:`_wake_key` measures, as the scores show it.
    wake_label = "WattsPerCore"

    def __init__(self, headroom: str | float = "1", empty: str = "awake") -> None:
        self.headroom = _headroom(self.name, headroom)
        self.empty = _empty(self.name, empty)
        self.rng = np.random.default_rng(0)

    @property
    def scorer(self) -> Scorer:
        return self

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        self.rng = rng

    def _inner(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Keys ordering awake candidates, most significant first, lower is better."""
        raise NotImplementedError

    def _wake_key(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
        """The efficiency sleeping candidates are woken by, lower first: watts per core at full load."""
        return watts_per_core(st, idx)

    def _keys(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> tuple[list[np.ndarray], dict]:
        sleeping = st.power_state[idx] == ASLEEP
        # ``empty=asleep``: an awake node without pods is ranked with the sleeping ones, where it would sleep (not
        # a protected node, nor any node of a cluster that never sleeps).
        asleep = sleeping | ((st.pods[idx] == 0) & st.may_sleep[idx]) if self.empty == "asleep" else sleeping
        fits = st.req_cpu[idx] + pod.filter_cpu <= self.headroom * st.alloc_cpu[idx]
        # Tier 0: awake (on or waking) within the headroom; 1: asleep (woken only when tier 0 is empty);
        # 2: awake past the headroom, the last resort before leaving a placeable pod unplaced.
        tier = np.where(asleep, 1, np.where(fits, 0, 2))
        inner = self._inner(st, pod, idx)
        wpc = self._wake_key(st, pod, idx)
        keys = [tier.astype(np.float64)]
        # Inside the awake tiers the policy's own keys decide; inside the sleeping tier efficiency, then (an
        # empty awake node before a sleeping one) size.
        for v in inner.values():
            keys.append(np.where(asleep, 0.0, v))
        keys.append(np.where(asleep, wpc, 0.0))
        if self.empty == "asleep":
            keys.append(np.where(asleep, sleeping.astype(np.float64), 0.0))
        keys.append(np.where(asleep, -st.alloc_cpu[idx].astype(np.float64), 0.0))
        shown = {"Tier": tier, **inner, self.wake_label: wpc}
        return keys, shown

    def node_scores(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> NodeScores:
        keys, shown = self._keys(st, pod, idx)
        total = -_rank(keys)  # higher is better: 0 for the best candidates (integers: no "-0")
        # The keys in _keys' order, each lower first, and the sleeping nodes' last tie-break, larger first.
        plugins = {k: (-1.0, np.asarray(v, dtype=np.float64)) for k, v in shown.items()}
        plugins["AllocatableCpu"] = (1.0, st.alloc_cpu[idx].astype(np.float64))
        inner = [k for k in shown if k not in ("Tier", self.wake_label)]
        asleep = "asleep or empty" if self.empty == "asleep" else "asleep"
        then = "an empty awake node before a sleeping one, then " if self.empty == "asleep" else ""
        note = (f"Tier first (0 awake, 1 {asleep}, 2 awake past the headroom); then awake nodes by {', '.join(inner)} "
                f"and tier 1 by {self.wake_label}, then {then}AllocatableCpu")
        return NodeScores(idx, plugins, total, rule="lexicographic", note=note)

    def choose(self, st: ClusterState, pod: PodRequest, mask: np.ndarray) -> int:
        idx = np.flatnonzero(mask)
        if idx.size == 1:
            return int(idx[0])
        keys, _ = self._keys(st, pod, idx)
        best = idx[_rank(keys) == 0]
        return int(best[self.rng.integers(best.size)]) if best.size > 1 else int(best[0])


class AwakeFirst(_SleepAware):
    """Awake-first packer: best fit on requests among awake (on or waking) nodes; only when none fits, wake the
    sleeping node with the fewest watts per core at full load, ties toward the larger node.

    Best fit is Johnson's rule (1974) on CPU requests, then memory (kube's non-zero requests, as MostAllocated
    reads them): the node left with the smallest share free. ``fit=efficient`` orders awake nodes by watts per
    core first and best fit second. ``headroom=h`` (0 < h <= 1, default 1) does not fill a node's CPU requests
    past h of its allocatable while another awake or sleeping node can take the pod.
    """

    name = "awake-first"

    def __init__(self, fit: str = "tightest", headroom: str | float = "1", empty: str = "awake") -> None:
        if fit not in FIT_ORDERS:
            raise PolicyError(f"policy {self.name!r}: option fit={fit!r} is not a fit order; use "
                              f"{' or '.join(FIT_ORDERS)}")
        super().__init__(headroom, empty)
        self.fit = fit

    def _inner(self, st, pod, idx):
        free_cpu, free_mem = free_shares(st, pod, idx)
        fit = {"FreeCpuShare": free_cpu, "FreeMemShare": free_mem}
        if self.fit == "efficient":
            return {"WattsPerCoreAwake": watts_per_core(st, idx), **fit}
        return fit


class PABFD(_SleepAware):
    """PABFD, Power-Aware Best Fit Decreasing (Beloglazov & Buyya, CCPE 24(13), 2012, Algorithm 1), online: the
    awake node whose power rises least when the pod is added, with the awake-first waking rule (wake the sleeping
    node with the fewest watts per core at full load, ties toward the larger node, only when no awake node fits).

    Power is the node's own curve at its CPU requests over allocatable (the paper's host utilisation is the
    requested MIPS of its VMs): increase = P((req + pod) / cap) - P(req / cap). Ties go to the tighter fit.
    ``headroom`` is the paper's utilisation threshold (0 < h <= 1, default 1).
    """

    name = "pabfd"

    def _inner(self, st, pod, idx):
        # Round away float noise so that equal increases tie (then best fit decides).
        return {"PowerIncreaseW": np.round(power_increase(st, pod, idx), 9),
                "FreeCpuShare": free_cpu_share(st, pod, idx)}
