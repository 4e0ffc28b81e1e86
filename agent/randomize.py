"""Domain randomisation of the DQN's training clusters (issue 15, "training that generalises").

:func:`random_scenario` draws one cluster and workload from a seeded generator, as a validated
:class:`~joulesched.cluster.scenario.Scenario` (so the twin, the env and the benchmark treat it like any file):

* **nodes**: 1 to 4 groups, 3 to ``max_nodes`` nodes in all (log-uniform), sizes from 4 to 64 cores with 2, 4
  or 8 GiB per core;
* **power curves drawn around the SPECpower tables** (power/curves.py): a table's shape with its peak scaled
  (lognormal, sigma 0.25), its idle share of the peak moved (lognormal, sigma 0.35, kept in [0.12, 0.9]: from
  modern servers that idle low to old ones that barely scale) and the rise bent by a power in [0.6, 1.6]; with
  ``hardware="wide"`` half the groups instead by watts per core at full load (:data:`HARDWARE`);
* **idle policy**: sleep with probability 0.7 (sleep after 60-900 s, wake in 10-180 s, 2-20 W asleep), else
  always on;
* **workload**: 1 to 3 kinds of job, each its own app, owner kind and priority, with its own lifetime
  distribution (median 1 minute to 1 hour, sigma 0.5-2.0: some kinds predictable, some not), request scale,
  usage share, best-effort share, Poisson or diurnal bursty arrivals; with probability 0.4 one or two kinds of
  service (Deployments with a daily load compressed into the run, some autoscaled);
* **load level**: the arrival rates are set so that the mean demanded CPU is 10-70 % of the cluster's.

Everything comes from the generator, so the same seed gives the same scenario.
"""

from __future__ import annotations

import math

import numpy as np

from joulesched.cluster.scenario import Scenario
from joulesched.cluster.workload import build_workload
from joulesched.power.curves import SPECPOWER

_SIZES_M = (4000, 8000, 8000, 16000, 24000, 24000, 32000, 48000, 64000)
_MEM_PER_CORE_MIB = (2048, 4096, 4096, 8192)
_PRIORITIES = (0, 0, 100, 1000, 10000)
_OWNERS = ("Job", "Job", "CronJob", "BorgJob", "")


#: How the nodes' curves are drawn (``dqn.randomize_hardware``): ``specpower``, around the SPECpower tables (a
#: table's peak, whatever the node's size); ``wide``, half the groups so and half by watts per core at full load
#: (log-uniform 1.5-12 W per core: frugal ARM-class nodes to old Xeons) with the idle share log-uniform in
#: [0.12, 0.6], so that one cluster can hold nodes whose peaks differ by about 70x, as real mixed fleets do.
HARDWARE = ("specpower", "wide")
_WIDE_W_PER_CORE = (1.5, 12.0)
_WIDE_IDLE_SHARE = (0.12, 0.6)


def random_curve(rng: np.random.Generator, cores: float | None = None, hardware: str = "specpower") -> list[float]:
    """An 11-point power curve around one of the SPECpower tables (module docstring); with ``hardware="wide"``
    and the node's ``cores``, half the time one drawn by watts per core instead (:data:`HARDWARE`)."""
    base = np.asarray(SPECPOWER[sorted(SPECPOWER)[int(rng.integers(len(SPECPOWER)))]], dtype=np.float64)
    if hardware == "wide" and cores is not None and rng.random() < 0.5:
        peak = _loguniform(rng, *_WIDE_W_PER_CORE) * cores
        idle_share = _loguniform(rng, *_WIDE_IDLE_SHARE)
    else:
        peak = base[10] * math.exp(rng.normal(0.0, 0.25))
        idle_share = float(np.clip(base[0] / base[10] * math.exp(rng.normal(0.0, 0.35)), 0.12, 0.9))
    rise = (base - base[0]) / max(base[10] - base[0], 1e-9)
    rise = np.clip(rise, 0.0, 1.0) ** rng.uniform(0.6, 1.6)
    idle = peak * idle_share
    curve = np.maximum.accumulate(np.round(idle + (peak - idle) * rise, 1))
    return [float(w) for w in curve]


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


#: Bursts of arrivals each job kind expects over the run, at least: e^-20 (2e-9) is the chance a kind draws none.
MIN_BURSTS = 20


