"""kube-scheduler's resource scoring, with its exact integer arithmetic (reference.md sections 1 and 3).

Every function takes int64 arrays over candidate nodes and returns int64 scores in [0, 100]. Resources whose
allocatable is 0 are skipped, as kube-scheduler does. Go's integer division truncates toward zero; where an
operand can be negative we do the same rather than Python's floor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_NODE_SCORE = 100
MAX_CUSTOM_PRIORITY_SCORE = 10
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE = 5


def _weighted(scores: Sequence[np.ndarray], allocs: Sequence[np.ndarray], weights: Sequence[int]) -> np.ndarray:
    """floor(sum w_r s_r / sum w_r) over resources with allocatable > 0 (0 when none counts)."""
    if all(int(a.min(initial=1)) > 0 for a in allocs):  # the usual case: no resource is skipped anywhere
        num = scores[0] * weights[0]
        for s, w in zip(scores[1:], weights[1:]):
            num += s * w
        return num // sum(weights)
    num = np.zeros_like(scores[0])
    den = np.zeros_like(scores[0])
    for s, a, w in zip(scores, allocs, weights):
        valid = a > 0
        num += np.where(valid, s * w, 0)
        den += np.where(valid, w, 0)
    return np.where(den > 0, num // np.maximum(den, 1), 0)


def least_allocated(alloc: Sequence[np.ndarray], requested: Sequence[np.ndarray],
                    weights: Sequence[int] = (1, 1)) -> np.ndarray:
    """NodeResourcesFit LeastAllocated: s_r = (A - R) * 100 / A, 0 when R > A."""
    scores = [np.where(r > a, 0, (a - r) * MAX_NODE_SCORE // np.maximum(a, 1)) for a, r in zip(alloc, requested)]
    return _weighted(scores, alloc, weights)


def most_allocated(alloc: Sequence[np.ndarray], requested: Sequence[np.ndarray],
                   weights: Sequence[int] = (1, 1)) -> np.ndarray:
    """NodeResourcesFit MostAllocated: s_r = min(R, A) * 100 / A."""
    scores = [np.minimum(r, a) * MAX_NODE_SCORE // np.maximum(a, 1) for a, r in zip(alloc, requested)]
    return _weighted(scores, alloc, weights)


def go_div(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    """Integer division truncating toward zero, as Go's ``/`` on int64."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q)


def broken_linear(shape: Sequence[tuple[int, int]], p: np.ndarray) -> np.ndarray:
    """kube-scheduler's buildBrokenLinearFunction over utilisation ``p`` (0..100); shape scores already x10."""
    p = np.asarray(p, dtype=np.int64)
    out = np.full(p.shape, shape[-1][1], dtype=np.int64)
    done = np.zeros(p.shape, dtype=bool)
    for i, (u, s) in enumerate(shape):
        hit = ~done & (p <= u)
        if i == 0:
            out = np.where(hit, s, out)
        else:
            u0, s0 = shape[i - 1]
            out = np.where(hit, s0 + go_div((s - s0) * (p - u0), u - u0), out)
        done |= hit
    return out


