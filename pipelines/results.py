"""The results of a run, typed: what ``results.json`` holds, written by the twin benchmark and the kube pipeline,
read by the report, the CLI and the tests through attributes.

Its JSON Schema, generated from these models, ships as ``docs/results.schema.json`` (regenerate it with
``python -m joulesched.pipelines.results``; a test checks it matches). A scenario has one key everywhere: its
name (unique in a run), in ``scenarios[].name``, the ``summary``, ``nodes.json`` and the ``timelines.npz`` keys
(``NAME/POLICY/watts``). Schema 1 files (``"version": 1``, written before the model, with per-scenario
timelines keyed by position) still load; any other version is refused with its number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt, PrivateAttr,
                      ValidationError, model_validator)

from joulesched.core.errors import UsageError
from joulesched.core.fsio import read_text_input

SCHEMA_VERSION = 2
#: Versions :func:`load_results` reads (1: before the model; the same fields, ``version`` for ``schema_version``).
READABLE_VERSIONS = (1, 2)
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "docs" / "results.schema.json"


class ResultsError(UsageError):
    """A results file that is missing, unreadable, of an unknown version or not of this schema."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN and Infinity are no JSON, nor results


class PolicyRun(BaseModel):
    """One policy on one (scenario, seed). A backend may record measurements of its own beside these (the kube
    pipeline's are listed; others are allowed)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    energy_joules: NonNegativeFloat
    slo_violation_rate: float = Field(ge=0, le=1)
    unschedulable_pods: NonNegativeInt
    mean_pending_s: NonNegativeFloat
    placements: NonNegativeInt
    decision_us_p99: float | None = Field(description="null where not observable (measured runs)")
    mean_throttling: float | None = Field(description="null where not observable (measured runs)")
    end_s: float = Field(description="when its last job finished (never before the scenario's duration_s)")
    window_end_s: float | None = Field(
        None, description="the end of the window its energies cover: the latest end_s of its (scenario, seed)'s "
                          "runs, so that every policy is metered over one window (docs/twin.md); null: end_s")
    completed_pods: NonNegativeInt
    # The twin's account of every pod (docs/twin.md, "Counts"); absent in schema 1 files and measured runs.
    placed_pods: int | None = None
    unplaced_fits_no_node: int | None = None
    unplaced_pending_at_end: int | None = None
    unplaced_stopped_before_running: int | None = None
    # GPU clusters (the twin; docs/twin.md, "GPUs"): energy split into GPUs and the rest, per run and per node,
    # and FGD's fragmentation measure (unallocated GPU share whenever a GPU pod found no node).
    gpu_joules: float | None = None
    cpu_joules: float | None = Field(None, description="energy_joules less gpu_joules: CPUs, memory, board, sleep")
    node_joules: dict[str, float] | None = Field(None, description="per node: total joules (GPU clusters)")
    node_gpu_joules: dict[str, float] | None = Field(None, description="per node: its GPUs' joules")
    gpu_blocked: int | None = Field(None, description="times a GPU pod found no node")
    gpu_unallocated_when_blocked: float | None = Field(
        None, description="mean unallocated share of the cluster's GPUs at those times (null: never blocked)")
    # Measured runs (pipeline --env kube).
    scheduler_name: str | None = None
    window_start_unix: float | None = None
    window_end_unix: float | None = None
    energy_query: str | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    throughput_rps: float | None = None
    requests: int | None = None
    load_tool: str | None = None
    nodes_used: dict[str, int] | None = Field(None, description="pods bound per node")
    node_power: dict[str, list[tuple[float, float]]] | None = Field(
        None, description="per node: (seconds since the pods were created, watts)")
    awake_nodes: list[tuple[float, int]] | None = Field(
        None, description="(seconds since the pods were created, nodes awake), with the node power controller")


class OptimumRun(BaseModel):
    """The clairvoyant optimum's record for one (scenario, seed) (``agent/optimum.py:optimum_entry``)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # solver statistics come and go

    name: str
    seed: int
    nodes: int
    pods: int | None
    status: str
    overload_free: bool | None = None
    fluid_joules: float | None = None
    lp_bound_joules: float | None
    lp_wall_s: float | None = None
    optimum_joules: float | None
    bound_joules: float | None
    gap: float | None = None
    wall_s: float | None = None
    replay_joules: float | None = None
    replay_rel_error: float | None = None
    message: str = ""
    # What agent/optimum.py ``certify`` and ``window_schedule`` add (absent from older rows), typed because the
    # report computes with them: a schema-valid file must render.
    certificate: Literal["optimal", "feasible", "bound-only"] | None = None
    schedule_joules: float | None = None
    best_bound_joules: float | None = None
    best_gap: float | None = None
    boa_bound_joules: float | None = None
    window_end_s: float | None = None
    window_tail_joules: float | None = None

    @property
    def schedule_energy(self) -> float | None:
        """The joules of the MIP's schedule as the twin meters it: its replay (``schedule_joules``, or
        ``replay_joules``), else, in a row that was not replayed, the MIP's own figure."""
        if self.optimum_joules is None:
            return None
        if self.schedule_joules is not None:
            return self.schedule_joules
        return self.replay_joules if self.replay_joules is not None else self.optimum_joules

    @property
    def proven_optimal(self) -> bool:
        """The schedule is proven optimal: the solver closed the gap *and*, where the row has a certificate,
        the twin replayed it to the MIP's energy (``certificate: optimal``, agent/optimum.py ``certify``)."""
        return self.status == "optimal" and self.certificate in (None, "optimal")

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """(the best bound for every run: the LP's, or None; the best for the runs that bind each pod on arrival:
        the bind-on-arrival LP's and, where no run can overload a node, the MIP's own, or None). The MIP's bound
        also assumes no node is overloaded (docs/optimum.md), so where a run can overload one (``overload_free``
        false) a throttled run that binds on arrival may use less, and it is left out. The fluid bound is the
        entry's ``lower_bound_joules``."""
        mip = self.bound_joules if self.overload_free is not False else None
        boa = [v for v in (mip, self.boa_bound_joules) if v is not None]
        return self.lp_bound_joules, (max(boa) if boa else None)

    @property
    def every_run_bound(self) -> float | None:
        """The best bound this row proves for every run, queued and throttled ones too: the LP's or the fluid."""
        every = [v for v in (self.lp_bound_joules, self.fluid_joules) if v is not None]
        return max(every) if every else None


