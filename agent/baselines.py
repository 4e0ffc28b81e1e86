"""Baseline schedulers: kube-scheduler's scoring reproduced exactly, the load/power-aware plugins, and simple
references. Every policy picks among feasible nodes only and breaks ties with the run's seeded generator.
"""

from __future__ import annotations

import math

import numpy as np

from joulesched.agent import kube_scoring as ks
from joulesched.agent.policy import NodeScores, PolicyError, Scorer
from joulesched.cluster.state import ASLEEP, ClusterState, PodRequest
from joulesched.power.curves import interp_many


def _int_opt(name: str, key: str, value: str, lo: int, hi: int) -> int:
    try:
        v = int(value)
    except ValueError:
        raise PolicyError(f"policy {name!r}: option {key}={value!r} is not an integer") from None
    if not lo <= v <= hi:
        raise PolicyError(f"policy {name!r}: option {key}={v} must be in {lo}..{hi}")
    return v


def _float_opt(name: str, key: str, value: str, lo: float, hi: float, *, closed: bool = False) -> float:
    """``value`` as a number in the open interval (lo, hi), or in [lo, hi] with ``closed``."""
    try:
        v = float(value)
    except ValueError:
        raise PolicyError(f"policy {name!r}: option {key}={value!r} is not a number") from None
    if not (lo <= v <= hi if closed else lo < v < hi):
        interval = f"[{lo}, {hi}]" if closed else f"({lo}, {hi})"
        raise PolicyError(f"policy {name!r}: option {key}={v} must be in {interval}")
    return v


