"""The DQN's per-decision passes over every node, compiled (numba): one loop each instead of dozens of numpy calls.

At 5,000 busy nodes a sampled decision (agent/dqn_policy.py) made some sixty numpy calls over every node or over
the sample: the heuristics' picks, the tightest fits, the most efficient nodes, the stride through the rest, and
then the sampled nodes' feature columns. Each call is cheap, but their fixed cost and the passes over memory added
up to most of a millisecond (docs/live.md, issue 28). Here each is one compiled loop, with the same arithmetic in
the same order as the numpy code it replaces, so the results are equal, not close:

* :func:`picks` is :func:`joulesched.agent.features.heuristic_picks` (ties, the 1e-9 W rounding and all);
* :func:`sample` is the sample of the numpy reference in tests/agent/test_fused.py (what the sample must hold is in dqn_policy's
  docstring);
* :func:`node_columns` is :meth:`FeatureBuilderV2.parts_at`'s node columns that read no predictor;
* :func:`empty_groups` is :meth:`FeatureBuilderV2.groups` (the keys index a table instead of being sorted);
* :func:`advance_view` brings the predictor's view forward (PodPredictor._advance: a scan of the pods' next
  change times instead of a heap).

tests/agent/test_fused.py checks each against its numpy counterpart on random states and along twin runs (the
groups and the predictor's view against their contract and their from-scratch computation in
test_features_incremental.py and test_predictor_incremental.py). The loops release the GIL (``nogil``), so a
live scheduler's informer and binding threads run beside a decision. They are compiled once per process before
the first decision (:func:`warm`, which the policies' ``warm`` and ``reset`` call; about 3.5 s on 2 cores), not
cached on disk: an installed package's directory may be read-only.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from joulesched.core.signals import held_signals
from joulesched.cluster.state import ASLEEP as _ASLEEP  # module globals: constants in a compiled loop
from joulesched.cluster.state import WAKING as _WAKING

#: How far above the least power increase a node may be and still round (to 1e-9 W) to the same value in pabfd's
#: pick: a node further away cannot tie, so only the nodes within it are rounded (rounding is monotone).
ROUND_MARGIN = 1e-6


@njit(cache=False, nogil=True)
def _round9(x):
    """numpy's ``np.round(x, 9)``: scale, round half to even, unscale."""
    return np.rint(x * 1e9) / 1e9


@njit(cache=False, nogil=True)
def _draw(flat, rise, i, x):
    """Node ``i``'s watts at ``x`` = utilisation x 10 (PickTables.draw)."""
    j = min(int(x), 9)
    k = i * 11 + j
    return flat[k] + (x - j) * rise[k]


@njit(cache=False, nogil=True)
def _least2(out, cnt, b1, b2, i, k1, k2):
    """Node ``i`` with keys (k1, k2) against the least keys so far (b1, b2) and the nodes holding them
    (``out[:cnt]``): returns the new (cnt, b1, b2)."""
    if k1 < b1 or (k1 == b1 and k2 < b2):
        out[0] = i
        return 1, k1, k2
    if k1 == b1 and k2 == b2:
        out[cnt] = i
        return cnt + 1, b1, b2
    return cnt, b1, b2


