"""`joulesched train` and `joulesched test`: thin typer commands over pipelines/train.py.

The root app registers them with ``app.command("train")(train_cmd)`` and ``app.command("test")(test_cmd)``;
``app`` here holds both for use on its own. Bad input prints one red line and exits 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True)
err = Console(stderr=True, highlight=False)
out = Console(highlight=False)

DEFAULT_MODEL = Path("models/dqn.pt")
SHIPPED_MODEL = Path("models/small.pt")
SUITE = ("scenarios/heterogeneous-sleep.yaml", "scenarios/heterogeneous.yaml", "scenarios/homogeneous.yaml",
         "scenarios/large.yaml", "scenarios/tiny.yaml")


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(2)


def train_cmd(
    scenario: Annotated[Optional[list[Path]], typer.Option(
        "--scenario", "-s", help="Scenario YAML to train on (repeat for a mix; a repeated file gets more episodes). "
        "Default: heterogeneous-sleep, heterogeneous twice, homogeneous (tiny and large stay unseen).")] = None,
    model: Annotated[Path, typer.Option(help="Model file (safetensors, whatever the extension). Created if "
                                        "missing.")] = DEFAULT_MODEL,
    minutes: Annotated[Optional[float], typer.Option(help="Train for this many minutes of wall time.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Train for this many decisions (environment steps).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue training an existing model.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing model instead of "
                                            "refusing.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for the network, exploration and episode sampling.")] = 0,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
) -> None:
    """Train the DQN scheduler on the twin; writes the model, NAME.json, NAME.curve.csv and NAME.curve.png."""
    from agent.policy import PolicyError
    from cluster.scenario import ScenarioError
    from pipelines.train import DEFAULT_TRAIN_SCENARIOS, TrainError, train

    if minutes is not None and steps is not None:
        _fail("give --minutes or --steps, not both")
    if minutes is None and steps is None:
        minutes = 5.0
    scenarios = scenario or [Path(p) for p in DEFAULT_TRAIN_SCENARIOS]
    try:
        s = train(scenarios, model, minutes=minutes, steps=steps, resume=resume, overwrite=overwrite, seed=seed,
                  progress=progress)
    except (TrainError, ScenarioError, PolicyError) as e:
        _fail(str(e))
    out.print(f"wrote {s.model} ({s.steps:,} steps this run, {s.total_steps:,} in all, {s.episodes} episodes, "
              f"{s.wall_s:.0f} s); best validation score {s.best_validation_score:.4f} at step {s.best_step:,}")
    out.print(f"training curve: {s.curve_csv}" + (f", {s.curve_png}" if s.curve_png else ""))


def test_cmd(
    model: Annotated[Path, typer.Option(help="Model file to evaluate.")] = SHIPPED_MODEL,
    scenario: Annotated[Optional[list[Path]], typer.Option(
        "--scenario", "-s", help="Scenario YAML (repeat). Default: the standard suite.")] = None,
    seeds: Annotated[int, typer.Option(help="Workloads per scenario (seeds scenario.seed + 0..N-1).")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    bound: Annotated[bool, typer.Option("--bound/--no-bound", help="Also compute the offline lower bound.")] = True,
) -> None:
    """Evaluate a model greedily (epsilon = 0) beside every baseline and print the table."""
    from agent.policy import PolicyError
    from cluster.scenario import ScenarioError
    from pipelines.train import TrainError, evaluate, format_table

    scenarios = scenario or [Path(p) for p in SUITE]
    try:
        res = evaluate(model, scenarios, seeds, lower=bound)
    except (TrainError, ScenarioError, PolicyError) as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(res, indent=2, sort_keys=True))
    else:
        out.print(format_table(res), soft_wrap=True)


app.command("train")(train_cmd)
app.command("test")(test_cmd)


if __name__ == "__main__":  # `python -m pipelines.train_cli train ...` before the root app registers them
    app()
