"""Random small clusters through the twin (a fuzz of 6,800 runs, kept as a property): heterogeneous
CPU and GPU nodes, labels and taints, sleep with min_awake, spare CPU and consolidation, jobs and services with
node selectors and tolerations, GPU shares, under a rotating set of policies. Every run ends, every pod is
either placed or unplaced for a stated reason (none still pending at the end), the energy lies between every node asleep and every node at its
peak, per-node energies add up to it, and a second run is identical."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as stg

from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.filters import Toleration, pod_constraints
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import JOB, SERVICE, Workload
from tests.helpers import scenario

POLICIES = ("default-k8s", "most-allocated", "awake-first:fit=efficient", "pabfd:empty=asleep", "lifetime-aware",
            "gpu-packing", "fgd", "gpu-energy:empty=asleep", "gpu-lifetime-aware", "round-robin", "random")
CONSTRAINTS = (None, pod_constraints({"zone": "a"}),
               pod_constraints(tolerations=[Toleration(key="ded", operator="Equal", value="x", effect="NoSchedule")]),
               pod_constraints({"zone": "b"}, tolerations=[Toleration(key="ded", operator="Exists")]))


def _case(seed: int):
    rng = np.random.default_rng(seed)
    gpu = rng.random() < 0.4
    groups = []
    for _ in range(rng.integers(1, 4)):
        idle, ex = float(rng.uniform(20, 120)), float(rng.uniform(0.5, 1.5))
        peak = idle + float(rng.uniform(10, 200))
        g = {"count": int(rng.integers(1, 4)), "cpu_m": int(rng.choice([1000, 2000, 4000])),
             "memory_mib": int(rng.choice([1024, 4096])), "max_pods": int(rng.choice([2, 5, 110])),
             "never_sleep": bool(rng.random() < 0.15),
             "power_watts": [idle + (peak - idle) * (k / 10) ** ex for k in range(11)]}
        if rng.random() < 0.3:
            g["labels"] = {"zone": str(rng.choice(["a", "b"]))}
        if rng.random() < 0.15:
            g["taints"] = [{"key": "ded", "value": "x", "effect": "NoSchedule"}]
        if gpu and rng.random() < 0.7:
            g.update(gpu_count=int(rng.integers(1, 5)), gpu_model="T4")
        groups.append(g)
    idle_policy = None
    if rng.random() < 0.75:
        idle_policy = {"mode": "sleep", "sleep_after_s": float(rng.choice([0, 10, 60])),
                       "sleep_watts": float(rng.uniform(0, 15)), "wake_s": float(rng.choice([0, 5, 60])),
                       "min_awake": min(int(rng.integers(0, 3)), sum(g["count"] for g in groups)),
                       "spare_cpu_m": int(rng.choice([0, 0, 500])), "recheck_s": float(rng.choice([10, 60]))}
        if rng.random() < 0.5:
            idle_policy["consolidation"] = {"interval_s": float(rng.choice([30, 100])),
                                            "max_evictions_per_hour": int(rng.choice([0, 60])),
                                            "restart_s": float(rng.choice([0, 30])),
                                            "checkpoint_fraction": float(rng.choice([0, 1]))}
    horizon = float(rng.choice([200, 1000, 3000]))
    n = int(rng.integers(1, 30))
    submit = np.sort(rng.uniform(0, horizon * 1.1, n))
    if rng.random() < 0.3:
        submit = np.round(submit / 50) * 50  # arrivals at one instant
    cpu = rng.choice([-1, 0, 100, 500, 900, 1500, 5000], n).astype(np.int64)
    kw = {}
    if gpu:
        count = rng.choice([0, 0, 1, 2], n).astype(np.int16)
        kw = {"gpu": count, "gpu_milli": np.where((count == 1) & (rng.random(n) < 0.5), rng.choice([100, 500], n),
                                                  1000).astype(np.int16)}
    if rng.random() < 0.4:
        kw.update(placement=rng.integers(0, len(CONSTRAINTS), n).astype(np.int32), placement_table=CONSTRAINTS)
    wl = Workload(submit, np.maximum(rng.exponential(200, n), 0.0), cpu,
                  rng.choice([-1, 0, 100, 900, 3000], n).astype(np.int64),
                  np.array([rng.uniform(0, max(c, 100) * 1.2) for c in cpu]),
                  kind=np.where(rng.random(n) < rng.choice([0, 0.3, 1]), SERVICE, JOB).astype(np.int8), **kw)
    return scenario(groups, duration_s=horizon, idle=idle_policy), wl


@pytest.mark.timeout(300)
@settings(max_examples=int(os.environ.get("TWIN_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(stg.integers(0, 2**32 - 1), stg.sampled_from(POLICIES))
def test_random_clusters_end_with_every_pod_accounted_and_energy_in_bounds(seed, policy):
    sc, wl = _case(seed)
    tw = Twin(sc, wl)
    r = run_policy(tw, make_policy(policy), 0)
    assert r.placed_pods + r.unplaced_fits_no_node + r.unplaced_pending_at_end + \
        r.unplaced_stopped_before_running == len(wl.submit_s)
    assert r.unplaced_fits_no_node == int((~tw.placeable).sum())
    # The run ends once no job is bound and none is to come: a pod still pending then fits no empty node, so it
    # is one counted as fitting none (a pod whose cpu fitted one node and GPUs another waited for ever here).
    assert r.unplaced_pending_at_end == 0
    assert r.completed_pods <= r.placed_pods
    st = tw.state
    floor = float(np.minimum(st.sleep_watts, st.idle_watts).sum()) * r.end_s
    peak = (float(st.peak_watts.sum()) + float((st.gpu_curves.max(axis=1) * st.alloc_gpu).sum())) * r.end_s
    assert floor * (1 - 1e-9) - 1e-6 <= r.energy_joules <= peak * (1 + 1e-9) + 1e-6
    if r.node_energy_joules is not None:
        assert sum(r.node_energy_joules) == pytest.approx(r.energy_joules, rel=1e-9, abs=1e-6)
    again = run_policy(Twin(sc, wl), make_policy(policy), 0)
    assert (again.energy_joules, again.end_s, again.placements) == (r.energy_joules, r.end_s, r.placements)
