"""Scenario files: YAML validated by pydantic, every error naming the file and the field.

A scenario is a cluster (node groups with power curves), an idle-power policy, and a workload (a synthetic
generator or a trace CSV). Loading never writes anything; a bad file raises :class:`ScenarioError`, which the
CLI turns into one line and exit code 2.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from joulesched.core.errors import UsageError
from joulesched.power.curves import SPECPOWER, validate_curve


class ScenarioError(UsageError):
    """A scenario, trace or node-profile file is malformed. The message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AlwaysOn(_Strict):
    """Nodes never power down: an idle node draws its curve's 0 % watts."""

    mode: Literal["always_on"] = "always_on"


class Sleep(_Strict):
    """An empty node sleeps after ``sleep_after_s``; binding a pod to it wakes it, which takes ``wake_s``."""

    mode: Literal["sleep"]
    sleep_after_s: float = Field(300.0, ge=0, allow_inf_nan=False)
    sleep_watts: float = Field(10.0, ge=0, allow_inf_nan=False)
    wake_s: float = Field(60.0, ge=0, allow_inf_nan=False)


IdlePolicy = Annotated[Union[AlwaysOn, Sleep], Field(discriminator="mode")]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class NodeGroup(_Strict):
    """``count`` identical nodes. ``power_watts`` is 11 floats (0..100 % CPU) or a SPECpower profile name."""

    name_prefix: str
    count: int = Field(ge=1, le=100_000)
    cpu_m: int = Field(gt=0)
    memory_mib: int = Field(gt=0)
    max_pods: int = Field(110, ge=1)
    power_watts: Union[list[float], str]

    @field_validator("name_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not _DNS_LABEL.match(v) or len(v) > 50:
            raise ValueError("must be a lowercase DNS label prefix (a-z, 0-9, '-'), at most 50 characters")
        return v

    @field_validator("power_watts")
    @classmethod
    def _curve(cls, v: Union[list[float], str]) -> Union[list[float], str]:
        if isinstance(v, str):
            if v not in SPECPOWER:
                raise ValueError(f"unknown power profile {v!r}; known: {', '.join(sorted(SPECPOWER))}")
            return v
        return list(validate_curve(v))

    @property
    def curve(self) -> tuple[float, ...]:
        return SPECPOWER[self.power_watts] if isinstance(self.power_watts, str) else tuple(self.power_watts)


class Synthetic(_Strict):
    """A generated workload calibrated to the trace statistics in reference.md section 6.

    Pods arrive until ``pods`` have arrived or ``duration_s`` has passed. Arrivals come in bursts of mean size
    ``burst_mean`` (1 = plain Poisson); ``diurnal`` modulates the rate sinusoidally with a peak/trough ratio of
    ``diurnal_swing`` over ``diurnal_period_s``. Durations are lognormal (median, sigma in ln seconds). CPU
    requests follow the Alibaba 2023 quantiles (cores) times ``cpu_scale``; memory is ``memory_per_core_mib``
    per requested core with lognormal noise. Actual usage is a uniform fraction of the request in
    ``usage_fraction``, with noise. ``best_effort_fraction`` of pods carry no requests at all.
    """

    pods: int = Field(ge=1, le=10_000_000)
    arrival: Literal["poisson", "diurnal"] = "poisson"
    mean_interarrival_s: float = Field(gt=0, allow_inf_nan=False)
    burst_mean: float = Field(1.0, ge=1.0, allow_inf_nan=False)
    diurnal_swing: float = Field(4.0, ge=1.0, allow_inf_nan=False)
    diurnal_period_s: float = Field(86_400.0, gt=0, allow_inf_nan=False)
    duration_median_s: float = Field(540.0, gt=0, allow_inf_nan=False)
    duration_sigma: float = Field(1.88, ge=0, allow_inf_nan=False)
    min_duration_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    max_duration_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    cpu_scale: float = Field(0.0625, gt=0, allow_inf_nan=False)
    cpu_granularity_m: int = Field(50, ge=1)
    memory_per_core_mib: float = Field(3789.0, gt=0, allow_inf_nan=False)
    usage_fraction: tuple[float, float] = (0.5, 0.8)
    usage_noise_sigma: float = Field(0.1, ge=0, allow_inf_nan=False)
    best_effort_fraction: float = Field(0.05, ge=0, le=1, allow_inf_nan=False)

    @field_validator("usage_fraction")
    @classmethod
    def _usage(cls, v: tuple[float, float]) -> tuple[float, float]:
        lo, hi = v
        if not (0 < lo <= hi <= 4) or not all(map(math.isfinite, v)):
            raise ValueError("must be [low, high] with 0 < low <= high <= 4")
        return v

    @model_validator(mode="after")
    def _durations(self) -> "Synthetic":
        if self.max_duration_s is not None and self.max_duration_s < self.min_duration_s:
            raise ValueError("max_duration_s must be >= min_duration_s")
        return self


class WorkloadSpec(_Strict):
    """Exactly one of ``synthetic`` or ``trace`` (a CSV path relative to the scenario file)."""

    synthetic: Synthetic | None = None
    trace: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "WorkloadSpec":
        if (self.synthetic is None) == (self.trace is None):
            raise ValueError("give exactly one of 'synthetic' or 'trace'")
        return self


class Scenario(_Strict):
    """A validated scenario. ``source`` is the file it came from (trace paths resolve against its folder)."""

    name: str = Field(min_length=1, max_length=100)
    seed: int = Field(ge=0)
    duration_s: float = Field(gt=0, allow_inf_nan=False)
    idle_policy: IdlePolicy = Field(default_factory=AlwaysOn)
    nodes: list[NodeGroup] = Field(min_length=1)
    workload: WorkloadSpec
    slo_fraction: float = Field(0.9, gt=0, le=1, allow_inf_nan=False)
    slo_tolerance: float = Field(0.05, ge=0, lt=1, allow_inf_nan=False)
    source: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _unique_prefixes(self) -> "Scenario":
        seen: set[str] = set()
        for g in self.nodes:
            if g.name_prefix in seen:
                raise ValueError(f"node group name_prefix {g.name_prefix!r} is used twice")
            seen.add(g.name_prefix)
        return self

    @property
    def node_count(self) -> int:
        return sum(g.count for g in self.nodes)

    @property
    def trace_path(self) -> Path | None:
        if self.workload.trace is None:
            return None
        base = self.source.parent if self.source else Path.cwd()
        return (base / self.workload.trace).resolve()


def _format_validation_error(path: Path | str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
        # Drop pydantic's union-branch names (e.g. "Sleep") so the path reads like the YAML.
        loc = re.sub(r"\.(AlwaysOn|Sleep|always_on|sleep)(?=\.|$)", "", loc)
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc or '<root>'}: {msg}")
    return f"{path}: invalid scenario: " + "; ".join(lines)


def _read_yaml(path: Path, what: str) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: {what} file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path}: cannot read {what} file: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}".replace("\n", " ")) from None


