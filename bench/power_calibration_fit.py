"""How well calibration recovers a known power curve from noisy (utilisation, watts) samples.

Samples are drawn from each SPECpower curve in power.curves with Gaussian meter noise, as a RAPL or wall
meter sampled once a second during `joulesched power calibrate` would give, and fitted by power.calibrate.

    .venv/bin/python bench/power_calibration_fit.py [--noise-w 2] [--samples 110]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from joulesched.power.calibrate import Sample, fit_curve  # noqa: E402
from joulesched.power.curves import SPECPOWER, interp  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--noise-w", type=float, default=2.0, help="meter noise, standard deviation in watts")
    ap.add_argument("--samples", type=int, default=110, help="samples per fit (10 per step at 11 steps)")
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    print(f"{'curve':<22} {'RMSE W':>8} {'MAPE %':>7} {'knot err W (max)':>17}")
    for name, curve in SPECPOWER.items():
        rmse, mape, knot = [], [], []
        for seed in range(args.seeds):
            rng = random.Random(seed)
            # Calibration steps 0..100 %, the measured utilisation scattering around each step.
            us = [min(1.0, max(0.0, k / 10 + rng.gauss(0, 0.01))) for k in range(11)
                  for _ in range(args.samples // 11)]
            fit = fit_curve([Sample(u, interp(curve, u) + rng.gauss(0, args.noise_w)) for u in us])
            rmse.append(fit.rmse_w)
            mape.append(fit.mape_pct)
            knot.append(max(abs(a - b) for a, b in zip(fit.curve, curve)))
        print(f"{name:<22} {sum(rmse) / len(rmse):8.2f} {sum(mape) / len(mape):7.2f} {max(knot):17.2f}")


if __name__ == "__main__":
    main()