#: A proven schedule is the optimum over every run when a bound every run obeys meets it within this (relative).
EVERY_RUN_TOL = 1e-4


def weakest_optimum_label(labels: set[str | None]) -> str:
    """What several seeds' schedules are together (:meth:`ScenarioRun.optimum_label`): the weakest claim among
    them; a seed without a schedule (None) makes it ``optimum*``."""
    if labels == {"optimum"}:
        return "optimum"
    if labels <= {"optimum", "optimum, bind-on-arrival"}:
        return "optimum, bind-on-arrival"
    return "optimum*"


class ScenarioRun(_Strict):
    """Every policy on one scenario and workload seed."""

    name: str = Field(description="the scenario's key, unique in a run")
    seed: int = Field(description="the workload seed")
    nodes: int
    pods: int
    trace_rows_dropped: int = 0
    duration_s: float | None = None
    lower_bound_joules: float | None = Field(description="the fluid lower bound; null for measured runs")
    lower_bound_end_s: float | None = None
    scenario_file: str | None = Field(None, description="where the scenario came from (provenance, not a key)")
    optimum: OptimumRun | None = None
    target: str | None = Field(None, description="measured runs: the load target")
    apps: list[str] | None = Field(None, description="measured runs: the apps deployed")
    policies: dict[str, PolicyRun]

    def optimum_label(self) -> str | None:
        """What the optimum's schedule is, metered as the policies beside it are (None without one):

        * ``optimum``: proven optimal over the run's window and over every run the twin can produce: a bound
          every run obeys (the LP's, or the fluid one of the row or of the entry) meets it within
          :data:`EVERY_RUN_TOL`;
        * ``optimum, bind-on-arrival``: proven optimal among the schedules that bind each pod when it arrives and
          overload no node (the MIP's class, docs/optimum.md), and no more: a run outside the class (one that
          queues a pod, or binds on arrival onto a node its pods overload) may use less, whatever ran beside it;
        * ``optimum*``: not proven over the window: the solver's time ran out or the replay disagreed, or the
          schedule was charged an idle tail past its own end to meet the policies' window (the MIP minimised
          its energy to its own end, not that tail)."""
        o = self.optimum
        if o is None or o.schedule_energy is None:
            return None
        if not o.proven_optimal or (o.window_tail_joules or 0.0) > 0.0:
            return "optimum*"
        every = max((v for v in (o.every_run_bound, self.lower_bound_joules) if v is not None), default=None)
        if every is not None and every >= o.schedule_energy * (1 - EVERY_RUN_TOL):
            return "optimum"
        return "optimum, bind-on-arrival"