@njit(cache=False, nogil=True)
def picks(mask, ps, wpc, alloc_cpu, alloc_mem, nz_cpu, nz_mem, cap, flat, rise, pod_cpu, pod_mem):
    """(awake-first:fit=efficient's first nodes, pabfd's): :func:`~joulesched.agent.features.heuristic_picks`
    over the nodes where ``mask`` holds; each an int64 array in node order (an exact tie names every tied node).
    Successive minima over keys keep the nodes whose keys equal the lexicographic minimum, so each heuristic
    is one running minimum with its ties (a later key computed only where the earlier ones do not already
    lose): the first pass does awake-first and every awake node's power increase, the second pabfd among the
    increases within the rounding margin of the least."""
    n = mask.size
    d = np.empty(n)
    d_min = np.inf
    af = np.empty(n, dtype=np.int64)
    n_af = 0
    b1 = b2 = b3 = np.inf
    wake = np.empty(n, dtype=np.int64)
    n_wake = 0
    w1 = w2 = np.inf
    for i in range(n):
        if not mask[i]:
            continue
        w = wpc[i]
        if ps[i] == _ASLEEP:
            if n_af == 0 and w <= w1:  # while no awake node is feasible: the most efficient sleeper, the largest
                n_wake, w1, w2 = _least2(wake, n_wake, w1, w2, i, w, -float(alloc_cpu[i]))
            continue
        # awake-first:fit=efficient: watts per core, then the smallest free CPU share, then memory share.
        if w <= b1:
            k2 = (alloc_cpu[i] - nz_cpu[i] - pod_cpu) / float(max(alloc_cpu[i], 1))
            if w < b1 or k2 <= b2:
                k3 = (alloc_mem[i] - nz_mem[i] - pod_mem) / float(max(alloc_mem[i], 1))
                if w < b1 or k2 < b2 or k3 < b3:
                    b1, b2, b3 = w, k2, k3
                    af[0] = i
                    n_af = 1
                elif k3 == b3:
                    af[n_af] = i
                    n_af += 1
        c = cap[i]
        p0 = _draw(flat, rise, i, min(nz_cpu[i] / c, 1.0) * 10.0)
        di = _draw(flat, rise, i, min((nz_cpu[i] + pod_cpu) / c, 1.0) * 10.0) - p0
        d[i] = di
        d_min = min(d_min, di)
    if n_af == 0:
        out = wake[:n_wake]
        return out, out
    # pabfd: the least power increase (rounded to 1e-9 W among those within the margin), then the tighter fit.
    thr = d_min + ROUND_MARGIN
    pb = np.empty(n, dtype=np.int64)
    n_pb = 0
    r1 = r2 = np.inf
    for i in range(n):
        if mask[i] and ps[i] != _ASLEEP and d[i] <= thr:
            r = _round9(d[i])
            if r <= r1:
                n_pb, r1, r2 = _least2(pb, n_pb, r1, r2, i, r, (cap[i] - nz_cpu[i] - pod_cpu) / cap[i])
    return af[:n_af], pb[:n_pb]


@njit(cache=False, nogil=True)
def _push_smallest(buf_v, buf_i, filled, v, i):
    """Keep the ``len(buf_v)`` smallest (value, index) pairs seen, sorted ascending; indices come in increasing
    order, so among equal values the lower index is kept: the first entries of a stable argsort."""
    cap = buf_v.size
    if filled == cap and not v < buf_v[cap - 1]:
        return filled
    j = filled if filled < cap else cap - 1
    while j > 0 and v < buf_v[j - 1]:
        buf_v[j] = buf_v[j - 1]
        buf_i[j] = buf_i[j - 1]
        j -= 1
    buf_v[j] = v
    buf_i[j] = i
    return filled + 1 if filled < cap else filled


@njit(cache=False, nogil=True)
def sample(mask, ps, pods, wpc, alloc_cpu, nz_cpu, pod_cpu, af, pb, er, er_cnt, k, start, n_picks, n_fit, n_eff):
    """The sampled columns (sorted), the number of nodes each stands for, the positions of the feasible ones among
    them, and the next stride start: the numpy reference in tests/agent/test_fused.py after its picks. ``af``, ``pb``: the heuristics'
    picks; ``er``, ``er_cnt``: the representatives of the empty-node groups and their sizes; ``k``: the budget;
    ``start``: where the stride through the other busy nodes begins; ``n_picks``, ``n_fit``, ``n_eff``: how many
    busy picks of each heuristic, tightest fits among the awake busy feasible nodes and most efficient busy
    feasible nodes the sample always holds."""
    n = mask.size
    must = np.zeros(n, dtype=np.bool_)
    for p in (af, pb):
        c = 0
        for j in range(p.size):
            if c == n_picks:
                break
            i = p[j]
            if pods[i] > 0:
                must[i] = True
                c += 1
    fit_v = np.empty(n_fit)
    fit_i = np.empty(n_fit, dtype=np.int64)
    eff_v = np.empty(n_eff)
    eff_i = np.empty(n_eff, dtype=np.int64)
    nf = ne = 0
    n_busy = 0
    for i in range(n):
        if pods[i] <= 0:
            continue
        n_busy += 1
        if not mask[i]:
            continue
        if n_eff > 0:
            ne = _push_smallest(eff_v, eff_i, ne, wpc[i], i)
        if n_fit > 0 and ps[i] != _ASLEEP:
            free = (alloc_cpu[i] - nz_cpu[i] - pod_cpu) / max(alloc_cpu[i], 1)
            nf = _push_smallest(fit_v, fit_i, nf, free, i)
    for j in range(nf):
        must[fit_i[j]] = True
    for j in range(ne):
        must[eff_i[j]] = True
    n_must = 0
    for i in range(n):
        if must[i]:
            n_must += 1
    # The stride through the other busy nodes, each standing for rest / r nodes.
    n_rest = n_busy - n_must
    r = max(k - n_must - er.size, min(n_rest, 16))
    w = np.zeros(n)
    for i in range(n):
        if must[i]:
            w[i] = 1.0
    nxt = start
    if n_rest > r:
        step = n_rest / r
        st = start % n_rest
        nxt = (st + 1) % n_rest
        take = np.zeros(n_rest, dtype=np.bool_)
        for j in range(r):
            take[(st + int(j * step)) % n_rest] = True
        w_rest = n_rest / r
    else:
        take = np.ones(n_rest, dtype=np.bool_)
        w_rest = 1.0
    q = 0
    for i in range(n):
        if pods[i] > 0 and not must[i]:
            if take[q]:
                w[i] = w_rest
            q += 1
    for j in range(er.size):
        w[er[j]] = er_cnt[j]
    m = 0
    for i in range(n):
        if w[i] > 0.0:
            m += 1
    cols = np.empty(m, dtype=np.int64)
    cw = np.empty(m)
    pos = np.empty(m, dtype=np.int64)
    c = 0
    npos = 0
    for i in range(n):
        if w[i] > 0.0:
            cols[c] = i
            cw[c] = w[i]
            if mask[i]:
                pos[npos] = c
                npos += 1
            c += 1
    return cols, cw, pos[:npos], nxt


