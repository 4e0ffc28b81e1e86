"""Energy ratios on the standard suite, as the markdown table in docs/PERFORMANCE.md.

Run: .venv/bin/python bench/suite_table.py [--seeds 3] [--jobs 2] [--policy dqn=models/small.pt ...]
Every policy runs on the same workloads (per scenario and seed); ratios are per seed, then averaged.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from joulesched.agent.registry import BASELINES
from joulesched.pipelines.benchmark import run_benchmark
from joulesched.pipelines.report import bound_ratios

SUITE = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.yaml"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--policy", action="append", default=[], help="extra policies besides the baselines")
    ap.add_argument("--out", type=Path, default=Path("out/bench-suite"))
    a = ap.parse_args()
    policies = list(BASELINES) + a.policy
    doc = run_benchmark(SUITE, policies, a.seeds, a.out, jobs=a.jobs)
    summ = doc.summary
    print(f"Energy / default-k8s (mean of {a.seeds} seeds; in brackets: energy / lower bound; SLO violations %)\n")
    print("| policy | " + " | ".join(summ) + " |")
    print("|---|" + "---|" * len(summ))
    for p in policies:
        cells = []
        for name in summ:
            r = summ[name].policies[p]
            cells.append(f"{r.energy_vs_default:.3f} ({r.energy_vs_lower_bound:.2f}; {100 * r.slo_violation_rate:.1f}%)")
        print(f"| {p} | " + " | ".join(cells) + " |")
    print("| *lower bound* | " + " | ".join(f"{bound_ratios(doc, n).get('fluid lower bound', float('nan')):.3f}" for n in summ) + " |")


if __name__ == "__main__":
    main()
