"""Make the OpenB mini scenarios' files (scenarios/openb/mini/): a tenth of the real OpenB cluster and a quarter
of its pods, 3-day windows, for training the schema-3 DQN (docs/dqn.md, "Schema 3: GPUs") in minutes.

* nodes: of each machine type (CPU, memory, GPU count and model) of openb_node_list_all_node.csv, every tenth
  node in trace order (so ceil(count / 10) of each type: every GPU model stays; 164 nodes, 648 GPUs);
* pods: every fourth pod of openb_pod_list_default.csv (by its number), so the mini cluster carries 2.5x the
  real cluster's load per node: more contention for GPUs than the (lightly loaded) real windows.

Then ``joulesched trace import -f alibaba-gpu-2023 --window START:END`` converts each window. Run from the
repository root:  .venv/bin/python scenarios/openb/mini/make_mini.py ../shared/data/alibaba-gpu-2023
"""

from __future__ import annotations

import csv
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAYS3 = 259_200
#: name -> trace start second of a 3-day window. Training windows end before the windows that evaluate: the
#: benchmark's openb-3days (11,000,000-11,259,200), the schema-3 held-out window (11,600,000-11,859,200) and the
#: evaluation window of issue 27, every pod from 12,000,000 s on (openb-eval), which nothing may train on.
WINDOWS = {"w10000k": 10_000_000, "w10400k": 10_400_000, "w10700k": 10_700_000, "w11300k": 11_300_000}
NODE_EVERY, POD_EVERY = 10, 4


def main(data: Path) -> None:
    nodes = list(csv.DictReader((data / "openb_node_list_all_node.csv").open()))
    seen: dict[tuple, int] = defaultdict(int)
    keep_nodes = []
    for r in nodes:
        key = (r["cpu_milli"], r["memory_mib"], r["gpu"], r["model"])
        if seen[key] % NODE_EVERY == 0:
            keep_nodes.append(r)
        seen[key] += 1
    pods = list(csv.DictReader((data / "openb_pod_list_default.csv").open()))
    keep_pods = [r for r in pods if int(r["name"].rsplit("-", 1)[1]) % POD_EVERY == 0]
    with tempfile.TemporaryDirectory() as tmp:
        nf, pf = Path(tmp) / "openb_node_list_all_node.csv", Path(tmp) / "openb_pod_list_default.csv"
        for path, rows, src in ((nf, keep_nodes, nodes), (pf, keep_pods, pods)):
            with path.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(src[0].keys()))
                w.writeheader()
                w.writerows(rows)
        for name, start in WINDOWS.items():
            cmd = [sys.executable, "-m", "joulesched.pipelines.cli", "trace", "import", "-f", "alibaba-gpu-2023",
                   "--window", f"{start}:{start + DAYS3}", "-o", str(HERE / f"{name}.pods.csv"),
                   "-m", str(HERE / "openb-mini.nodes.yaml"), str(nf), str(pf)]
            subprocess.run(cmd, check=True)
    print(f"{len(keep_nodes)} nodes, {len(keep_pods)} pods kept")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/alibaba-gpu-2023"))
