"""bench/predictor_quality.py: the online predictor's R^2 on log lifetimes, the figure that places it on the curve
of clairvoyant:r2=R (docs/dqn.md). Where pod keys carry lifetimes (OpenB's CPU side, fitted per application) the
predictor explains a good share of them; where the synthetic generator draws lifetimes independently of every
key, nothing: what the issue-27 results rest on, checked so that a change to either shows."""

from __future__ import annotations

from pathlib import Path

from bench.predictor_quality import quality
from joulesched.cluster.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_keys_that_carry_lifetimes_are_read_and_keys_that_do_not_are_not():
    fitted = quality(load_scenario(ROOT / "scenarios" / "openb" / "openb-cpu-fitted-sleep.yaml"), 28)
    synthetic = quality(load_scenario(ROOT / "tests" / "support" / "scenarios" / "heldout-hetero-sleep-12.yaml"), 3)
    assert fitted["decisions"] > 400 and synthetic["decisions"] > 100
    assert 0.35 < fitted["r2"] <= fitted["corr2"] + 1e-9 < 0.8, fitted
    assert synthetic["corr2"] < 0.05 and synthetic["r2"] < 0.05, synthetic
