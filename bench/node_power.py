"""Node power in the twin: energy with consolidation off and on, for every policy, on the standard suite's sleep
scenarios and on a service-dominated cluster after a 50 % scale-in; and how long after the scale-in the
cluster's power comes within 5 % of the lower bound.

Run: .venv/bin/python bench/node_power.py [--policies a,b] [--json FILE]

Consolidation settings (the decision core's, cluster/nodepower.py): the suite uses interval 300 s, at most 60
evictions an hour, restart 30 s, a 1 h horizon, and jobs lose their progress when evicted (none checkpoints);
the service scenario uses interval 120 s, 120 evictions an hour, and services keep serving once restarted
(checkpoint_fraction 1: an evicted service loses only its restart).

The service scenario: 20 nodes of three generations (as heterogeneous-sleep), 240 long-running services
(250/500/1000 m, using 70 % of it) started in the first 10 minutes; at t = 1 h half of them, chosen at random,
are scaled in; the rest run to the 4 h horizon. Two references for the power after the scale-in:

- the bound: the clairvoyant fluid relaxation of docs/lower-bound.md at the load then running, G(Y(t)) (every
  node at its sleep draw, the load poured onto the cheapest convex segments). Services use 70 % of their
  requests, so no packing by requests can bring a node past 70 % busy: the bound is out of reach by design;
- the best fresh packing: the lowest steady power (2 h to 3.5 h) any policy reaches when only the surviving
  services are placed from the start, i.e. what the cluster could draw had it never been scaled in.

"Time to 5 %" is the first 60 s bin after the scale-in from which on (up to 3.5 h) the power stays within 5 %
of the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from joulesched.agent.lower_bound import _G, cluster_cost  # noqa: E402
from joulesched.agent.registry import BASELINES, make_policy  # noqa: E402
from joulesched.agent.runner import run_policy  # noqa: E402
from joulesched.cluster.scenario import Consolidation, Scenario, Sleep, load_scenario  # noqa: E402
from joulesched.cluster.twin import Twin, cluster_from_scenario, common_window  # noqa: E402
from joulesched.cluster.workload import Workload, build_workload  # noqa: E402
from joulesched.pipelines.suite import SHIPPED_MODEL, standard_suite  # noqa: E402

SUITE_CONSOLIDATION = Consolidation(interval_s=300, max_evictions_per_hour=60, restart_s=30, horizon_s=3600)
SERVICE_CONSOLIDATION = Consolidation(interval_s=120, max_evictions_per_hour=120, restart_s=30, horizon_s=3600,
                                      checkpoint_fraction=1.0)
SCALE_IN_S, HORIZON_S = 3600.0, 14400.0


def with_consolidation(sc: Scenario, c: Consolidation | None) -> Scenario:
    return sc.model_copy(update={"idle_policy": sc.idle_policy.model_copy(update={"consolidation": c})})


def service_scenario(seed: int = 7) -> tuple[Scenario, Workload]:
    sc = Scenario.model_validate(dict(
        name="services-scale-in", seed=seed, duration_s=HORIZON_S,
        idle_policy=dict(mode="sleep", sleep_after_s=300, sleep_watts=8, wake_s=60),
        nodes=[dict(name_prefix="ml110-g4", count=8, cpu_m=8000, memory_mib=32768, power_watts="hp-ml110-g4"),
               dict(name_prefix="x3250", count=8, cpu_m=8000, memory_mib=32768, power_watts="ibm-x3250-x3470"),
               dict(name_prefix="x5675", count=4, cpu_m=24000, memory_mib=98304, power_watts="ibm-x3550-m3-x5675")],
        workload=dict(synthetic=dict(pods=1, mean_interarrival_s=1))))
    rng = np.random.default_rng(seed)
    n = 240
    submit = np.sort(rng.uniform(0, 600, n))
    cpu = rng.choice([250, 500, 1000], n)
    mem = rng.choice([512, 1024, 2048], n)
    scaled_in = rng.permutation(n) < n // 2
    dur = np.where(scaled_in, SCALE_IN_S, HORIZON_S) - submit
    return sc, Workload(submit, dur, cpu.astype(np.int64), mem.astype(np.int64), 0.7 * cpu)


def bound_watts(sc: Scenario, wl: Workload, times: np.ndarray) -> np.ndarray:
    """G(Y(t)): the fluid bound's power at the load running at each time (services run at their demand)."""
    G = _G(*cluster_cost(cluster_from_scenario(sc)))
    y = [float(wl.usage_m[(wl.submit_s <= t) & (wl.submit_s + wl.duration_s > t)].sum()) for t in times]
    return np.array([G(v) for v in y])


def policies(arg: str | None) -> list[str]:
    if arg:
        return arg.split(",")
    return list(BASELINES) + ([f"dqn={SHIPPED_MODEL}"] if SHIPPED_MODEL.exists() else [])


