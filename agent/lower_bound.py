"""The offline energy lower bound: a clairvoyant fluid relaxation that no policy can beat in the twin.

docs/lower-bound.md states it and proves it. In short:

1. Each node's cost of serving x millicores is at least c_i(x), the lower convex envelope of its curve, with
   x = 0 costing its floor (the sleep draw where nodes may sleep, else its idle watts).
2. The cluster's cost of serving Y millicores is at least G(Y) = min sum c_i(x_i) with sum x_i = Y: convex and
   piecewise linear, built by filling the envelopes' segments in order of slope (watts per millicore).
3. A job is served at most at its demanded rate, from its arrival on, so by time t at most
   A(t) = sum_j W_j(clip(t - a_j, 0, d_j)) has been served (W_j(x): the job's demand integrated over its
   first x seconds of progress; u_j x for a constant job), and no run ends before
   H' = max(duration_s, max_j a_j + d_j). With S(t) the job work served by t, S(t) <= A(t) and S(T) = W. For
   convex G the cheapest such S on [0, T] is the lower convex hull of A's corners and (T, W) (a taut string),
   and we minimise over every T >= H' exactly, vertex by vertex.

GPUs (issue 25): an awake node draws its GPUs' idle watts whatever its CPU does, so each node's curve and idle
draw in G include them (asleep it draws its sleep watts, GPUs included); and a GPU job holds its GPUs while it
runs, at least d_j seconds, on a node whose GPUs it fits, which adds at least its share times the least rise
per unit of share of any such node's GPU curve (the curve's smallest chord slope from idle): a constant
(:func:`gpu_dynamic_joules`) added to the bound. It ignores which GPUs must be awake, which only makes it lower.

Services count for nothing beyond the floor: no work of theirs is conserved (a throttled service's demand is
lost, not served later) and a run may leave one waiting, so no served amount of theirs holds for every run
(docs/lower-bound.md has the counterexamples). It ignores memory, pod slots, wake-up time and the
discreteness of pods, which only makes it lower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from joulesched.cluster.state import ClusterState
from joulesched.cluster.workload import JOB, Workload


@dataclass(frozen=True)
class LowerBound:
    joules: float
    end_s: float  # the window length T that attains it
    floor_watts: float  # b: every node at its floor
    work_m_s: float  # W: job millicore-seconds served (services' demand is not in it)


def node_envelope(curve: np.ndarray, cap_m: float, floor_w: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower convex hull of (0, floor) and (k cap / 10, P_k), k = 1..10. Returns segment widths and slopes."""
    xs = np.linspace(0.0, cap_m, 11)
    ys = np.array(curve, dtype=np.float64)
    ys[0] = min(ys[0], floor_w)
    hx, hy = _lower_hull(xs, ys)
    return np.diff(hx), np.diff(hy) / np.diff(hx)