@njit(cache=False, nogil=True)
def _minimum(a, b):
    """``np.minimum`` of two floats (NaN propagates)."""
    return a if (a < b or math.isnan(a)) else b


@njit(cache=False, nogil=True)
def node_columns(o, cols, mask, ps, pods, req_cpu, req_mem, nz_cpu, nz_mem, inv_cpu, inv_mem, inv_pods, u_all,
                 w_all, curves, static, inv_max_peak, pc, pm, af, pb):
    """Schema 2's node columns of the nodes ``cols`` into ``o`` (N_NODE_V2, len(cols)), as
    :meth:`FeatureBuilderV2.parts_at` writes them, except the three predicted ones (19-21: the caller's)."""
    n = mask.size
    flag = np.zeros(n, dtype=np.int8)
    for j in range(af.size):
        flag[af[j]] |= 1
    for j in range(pb.size):
        flag[pb[j]] |= 2
    for c in range(cols.size):
        i = cols[c]
        ic = inv_cpu[i]
        u = u_all[i]
        w_now = w_all[i]
        share = pc * ic
        ua = u + share
        if math.isnan(ua):  # NaN in, NaN out (as numpy; an index from it would read anywhere)
            w_after = ua
        else:
            x = min(max(ua, 0.0), 1.0) * 10.0
            k = min(int(x), 9)
            lo = curves[i, k]
            w_after = lo + (x - k) * (curves[i, k + 1] - lo)
        o[0, c] = req_cpu[i] * ic
        o[1, c] = req_mem[i] * inv_mem[i]
        o[2, c] = pods[i] * inv_pods[i]
        o[3, c] = _minimum(u, 2.0)
        o[4, c] = _minimum(ua, 2.0)
        o[5, c] = _minimum(ua - 1.0 if ua - 1.0 > 0.0 or math.isnan(ua) else 0.0, 1.0)
        o[6, c] = _minimum((nz_cpu[i] + pc) * ic, 1.5)
        o[7, c] = _minimum((nz_mem[i] + pm) * inv_mem[i], 1.5)
        o[8, c] = w_now * inv_max_peak
        o[9, c] = (w_after - w_now) * inv_max_peak
        for f in range(6):
            o[10 + f, c] = static[i, f]
        o[16, c] = ps[i] == _ASLEEP
        o[17, c] = ps[i] == _WAKING
        o[18, c] = pods[i] == 0
        o[22, c] = _minimum(share, 1.5)
        o[23, c] = flag[i] & 1
        o[24, c] = (flag[i] >> 1) & 1
        o[25, c] = mask[i]


_warm = False


def warm() -> None:
    """Compile every loop here for the types a decision passes (once per process, a second or two), so the first
    decision of a run is not the one that pays for it."""
    global _warm
    if _warm:
        return
    with held_signals():  # a Ctrl-C mid-compile would be lost in numba's callbacks (core/signals.py)
        _compile_all()
    _warm = True


