"""Resumable stages: a re-run skips a stage whose outputs exist, unchanged, and whose inputs are unchanged.

Each stage records ``DIR/.stages/NAME.json`` with the hash of its inputs (file contents plus parameters) and of
its outputs only after its outputs are complete, so an interrupted run (Ctrl-C, a crash) leaves either the old
record or none, and the stage runs again; so does one whose outputs another command has since overwritten (a
``joulesched benchmark --out`` into a pipeline's folder).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from joulesched.core.fsio import atomic_write_text


def fingerprint(files: Iterable[Path], params: dict) -> str:
    """SHA-256 over the named files' bytes (in order, missing ones as such) and the JSON of ``params``."""
    h = hashlib.sha256()
    for f in files:
        f = Path(f)
        h.update(str(f.name).encode())
        if f.is_file():
            h.update(f.read_bytes())
        elif f.is_dir():
            for sub in sorted(p for p in f.rglob("*") if p.is_file()):
                h.update(str(sub.relative_to(f)).encode())
                h.update(sub.read_bytes())
        else:
            h.update(b"<missing>")
    h.update(json.dumps(params, sort_keys=True, default=str).encode())
    return h.hexdigest()


@dataclass
class Stage:
    """One step: ``run()`` must produce every path in ``outputs``; ``inputs`` and ``params`` key the cache."""

    name: str
    inputs: Sequence[Path]
    params: dict
    outputs: Sequence[Path]
    run: Callable[[], None]


class StageRunner:
    def __init__(self, out: Path, *, force: bool = False, on_event: Callable[[str, str], None] | None = None):
        self.out = Path(out)
        self.force = force
        self.on_event = on_event or (lambda name, what: None)
        self.records = self.out / ".stages"

    def _record(self, name: str) -> Path:
        return self.records / f"{name}.json"

    def is_fresh(self, stage: Stage) -> bool:
        rec = self._record(stage.name)
        if self.force or not rec.is_file() or not all(Path(o).exists() for o in stage.outputs):
            return False
        try:
            doc = json.loads(rec.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        if doc.get("hash") != fingerprint(stage.inputs, stage.params):
            return False
        # (a record from before the outputs were hashed: its outputs are taken as they are)
        return "outputs_hash" not in doc or doc["outputs_hash"] == fingerprint(stage.outputs, {})

    def run(self, stage: Stage) -> bool:
        """Run ``stage`` unless it is fresh; returns True when it ran."""
        if self.is_fresh(stage):
            self.on_event(stage.name, "skipped (inputs unchanged)")
            return False
        self.on_event(stage.name, "running")
        rec = self._record(stage.name)
        rec.unlink(missing_ok=True)  # a half-done re-run must not look fresh
        stage.run()
        missing = [str(o) for o in stage.outputs if not Path(o).exists()]
        if missing:
            raise RuntimeError(f"stage {stage.name} did not produce {', '.join(missing)}")
        self.records.mkdir(parents=True, exist_ok=True)
        atomic_write_text(rec, json.dumps({"hash": fingerprint(stage.inputs, stage.params), "params": stage.params,
                                           "outputs": [str(o) for o in stage.outputs],
                                           "outputs_hash": fingerprint(stage.outputs, {})}, default=str) + "\n")
        self.on_event(stage.name, "done")
        return True
