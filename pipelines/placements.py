"""``benchmark --placements``: one CSV row per pod, per scenario, seed and policy, for auditing placements.

Columns: scenario, seed, policy, pod (the trace's name, ``pod-<i>`` without one), node ("" when never placed),
node_gpu_count, node_gpu_model, bind_s (when it was last bound), end_s (when it finished or stopped; empty
while it ran past the run). Times are the twin's seconds.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path

from joulesched.core.fsio import atomic_path

COLUMNS = ("scenario", "seed", "policy", "pod", "node", "node_gpu_count", "node_gpu_model", "bind_s", "end_s")


def placement_rows(twin, scenario: str, seed: int, policy: str) -> list[tuple]:
    """The finished ``twin``'s rows (one per pod of its workload)."""
    st, wl = twin.state, twin.workload
    gpus, models = st.alloc_gpu.tolist(), st.gpu_model
    rows = []
    for p, node in enumerate(twin.pod_node):
        b, e = twin.pod_bind[p], twin.pod_end[p]
        placed = node >= 0 or not math.isnan(b)  # an evicted pod whose restart never came keeps its last bind
        rows.append((scenario, seed, policy, wl.name_of(p), st.names[node] if node >= 0 else "",
                     gpus[node] if node >= 0 else "", models[node] if node >= 0 else "",
                     repr(b) if placed and not math.isnan(b) else "", "" if math.isnan(e) else repr(e)))
    return rows


def write_placements(path: Path, rows: Iterable[tuple]) -> Path:
    """All rows, atomically."""
    with atomic_path(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        w.writerows(rows)
    return path