class ScoringPolicy:
    """kube-scheduler's framework: sample nodes (percentageOfNodesToScore), score with weighted plugins, pick
    the maximum total, and break ties uniformly at random. A single feasible node is taken without scoring.

    Subclasses implement :meth:`plugin_scores` over a candidate index array.
    """

    name = "scoring"
    kube_sampling = True

    @property
    def scorer(self) -> Scorer:
        return self

    def __init__(self, pct: str | int = 0) -> None:
        self.percentage = _int_opt(self.name, "pct", str(pct), 0, 100)
        self.rng = np.random.default_rng(0)
        self.next_start = 0

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        self.rng = rng
        self.next_start = 0

    def plugin_scores(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> dict[str, tuple[int, np.ndarray]]:
        raise NotImplementedError

    def scores(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> dict[str, tuple[int, np.ndarray]]:
        """:meth:`plugin_scores`, with TaintToleration (weight 3, in every kube profile) where the scored nodes'
        PreferNoSchedule taints that the pod does not tolerate differ in number; elsewhere it adds the same 100
        to every node, and is left out."""
        out = self.plugin_scores(st, pod, idx)
        counts = _untolerated_prefer_no_schedule(st, pod, idx)
        if counts is not None and counts.max() > counts.min():
            out["TaintToleration"] = (3, ks.default_normalize_reverse(counts))
        return out

    def total(self, st: ClusterState, pod: PodRequest, idx: np.ndarray,
              plugins: dict[str, tuple[int, np.ndarray]] | None = None) -> np.ndarray:
        out = None
        for w, s in (self.scores(st, pod, idx) if plugins is None else plugins).values():
            out = w * s if out is None else out + w * s
        return out

    def node_scores(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> NodeScores:
        plugins = self.scores(st, pod, idx)
        return NodeScores(idx, plugins, self.total(st, pod, idx, plugins))

    def candidates(self, st: ClusterState, mask: np.ndarray) -> np.ndarray:
        """Feasible nodes kube-scheduler would score: the first k found from a rotating start index."""
        idx = np.flatnonzero(mask)
        n = len(mask)
        if not self.kube_sampling:
            return idx
        k = ks.num_nodes_to_score(n, self.percentage)
        start = self.next_start
        if start:
            pos = int(np.searchsorted(idx, start))
            idx = np.concatenate((idx[pos:], idx[:pos]))
        if idx.size > k:
            idx = idx[:k]
            processed = (int(idx[-1]) - start) % n + 1
        else:
            processed = n
        self.next_start = (start + processed) % n
        return idx

    def choose(self, st: ClusterState, pod: PodRequest, mask: np.ndarray) -> int:
        idx = self.candidates(st, mask)
        if idx.size == 1:
            return int(idx[0])
        tot = self.total(st, pod, idx)
        ties = idx[tot == tot.max()]
        return int(ties[self.rng.integers(ties.size)]) if ties.size > 1 else int(ties[0])


def _untolerated_prefer_no_schedule(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray | None:
    """TaintToleration's raw score per candidate: its PreferNoSchedule taints the pod does not tolerate (kube's
    countIntolerableTaintsPreferNoSchedule); None where no node has any (every twin scenario without taints)."""
    per_node = st.filter_table.untolerated_prefer_no_schedule(
        pod.constraints.tolerations if pod.constraints is not None else ())
    return None if per_node is None else per_node[idx]


def _fit_inputs(st: ClusterState, pod: PodRequest, idx: np.ndarray):
    alloc = (st.alloc_cpu[idx], st.alloc_mem[idx])
    req = (st.nz_cpu[idx] + pod.nz_cpu, st.nz_mem[idx] + pod.nz_mem)
    return alloc, req


def _balanced(st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
    # Since 1.33 BalancedAllocation skips a pod whose real cpu and memory requests are all zero (isBestEffortPod
    # over its requests: absent or an explicit 0 alike): a constant, i.e. no effect.
    if pod.filter_cpu == 0 and pod.filter_mem == 0:
        return np.zeros(idx.size, dtype=np.int64)
    alloc = (st.alloc_cpu[idx], st.alloc_mem[idx])
    req = (st.req_cpu[idx] + pod.filter_cpu, st.req_mem[idx] + pod.filter_mem)
    return ks.balanced_allocation(alloc, req)


class DefaultK8s(ScoringPolicy):
    """kube-scheduler's (1.33 and later) default profile for a plain pod: NodeResourcesFit LeastAllocated (w=1,
    non-zero requests) plus NodeResourcesBalancedAllocation (w=1, real requests; skipped for a pod requesting no
    cpu or memory, as 1.33 does: 1.28-1.32 still score it), and TaintToleration (w=3) where nodes
    carry PreferNoSchedule taints (:meth:`ScoringPolicy.scores`). The other default plugins add the same constant
    to every node for a pod without preferred affinity or spread constraints (a twin pod has neither), so they
    are omitted; live, see docs/live.md ("Known limits").

    ``gpu_weight=w`` (default 0, kube's default profile, which scores cpu and memory only) adds
    ``nvidia.com/gpu`` to NodeResourcesFit's ``resources`` with weight w, as a profile that lists the extended
    resource does: LeastAllocated over the node's GPUs, a node without GPUs skipped for that resource, and so is
    a pod requesting no GPU (kube scores an extended resource only for a pod that requests it). A GPU counts as
    requested once anything holds it (a shared GPU too: its device plugin advertises it as taken).
    """

    name = "default-k8s"

    def __init__(self, pct: str | int = 0, gpu_weight: str | int = 0) -> None:
        super().__init__(pct)
        self.gpu_weight = _int_opt(self.name, "gpu_weight", str(gpu_weight), 0, 100)

    def plugin_scores(self, st, pod, idx):
        alloc, req = _fit_inputs(st, pod, idx)
        if self.gpu_weight and st.has_gpus and pod.gpu:
            taken = st.alloc_gpu[idx] - st.gpu_whole_free[idx]
            if pod.gpu_milli >= 1000:
                extra = pod.gpu
            else:  # a share opens a free GPU only where no partly used one fits it (the state's best fit)
                free = st.gpu_free[idx]
                extra = ~((free >= pod.gpu_milli) & (free < 1000)).any(axis=1)
            fit = ks.least_allocated((*alloc, st.alloc_gpu[idx]), (*req, taken + extra), (1, 1, self.gpu_weight))
        else:
            fit = ks.least_allocated(alloc, req)
        return {"NodeResourcesFit": (1, fit), "NodeResourcesBalancedAllocation": (1, _balanced(st, pod, idx))}


class MostAllocated(ScoringPolicy):
    """NodeResourcesFit with the MostAllocated strategy (bin packing). ``balanced=W`` (0-100) keeps
    BalancedAllocation at weight W beside it: 1 as a real profile that only changes scoringStrategy would; the
    default (0) is pure packing, the stronger energy baseline.
    """

    name = "most-allocated"

    def __init__(self, pct: str = "0", balanced: str = "0") -> None:
        super().__init__(pct)
        self.balanced_weight = _int_opt(self.name, "balanced", balanced, 0, 100)

    def plugin_scores(self, st, pod, idx):
        alloc, req = _fit_inputs(st, pod, idx)
        out = {"NodeResourcesFit": (1, ks.most_allocated(alloc, req))}
        if self.balanced_weight:
            out["NodeResourcesBalancedAllocation"] = (self.balanced_weight, _balanced(st, pod, idx))
        return out


class RequestedToCapacityRatio(ScoringPolicy):
    """NodeResourcesFit with RequestedToCapacityRatio. ``shape`` is ``util:score|util:score`` (score 0..10);
    the default ``0:0|100:10`` packs.
    """

    name = "requested-to-capacity-ratio"

    def __init__(self, pct: str = "0", shape: str = "0:0|100:10") -> None:
        super().__init__(pct)
        try:
            pts = [tuple(int(x) for x in p.split(":")) for p in shape.split("|")]
            if any(len(p) != 2 for p in pts):
                raise ValueError("each point is util:score")
            self.shape = ks.validate_shape(pts)
        except ValueError as e:
            raise PolicyError(f"policy {self.name!r}: bad shape {shape!r}: {e}") from None

    def plugin_scores(self, st, pod, idx):
        alloc, req = _fit_inputs(st, pod, idx)
        return {"NodeResourcesFit": (1, ks.requested_to_capacity_ratio(alloc, req, self.shape))}


class _PredictsUsage:
    """A pod's CPU use predicted as scheduler-plugins' PredictUtilisation does: its limit first, which only the
    pod's metadata carries (without it: request x 1.5, else 1000m)."""

    #: choose() and node_scores() are handed the pod's metadata (its CPU limit).
    uses_meta = True
    _cpu_limit_m: int | None = None

    def _predicted(self, pod: PodRequest) -> float:
        return ks.tlp_predicted_usage(pod.cpu_m, self._cpu_limit_m)

    def node_scores(self, st: ClusterState, pod: PodRequest, idx: np.ndarray, meta=None) -> NodeScores:
        self._cpu_limit_m = getattr(meta, "cpu_limit_m", None)
        return super().node_scores(st, pod, idx)

    def choose(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> int:
        self._cpu_limit_m = getattr(meta, "cpu_limit_m", None)
        return super().choose(st, pod, mask)


class TargetLoadPacking(_PredictsUsage, ScoringPolicy):
    """scheduler-plugins TargetLoadPacking: pack on measured CPU up to ``x`` % (default 40), then spread."""

    name = "target-load-packing"

    def __init__(self, pct: str = "0", x: str = "40") -> None:
        super().__init__(pct)
        self.target = _float_opt(self.name, "x", x, 0.0, 100.0)

    def plugin_scores(self, st, pod, idx):
        used = np.minimum(st.usage_cpu[idx], st.alloc_cpu[idx])  # what node metrics would show
        pred = self._predicted(pod)
        return {"TargetLoadPacking": (1, ks.target_load_packing(used, st.alloc_cpu[idx], pred, self.target))}


def fit_peaks(curve: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit of P(x) = K0 + K1 exp(K2 x), x in CPU % (0..100), to an 11-point curve.

    For a fixed K2 the fit is linear in (K0, K1); K2 is found by a coarse log grid then golden-section search.
    """
    x = np.linspace(0.0, 100.0, 11)
    y = np.asarray(curve, dtype=np.float64)

    def solve(k2: float) -> tuple[float, float, float]:
        e = np.exp(k2 * x)
        a = np.column_stack((np.ones_like(x), e))
        (k0, k1), *_ = np.linalg.lstsq(a, y, rcond=None)
        err = float(((a @ np.array([k0, k1]) - y) ** 2).sum())
        return err, float(k0), float(k1)

    grid = np.concatenate((-np.logspace(-4, -0.5, 40)[::-1], np.logspace(-4, -0.5, 40)))
    errs = [solve(k)[0] for k in grid]
    j = int(np.argmin(errs))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if solve(a)[0] < solve(b)[0]:
            hi = b
        else:
            lo = a
    k2 = (lo + hi) / 2
    _, k0, k1 = solve(k2)
    return k0, k1, k2


class Peaks(_PredictsUsage, ScoringPolicy):
    """PEAKS: each node's power as K0 + K1 e^(K2 x); score the power increase of adding the pod, normalised so
    the smallest increase scores 100. Pod utilisation is predicted as TargetLoadPacking does.
    """

    name = "peaks"

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        super().reset(state, rng)
        self.k = self._fits(state.curves)  # (N, 3)

    def _fits(self, curves: np.ndarray) -> np.ndarray:
        """Each node's (K0, K1, K2): one fit per distinct curve, kept across resets (a fit takes milliseconds, and
        a live scheduler resets whenever its node set changes: 2,000 nodes refitted one by one took 8 s)."""
        cache = self.__dict__.setdefault("_fit_cache", {})
        uniq, inverse = np.unique(np.asarray(curves, dtype=np.float64), axis=0, return_inverse=True)
        for c in uniq:
            if (key := c.tobytes()) not in cache:
                cache[key] = fit_peaks(c)
        fits = np.array([cache[c.tobytes()] for c in uniq]).reshape(-1, 3)
        return fits[np.asarray(inverse).reshape(-1)]

    def _model(self, k: np.ndarray, x: np.ndarray) -> np.ndarray:
        return k[:, 0] + k[:, 1] * np.exp(k[:, 2] * x)

    def plugin_scores(self, st, pod, idx):
        if getattr(self, "k", None) is None or len(self.k) != len(st):
            self.k = self._fits(st.curves)
        cap = st.alloc_cpu[idx].astype(np.float64)
        x = 100.0 * np.minimum(st.usage_cpu[idx], cap) / np.maximum(cap, 1)
        dx = 100.0 * self._predicted(pod) / np.maximum(cap, 1)
        k = self.k[idx]
        raw = self._model(k, x + dx) - self._model(k, x)
        lo, hi = raw.min(), raw.max()
        score = np.full(idx.size, 100, dtype=np.int64) if hi - lo <= 1e-12 else \
            (100 - 100 * (raw - lo) / (hi - lo)).astype(np.int64)
        return {"Peaks": (1, score)}


class EnergyGreedy:
    """Pick the node whose power rises least when the pod's request is added to its measured usage. A sleeping
    node's increase is measured from its sleep draw, so waking one costs its idle power.
    """

    name = "energy-greedy"

    @property
    def scorer(self) -> Scorer:
        return self

    def node_scores(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> NodeScores:
        w = self.marginal_watts(st, pod, idx)
        return NodeScores(idx, {"MarginalWatts": (-1, w)}, -w)

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        self.rng = rng

    def marginal_watts(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> np.ndarray:
        cap = np.maximum(st.alloc_cpu[idx], 1).astype(np.float64)
        u = st.usage_cpu[idx] / cap
        curves = st.curves[idx]
        now = np.where(st.power_state[idx] == ASLEEP, st.sleep_watts[idx], interp_many(curves, u))
        return interp_many(curves, u + pod.nz_cpu / cap) - now

    def choose(self, st, pod, mask):
        idx = np.flatnonzero(mask)
        if idx.size == 1:
            return int(idx[0])
        d = self.marginal_watts(st, pod, idx)
        ties = idx[d <= d.min() + 1e-9]
        return int(ties[self.rng.integers(ties.size)]) if ties.size > 1 else int(ties[0])


class RoundRobin:
    """The next feasible node after the last one chosen, wrapping around."""

    name = "round-robin"
    scorer = None

    def reset(self, state, rng):
        self.next = 0

    def choose(self, st, pod, mask):
        start = self.next
        j = start + int(mask[start:].argmax())
        if not mask[j]:  # nothing feasible from the pointer on: wrap around
            j = int(mask.argmax())
        self.next = (j + 1) % len(mask)
        return j


class Random:
    """A uniformly random feasible node."""

    name = "random"
    scorer = None

    def reset(self, state, rng):
        self.rng = rng

    def choose(self, st, pod, mask):
        idx = np.flatnonzero(mask)
        return int(idx[int(self.rng.random() * idx.size)])  # Generator.random is cheaper than .integers