def _lower_hull(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Andrew's monotone chain, lower half, for points sorted by x."""
    hx: list[float] = []
    hy: list[float] = []
    for x, y in zip(xs.tolist(), ys.tolist()):
        while len(hx) >= 2 and (hx[-1] - hx[-2]) * (y - hy[-2]) - (hy[-1] - hy[-2]) * (x - hx[-2]) <= 0:
            hx.pop()
            hy.pop()
        hx.append(x)
        hy.append(y)
    return np.array(hx), np.array(hy)


def _gpu_idle(state: ClusterState) -> np.ndarray:
    """Each node's GPUs' idle draw in all (0 without GPUs): what its GPUs draw while it is awake."""
    return state.alloc_gpu * state.gpu_curves[:, 0] if state.has_gpus else np.zeros(len(state))


def cluster_cost(state: ClusterState) -> tuple[float, np.ndarray, np.ndarray]:
    """G as (b, breakpoints X, values G(X)), X from 0 to the cluster's total CPU; an awake node's draw includes
    its GPUs' idle watts."""
    gidle = _gpu_idle(state)
    idle = state.idle_watts + gidle
    floors = np.minimum(state.sleep_watts, idle) if state.can_sleep else idle
    widths, slopes = [], []
    for i in range(len(state)):
        cap = float(state.alloc_cpu[i])
        if cap <= 0:
            continue
        w, s = node_envelope(np.asarray(state.curves[i]) + gidle[i], cap, float(floors[i]))
        widths.append(w)
        slopes.append(s)
    b = float(floors.sum())
    if not widths:
        return b, np.array([0.0]), np.array([b])
    w = np.concatenate(widths)
    s = np.concatenate(slopes)
    order = np.argsort(s, kind="stable")
    w, s = w[order], s[order]
    x = np.concatenate(([0.0], np.cumsum(w)))
    g = np.concatenate(([b], b + np.cumsum(w * s)))
    return b, x, g


def gpu_dynamic_joules(state: ClusterState, workload: Workload, keep: np.ndarray | None = None) -> float:
    """The least GPU energy above idle that the GPU jobs ``keep`` (default: all jobs) use in any run: each holds
    its GPUs at least ``d`` seconds while its node is on, on a node whose empty GPUs fit it (count and model),
    drawing at least its share (count x milli / 1000) times that node's smallest chord slope of its GPU curve
    from idle (watts per GPU of share)."""
    if not (state.has_gpus and workload.has_gpus):
        return 0.0
    sel = (workload.kind == JOB) & (workload.gpu > 0)
    if keep is not None:
        sel &= np.asarray(keep, dtype=bool)
    if not sel.any():
        return 0.0
    gc = state.gpu_curves
    chord = ((gc[:, 1:] - gc[:, :1]) / (np.arange(1, 11) / 10.0)[None, :]).min(axis=1)  # W per GPU of share
    whole = gc[:, 10] - gc[:, 0]  # a whole GPU sits at 100 % of its curve
    total = 0.0
    for j in np.flatnonzero(sel).tolist():
        g, milli = int(workload.gpu[j]), int(workload.gpu_milli[j])
        ok = state.alloc_gpu >= (g if milli >= 1000 else 1)
        models = workload.gpu_spec_table[int(workload.gpu_spec[j])]
        if models is not None:
            ok &= state.gpu_model_mask(models)
        if not ok.any():
            continue  # fits no node: never placed
        rate = g * whole if milli >= 1000 else (milli / 1000.0) * chord
        total += float(rate[ok].min()) * float(workload.duration_s[j])
    return total


class _G:
    """G(Y), extended past the cluster's capacity with its steepest slope (a relaxation: only lowers G)."""

    def __init__(self, b: float, x: np.ndarray, g: np.ndarray):
        self.b, self.x, self.g = b, x, g
        self.max_slope = float((g[-1] - g[-2]) / (x[-1] - x[-2])) if x.size > 1 else 0.0
        slopes = np.diff(g) / np.maximum(np.diff(x), 1e-300) if x.size > 1 else np.zeros(0)
        intercepts = g[:-1] - slopes * x[:-1]  # alpha_s of G = alpha_s + beta_s Y on segment s (decreasing)
        # tau * G(R / tau) is minimised where the intercept changes sign: at breakpoint x*.
        neg = np.flatnonzero(intercepts < 0)
        self.x_star = float(x[neg[0]]) if neg.size else math.inf
        if neg.size and neg[0] == 0:
            self.x_star = 0.0

    def __call__(self, y: float) -> float:
        if y <= self.x[-1]:
            return float(np.interp(y, self.x, self.g))
        return float(self.g[-1] + self.max_slope * (y - self.x[-1]))

    def perspective(self, tau: float, r: float) -> float:
        """Cost of serving ``r`` millicore-seconds evenly over ``tau`` seconds: tau * G(r / tau)."""
        if tau <= 0:
            return r * self.max_slope if r > 0 else 0.0
        return tau * self(r / tau)


def _profile_corners(wl: Workload, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Slope changes of the barrier of the profiled jobs ``idx``: at ``a_j + x_k`` for each breakpoint ``x_k``
    of progress inside its work (the first value holds from progress 0), and at ``a_j + d_j`` back to 0.
    Returns (times, slope changes, the jobs' total work)."""
    times: list[float] = []
    slopes: list[float] = []
    work = 0.0
    for j in idx.tolist():
        a, d = float(wl.submit_s[j]), float(wl.duration_s[j])
        pa, pb = wl.profile_bounds(j)
        t, m = wl.prof_t[pa:pb].tolist(), wl.prof_m[pa:pb].tolist()
        prev = 0.0
        for k, (x, v) in enumerate(zip(t, m)):
            if k and x >= d:
                break
            times.append(a + (x if k else 0.0))
            slopes.append(v - prev)
            prev = v
        times.append(a + d)
        slopes.append(-prev)
        work += wl.usage_integral(j, 0.0, d)
    return np.array(times), np.array(slopes), work


def lower_bound(state: ClusterState, workload: Workload, horizon_s: float,
                placeable: np.ndarray | None = None) -> LowerBound:
    """Minimum over T >= max(horizon, last clairvoyant job completion) and causal schedules of the integral of
    G(S'(t)), S the jobs' work served (services add nothing beyond the floor; see the module docstring)."""
    b, x, g = cluster_cost(state)
    G = _G(b, x, g)
    keep = np.ones(len(workload), dtype=bool) if placeable is None else np.asarray(placeable, dtype=bool)
    keep = keep & (workload.kind == JOB)
    const = keep & (workload.profile < 0)
    a = workload.submit_s[const]
    u = workload.usage_m[const]
    d = workload.duration_s[const]
    total = float(np.dot(u, d))
    prof = np.flatnonzero(keep & (workload.profile >= 0))
    pt, ps, pw = _profile_corners(workload, prof) if prof.size else (np.zeros(0), np.zeros(0), 0.0)
    total += pw
    # No job can finish before arrival + duration (its progress rate is at most 1), so no run ends before the
    # clairvoyant last completion.
    ends = workload.submit_s[keep] + workload.duration_s[keep]
    h_min = max(horizon_s, float(ends.max()) if ends.size else 0.0)
    gdyn = gpu_dynamic_joules(state, workload, keep)
    if total <= 0:
        return LowerBound(b * h_min + gdyn, h_min, b, 0.0)
    # Barrier A(t): job work that could have been served by t, piecewise linear with breakpoints at arrivals,
    # profile breakpoints and clairvoyant completions.
    t_ev = np.concatenate((a, a + d, pt))
    slope_ev = np.concatenate((u, -u, ps))
    order = np.argsort(t_ev, kind="stable")
    t_ev, slope_ev = t_ev[order], slope_ev[order]
    times, first = np.unique(t_ev, return_index=True)
    slope_after = np.cumsum(slope_ev)[np.r_[first[1:] - 1, t_ev.size - 1]]
    vals = np.concatenate(([0.0], np.cumsum(slope_after[:-1] * np.diff(times))))
    px = np.concatenate(([0.0], times)) if times[0] > 0 else times
    py = np.concatenate(([0.0], vals)) if times[0] > 0 else vals
    py = np.minimum(py, total)
    hx, hy = _lower_hull(px, py)
    # prefix[k]: cost of following the corner hull from the origin to vertex k.
    seg = [G.perspective(float(dt), float(ds)) for dt, ds in zip(np.diff(hx), np.diff(hy))]
    prefix = np.concatenate(([0.0], np.cumsum(seg)))
    best, best_t = math.inf, h_min
    for k in range(hx.size):
        tv, sv = float(hx[k]), float(hy[k])
        r = total - sv
        if r <= total * 1e-12:
            # Everything served by this vertex; the rest of the window idles at the floor.
            cost = float(prefix[k]) + b * max(0.0, h_min - tv)
            if cost < best:
                best, best_t = cost, max(tv, h_min)
            continue
        t_lo = h_min
        if k + 1 < hx.size:
            slope_next = float(hy[k + 1] - sv) / float(hx[k + 1] - tv)
            if slope_next <= r / 1e12:
                continue  # no reasonable window keeps the straight finish under the next corner
            t_lo = max(t_lo, tv + r / slope_next)
        tau_lo = t_lo - tv
        tau_star = r / G.x_star if G.x_star > 0 else math.inf
        if G.x_star == math.inf:
            tau_star = 0.0
        tau = max(tau_lo, tau_star)
        if not math.isfinite(tau):
            continue
        cost = float(prefix[k]) + G.perspective(tau, r)
        if cost < best:
            best, best_t = cost, tv + tau
    return LowerBound(best + gdyn, best_t, b, total)
