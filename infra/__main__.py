"""Pulumi entry point: read the stack config once, build the target, export. Resources live in modules."""

import sys
from pathlib import Path

# Pulumi runs this file with infra/ as the working directory; make the repository importable as packages.
_repo = str(Path(__file__).resolve().parent.parent)
if _repo not in sys.path:
    sys.path.insert(0, _repo)

import pulumi  # noqa: E402

from infra.config import load  # noqa: E402
from infra.program import build  # noqa: E402

outputs = build(load(pulumi.Config()))

for key, value in outputs.items():
    pulumi.export(key, value)