class PolicySummary(_Strict):
    """One policy on one scenario: means over its seeds, and energy ratios (per seed, then averaged, with the
    half-width of a 95 % Student-t interval; null with one seed)."""

    energy_joules: NonNegativeFloat
    energy_joules_ci95: NonNegativeFloat | None = None
    energy_vs_lower_bound: float | None
    slo_violation_rate: float = Field(ge=0, le=1)
    slo_violation_rate_ci95: NonNegativeFloat | None = None
    mean_throttling: float | None
    mean_pending_s: NonNegativeFloat
    mean_pending_s_ci95: NonNegativeFloat | None = None
    unschedulable_pods: NonNegativeFloat
    decision_us_p99: float | None = Field(description="median over seeds")
    placed_pods: float | None = None
    unplaced_fits_no_node: float | None = None
    unplaced_pending_at_end: float | None = None
    unplaced_stopped_before_running: float | None = None
    gpu_joules: float | None = None
    cpu_joules: float | None = None
    gpu_unallocated_when_blocked: float | None = None
    energy_vs_default: float | None = None
    energy_vs_default_ci95: float | None = None
    energy_vs_best_heuristic: float | None = None
    energy_vs_best_heuristic_ci95: float | None = None
    latency_p99_ms: float | None = None


class OptimumSummary(_Strict):
    lp_bound_joules: float | None
    optimum_joules: float | None
    optimum_bound_joules: float | None
    status: list[str]


class ScenarioSummary(_Strict):
    seeds: PositiveInt
    lower_bound_joules: float | None
    pods: float | None = None
    policies: dict[str, PolicySummary]
    warnings: list[str] = Field(default_factory=list)
    best_heuristics: list[str] | None = Field(
        None, description="what energy_vs_best_heuristic divides by: the heuristic best on each seed, most often first")
    optimum: OptimumSummary | None = None
    replay: bool = Field(False, description="a trace replayed as it is: every seed ran the same pods, so the "
                                            "seeds vary the policies' tie-breaking only")


class Results(_Strict):
    """A run's results: every (scenario, seed) entry and the summary per scenario."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False,
                              json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"})

    schema_version: Literal[2] = Field(description="2: this model")
    env: Literal["twin", "kube"] = Field("twin", description="the embedded twin or a measured cluster")
    command: str
    created_unix: float
    wall_s: float
    policies: list[str] = Field(min_length=1)
    seeds: PositiveInt
    scenarios: list[ScenarioRun]
    summary: dict[str, ScenarioSummary]
    _read_version: int = PrivateAttr(SCHEMA_VERSION)

    @model_validator(mode="after")
    def _consistent(self) -> Results:
        """Every run holds every policy of ``policies``, and the summary has exactly the runs' scenarios, each
        with every policy: what the report and the CLI index by (a partial or hand-edited file is refused here,
        naming what is missing, instead of failing halfway through a render). A policy is listed once and a
        (scenario, seed) run once, and each summary counts its scenario's runs: a repeat would be averaged in
        twice, and the page's n would not be the number of runs its ratios average."""
        twice = next((p for i, p in enumerate(self.policies) if p in self.policies[:i]), None)
        if twice is not None:
            raise ValueError(f"policies lists {twice!r} twice")
        seen: dict[tuple[str, int], int] = {}
        for k, e in enumerate(self.scenarios):
            if (e.name, e.seed) in seen:
                raise ValueError(f"scenarios.{k} repeats the run of ({e.name!r}, seed {e.seed}) of "
                                 f"scenarios.{seen[(e.name, e.seed)]}")
            seen[(e.name, e.seed)] = k
            missing = [p for p in self.policies if p not in e.policies]
            if missing:
                raise ValueError(f"scenarios.{k} ({e.name!r}, seed {e.seed}) has no run of policy {missing[0]!r}, "
                                 "which policies lists")
        names = list(dict.fromkeys(e.name for e in self.scenarios))
        for name in names:
            if name not in self.summary:
                raise ValueError(f"summary has no entry for scenario {name!r}")
            missing = [p for p in self.policies if p not in self.summary[name].policies]
            if missing:
                raise ValueError(f"summary.{name}.policies has no entry for policy {missing[0]!r}")
            runs = sum(e.name == name for e in self.scenarios)
            if self.summary[name].seeds != runs:
                raise ValueError(f"summary.{name}.seeds is {self.summary[name].seeds}, but scenarios has {runs} "
                                 f"run(s) of {name!r}")
        extra = [n for n in self.summary if n not in names]
        if extra:
            raise ValueError(f"summary has scenario {extra[0]!r}, which no entry of scenarios runs")
        return self

    @property
    def read_version(self) -> int:
        """The schema version of the file this came from (1: its timelines are keyed by scenario position)."""
        return self._read_version

    def runs(self, name: str) -> list[ScenarioRun]:
        """The per-seed entries of one scenario, in seed order."""
        return [e for e in self.scenarios if e.name == name]

    def timeline_key(self, name: str) -> str:
        """The prefix of a scenario's arrays in timelines.npz and its key in nodes.json: its name (schema 1: its
        position among the scenarios)."""
        if self._read_version >= 2:
            return name
        return str(list(dict.fromkeys(e.name for e in self.scenarios)).index(name))


