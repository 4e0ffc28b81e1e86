"""How much of the variance of pods' log lifetimes the online predictor explains, where the models are judged.

    .venv/bin/python bench/predictor_quality.py [-s SCENARIO.yaml ...] [--seeds 3] [--random 6] [--json FILE]

Runs ``lifetime-aware`` (agent/lifetime_aware.py, on the DQN's own online predictor, agent/predictor.py) on each
scenario's held-out workloads (seeds ``scenario.seed + k``) and on bench/dqn_v2.py's held-out randomised
clusters (``--random``: the same seed streams, one workload each), and records, at every decision, the deciding pod's
predicted life beside its true one (``Twin.deciding_life``). Over the second half of the run's decisions (the
predictor has seen pods end by then) it reports, in log space, R^2 = 1 - var(y - yhat) / var(y) (what the
predictions explain as they are) and corr^2 (what the best linear recalibration of them would), and the
deviation of the true log lives. The R^2 places the predictor on the curve of ``clairvoyant:r2=R`` (an oracle
of that quality, agent/clairvoyant.py; docs/dqn.md, "What a predictor of a given quality is worth").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from dqn_v2 import RANDOM_MAX_NODES, RANDOM_STREAM

from joulesched.agent.lifetime_aware import LifetimeAware
from joulesched.agent.randomize import random_scenario
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import Scenario, load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.core.fsio import atomic_write_text

DEFAULT = ("scenarios/heterogeneous-sleep.yaml", "scenarios/services-diurnal-sleep.yaml",
           "scenarios/large.yaml", "scenarios/openb/openb-cpu-fitted-sleep.yaml")


class _Recording(LifetimeAware):
    """lifetime-aware, unchanged, that also notes (predicted, true) life of every deciding pod."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, float]] = []
        self._twin: Twin | None = None

    def attach(self, backend: object) -> None:
        super().attach(backend)
        self._twin = backend  # type: ignore[assignment]

    def _lives(self, st, idx):
        out = super()._lives(st, idx)
        if out is not None:
            self.seen.append((out[1], self._twin.deciding_life()))
        return out


def quality(sc: Scenario, seed: int) -> dict:
    """R^2 and corr^2 of the log predicted life over the second half of one run's decisions."""
    pol = _Recording()
    run_policy(Twin(sc, build_workload(sc, seed)), pol, seed)
    a = np.asarray(pol.seen[len(pol.seen) // 2:], dtype=np.float64)
    y, yhat = np.log(np.maximum(a[:, 1], 1.0)), np.log(np.maximum(a[:, 0], 1.0))
    return {"seed": seed, "decisions": int(a.shape[0]), "r2": 1.0 - float(np.var(y - yhat) / np.var(y)),
            "corr2": float(np.corrcoef(y, yhat)[0, 1] ** 2), "sd_log_life": float(np.std(y))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-s", "--scenario", action="append", type=Path, help="scenario file (repeatable)")
    ap.add_argument("--seeds", type=int, default=3, help="workloads per scenario")
    ap.add_argument("--random", type=int, default=0, help="held-out randomised clusters (bench/dqn_v2.py's)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args()
    if a.seeds < 1 or a.random < 0:
        ap.error("--seeds must be >= 1 and --random >= 0")
    paths = a.scenario or ([] if a.random else [ROOT / p for p in DEFAULT])
    for p in paths:
        if not p.is_file():
            ap.error(f"no scenario file {p}")
    cases = []  # (name, scenario, workload seeds)
    for p in paths:
        sc = load_scenario(p)
        cases.append((p.stem, sc, [sc.seed + k for k in range(a.seeds)]))
    for k in range(a.random):
        sc = random_scenario(np.random.default_rng([RANDOM_STREAM, k]), RANDOM_MAX_NODES, name=f"random-{k}")
        cases.append((sc.name, sc, [sc.seed]))
    rows = []
    print("| scenario | R^2 per seed | corr^2 per seed | sd of log life | decisions read |")
    print("|---|---|---|---|---|")
    for name, sc, seeds in cases:
        rs = [quality(sc, s) for s in seeds]
        rows.append({"scenario": name, "runs": rs})
        r2, c2 = (" / ".join(f"{r[k]:.2f}" for r in rs) for k in ("r2", "corr2"))
        sd = np.mean([r["sd_log_life"] for r in rs])
        print(f"| {name} | {r2} | {c2} | {sd:.2f} | {sum(r['decisions'] for r in rs)} |", flush=True)
    if a.json:
        atomic_write_text(a.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