def suite(pols: list[str]) -> list[dict]:
    rows = []
    for path in standard_suite():
        sc = load_scenario(path)
        if not isinstance(sc.idle_policy, Sleep):
            continue  # nodes never sleep: consolidation has nothing to gain
        wl = build_workload(sc)
        for p in pols:
            off = run_policy(Twin(sc, wl), make_policy(p), 0)
            on = run_policy(Twin(with_consolidation(sc, SUITE_CONSOLIDATION), wl), make_policy(p), 0)
            off, on = common_window({"off": off, "on": on}).values()  # one window for both (docs/twin.md)
            rows.append(dict(scenario=sc.name, policy=p, off_j=off.energy_joules, on_j=on.energy_joules,
                             ratio=on.energy_joules / off.energy_joules, evictions=on.evictions,
                             slo_off=off.slo_violation_rate, slo_on=on.slo_violation_rate,
                             pending_off=off.mean_pending_s, pending_on=on.mean_pending_s))
            print(f"{sc.name:<22} {p:<28} off {off.energy_joules / 3.6e6:8.2f} kWh  on {on.energy_joules / 3.6e6:8.2f}"
                  f" kWh  on/off {rows[-1]['ratio']:.3f}  evictions {on.evictions:5d}  SLO {off.slo_violation_rate:.3f}"
                  f" -> {on.slo_violation_rate:.3f}", flush=True)
    return rows


STEADY_END_S = 12600.0  # 3.5 h: before the survivors end at the horizon


def time_within(watts: np.ndarray, ref: np.ndarray, starts: np.ndarray) -> float | None:
    """Seconds after the scale-in until the power stays within 5 % of ``ref`` up to 3.5 h (None: never)."""
    win = (starts >= SCALE_IN_S) & (starts < STEADY_END_S)
    ok = watts[win] <= 1.05 * ref[win]
    for k in range(ok.size):
        if ok[k:].all():
            return float(starts[win][k] - SCALE_IN_S)
    return None


def _timeline(sc: Scenario, wl: Workload, policy: str):
    tw = Twin(sc, wl, record=True)
    r = run_policy(tw, make_policy(policy), 0)
    watts = tw.timeline.watts()
    return r, tw.timeline, watts, np.arange(len(watts)) * tw.timeline.bin_s


def services(pols: list[str]) -> list[dict]:
    sc, wl = service_scenario()
    # The best fresh packing: only the survivors, placed from the start.
    keep = wl.submit_s + wl.duration_s > SCALE_IN_S
    fresh = Workload(wl.submit_s[keep], wl.duration_s[keep], wl.cpu_req[keep], wl.mem_req[keep], wl.usage_m[keep])
    ref_w = {}
    for p in pols:
        _, _, watts, starts = _timeline(sc, fresh, p)
        ref_w[p] = float(watts[(starts >= 7200) & (starts < STEADY_END_S)].mean())
    best_ref = min(ref_w.values())
    print(f"services-scale-in: best fresh packing of the survivors {best_ref:.0f} W ({min(ref_w, key=ref_w.get)})")
    rows = []
    for p in pols:
        res = {}
        for label, c in (("off", None), ("on", SERVICE_CONSOLIDATION)):
            r, tl, watts, starts = _timeline(with_consolidation(sc, c), wl, p)
            bound = bound_watts(sc, wl, starts + tl.bin_s / 2)
            win = (starts >= SCALE_IN_S) & (starts < STEADY_END_S)
            res[label] = dict(energy_j=r.energy_joules, evictions=r.evictions, slo=r.slo_violation_rate,
                              watts_after=float(watts[win].mean()),
                              after_vs_bound=float(watts[win].mean() / bound[win].mean()),
                              after_vs_fresh=float(watts[win].mean() / best_ref),
                              to_bound_s=time_within(watts, bound, starts),
                              to_fresh_s=time_within(watts, np.full_like(watts, best_ref), starts),
                              awake_3h=int(tl.awake[int(3 * 3600 / tl.bin_s)]))
        rows.append(dict(policy=p, fresh_ref_w=best_ref,
                         **{f"{k}_{lab}": v for lab, d in res.items() for k, v in d.items()}))
        fmt = lambda t: "never" if t is None else f"{t / 60:.0f} min"  # noqa: E731
        off, on = res["off"], res["on"]
        print(f"services-scale-in      {p:<28} on/off {on['energy_j'] / off['energy_j']:.3f}  after scale-in: "
              f"vs bound {off['after_vs_bound']:.2f} -> {on['after_vs_bound']:.2f}, vs best fresh packing "
              f"{off['after_vs_fresh']:.2f} -> {on['after_vs_fresh']:.2f}; to 5 % of it {fmt(off['to_fresh_s'])} -> "
              f"{fmt(on['to_fresh_s'])}; to 5 % of the bound {fmt(off['to_bound_s'])} -> {fmt(on['to_bound_s'])};"
              f" awake at 3 h {off['awake_3h']} -> {on['awake_3h']}; evictions {on['evictions']}, SLO "
              f"{off['slo']:.3f} -> {on['slo']:.3f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", help="comma-separated policy specs (default: every baseline and the shipped DQN)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--skip-suite", action="store_true")
    a = ap.parse_args()
    pols = policies(a.policies)
    t0 = time.perf_counter()
    out = {"suite": [] if a.skip_suite else suite(pols), "services": services(pols)}
    print(f"({time.perf_counter() - t0:.0f} s)")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