def _compile_all() -> None:
    n = 3
    mask = np.ones(n, dtype=np.bool_)
    ps = np.zeros(n, dtype=np.int8)
    i64 = np.arange(1, n + 1, dtype=np.int64)
    f64 = np.ones(n)
    curves = np.tile(np.linspace(50.0, 100.0, 11), (n, 1))
    af, pb = picks(mask, ps, f64, i64, i64, i64, i64, f64, curves.reshape(-1), np.zeros(n * 11), 1, 1)
    cols = sample(mask, ps, i64, f64, i64, i64, 1, af, pb, i64[:0], f64[:0], 2, 0, 1, 1, 1)[0]
    node_columns(np.zeros((26, cols.size), dtype=np.float32), cols, mask, ps, i64, i64, i64, i64, i64, f64, f64,
                 f64, f64, f64, curves, np.zeros((n, 6)), 1.0, 1.0, 1.0, af, pb)
    advance_view(1.0, n, f64.copy(), i64 - 1, f64, i64 - 1, np.full(n, -np.inf), np.zeros(n, dtype=np.bool_),
                 np.full(n, -np.inf), np.ones((n, 4)), np.full(n, -np.inf), np.zeros(n), 600.0, f64, 2.0)
    empty_groups(i64 - 1, np.zeros(n, dtype=np.int64), ps, mask)


@njit(cache=False, nogil=True)
def advance_view(now, m, t0, kid, cpu, node, end, stay, nxt, table, n_end, n_stay, h, edges, scale):
    """The predictor's incremental view brought to ``now`` (PodPredictor._advance): every running pod (slots below
    ``m``) whose bin or "still there in ``h``" flag may have changed by ``now`` (``nxt[k] <= now``; a new pod has
    -inf) evaluated afresh, its node's aggregates patched. One pass over the pods instead of a heap: no per-pod
    Python. Returns the nodes whose latest predicted end fell (the caller recomputes them from their pods)."""
    top = table.shape[1] - 1
    after = np.nextafter(now, np.inf)
    fell = np.empty(0, dtype=np.int64)
    n_fell = 0
    for k in range(m):
        if not nxt[k] <= now:
            continue
        t0k = t0[k]
        age = max(now - t0k, 0.0)
        b = min(int(scale * math.log(max(age, 1.0))), top)
        tb = table[kid[k], b]
        st = max(tb - age, max(1.0, 0.05 * age)) > h
        nx = np.inf
        if b < top:
            edge = t0k + edges[b + 1]
            nx = edge - 1e-12 * (abs(edge) + abs(t0k) + 1.0)
        c = t0k + tb - h  # T - age falls to h
        margin = 1e-12 * (abs(c) + abs(t0k) + 1.0)
        if c > now - margin:
            nx = min(nx, c - margin)
        c = t0k + h / 0.05  # age / 20 passes h
        margin = 1e-12 * (abs(c) + abs(t0k) + 1.0)
        if c > now - margin:
            nx = min(nx, c - margin)
        if nx <= now:
            nx = after
        e = t0k + tb
        j = node[k]
        old = end[k]
        if st != stay[k]:
            n_stay[j] += cpu[k] if st else -cpu[k]
        if old == n_end[j] and e < old:
            if n_fell == fell.size:
                grown = np.empty(max(8, 2 * fell.size), dtype=np.int64)
                grown[:n_fell] = fell[:n_fell]
                fell = grown
            fell[n_fell] = j
            n_fell += 1
        end[k] = e
        stay[k] = st
        nxt[k] = nx
        n_end[j] = max(n_end[j], e)
    return fell[:n_fell]


@njit(cache=False, nogil=True)
def empty_groups(pods, node_class, ps, mask):
    """FeatureBuilderV2.groups: the representatives (every busy node, and the lowest-index node of each group of
    empty nodes of one class, power state and feasibility) in node order, with the number of nodes each stands
    for; keys index a table (class x 6 + state x 2 + fits), so no sort. Returns (reps, counts, empty nodes,
    groups): the caller keeps every node where fewer than two are empty or no two share a group."""
    n = pods.size
    top = 0
    for i in range(n):
        top = max(top, node_class[i])
    first = np.full(top * 6 + 6, -1, dtype=np.int64)
    count = np.zeros(top * 6 + 6)
    n_empty = 0
    n_groups = 0
    for i in range(n):
        if pods[i] == 0:
            key = node_class[i] * 6 + ps[i] * 2 + (1 if mask[i] else 0)
            if first[key] < 0:
                first[key] = i
                n_groups += 1
            count[key] += 1.0
            n_empty += 1
    m = n - n_empty + n_groups
    reps = np.empty(m, dtype=np.int64)
    cnt = np.empty(m)
    c = 0
    for i in range(n):
        if pods[i] != 0:
            reps[c] = i
            cnt[c] = 1.0
            c += 1
        else:
            key = node_class[i] * 6 + ps[i] * 2 + (1 if mask[i] else 0)
            if first[key] == i:
                reps[c] = i
                cnt[c] = count[key]
                c += 1
    return reps, cnt, n_empty, n_groups