def validate_shape(shape: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Check a RequestedToCapacityRatio shape as kube-scheduler's validation does; scale scores by 10."""
    if not shape:
        raise ValueError("shape needs at least one point")
    out = []
    prev = -1
    for u, s in shape:
        if not (0 <= u <= 100):
            raise ValueError(f"shape utilization {u} must be in 0..100")
        if not (0 <= s <= MAX_CUSTOM_PRIORITY_SCORE):
            raise ValueError(f"shape score {s} must be in 0..{MAX_CUSTOM_PRIORITY_SCORE}")
        if u <= prev:
            raise ValueError("shape utilizations must be strictly increasing")
        prev = u
        out.append((int(u), int(s) * (MAX_NODE_SCORE // MAX_CUSTOM_PRIORITY_SCORE)))
    return out


def requested_to_capacity_ratio(alloc: Sequence[np.ndarray], requested: Sequence[np.ndarray],
                                shape: Sequence[tuple[int, int]], weights: Sequence[int] = (1, 1)) -> np.ndarray:
    """RequestedToCapacityRatio: u_r = R * 100 / A (100 if A = 0 or R > A), s_r = f(u_r).

    The node score is round(sum over s_r > 0 of w_r s_r / sum of those w_r), 0 when no resource scores.
    ``shape`` is the already-scaled output of :func:`validate_shape`.
    """
    num = np.zeros(len(alloc[0]), dtype=np.int64)
    den = np.zeros(len(alloc[0]), dtype=np.int64)
    for a, r, w in zip(alloc, requested, weights):
        u = np.where((a == 0) | (r > a), MAX_NODE_SCORE, r * MAX_NODE_SCORE // np.maximum(a, 1))
        s = broken_linear(shape, u)
        pos = (s > 0) & (a > 0)
        num += np.where(pos, s * w, 0)
        den += np.where(pos, w, 0)
    # Go's math.Round rounds half away from zero; scores are >= 0 so floor(x + 0.5) matches.
    return np.where(den > 0, np.floor(num / np.maximum(den, 1) + 0.5), 0).astype(np.int64)


def balanced_allocation(alloc: Sequence[np.ndarray], requested: Sequence[np.ndarray]) -> np.ndarray:
    """NodeResourcesBalancedAllocation on real requests: floor((1 - std of min(R/A, 1)) * 100).

    Float64 operations in the same order as kube-scheduler so that truncation lands on the same integer.
    """
    fracs = []
    for a, r in zip(alloc, requested):
        f = np.minimum(r.astype(np.float64) / np.where(a > 0, a, 1).astype(np.float64), 1.0)
        fracs.append(np.where(a > 0, f, np.nan))
    f = np.vstack(fracs)
    valid = ~np.isnan(f)
    n = valid.sum(axis=0)
    if f.shape[0] == 2:
        std = np.where(n == 2, np.abs((f[0] - f[1]) / 2), 0.0)
    else:
        fz = np.where(valid, f, 0.0)
        mean = fz.sum(axis=0) / np.maximum(n, 1)
        var = np.where(valid, (fz - mean) ** 2, 0.0).sum(axis=0) / np.maximum(n, 1)
        std = np.where(n >= 2, np.sqrt(var), 0.0)
    return ((1 - std) * MAX_NODE_SCORE).astype(np.int64)


def default_normalize_reverse(counts: np.ndarray) -> np.ndarray:
    """framework's ``DefaultNormalizeScore(MaxNodeScore, reverse=true)`` over the scored nodes: a count scaled to
    0..100 against the largest (integer, truncating), then reversed; all 100 when every count is 0."""
    top = int(counts.max(initial=0))
    if top == 0:
        return np.full(counts.shape, MAX_NODE_SCORE, dtype=np.int64)
    return MAX_NODE_SCORE - counts.astype(np.int64) * MAX_NODE_SCORE // top


def num_nodes_to_score(n_nodes: int, percentage: int = 0) -> int:
    """kube-scheduler's numFeasibleNodesToFind (percentageOfNodesToScore; 0 = adaptive)."""
    if n_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return n_nodes
    if percentage == 0:
        percentage = max(MIN_FEASIBLE_NODES_PERCENTAGE, 50 - n_nodes // 125)
    k = n_nodes * percentage // 100
    return max(k, MIN_FEASIBLE_NODES_TO_FIND)


def target_load_packing(usage_m: np.ndarray, capacity_m: np.ndarray, predicted_m: float,
                        target: float = 40.0) -> np.ndarray:
    """TargetLoadPacking (scheduler-plugins): rises to ``target`` % utilisation, then falls to 0 at 100 %."""
    u = 100.0 * (usage_m + predicted_m) / np.maximum(capacity_m, 1)
    up = np.floor((100.0 - target) * u / target + target + 0.5)
    down = np.floor(target * (100.0 - u) / (100.0 - target) + 0.5)
    s = np.where(u <= target, up, np.where(u <= 100.0, down, 0.0))
    return s.astype(np.int64)


def tlp_predicted_usage(cpu_request_m: int | None, cpu_limit_m: int | None = None) -> float:
    """TargetLoadPacking's pod usage prediction: limit, else request x 1.5, else 1000m. A limit or request that
    is present counts, 0 included (scheduler-plugins tests the key, not its value)."""
    if cpu_limit_m is not None:
        return float(cpu_limit_m)
    if cpu_request_m is not None:
        return float(int(cpu_request_m * 1.5 + 0.5))  # Go: int64(math.Round(request * 1.5))
    return 1000.0
