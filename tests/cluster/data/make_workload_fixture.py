"""Regenerate ``workload_fixture.json``: digests of the workload arrays of every shipped scenario (and a few
variants that reach the generator's other branches) for several seeds.

The fixture was written by this script from the code *before* the pod model (issue 14) was added, so that
``tests/cluster/test_workload_model.py::test_shipped_workloads_are_unchanged`` proves that scenarios which
loaded then give bit-identical workloads now. Rerun it only when a change to the workloads is intended:

    .venv/bin/python tests/cluster/data/make_workload_fixture.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(__file__).with_name("workload_fixture.json")
ARRAYS = ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m")
SEEDS = (None, 0, 1, 12345)
#: The standard suite as it was before the pod model: the scenarios whose workloads must not change. Scenarios
#: added since (services, traces of the public formats) have no digest from before to match.
PRE_POD_MODEL = ("heterogeneous-sleep.yaml", "heterogeneous.yaml", "homogeneous.yaml", "large.yaml", "tiny.yaml",
                 "trace-sample.yaml")

# Variants of the generator beyond the shipped files (poisson/diurnal, bursts, caps, best effort, scales).
VARIANTS = {
    "variant-poisson-burst": {"pods": 3000, "arrival": "poisson", "mean_interarrival_s": 2.0, "burst_mean": 5,
                              "max_duration_s": 900, "best_effort_fraction": 0.3},
    "variant-diurnal": {"pods": 4000, "arrival": "diurnal", "mean_interarrival_s": 1.0, "diurnal_swing": 8,
                        "diurnal_period_s": 3600, "cpu_scale": 0.2, "cpu_granularity_m": 100,
                        "usage_fraction": [0.2, 1.5], "usage_noise_sigma": 0.4, "duration_sigma": 0.5},
}


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def entry(wl) -> dict:
    return {"pods": len(wl), "dropped": int(wl.dropped),
            **{k: {"dtype": str(getattr(wl, k).dtype), "sha256": digest(getattr(wl, k)),
                   "head": getattr(wl, k)[:3].tolist()} for k in ARRAYS}}


def build() -> dict:
    from joulesched.cluster.scenario import Scenario, load_scenario
    from joulesched.cluster.workload import build_workload

    out: dict[str, dict] = {}
    files = [ROOT / "scenarios" / name for name in PRE_POD_MODEL]
    scenarios = [(f.name, load_scenario(f)) for f in files]
    base = load_scenario(ROOT / "scenarios" / "tiny.yaml")
    for name, spec in VARIANTS.items():
        raw = base.model_dump(mode="json")
        raw.update(name=name, workload={"synthetic": spec})
        scenarios.append((name, Scenario.model_validate(raw)))
    for name, sc in scenarios:
        for seed in SEEDS:
            out[f"{name}@{'default' if seed is None else seed}"] = entry(build_workload(sc, seed))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    OUT.write_text(json.dumps(build(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