def dump(res: Results) -> str:
    """results.json's text: the fields a writer set (a twin run has no kube fields, not a row of nulls), with
    Python's float formatting, so energies read back bit for bit."""
    return json.dumps(res.model_dump(exclude_unset=True), indent=2) + "\n"


def json_schema() -> dict:
    """The JSON Schema of results.json, as shipped in docs/results.schema.json."""
    return Results.model_json_schema()


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def from_dict(doc: object, where: str = "results") -> Results:
    """Validate a results document (schema 1 is upgraded); a clear :class:`ResultsError` otherwise."""
    if not isinstance(doc, dict) or not ("schema_version" in doc or "version" in doc):
        raise ResultsError(f"{where}: not a joulesched results file (no schema_version)")
    version = doc.get("schema_version", doc.get("version"))
    if version not in READABLE_VERSIONS:
        raise ResultsError(f"{where}: results schema version {version!r} is not one this joulesched reads "
                           f"({', '.join(map(str, READABLE_VERSIONS))}); re-run the benchmark to write version "
                           f"{SCHEMA_VERSION}")
    if version == 1:
        doc = {("schema_version" if k == "version" else k): (SCHEMA_VERSION if k == "version" else v)
               for k, v in doc.items()}
    try:
        res = Results.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        # A cross-field check (Results._consistent) says what is wrong itself, without pydantic's "Value error, ".
        msg = str(first["ctx"]["error"]) if first["type"] == "value_error" and "error" in first.get("ctx", {}) \
            else first["msg"]
        raise ResultsError(f"{where}: not valid results (schema version {version}): {loc}: {msg}"
                           + (f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else "")) from None
    res._read_version = version
    return res


def parse_json(text: str, path: Path | str) -> object:
    """``text`` (the file ``path``'s) as JSON, or a one-line :class:`ResultsError` naming the file. Not only a
    syntax error: json's decoder recurses per nesting level (``[[[...`` deep enough is a RecursionError) and refuses
    an integer of more than ``sys.get_int_max_str_digits()`` digits with a plain ValueError; each was a traceback."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise ResultsError(f"{path}: cannot read it as JSON: nested too deeply") from None
    except ValueError as e:  # the advice that follows ";" (sys.set_int_max_str_digits) is for programmers
        raise ResultsError(f"{path}: cannot read it as JSON: {str(e).split(';')[0]}") from None


def load_results(path: Path) -> Results:
    """Read a results.json written by the benchmark or the kube pipeline (schema 1 or 2)."""
    doc = parse_json(read_text_input(path, "a results.json", ResultsError,
                                     missing=f"{path}: no results.json there; run `joulesched benchmark` first"), path)
    return from_dict(doc, str(path))


def main() -> None:
    """Regenerate docs/results.schema.json from the model."""
    from joulesched.core.fsio import atomic_write_text

    print(atomic_write_text(SCHEMA_PATH, schema_text()))


if __name__ == "__main__":
    main()