def random_scenario(rng: np.random.Generator, max_nodes: int = 40, name: str = "random",
                    max_pods: int = 3000, hardware: str = "specpower") -> Scenario:
    """One randomised cluster and workload (module docstring), drawn from ``rng``; ``hardware``: how the curves
    are (:data:`HARDWARE`; ``specpower`` draws exactly what it drew before the option)."""
    if hardware not in HARDWARE:
        raise ValueError(f"hardware {hardware!r} is not one of {', '.join(HARDWARE)}")
    total = int(round(_loguniform(rng, 3, max(3, max_nodes))))
    n_groups = int(min(total, rng.integers(1, 5)))
    counts = 1 + rng.multinomial(total - n_groups, np.ones(n_groups) / n_groups)
    nodes, cap_m = [], 0.0
    for g in range(n_groups):
        cpu = int(_SIZES_M[int(rng.integers(len(_SIZES_M)))])
        mem = int(cpu // 1000 * _MEM_PER_CORE_MIB[int(rng.integers(len(_MEM_PER_CORE_MIB)))])
        nodes.append({"name_prefix": f"g{g}", "count": int(counts[g]), "cpu_m": cpu, "memory_mib": mem,
                      "max_pods": 110, "power_watts": random_curve(rng, cpu / 1000, hardware)})
        cap_m += cpu * int(counts[g])
    duration = float(rng.uniform(2, 8) * 3600)
    if rng.random() < 0.7:
        idle = {"mode": "sleep", "sleep_after_s": round(_loguniform(rng, 60, 900)),
                "sleep_watts": round(float(rng.uniform(2, 20)), 1), "wake_s": round(float(rng.uniform(10, 180)))}
        if hardware == "wide":  # a frugal node may idle below 2 W: asleep it must draw less than idle
            least_idle = min(float(g["power_watts"][0]) for g in nodes)
            idle["sleep_watts"] = min(idle["sleep_watts"], math.floor(5.0 * least_idle) / 10.0)
    else:
        idle = {"mode": "always_on"}
    jobs = []
    for k in range(int(rng.integers(1, 4))):
        lo = float(rng.uniform(0.3, 0.8))
        jobs.append({
            "pods": 1, "arrival": "diurnal" if rng.random() < 0.5 else "poisson", "mean_interarrival_s": 10.0,
            "burst_mean": round(float(rng.uniform(1, 4)), 2), "diurnal_period_s": duration,
            "diurnal_swing": round(float(rng.uniform(1.5, 4)), 2),
            "duration_median_s": round(_loguniform(rng, 60, 3600)), "duration_sigma": round(float(rng.uniform(0.5, 2.0)), 2),
            "max_duration_s": duration * 2, "cpu_scale": round(_loguniform(rng, 0.03, 0.15), 4),
            "usage_fraction": [round(lo, 3), round(min(1.2, lo + float(rng.uniform(0, 0.35))), 3)],
            "best_effort_fraction": round(float(rng.uniform(0, 0.1)), 3),
            "owner_kind": _OWNERS[int(rng.integers(len(_OWNERS)))], "app": f"kind-{k}",
            "priority": int(_PRIORITIES[int(rng.integers(len(_PRIORITIES)))])})
    services = []
    if rng.random() < 0.4:
        for k in range(int(rng.integers(1, 3))):
            cpu = int((250, 500, 1000, 2000)[int(rng.integers(4))])
            svc = {"name": f"svc-{k}", "count": int(rng.integers(1, 8)), "replicas": int(rng.integers(1, 5)),
                   "cpu_m": cpu, "memory_mib": int(cpu * 2), "priority": 1000,
                   "usage": {"pattern": "sinusoid", "mean_fraction": round(float(rng.uniform(0.2, 0.7)), 3),
                             "swing": round(float(rng.uniform(1, 4)), 2), "period_s": duration,
                             "peak_s": round(float(rng.uniform(0, duration))), "step_s": 300}}
            if rng.random() < 0.5:
                svc["autoscale"] = {"min_replicas": 1, "target_fraction": 0.6}
            services.append(svc)
    target = float(rng.uniform(0.1, 0.7)) * cap_m * duration  # millicore-seconds demanded over the run
    seed = int(rng.integers(2**31 - 1))

    def scenario(job_specs: list[dict]) -> Scenario:
        wl = {"jobs": job_specs} | ({"services": services} if services else {})
        return Scenario.model_validate({"name": name, "seed": seed, "duration_s": duration, "idle_policy": idle,
                                        "nodes": nodes, "workload": wl})

    # Calibrate the load: build with a reference rate, then scale each kind's arrival rate to its share.
    draft = [dict(j, pods=max_pods, mean_interarrival_s=duration / max_pods * len(jobs)) for j in jobs]
    sc = scenario(draft)
    wl = build_workload(sc, seed)
    svc_demand = 0.0
    if services:
        svc_demand = build_workload(scenario([dict(draft[0], pods=1)]), seed).demand_m_s(duration)
    job_demand = max(wl.demand_m_s(duration) - svc_demand, 1.0)
    want = max(target - svc_demand, 0.05 * target)
    factor = want / job_demand  # > 1: more pods per second
    # Past the pod cap the jobs run longer instead (up to 10x), then the load is what it is.
    stretch = min(10.0, max(1.0, factor))
    factor /= stretch
    final = []
    for j in draft:
        # At least MIN_BURSTS bursts expected before the end: with fewer, a kind whose rate the services' load
        # squeezed could draw no pod at all for some workload seed (none in e^-m of them, m the bursts expected),
        # and that workload is refused; training met one at seed 1 after 40 minutes.
        ia = min(float(j["mean_interarrival_s"]) / factor, duration / (MIN_BURSTS * float(j["burst_mean"])))
        final.append(dict(j, mean_interarrival_s=round(max(ia, 0.05), 3),
                          duration_median_s=round(float(j["duration_median_s"]) * stretch, 1),
                          pods=int(max(1, min(max_pods // len(jobs), duration / max(ia, 0.05) * 1.2)))))
    return scenario(final)


__all__ = ["HARDWARE", "random_curve", "random_scenario"]
