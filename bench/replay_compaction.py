"""Training time with and without compacted replay states (``dqn.compact_replay``, docs/dqn.md "Compacted
states"), side by side: the same ``joulesched train`` command, recipe, seed and decision budget, once each way.

Run: .venv/bin/python bench/replay_compaction.py [--steps 3000] [--scale full|mini] [--json]

``--scale full`` trains on the four full-size OpenB training windows (scenarios/openb/full, 1,523 nodes) and
``mini`` on their tenth-size twins (scenarios/openb/mini, 164 nodes), both with heterogeneous-sleep and the GPU
arms' recipe (bench/dqn_ablation.py). Each run reads its wall time and update count from the model's JSON, so
process start-up is left out. Run it on quiet cores: the two runs are sequential, not interleaved.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dqn_ablation import GPU_FULL_TRAIN, GPU_SETS, GPU_TRAIN  # noqa: E402


def run(scenarios: tuple[str, ...], steps: int, compact: bool, out: Path) -> dict:
    model = out / f"compact-{compact}.pt"
    cmd = [str(ROOT / ".venv" / "bin" / "joulesched"), "train", "--model", str(model), "--steps", str(steps),
           "--seed", "0", "--workers", "1", "--no-progress", "--overwrite"]
    for s in scenarios:
        cmd += ["-s", str(ROOT / s)]
    for s in (*GPU_SETS, "dqn.teacher=gpu-packing", f"dqn.compact_replay={str(compact).lower()}"):
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    meta = json.loads(model.with_suffix(".json").read_text())["training"]
    return {"compact_replay": compact, "wall_s": meta["wall_s"], "steps": meta["steps"], "updates": meta["updates"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000, help="decisions per run (after the demonstrations)")
    ap.add_argument("--scale", choices=("full", "mini"), default="full")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    scenarios = GPU_FULL_TRAIN if args.scale == "full" else GPU_TRAIN
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(scenarios, args.steps, c, Path(tmp)) for c in (False, True)]
    ratio = rows[0]["wall_s"] / max(rows[1]["wall_s"], 1e-9)
    if args.json:
        print(json.dumps({"scale": args.scale, "runs": rows, "speedup": ratio}))
        return
    for r in rows:
        print(f"compact_replay={str(r['compact_replay']).lower():5s}  {r['steps']:>7,} decisions  "
              f"{r['updates']:>6,} updates  {r['wall_s']:8.1f} s")
    print(f"speed-up: {ratio:.1f}x ({args.scale} clusters)")


if __name__ == "__main__":
    main()