def _expand_includes(raw: dict, path: Path) -> dict:
    """Node groups may be ``{include: profile.yaml, count: N, ...}``: a node profile from `power calibrate`."""
    nodes = raw.get("nodes")
    if not isinstance(nodes, list):
        return raw
    out = []
    for i, group in enumerate(nodes):
        if isinstance(group, dict) and "include" in group:
            inc = path.parent / str(group["include"])
            data = _read_yaml(inc, "node profile")
            if isinstance(data, dict) and isinstance(data.get("nodes"), list) and len(data["nodes"]) == 1:
                data = data["nodes"][0]
            if not isinstance(data, dict):
                raise ScenarioError(f"{path}: nodes.{i}.include: {inc} must hold one node group mapping")
            merged = {**data, **{k: v for k, v in group.items() if k != "include"}}
            out.append(merged)
        else:
            out.append(group)
    return {**raw, "nodes": out}


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises :class:`ScenarioError` naming the field on any problem."""
    path = Path(path)
    raw = _read_yaml(path, "scenario")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario must be a YAML mapping, got {type(raw).__name__}")
    raw = _expand_includes(raw, path)
    try:
        sc = Scenario.model_validate({**raw, "source": path.resolve()})
    except ValidationError as e:
        raise ScenarioError(_format_validation_error(path, e)) from None
    if sc.trace_path is not None and not sc.trace_path.is_file():
        raise ScenarioError(f"{path}: workload.trace: file not found: {sc.trace_path}")
    return sc
