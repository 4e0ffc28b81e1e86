"""Twin throughput: placements per second with heuristic policies at 100 nodes, on one core.

Run: .venv/bin/python bench/twin_throughput.py [--nodes 100] [--pods 50000] [--repeat 3] [--against OLD.py]
     [--against-tree DIR]
Every policy runs on the same workload in the same process, best of --repeat, so the ratios are comparable.
``--against`` loads another version of cluster/twin.py (e.g. ``git show HEAD:cluster/twin.py > /tmp/old.py``)
and alternates the two, run by run, so that an A/B holds on a loaded machine. ``--against-tree`` runs a whole
other checkout (``git worktree add /tmp/base COMMIT``) in a child process that imports joulesched from there,
alternating with this one run by run: an A/B of changes that span several modules.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the goal states

from joulesched.agent.registry import make_policy  # noqa: E402
from joulesched.agent.runner import run_policy  # noqa: E402
from joulesched.cluster.scenario import Scenario  # noqa: E402
from joulesched.cluster.twin import Twin  # noqa: E402
from joulesched.cluster.workload import build_workload  # noqa: E402


class _TreeTwin:
    """A twin of another checkout, in a child process (this file run with ``--serve`` under that checkout's
    joulesched): each :meth:`run` asks it for one timed run and returns its placements per second."""

    def __init__(self, tree: str, argv: list[str]) -> None:
        self._dir = tempfile.TemporaryDirectory()
        os.symlink(Path(tree).resolve(), Path(self._dir.name) / "joulesched")  # the package-dir mapping, by hand
        env = {**os.environ, "PYTHONPATH": self._dir.name}
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        where = self._ask("where")
        if Path(where).resolve() != Path(tree).resolve() / "cluster" / "twin.py":
            raise SystemExit(f"--against-tree: the child imported {where}, not {tree}")

    def _ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def run(self, policy: str) -> float:
        return float(json.loads(self._ask(policy))["per_s"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        self._dir.cleanup()


def _serve(sc: Scenario) -> None:
    """Child mode: read policy names, answer each with one timed run (``where``: which twin.py was imported)."""
    import joulesched.cluster.twin as twin_mod

    twin = Twin(sc, build_workload(sc))
    for line in sys.stdin:
        name = line.strip()
        if name == "where":
            print(twin_mod.__file__, flush=True)
            continue
        t0 = time.perf_counter()
        r = run_policy(twin, make_policy(name), 0)
        print(json.dumps({"per_s": r.placements / (time.perf_counter() - t0)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", default="round-robin,random,most-allocated,energy-greedy,default-k8s,peaks")
    ap.add_argument("--against", help="another cluster/twin.py to compare with, alternating runs")
    ap.add_argument("--against-tree", help="another checkout to compare with (a child process), alternating runs")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sc = Scenario.model_validate(dict(
        name="throughput", seed=1, duration_s=a.pods * 0.5,
        nodes=[dict(name_prefix="n", count=a.nodes, cpu_m=32000, memory_mib=131072, power_watts="ibm-x3250-x3470")],
        workload=dict(synthetic=dict(pods=a.pods, mean_interarrival_s=0.5, duration_median_s=300, duration_sigma=1.0,
                                     max_duration_s=3600))))
    if a.serve:
        _serve(sc)
        return
    if a.against and a.against_tree:
        raise SystemExit("give --against or --against-tree, not both")
    wl = build_workload(sc)
    twins = {"this": Twin(sc, wl)}
    if a.against:
        spec = importlib.util.spec_from_file_location("twin_against", a.against)
        mod = sys.modules["twin_against"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(mod)
        twins["against"] = mod.Twin(sc, wl)
    tree = None
    if a.against_tree:
        tree = twins["against"] = _TreeTwin(a.against_tree, ["--nodes", str(a.nodes), "--pods", str(a.pods)])
    other = a.against or a.against_tree
    print(f"{a.nodes} nodes, {len(wl)} pods, best of {a.repeat}" + (f"; against {other}" if other else ""))
    print(f"{'policy':<16} {'twin':<8} {'placements/s':>13} {'us/placement':>13}")
    for name in a.policies.split(","):
        best = dict.fromkeys(twins, 0.0)
        for _ in range(a.repeat):
            for label, twin in twins.items():
                if twin is tree:
                    best[label] = max(best[label], tree.run(name))
                    continue
                t0 = time.perf_counter()
                r = run_policy(twin, make_policy(name), 0)
                best[label] = max(best[label], r.placements / (time.perf_counter() - t0))
        for label, b in best.items():
            print(f"{name:<16} {label:<8} {b:>13,.0f} {1e6 / b:>13.1f}")
        if other:
            print(f"{name:<16} {'ratio':<8} {best['this'] / best['against']:>13.3f}")
    if tree is not None:
        tree.close()


if __name__ == "__main__":
    main()
