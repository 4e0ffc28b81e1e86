"""Sweeps: scenarios x policies x seeds x policy hyperparameters, on a process pool or on Ray.

A grid file (paths relative to it)::

    scenarios: [../scenarios/tiny.yaml, ../scenarios/heterogeneous-sleep.yaml]
    policies: [default-k8s, most-allocated, "dqn=../models/small.pt"]   # omitted: the default set
    seeds: 3
    hyperparameters:              # each combination becomes one more policy spec
      target-load-packing: {x: [20, 40, 60]}
      requested-to-capacity-ratio: {shape: ["0:0|100:10", "0:0|50:10|100:5"]}

Every cell is one policy on one (scenario, seed) workload, so the results are the benchmark's: one
results.json with confidence intervals across seeds, and the same report.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator

from joulesched.cluster.scenario import NoLaxModel
from joulesched.core import yamlio
from joulesched.core.errors import validation_summary
from joulesched.core.fsio import read_text_input
from joulesched.pipelines.benchmark import BenchmarkInputError, any_gpus, run_benchmark


class GridError(BenchmarkInputError):
    """A malformed sweep grid; the message names the field."""


class Grid(NoLaxModel):
    model_config = ConfigDict(extra="forbid")

    scenarios: list[str] = Field(min_length=1)
    policies: list[str] | None = None  # None: the registry's default set (every baseline and variant)
    seeds: int = Field(1, ge=1, le=1000)
    hyperparameters: dict[str, dict[str, list[str | int | float]]] = Field(default_factory=dict)

    @field_validator("hyperparameters")
    @classmethod
    def _nonempty(cls, v: dict[str, dict[str, list]]) -> dict[str, dict[str, list]]:
        for pol, params in v.items():
            if not params:
                raise ValueError(f"{pol}: give at least one parameter")
            for k, vals in params.items():
                if not vals:
                    raise ValueError(f"{pol}.{k}: give at least one value")
                # Joined into "policy:k=v,k2=v2": a ',' would smuggle in another option, and so would a key
                # holding '=' or ':' (a value may: requested-to-capacity-ratio's shape is "0:0|100:10").
                for x, bad in ((k, ",=:"), *((str(x), ",") for x in vals)):
                    if any(c in x for c in bad) or not x.strip():
                        raise ValueError(f"{pol}.{k}: {x!r} may not be empty or hold {' or '.join(bad)} (each "
                                         "parameter and value is one key=value of the policy's spec)")
        return v


def expand_policies(grid: Grid, base: Path, gpus: bool = False) -> list[str]:
    """The grid's policy specs: the listed ones (the default set when ``policies`` is absent, with the GPU-aware
    heuristics where ``gpus``: some scenario has GPUs), then one spec per hyperparameter combination."""

    def resolve(spec: str) -> str:
        name, sep, path = spec.partition("=")
        if sep and ":" not in name and not Path(path).is_absolute():
            return f"{name}={(base / path).resolve()}"
        return spec

    from joulesched.agent.policy import PolicyError, parse_spec
    from joulesched.agent.registry import default_policies

    specs = [resolve(p) for p in (default_policies(gpus) if grid.policies is None else grid.policies)]
    for pol, params in grid.hyperparameters.items():
        keys = list(params)
        # A key is a spec as `policies` holds them: a model path there is the grid file's too, and options it
        # already has are joined by the new ones (``awake-first:fit=efficient`` + headroom).
        spec = resolve(pol)
        try:  # options already there: joined by ","; a ':' in a model's folder is no option
            sep = "," if parse_spec(spec)[1] else ":"
        except PolicyError as e:
            raise GridError(f"hyperparameters: {e}") from None
        for combo in itertools.product(*(params[k] for k in keys)):
            specs.append(spec + sep + ",".join(f"{k}={v}" for k, v in zip(keys, combo)))
    if not specs:
        raise GridError("the grid names no policy: give policies or hyperparameters")
    # A hyperparameter combination may name a spec the default set already runs (gpu-energy:empty=asleep).
    specs = list(dict.fromkeys(specs))
    return specs


def load_grid(path: Path) -> tuple[list[Path], list[str], int]:
    """Read a grid file into (scenario paths, policy specs, seeds)."""
    path = Path(path)
    try:
        raw = yamlio.load(read_text_input(path, "a grid file", GridError, missing=f"{path}: grid file not found"))
    except yaml.YAMLError as e:
        raise GridError(f"{path}: cannot read grid: {e}".replace("\n", " ")) from None
    try:
        grid = Grid.model_validate(raw)
    except ValidationError as e:
        raise GridError(f"{path}: invalid grid: {validation_summary(e)}") from None
    base = path.parent
    scenarios = [(base / s).resolve() for s in grid.scenarios]
    gpus = grid.policies is None and any_gpus(scenarios)
    return scenarios, expand_policies(grid, base, gpus), grid.seeds


def run_sweep(grid_path: Path, out: Path, *, executor: str = "local", jobs: int = 1, ray_address: str | None = None,
              on_progress: Callable[[str], None] | None = None, on_start: Callable[[int], None] | None = None,
              command: str = "") -> dict:
    scenarios, policies, seeds = load_grid(grid_path)
    return run_benchmark(scenarios, policies, seeds, out, jobs=jobs, executor=executor, ray_address=ray_address,
                         on_progress=on_progress, on_start=on_start, command=command)
