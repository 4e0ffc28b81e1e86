"""The end-to-end pipeline on the embedded twin: train or load -> benchmark -> report.

Scenarios travel as validated :class:`~joulesched.cluster.scenario.Scenario` objects; a calibrated node profile
turns them into copies on the measured curve (:func:`calibrated`), in memory. Each stage is resumable
(:mod:`joulesched.pipelines.stages`): re-running with the same inputs skips finished stages, and an interrupted
run leaves DIR consistent (every output is written atomically, a stage's record last).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from joulesched.agent.registry import default_policies
from joulesched.cluster.scenario import Scenario, ScenarioError, load_scenario
from joulesched.core.fsio import atomic_path, check_output_dir, check_output_file
from joulesched.pipelines.benchmark import OUTPUT_FILES, load_results, run_benchmark, validate_inputs
from joulesched.pipelines.results import Results
from joulesched.pipelines.report import write_report
from joulesched.pipelines.stages import Stage, StageRunner
from joulesched.power.calibrate import read_profile_curve


def profile_curve(profile: Path) -> list[float]:
    """The 11-point curve of a node profile written by ``joulesched power calibrate``."""
    return list(read_profile_curve(profile))


def calibrated(scenario: Scenario, curve: Sequence[float]) -> Scenario:
    """``scenario`` with every node group on ``curve``: the sim-to-real step. A node profile measured on the
    real hardware (``joulesched power calibrate``) replaces the catalogue curves in the twin used for training
    and benchmarking. The copy keeps its source (trace paths still resolve); nothing is written."""
    groups = [g.model_copy(update={"power_watts": list(curve)}) for g in scenario.nodes]
    return scenario.model_copy(update={"nodes": groups})


def _load(scenarios: Sequence[Path | Scenario], profile: Path | None) -> list[Scenario]:
    loaded = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
    if profile is None:
        return loaded
    curve = profile_curve(profile)
    return [calibrated(sc, curve) for sc in loaded]


def _stage_key(scenarios: Sequence[Scenario]) -> tuple[list[Path], list[dict]]:
    """What a stage over ``scenarios`` depends on: their source and trace files, and their content."""
    files = [f for sc in scenarios for f in sc.input_files]
    return files, [sc.model_dump(mode="json") for sc in scenarios]


def _train(runner: StageRunner, model_path: Path, scenarios: Sequence[Scenario], *, minutes: float | None,
           steps: int | None, seed: int, progress: bool,
           on_train: Callable[[int, float, float], None] | None = None) -> None:
    """The resumable train stage: ``model_path`` from ``scenarios`` within the budget."""
    from joulesched.pipelines.training import train

    def do_train() -> None:
        # A stale model from an interrupted or changed run is retrained (overwrite: the new one replaces it
        # atomically when the run ends; deleting it first lost it to a budget train() then refused).
        train(scenarios, model_path, minutes=minutes, steps=steps, seed=seed, progress=progress and on_train is None,
              overwrite=True, on_progress=on_train)

    files, content = _stage_key(scenarios)
    runner.run(Stage("train", files, {"minutes": minutes, "steps": steps, "seed": seed, "scenarios": content},
                     [model_path], do_train))


def train_stage(out: Path, *, model: Path | None, minutes: float | None, steps: int | None,
                scenarios: Sequence[Path | Scenario], node_profile: Path | None = None, force: bool = False,
                seed: int = 0, on_event: Callable[[str, str], None] | None = None,
                on_train: Callable[[int, float, float], None] | None = None) -> Path:
    """The model a cluster run measures: ``model`` when it exists, else trained on ``scenarios`` (their nodes
    given the curves of ``node_profile`` when one was measured) into ``model`` or ``out/model.pt``."""
    if model is not None and Path(model).exists():
        return Path(model)
    if minutes is None and steps is None:
        raise ScenarioError(f"model {model} does not exist: give --minutes or --steps to train it")
    from joulesched.pipelines.training import check_budget

    check_budget(minutes, steps)
    loaded = _load(scenarios, node_profile)
    runner = StageRunner(out, force=force, on_event=on_event)
    Path(out).mkdir(parents=True, exist_ok=True)
    model_path = Path(model) if model is not None else Path(out) / "model.pt"
    _train(runner, model_path, loaded, minutes=minutes, steps=steps, seed=seed, progress=False, on_train=on_train)
    return model_path


def copy_training_curve(model_path: Path, out: Path) -> Path | None:
    """The model's training curve (``MODEL.curve.png``, when there is one) as ``out/plots/training_curve.png``,
    written atomically: an interrupted or failed copy leaves the old plot or none, never half of one. A model
    without a curve removes an earlier model's from the folder (the report would show it as this one's)."""
    curve = Path(str(model_path.with_suffix("")) + ".curve.png")
    dest = out / "plots" / "training_curve.png"
    if not curve.is_file():
        dest.unlink(missing_ok=True)
        return None
    with atomic_path(dest) as tmp:
        shutil.copyfile(curve, tmp)
    return dest


def _short(path: Path) -> str:
    """The path relative to the working directory when it is below it: results and plots name the policy."""
    rel = os.path.relpath(Path(path).resolve())
    return str(path) if rel.startswith("..") else rel


def run_sim(scenarios: Sequence[Path | Scenario], out: Path, *, model: Path | None = None,
            train_scenarios: Sequence[Path | Scenario] | None = None, minutes: float | None = None,
            steps: int | None = None, seeds: int = 1, jobs: int = 1, node_profile: Path | None = None,
            extra_policies: Sequence[str] = (), force: bool = False, seed: int = 0, command: str = "",
            on_event: Callable[[str, str], None] | None = None,
            on_progress: Callable[[str], None] | None = None, on_start: Callable[[int], None] | None = None,
            on_plan: Callable[[list[str]], None] | None = None,
            on_train: Callable[[int, float, float], None] | None = None) -> Results:
    """Run the sim pipeline into ``out``; returns the benchmark results document.

    ``command`` is recorded in results.json as the command line that reproduces the run. ``on_plan`` gets the
    stage names once, before the first runs; ``on_event(stage, what)`` reports each.
    """
    out = check_output_dir(out, "--out", OUTPUT_FILES)
    train_needed = model is None or not Path(model).exists()
    if train_needed and minutes is None and steps is None:
        raise ScenarioError("no model to load: give --model PATH of an existing model, or --minutes/--steps to train")
    if train_needed:  # before the folder is touched: a typo must not cost a finished run its model
        from joulesched.pipelines.training import check_budget

        check_budget(minutes, steps)
    # Validate everything first: nothing is written for a bad scenario, profile or policy.
    bench_scenarios = _load(scenarios, node_profile)
    defaults = default_policies(any(sc.has_gpus for sc in bench_scenarios))
    validate_inputs(bench_scenarios, list(dict.fromkeys([*defaults, *extra_policies])))
    trained_on = _load(train_scenarios, node_profile) if train_scenarios else bench_scenarios
    if train_needed and model is not None:
        check_output_file(model, "--model")
    if not train_needed:  # a model that does not load is refused now, before the output folder is made
        validate_inputs([], [f"dqn={model}"])
    runner = StageRunner(out, force=force, on_event=on_event)
    out.mkdir(parents=True, exist_ok=True)
    if on_plan:
        on_plan((["train"] if train_needed else []) + ["benchmark", "report"])

    if train_needed:
        model_path = Path(model) if model is not None else out / "model.pt"
        _train(runner, model_path, trained_on, minutes=minutes, steps=steps, seed=seed,
               progress=on_progress is None, on_train=on_train)
    else:
        model_path = Path(model)

    policies = list(dict.fromkeys([*defaults, f"dqn={_short(model_path)}", *extra_policies]))
    results = out / "results.json"

    def do_bench() -> None:
        run_benchmark(bench_scenarios, policies, seeds, out, jobs=jobs, on_progress=on_progress, on_start=on_start,
                      command=command or "joulesched pipeline --env sim")

    files, content = _stage_key(bench_scenarios)
    # All three outputs: the report reads each, and one deleted or spoilt must send the stage round again.
    runner.run(Stage("benchmark", [*files, model_path], {"policies": policies, "seeds": seeds, "scenarios": content},
                     [results, out / "timelines.npz", out / "nodes.json"], do_bench))

    def do_report() -> None:
        copy_training_curve(model_path, out)
        write_report(out)

    runner.run(Stage("report", [results], {}, [out / "report.html"], do_report))
    return load_results(results)
