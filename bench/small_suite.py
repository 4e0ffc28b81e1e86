"""What the optimum's benches of the small suite share: its scenario files and their command-line flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = sorted((ROOT / "scenarios" / "small").glob("*.yaml"))


def parser(doc: str) -> argparse.ArgumentParser:
    """--seeds, --time-limit, --only (repeatable) and --json, described by the bench's docstring."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--only", action="append", default=[], help="scenario file stem (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    return ap


def paths(args: argparse.Namespace) -> list[Path]:
    """The suite's files that ``--only`` selects; exits 2 on a non-positive --seeds or --time-limit, or an
    --only that names none."""
    if args.seeds < 1 or args.time_limit <= 0:
        print("error: --seeds and --time-limit must be positive", file=sys.stderr)
        sys.exit(2)
    out = [p for p in SMALL if not args.only or p.stem in args.only]
    if not out:
        print(f"error: no scenario of scenarios/small/ is named {', '.join(args.only)}", file=sys.stderr)
        sys.exit(2)
    return out
