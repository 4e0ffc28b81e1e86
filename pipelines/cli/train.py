"""`joulesched train` and `joulesched test`: thin typer commands over :mod:`joulesched.pipelines.training`.

Every knob of the DQN (network, replay, exploration, validation, seeds, reward weights) lives in
:class:`joulesched.agent.config.TrainConfig`; ``--config FILE`` reads one from YAML, ``--set KEY=VALUE``
overrides single knobs and ``--show-config`` prints the result. The epilog of ``train --help`` lists them all.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Annotated, Optional

import typer

from rich.markup import escape

from joulesched.pipelines.cli.common import err, errors, fail, float_option, interrupted, json_text, out
from joulesched.pipelines.suite import SHIPPED_MODEL, display, standard_suite, train_scenarios

DEFAULT_MODEL = Path("models/dqn.pt")
DEFAULT_MINUTES = 5.0
#: torch.manual_seed's largest seed (one above it was a traceback after the scenarios had loaded).
MAX_SEED = 2**64 - 1


def knobs_epilog() -> str:
    """The epilog of ``train --help``: every knob with its default and description."""
    from joulesched.agent.config import describe

    lines = ["Training knobs (--set SECTION.KEY=VALUE, or a --config YAML with dqn: and reward: sections):", ""]
    for key, default, doc in describe():
        lines.append(f"  {key} = {default!r}: {doc}")
    # Typer's rich help keeps lines that end in two spaces (markdown-style line breaks) apart.
    return "\n\n".join(lines)


def _stamp(model: Path) -> tuple[int, int] | None:
    try:
        st = model.stat()
        return st.st_mtime_ns, st.st_size
    except OSError:
        return None


def _interrupted_message(model: Path, resume: bool) -> Callable[[], str]:
    """What Ctrl-C leaves, said when it comes: a model is written once, when its run ends, so the interrupted
    run's training is lost, unless the Ctrl-C came after the model was saved, while its side files were written
    (a review: "nothing was written" was said of a model already replaced)."""
    before = _stamp(model)

    def message() -> str:
        if _stamp(model) != before:
            return (f"{model} was saved before the interrupt and holds this run's training; its {model.stem}.json "
                    "and training curve may be the previous run's or missing. Do not re-run the same command: "
                    "it would train again on top of it.")
        hint = ("Re-run the same command to train it again from there." if resume else
                "Re-run with a smaller --steps or --minutes to keep a shorter run, and --resume it to go on.")
        was = "is as it was before this run" if before is not None else "was not created"
        return (f"nothing was written: {model} {was} (a model is saved only when its run ends), and this run's "
                f"training is lost. {hint}")

    return message


def _warn_gpu_blind(scenarios, schema: int) -> None:
    """A new model of feature schema 1 or 2 sees no GPU columns (schema 3 does, docs/dqn.md): on a cluster with
    GPUs it trains blind to them, which the default schema (2) did without a word."""
    gpu = [sc.name for sc in scenarios if sc.has_gpus]
    if gpu and schema < 3:
        err.print(f"[yellow]warning:[/yellow] {escape(', '.join(dict.fromkeys(gpu)))} has GPUs, but a schema-{schema} "
                  "model sees no GPU columns; --set dqn.feature_schema=3 trains one that does", soft_wrap=True)


def _warn_replayed_validation(scenarios) -> None:
    """A trace replayed as it is has one workload whatever the seed: its validation case is the training
    workload itself, so the best model is picked on what it trained on."""
    replayed = [sc.name for sc in scenarios if sc.workload.replay]
    if replayed:
        err.print(f"[yellow]warning:[/yellow] {escape(', '.join(dict.fromkeys(replayed)))} replays a trace as it is: "
                  "its validation case is the workload it trains on, not a held-out one. Judge the model on a "
                  "held-out window with `joulesched test` (docs/dqn.md, \"Training at full size\")", soft_wrap=True)


def _resumed_config(model: Path):
    """What ``--resume`` trains with: the hyperparameters and reward weights stored in the model, not the defaults
    (``--resume --show-config`` printed those)."""
    from joulesched.agent.config import TrainConfig
    from joulesched.pipelines.training import load_resumed

    agent, _, reward = load_resumed(model)  # refuses a missing or garbled file with its reason
    return TrainConfig(dqn=agent.cfg, reward=reward)


def train_cmd(
    scenario: Annotated[Optional[list[Path]], typer.Option(
        "--scenario", "-s", help="Scenario YAML to train on (repeat for a mix; a repeated file gets more episodes). "
        "Default: heterogeneous-sleep, heterogeneous, homogeneous, services-diurnal-sleep, mixed-always-on (tiny and "
        "large stay unseen).")] = None,
    model: Annotated[Path, typer.Option(help="Model file (safetensors, whatever the extension). Created if "
                                        "missing.")] = DEFAULT_MODEL,
    minutes: Annotated[Optional[float], float_option(
        help=f"Train for this many minutes of wall time (demonstrations and validations included; the episodes in "
             f"progress and a last validation finish after it). Default: {DEFAULT_MINUTES:g} when --steps is not "
             "given.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Train for this many decisions (environment steps).")] = None,
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="Training config YAML (dqn: and reward: sections; see the knobs below).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Override one knob, e.g. --set dqn.hidden=128 (repeatable; applied after --config).")] = None,
    show_config: Annotated[bool, typer.Option(
        "--show-config", help="Print the resolved config as YAML and exit without training.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue training an existing model.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing model instead of "
                                            "refusing.")] = False,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed for the network, exploration and episode "
                                      "sampling.")] = 0,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
    workers: Annotated[int, typer.Option(min=1, max=256, help="Processes collecting rollouts and running "
                                         "validation (the same model for any number).")] = 1,
    executor: Annotated[str, typer.Option(help="Where the rollouts run: local (a process pool of --workers) or "
                                          "ray (Ray tasks; a local Ray with --workers CPUs unless --ray-address).")]
    = "local",
    ray_address: Annotated[Optional[str], typer.Option(help="Address of an existing Ray cluster for --executor "
                                                       "ray.")] = None,
) -> None:
    """Train the DQN scheduler on the twin; writes the model, NAME.json, NAME.curve.csv and NAME.curve.png."""
    from joulesched.agent.config import TrainConfig, dump_config, load_config, with_overrides
    from joulesched.cluster.scenario import load_scenario
    from joulesched.pipelines.training import check_teachers, train

    if minutes is not None and steps is not None:
        fail("give --minutes or --steps, not both")
    if executor not in ("local", "ray"):
        fail(f"--executor must be local or ray, got {executor!r}")
    with errors(), interrupted(model.parent, _interrupted_message(model, resume)):
        cfg = load_config(config) if config is not None else None
        if set_:
            cfg = with_overrides(cfg or TrainConfig(), set_)
        if show_config:
            if resume and cfg is not None:
                fail("--resume keeps the model's hyperparameters; do not pass a config")
            shown = _resumed_config(model) if resume else cfg or TrainConfig()
            check_teachers(shown.dqn)  # what training would refuse is refused here too
            out.print(dump_config(shown), end="", soft_wrap=True)
            return
        if minutes is None and steps is None:
            minutes = DEFAULT_MINUTES
        scenarios = [load_scenario(p) for p in scenario or train_scenarios()]  # errors name the file and field
        if not resume:
            _warn_gpu_blind(scenarios, (cfg or TrainConfig()).dqn.feature_schema)
        _warn_replayed_validation(scenarios)
        s = train(scenarios, model, minutes=minutes, steps=steps, resume=resume,
                  overwrite=overwrite, seed=seed, progress=progress, config=cfg, workers=workers, executor=executor,
                  ray_address=ray_address)
    out.print(f"wrote {s.model} ({s.steps:,} steps this run, {s.total_steps:,} in all, {s.episodes} episodes, "
              f"{s.wall_s:.0f} s); best validation score {s.best_validation_score:.4f} at step {s.best_step:,}")
    out.print(f"training curve: {s.curve_csv}" + (f", {s.curve_png}" if s.curve_png else ""))


def test_cmd(
    model: Annotated[Path, typer.Option(help="Model file to evaluate.", show_default=display(SHIPPED_MODEL))]
    = SHIPPED_MODEL,
    scenario: Annotated[Optional[list[Path]], typer.Option(
        "--scenario", "-s", help="Scenario YAML (repeat). Default: the standard suite in scenarios/.")] = None,
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="Workloads per scenario (seeds scenario.seed + "
                                       "0..N-1).")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    bound: Annotated[bool, typer.Option("--bound/--no-bound", help="Also compute the offline lower bound.")] = True,
    optimum: Annotated[bool, typer.Option(
        "--optimum/--no-optimum", help="Also the optimum (the MIP, on instances of at most 16 nodes and 200 pods) "
        "and the LP bound (docs/optimum.md): the ratios to them and the share of the gap closed.")] = True,
    optimum_time_limit: Annotated[float, float_option(help="Seconds for the MIP per scenario and seed.")] = 20.0,
) -> None:
    """Evaluate a model greedily (epsilon = 0) beside the default set; print the ratios to default-k8s, to the
    best heuristic, to the best sleep-aware heuristic and to the optimum or bound."""
    from joulesched.pipelines.training import evaluate, format_table

    with errors():
        res = evaluate(model, scenario or standard_suite(), seeds, lower=bound, optimum=optimum,
                       optimum_time_limit=optimum_time_limit)
    if as_json:
        typer.echo(json_text(res, indent=2, sort_keys=True))
    else:
        out.print(format_table(res), soft_wrap=True)

