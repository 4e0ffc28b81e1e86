"""bench/sleep_cap.py: what the live controller's sleep cap costs, measured in the twin (docs/PERFORMANCE.md)."""

from __future__ import annotations

from pathlib import Path

from bench.sleep_cap import busiest_hour, measure

ROOT = Path(__file__).resolve().parents[2]


def test_busiest_hour_opens_at_a_sleep_and_excludes_its_end():
    assert busiest_hour([]) == 0
    assert busiest_hour([0.0, 10.0, 3600.0, 3700.0]) == 2  # 0 and 3600 are an hour apart: not in one hour
    assert busiest_hour([0.0, 1.0, 2.0, 5000.0]) == 3


def test_a_cap_below_the_busiest_hour_holds_sleeps_and_costs_energy():
    rows = measure(str(ROOT / "tests" / "support" / "scenarios" / "heldout-hetero-sleep-12.yaml"),
                   "awake-first:fit=efficient", [1])
    free, capped = rows
    assert free["cap"] == 0 and free["energy_over_uncapped"] == 1.0 and free["busiest_hour"] > 1
    assert capped["busiest_hour"] == 1 and capped["energy_over_uncapped"] > 1.0, rows
