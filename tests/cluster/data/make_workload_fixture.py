"""Regenerate ``workload_fixture.json``: a portable fingerprint of the workload arrays of every shipped scenario
(and a few variants that reach the generator's other branches) for several seeds.

Integer arrays are fingerprinted exactly (SHA-256 of their bytes). Float arrays are not: numpy's vectorised
``exp``/``log`` (SVML on AVX-512, libm elsewhere) and so the distributions drawn through them differ in the last
bits between CPU feature levels, and a digest written on one machine fails on another (issue 30). A float array is
kept as its length, first and last values, minimum, maximum and four projections ``fsum(a * r_k)`` on fixed
uniform weights ``r_k`` (PCG64 draws, identical on every platform), all compared with ``RTOL``. A permutation, a
shifted distribution or any one value moved by more than about 1e-8 of the array's mean changes a projection by
far more than ``RTOL``; a last-bit difference changes none of them by more than 1e-15.

History: the digests were first written from the code *before* the pod model (issue 14). This format was
written from the code of issue 30 on an AVX2 machine after checking that every integer array matched those
digests bit for bit and every float array's first values agreed to 2.1e-16 (the rest of each float digest
differed only by the SIMD paths). Rerun this script only when a change to the workloads is intended:

    .venv/bin/python tests/cluster/data/make_workload_fixture.py
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
OUT = Path(__file__).with_name("workload_fixture.json")
ARRAYS = ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m")
SEEDS = (None, 0, 1, 12345)
#: Relative tolerance for float fingerprints: far above last-bit noise (~1e-16), far below any real change.
RTOL = 1e-12
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


def fingerprint(a: np.ndarray) -> dict:
    """Exact for integers; for floats, statistics that survive last-bit differences (see the module doc)."""
    a = np.ascontiguousarray(a)
    out: dict = {"dtype": str(a.dtype), "n": int(a.size), "head": a[:3].tolist()}
    if a.dtype.kind in "iub":
        out["sha256"] = hashlib.sha256(a.tobytes()).hexdigest()
        return out
    x = a.astype(np.float64)
    weights = np.random.Generator(np.random.PCG64(2026)).random((4, x.size))
    out.update(tail=x[-3:].tolist(),
               min=float(x.min()) if x.size else 0.0, max=float(x.max()) if x.size else 0.0,
               # math.fsum is exactly rounded: the sum itself adds no platform-dependent error.
               projections=[math.fsum((x * w).tolist()) for w in weights])
    return out


def mismatches(want: dict, got: dict, label: str = "") -> list[str]:
    """What differs between two fingerprints (empty when they agree), each with the values side by side."""
    if want.get("dtype") != got.get("dtype") or want.get("n") != got.get("n"):
        return [f"{label}: dtype/length {want.get('dtype')}[{want.get('n')}] != {got.get('dtype')}[{got.get('n')}]"]
    if "sha256" in want:
        if want["sha256"] != got.get("sha256"):
            return [f"{label}: integer values differ (first {want['head']} then, {got['head']} now)"]
        return []
    bad = []
    for key in ("head", "tail", "min", "max", "projections"):
        w, g = np.atleast_1d(want[key]), np.atleast_1d(got[key])
        if w.shape != g.shape or not np.allclose(g, w, rtol=RTOL, atol=0.0):
            bad.append(f"{label}: {key} {w.tolist()[:3]} then, {g.tolist()[:3]} now (rtol {RTOL})")
    return bad


def entry(wl) -> dict:
    return {"pods": len(wl), "dropped": int(wl.dropped), **{k: fingerprint(getattr(wl, k)) for k in ARRAYS}}


def compare(want: dict, got: dict) -> list[str]:
    """Every difference between two fixtures, keyed ``scenario@seed: array: ...``."""
    out = []
    for key in want:
        if key not in got:
            out.append(f"{key}: missing")
            continue
        w, g = want[key], got[key]
        for scalar in ("pods", "dropped"):
            if w[scalar] != g[scalar]:
                out.append(f"{key}: {scalar} {w[scalar]} then, {g[scalar]} now")
        for k in ARRAYS:
            out += mismatches(w[k], g[k], f"{key}: {k}")
    return out


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
