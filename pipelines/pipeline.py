"""The end-to-end pipeline on the embedded twin: (calibrate) -> train or load -> benchmark -> report.

Each stage is resumable (``pipelines/stages.py``): re-running with the same inputs skips finished stages, and
an interrupted run leaves DIR consistent (every output is written atomically, a stage's record last).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from agent.policy import BASELINES
from cluster.scenario import ScenarioError, load_scenario
from pipelines.benchmark import run_benchmark, validate_inputs
from pipelines.report import write_report
from pipelines.stages import Stage, StageRunner
from power.curves import validate_curve


def profile_curve(profile: Path) -> list[float]:
    """The 11-point curve of a node profile written by ``joulesched power calibrate``."""
    try:
        data = yaml.safe_load(Path(profile).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"{profile}: cannot read node profile: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("nodes"), list) and len(data["nodes"]) == 1:
        data = data["nodes"][0]
    if not isinstance(data, dict) or "power_watts" not in data:
        raise ScenarioError(f"{profile}: not a node profile (expected a node group with power_watts)")
    try:
        return list(validate_curve(data["power_watts"]))
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"{profile}: power_watts: {e}") from None


def calibrated_scenarios(scenarios: Sequence[Path], profile: Path, out_dir: Path) -> list[Path]:
    """Copies of ``scenarios`` whose node groups all take the calibrated curve of ``profile``.

    This is the sim-to-real step: a node profile measured on the real hardware (``joulesched power
    calibrate``) replaces the catalogue curves in the twin used for training and benchmarking.
    """
    curve = profile_curve(profile)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for p in scenarios:
        sc = load_scenario(p)  # validated before rewriting
        raw = yaml.safe_load(Path(p).read_text())
        for group in raw["nodes"]:
            group.pop("include", None)
            group["power_watts"] = curve
        if raw["workload"].get("trace"):
            raw["workload"]["trace"] = str(sc.trace_path)
        dst = out_dir / Path(p).name
        tmp = dst.with_suffix(".tmp")
        tmp.write_text(f"# {Path(p).name} with node curves from {profile}\n" + yaml.safe_dump(raw, sort_keys=False))
        tmp.replace(dst)
        load_scenario(dst)
        written.append(dst)
    return written


def _train(runner: StageRunner, model_path: Path, scenarios: Sequence[Path], *, minutes: float | None,
           steps: int | None, seed: int, progress: bool,
           on_train: Callable[[int, float, float], None] | None = None) -> None:
    """The resumable train stage: ``model_path`` from ``scenarios`` within the budget."""
    from pipelines.train import train

    def do_train() -> None:
        if model_path.exists():
            model_path.unlink()  # a stale model from an interrupted or changed run is retrained
        train(scenarios, model_path, minutes=minutes, steps=steps, seed=seed, progress=progress and on_train is None,
              overwrite=True, on_progress=on_train)

    runner.run(Stage("train", list(scenarios), {"minutes": minutes, "steps": steps, "seed": seed}, [model_path],
                     do_train))


def train_stage(out: Path, *, model: Path | None, minutes: float | None, steps: int | None,
                scenarios: Sequence[Path], node_profile: Path | None = None, force: bool = False, seed: int = 0,
                on_event: Callable[[str, str], None] | None = None,
                on_train: Callable[[int, float, float], None] | None = None) -> Path:
    """The model a cluster run measures: ``model`` when it exists, else trained on ``scenarios`` (their nodes
    given the curves of ``node_profile`` when one was measured) into ``model`` or ``out/model.pt``."""
    if model is not None and Path(model).exists():
        return Path(model)
    if minutes is None and steps is None:
        raise ScenarioError(f"model {model} does not exist: give --minutes or --steps to train it")
    scenarios = [Path(s) for s in scenarios]
    for p in scenarios:
        load_scenario(p)
    runner = StageRunner(out, force=force, on_event=on_event)
    Path(out).mkdir(parents=True, exist_ok=True)
    if node_profile is not None:
        tcal = Path(out) / "train-scenarios"
        runner.run(Stage("calibrate-train", [Path(node_profile), *scenarios], {}, [tcal],
                         lambda: calibrated_scenarios(scenarios, Path(node_profile), tcal)))
        scenarios = [tcal / p.name for p in scenarios]
    model_path = Path(model) if model is not None else Path(out) / "model.pt"
    _train(runner, model_path, scenarios, minutes=minutes, steps=steps, seed=seed, progress=False, on_train=on_train)
    return model_path


def _short(path: Path) -> str:
    """The path relative to the working directory when it is below it: results and plots name the policy."""
    rel = os.path.relpath(Path(path).resolve())
    return str(path) if rel.startswith("..") else rel


def run_sim(scenarios: Sequence[Path], out: Path, *, model: Path | None = None,
            train_scenarios: Sequence[Path] | None = None, minutes: float | None = None,
            steps: int | None = None, seeds: int = 1, jobs: int = 1, node_profile: Path | None = None,
            extra_policies: Sequence[str] = (), force: bool = False, seed: int = 0,
            on_event: Callable[[str, str], None] | None = None,
            on_progress: Callable[[str], None] | None = None, on_start: Callable[[int], None] | None = None,
            on_plan: Callable[[list[str]], None] | None = None,
            on_train: Callable[[int, float, float], None] | None = None) -> dict:
    """Run the sim pipeline into ``out``; returns the benchmark results document.

    ``on_plan`` gets the stage names once, before the first runs; ``on_event(stage, what)`` reports each.
    """
    out = Path(out)
    scenarios = [Path(s) for s in scenarios]
    train_scenarios = [Path(s) for s in (train_scenarios or [])]
    train_needed = model is None or not Path(model).exists()
    if train_needed and minutes is None and steps is None:
        raise ScenarioError("no model to load: give --model PATH of an existing model, or --minutes/--steps to train")
    # Validate everything first: nothing is written for a bad scenario, profile or policy.
    validate_inputs(scenarios, list(BASELINES) + list(extra_policies))
    for p in train_scenarios:
        load_scenario(p)
    if node_profile is not None:
        profile_curve(node_profile)
    runner = StageRunner(out, force=force, on_event=on_event)
    out.mkdir(parents=True, exist_ok=True)
    if on_plan:
        on_plan((["calibrate"] if node_profile is not None else [])
                + (["calibrate-train"] if node_profile is not None and train_scenarios else [])
                + (["train"] if train_needed else []) + ["benchmark", "report"])

    bench_scenarios = scenarios
    if node_profile is not None:
        cal_dir = out / "scenarios"
        runner.run(Stage("calibrate", [Path(node_profile), *scenarios], {}, [cal_dir],
                         lambda: calibrated_scenarios(scenarios, Path(node_profile), cal_dir)))
        bench_scenarios = [cal_dir / p.name for p in scenarios]
        if train_scenarios:
            tcal = out / "train-scenarios"
            runner.run(Stage("calibrate-train", [Path(node_profile), *train_scenarios], {}, [tcal],
                             lambda: calibrated_scenarios(train_scenarios, Path(node_profile), tcal)))
            train_scenarios = [tcal / p.name for p in train_scenarios]

    if train_needed:
        model_path = Path(model) if model is not None else out / "model.pt"
        _train(runner, model_path, train_scenarios or bench_scenarios, minutes=minutes, steps=steps, seed=seed,
               progress=on_progress is None, on_train=on_train)
    else:
        model_path = Path(model)

    policies = list(BASELINES) + [f"dqn={_short(model_path)}"] + list(extra_policies)
    results = out / "results.json"

    def do_bench() -> None:
        run_benchmark(bench_scenarios, policies, seeds, out, jobs=jobs, on_progress=on_progress, on_start=on_start,
                      command="joulesched pipeline --env sim")

    runner.run(Stage("benchmark", [*bench_scenarios, model_path], {"policies": policies, "seeds": seeds},
                     [results], do_bench))

    def do_report() -> None:
        curve = Path(str(model_path.with_suffix("")) + ".curve.png")
        if curve.is_file():
            (out / "plots").mkdir(exist_ok=True)
            shutil.copyfile(curve, out / "plots" / "training_curve.png")
        write_report(out)

    runner.run(Stage("report", [results], {}, [out / "report.html"], do_report))
    from pipelines.benchmark import load_results

    return load_results(results)
