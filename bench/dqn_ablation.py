"""Issue 27's ablation: training recipes side by side, several training seeds each, at an equal step budget.

    .venv/bin/python bench/dqn_ablation.py [--arm default --arm pool ...] [--seeds 3] [--steps 40000] \\
        [--jobs 2] [--out-dir out/ablation] [--no-train] [-- BENCH_ARGS...]

Trains every arm (:data:`ARMS`) at training seeds ``0..--seeds-1`` with ``joulesched train`` (``--jobs`` at a
time, one rollout worker each; a model already in ``--out-dir`` with the same recipe, seed and budget is kept),
then runs bench/dqn_v2.py on all of them (each arm as ``--model ARM=SEED0.pt,SEED1.pt,...``: per-model rows
and the arm's mean with its 95 % interval over the seeds), with the shipped model and the ``clairvoyant``
reference beside them, the OpenB trace's evaluation windows and its CPU side as extra groups. Arguments after
``--`` go to bench/dqn_v2.py (e.g. ``-- --seeds 1 --random 0`` for a quick look).

The budget is equal in decisions, not in wall time: a run's result depends on its recipe and seed only, never
on the machine's load, and each model's JSON records the wall time it took (the teacher pool's twin runs cost
about a fifth more). The arms:

* ``default``: the shipped recipe (agent/config.py's defaults: demonstrations and margin loss toward
  awake-first:fit=efficient or pabfd, the online predictor, attention, randomised clusters);
* ``pool``: the teacher of each episode is the best of awake-first:fit=efficient / pabfd and two clairvoyant
  packers (agent/clairvoyant.py) on that very episode (``dqn.teacher_pool``, DAgger-style relabelling);
* ``no-imitation``: no demonstrations, no margin loss, no teacher-guided exploration (pure DQN);
* ``fitted``: the default recipe with OpenB's CPU side (scenarios/openb/openb-cpu-fitted-sleep.yaml: pod keys
  that predict lifetimes) among the training scenarios;
* ``no-prediction``: the default recipe with the predictor's columns zeroed (``dqn.prediction=false``).

The small suite's arms (:data:`SMALL_ARMS`, by name only), trained on its synthetic clusters and benchmarked
with ``-- --group small``: ``small-auto`` (the default teacher), ``small-optimum`` (the MIP's best schedule of
each episode as the teacher, re-solved once per episode from where the agent left it: agent/optimum_teacher.py)
, ``small-optimum-bc`` (the same with four times the demonstration updates and the margin loss kept at 0.5)
and ``small-rollout`` (the rollout planner on the generators' model as the teacher: agent/planner.py; its labels
depend on the state and the workload's distribution, not on the run's future).

The GPU arms (:data:`GPU_ARMS`, by name only): schema 3 on the OpenB mini windows, taught by ``gpu-packing``
(``gpu-teach-packing``, models/gpu.short.pt's teacher) or by ``gpu-energy`` (``gpu-teach-energy``, the heuristic
that knows GPU power), benchmarked with ``-- --group extra``; ``gpu-full-teach-packing`` and
``gpu-full-teach-energy`` train the same recipe on the same days at full size (scenarios/openb/full);
``gpu-teach-energy-empty`` (and ``-twins``, the margin loss on node actions) are taught by
``gpu-energy:empty=asleep``, compacted.
``wide-hardware`` (:data:`HARDWARE_ARMS`, by name only) is the default recipe with randomised clusters whose
node peaks differ by up to about 70x (``dqn.randomize_hardware=wide``), for the held-out hardware of ``--group sleep``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from joulesched.pipelines.progress import progress_bar  # noqa: E402

SYNTHETIC = ("scenarios/heterogeneous-sleep.yaml", "scenarios/services-diurnal-sleep.yaml")
FITTED = "scenarios/openb/openb-cpu-fitted-sleep.yaml"
POOL = '["auto", "clairvoyant", "clairvoyant:fit_classes=8"]'
#: arm -> (training scenarios, --set overrides)
ARMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": (SYNTHETIC, ()),
    "pool": (SYNTHETIC, (f"dqn.teacher_pool={POOL}",)),
    "no-imitation": (SYNTHETIC, ("dqn.pretrain_episodes=0", "dqn.pretrain_updates=0", "dqn.bc_weight=0",
                                 "dqn.bc_weight_end=0", "dqn.heuristic_explore=0")),
    "fitted": ((*SYNTHETIC, FITTED), ()),
    "no-prediction": (SYNTHETIC, ("dqn.prediction=false",)),
}
#: The small suite's arms (issue 27, "learning from the optimum"): trained on the small suite's synthetic clusters
#: (its trace replays are left out: their one workload is the evaluation's), 40 workload seeds each, benchmarked
#: with ``-- --group small``; not in the default set. The MIP's schedules are cached under out/optimum-labels.
SMALL_TRAIN = ("scenarios/small/sleep-mixed.yaml", "scenarios/small/sleep-homogeneous.yaml",
               "scenarios/small/always-on-mixed.yaml")
SMALL_SETS = ("dqn.randomize=0", "dqn.load_scales=[1.0]", "dqn.validation_load_scales=[1.0]",
              "dqn.validation_random=0", "dqn.train_seed_range=[1000,1040]", "dqn.pretrain_episodes=40",
              "dqn.pretrain_updates=1000", "dqn.learning_starts=1000", "dqn.eval_every_steps=2000")
OPTIMUM = "optimum:time_limit=10,resolve=1,resolve_s=4,cache=out/optimum-labels"
#: The planner's labels (agent/planner.py): rollouts on futures from the clusters' own workload generators, which
#: the training draws its workloads from (the knowledge the learner is trained on; never the run's future).
PLANNER = "rollout:future=model,samples=16,max_candidates=4,confidence=0"
SMALL_ARMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "small-auto": (SMALL_TRAIN, SMALL_SETS),
    "small-rollout": (SMALL_TRAIN, (*SMALL_SETS, f"dqn.teacher={PLANNER}")),
    "small-optimum": (SMALL_TRAIN, (*SMALL_SETS, f"dqn.teacher={OPTIMUM}")),
    "small-optimum-bc": (SMALL_TRAIN, (*SMALL_SETS, f"dqn.teacher={OPTIMUM}", "dqn.pretrain_updates=4000",
                                       "dqn.bc_weight_end=0.5")),
}
#: The GPU arms (issue 27 on the OpenB trace): schema 3 on the four OpenB mini windows and a CPU scenario, the
#: recipe of models/gpu.short.pt (docs/dqn.md, "Schema 3: GPUs") with the teacher named; benchmarked with
#: ``-- --group extra`` (the OpenB evaluation and held-out windows, whose reference is then gpu-energy).
GPU_TRAIN = ("scenarios/openb/mini/openb-mini-w10000k.yaml", "scenarios/openb/mini/openb-mini-w10400k.yaml",
             "scenarios/openb/mini/openb-mini-w10700k.yaml", "scenarios/openb/mini/openb-mini-w11300k.yaml",
             "scenarios/heterogeneous-sleep.yaml")
GPU_SETS = ("dqn.feature_schema=3", "dqn.randomize=0.25", "dqn.validation_random=0",
            "dqn.validation_load_scales=[1.0]", "dqn.load_scales=[1.0]", "dqn.max_episode_decisions=600",
            "dqn.eval_every_steps=6000", "dqn.pretrain_episodes=2", "dqn.pretrain_updates=1000",
            "dqn.learning_starts=1000", "dqn.batch_size=64", "dqn.train_frequency=8")
GPU_ARMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpu-teach-packing": (GPU_TRAIN, (*GPU_SETS, "dqn.teacher=gpu-packing")),
    "gpu-teach-energy": (GPU_TRAIN, (*GPU_SETS, "dqn.teacher=gpu-energy")),
}
#: The same recipe on the same days at full size (scenarios/openb/full: 1,523 nodes at the real load per node),
#: trainable since the replay keeps compacted states (docs/dqn.md, "Training at full size").
GPU_FULL_TRAIN = ("scenarios/openb/full/openb-full-w10000k.yaml", "scenarios/openb/full/openb-full-w10400k.yaml",
                  "scenarios/openb/full/openb-full-w10700k.yaml", "scenarios/openb/full/openb-full-w11300k.yaml",
                  "scenarios/heterogeneous-sleep.yaml")
GPU_FULL_ARMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpu-full-teach-packing": (GPU_FULL_TRAIN, (*GPU_SETS, "dqn.teacher=gpu-packing")),
    "gpu-full-teach-energy": (GPU_FULL_TRAIN, (*GPU_SETS, "dqn.teacher=gpu-energy")),
}
# The arms measured before the replay kept compacted states (2026-12-05) train with the layout they were measured
# with, so their tables reproduce to the joule (compaction changes the float rounding and, by default, the margin
# loss: docs/dqn.md, "Compacted states"). Their models' recipes, written before, lack the setting and are read as
# having it (_done).
LEGACY = ("dqn.compact_replay=false",)
for _arms in (ARMS, SMALL_ARMS, GPU_ARMS):
    for _k, (_sc, _sets) in _arms.items():
        _arms[_k] = (_sc, (*_sets, *LEGACY))
#: Held-out hardware (issue 27): the default recipe with half the randomised clusters' node groups drawn by watts
#: per core, so one cluster can mix nodes whose peaks differ by about 70x (agent/randomize.py ``HARDWARE``); the old
#: layout, as ``default``'s, so the two differ in that alone. Benchmarked with ``-- --group sleep``.
HARDWARE_ARMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "wide-hardware": (SYNTHETIC, ("dqn.randomize_hardware=wide", *LEGACY)),
}
#: Taught by the best heuristic on the OpenB windows (docs/dqn.md, "What the models knew"), compacted, with the
#: margin loss on rows (the default) or on node actions (``dqn.bc_margin_twins=true``; "Compacted states").
GPU_EMPTY = "dqn.teacher=gpu-energy:empty=asleep"
GPU_EMPTY_ARMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpu-teach-energy-empty": (GPU_TRAIN, (*GPU_SETS, GPU_EMPTY)),
    "gpu-teach-energy-empty-twins": (GPU_TRAIN, (*GPU_SETS, GPU_EMPTY, "dqn.bc_margin_twins=true")),
}
DEFAULT_ARMS = tuple(ARMS)
ARMS.update(HARDWARE_ARMS)
ARMS.update(SMALL_ARMS)
ARMS.update(GPU_ARMS)
ARMS.update(GPU_FULL_ARMS)
ARMS.update(GPU_EMPTY_ARMS)
EXTRA = ("scenarios/openb/openb-eval.yaml", "scenarios/openb/openb-heldout-11600k.yaml", FITTED)


def train_command(arm: str, seed: int, steps: int, model: Path) -> list[str]:
    scenarios, sets = ARMS[arm]
    cmd = [str(ROOT / ".venv" / "bin" / "joulesched"), "train", "--model", str(model), "--steps", str(steps),
           "--seed", str(seed), "--workers", "1", "--no-progress", "--overwrite"]
    for s in scenarios:
        cmd += ["-s", str(ROOT / s)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _recipe(arm: str, seed: int, steps: int) -> dict:
    scenarios, sets = ARMS[arm]
    return {"arm": arm, "seed": seed, "steps": steps, "scenarios": list(scenarios), "sets": list(sets)}


def _done(model: Path, recipe: dict) -> bool:
    tag = model.with_suffix(".recipe.json")
    if not (model.is_file() and tag.is_file()):
        return False
    stored = json.loads(tag.read_text())
    if stored == recipe:
        return True
    # A legacy arm's model trained before compaction existed: its recipe has no layout setting, and it used the old.
    bare = dict(recipe, sets=[s for s in recipe["sets"] if s not in LEGACY])
    return bare != recipe and stored == bare


def train(arm: str, seed: int, steps: int, out_dir: Path) -> tuple[Path, float | None]:
    """One training run (kept when already done with this recipe); the model and its wall seconds."""
    from joulesched.core.fsio import atomic_write_text

    model = out_dir / f"{arm}-s{seed}.pt"
    recipe = _recipe(arm, seed, steps)
    if not _done(model, recipe):
        log = model.with_suffix(".log")
        with open(log, "w") as fh:
            rc = subprocess.run(train_command(arm, seed, steps, model), stdout=fh, stderr=subprocess.STDOUT,
                                cwd=ROOT, check=False).returncode
        if rc != 0:
            raise SystemExit(f"training {arm} seed {seed} failed (exit {rc}); see {log}")
        atomic_write_text(model.with_suffix(".recipe.json"), json.dumps(recipe) + "\n")
    run = json.loads(model.with_suffix(".json").read_text())["training"]["runs"][-1]
    return model, run.get("wall_s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", action="append", choices=sorted(ARMS),
                    help="an arm (repeatable; default: the five issue-27 arms, not the small suite's)")
    ap.add_argument("--seeds", type=int, default=3, help="training seeds per arm (>= 3 for an interval worth reading)")
    ap.add_argument("--steps", type=int, default=40_000, help="decisions per training run")
    ap.add_argument("--jobs", type=int, default=2, help="trainings at a time")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "out" / "ablation")
    ap.add_argument("--no-train", action="store_true", help="benchmark the models already in --out-dir")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: arguments for bench/dqn_v2.py")
    a = ap.parse_args()
    if a.seeds < 1 or a.steps < 1 or a.jobs < 1:
        ap.error("--seeds, --steps and --jobs must be >= 1")
    arms = a.arm or list(DEFAULT_ARMS)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    runs = [(arm, seed) for seed in range(a.seeds) for arm in arms]
    models: dict[str, list[Path]] = {arm: [] for arm in arms}
    walls: dict[str, list[float | None]] = {arm: [] for arm in arms}
    if a.no_train:
        for arm, seed in runs:
            m = a.out_dir / f"{arm}-s{seed}.pt"
            if not _done(m, _recipe(arm, seed, a.steps)):
                ap.error(f"--no-train: {m} is missing or was trained with another recipe, seed or budget")
            models[arm].append(m)
    else:
        with progress_bar() as bar, ThreadPoolExecutor(a.jobs) as pool:
            task = bar.add_task("trainings", total=len(runs), item="")
            futs = {pool.submit(train, arm, seed, a.steps, a.out_dir): (arm, seed) for arm, seed in runs}
            for fut, (arm, seed) in futs.items():
                bar.update(task, item=f"{arm} seed {seed}")
                m, wall = fut.result()
                models[arm].append(m)
                walls[arm].append(wall)
                bar.advance(task)
        for arm in arms:
            print(f"{arm}: training wall s {walls[arm]}")
    extra = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    cmd = [sys.executable, str(ROOT / "bench" / "dqn_v2.py"), "--model", f"v2={ROOT / 'models' / 'v2.pt'}",
           "--policy", "clairvoyant=clairvoyant"]
    for arm in arms:
        cmd += ["--model", f"{arm}=" + ",".join(str(m) for m in models[arm])]
    for e in EXTRA:
        cmd += ["--extra", str(ROOT / e)]
    if "--out" not in extra:
        cmd += ["--out", str(a.out_dir / "bench.json")]
    return subprocess.run([*cmd, *extra], cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
