"""Scenario files: YAML validated by pydantic, every error naming the file and the field.

A scenario is a cluster (node groups with power curves), an idle-power policy, and a workload (a synthetic
generator or a trace CSV, or a mix of job and service generators and traces). Loading never writes anything;
a bad file raises :class:`ScenarioError`, which the CLI turns into one line and exit code 2.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from joulesched.cluster.filters import (
    NodeSelectorTerm,
    NodeTraits,
    PodConstraints,
    Requirement,
    Taint,
    Toleration,
    pod_constraints,
)
from joulesched.cluster.nodepower import DisruptionBudget, PowerPolicy
from joulesched.core.errors import UsageError
from joulesched.core.fsio import read_text_input
from joulesched.core import yamlio
from joulesched.core.names import is_dns_label, is_label_key, is_label_value
from joulesched.core.strict import lax_coercion
from joulesched.power.curves import MAX_WATTS, SPECPOWER, validate_curve
from joulesched.power.gpu import gpu_curve, gpu_speed


#: Upper bounds of a node's or pod's CPU (a million cores) and memory (about 9.3 PiB): far beyond any machine,
#: and small enough that a cluster's sums stay within the twin's 64-bit columns (a larger one overflowed them).
MAX_CPU_M = 10**9
MAX_MEMORY_MIB = 10**10
#: The most GPUs a node or pod may have (no machine has more).
MAX_GPUS = 64


class ScenarioError(UsageError):
    """A scenario, trace or node-profile file is malformed. The message names the file and the field."""


class NoLaxModel(BaseModel):
    """A model that refuses what pydantic's lax mode would coerce without a word (core.strict): ``true`` for a
    number (read as 1), ``"no"`` or ``1`` for a switch. The base of every config file's model."""

    @model_validator(mode="before")
    @classmethod
    def _no_lax_coercion(cls, data: object) -> object:
        # A model validator, not a field one: pydantic allows no before-validator on a union's discriminator.
        if isinstance(data, dict):
            errors = [InitErrorDetails(type=PydanticCustomError("lax_coercion", why), loc=(key,), input=data[key])
                      for name, field in cls.model_fields.items()
                      if (key := field.alias or name) in data and (why := lax_coercion(field.annotation, data[key]))]
            if errors:  # raised as a ValidationError, each error keeps its field's place (nodes.0.count)
                raise ValidationError.from_exception_data(cls.__name__, errors)
        return data


class _Strict(NoLaxModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AlwaysOn(_Strict):
    """Nodes never power down: an idle node draws its curve's 0 % watts."""

    mode: Literal["always_on"] = "always_on"


class Budget(_Strict):
    """A disruption budget: ``nodes`` (``3`` or ``"10%"``), optionally in a cron ``schedule`` window of
    ``duration_s`` (:class:`joulesched.cluster.nodepower.DisruptionBudget`)."""

    nodes: Union[int, str] = "10%"
    schedule: Optional[str] = None
    duration_s: Optional[float] = Field(None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _valid(self) -> "Budget":
        self.core()  # the core's checks, named at load time
        return self

    def core(self) -> DisruptionBudget:
        return DisruptionBudget(str(self.nodes), self.schedule, self.duration_s)


class Consolidation(_Strict):
    """Evict the pods of an under-used awake node so that it can sleep (the decision core's rules,
    :mod:`joulesched.cluster.nodepower`). An evicted pod restarts after ``restart_s`` wherever the policy puts
    it; a job loses its progress unless it checkpoints (``checkpoint_fraction`` of pods, drawn from the
    scenario seed)."""

    interval_s: float = Field(300.0, ge=1, allow_inf_nan=False)  # (a tick a second at most: a run's events stay few)
    max_evictions_per_hour: int = Field(60, ge=0)
    restart_s: float = Field(30.0, ge=0, allow_inf_nan=False)
    horizon_s: float = Field(3600.0, ge=0, allow_inf_nan=False)
    checkpoint_fraction: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    #: Karpenter's disruption budgets (the twin's time 0 is Monday 2024-01-01 00:00 UTC for their schedules).
    budgets: list[Budget] = Field(default_factory=list)
    #: Karpenter's Balanced rule: savings fraction / disruption fraction >= balanced_k (0 = off).
    balanced_k: float = Field(0.0, ge=0, allow_inf_nan=False)


class Sleep(_Strict):
    """An empty node sleeps after ``sleep_after_s``; binding a pod to it wakes it, which takes ``wake_s``.

    ``min_awake`` nodes, with ``spare_cpu_m`` of free requested CPU among them, always stay awake (a node held
    awake by them is looked at again every ``recheck_s``); at most ``max_sleeps_per_hour`` sleeps start over any
    sliding hour (0, the default: no limit; the live controller's default is 60), an idle node waiting for room;
    ``consolidation`` (off unless given) evicts pods so that more nodes can sleep. The defaults keep the plain
    rule: every node that has been empty long enough sleeps."""

    mode: Literal["sleep"]
    sleep_after_s: float = Field(300.0, ge=0, allow_inf_nan=False)
    sleep_watts: float = Field(10.0, ge=0, le=MAX_WATTS, allow_inf_nan=False)
    wake_s: float = Field(60.0, ge=0, le=86_400, allow_inf_nan=False)  # a machine that takes a day to wake never slept
    min_awake: int = Field(0, ge=0)
    spare_cpu_m: int = Field(0, ge=0)
    recheck_s: float = Field(60.0, ge=1, allow_inf_nan=False)
    max_sleeps_per_hour: int = Field(0, ge=0)
    consolidation: Consolidation | None = None

    def power_policy(self) -> PowerPolicy:
        """The decision core's parameters."""
        c = self.consolidation
        extra = {} if c is None else dict(consolidate=True, consolidate_interval_s=c.interval_s,
                                          max_evictions_per_hour=c.max_evictions_per_hour, restart_s=c.restart_s,
                                          horizon_s=c.horizon_s, budgets=tuple(b.core() for b in c.budgets),
                                          balanced_k=c.balanced_k)
        return PowerPolicy(sleep_after_s=self.sleep_after_s, min_awake=self.min_awake, spare_cpu_m=self.spare_cpu_m,
                           recheck_s=self.recheck_s, max_sleeps_per_hour=self.max_sleeps_per_hour, **extra)


IdlePolicy = Annotated[Union[AlwaysOn, Sleep], Field(discriminator="mode")]


def _label_key(k: str) -> str:
    if not is_label_key(k):
        raise ValueError(f"{k!r} is not a Kubernetes label key ([prefix/]name, name at most 63 characters of "
                         "a-z, A-Z, 0-9, '-', '_', '.')")
    return k


def _label_value(v: str) -> str:
    if not is_label_value(v):
        raise ValueError(f"{v!r} is not a Kubernetes label value (at most 63 characters of a-z, A-Z, 0-9, '-', "
                         "'_', '.', alphanumeric at both ends)")
    return v


def _labels(v: dict[str, str]) -> dict[str, str]:
    for k, x in v.items():
        _label_key(k)
        _label_value(x)
    return v


class TaintSpec(_Strict):
    """A node taint, as in a Node's ``spec.taints``."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    _key = field_validator("key")(classmethod(lambda cls, v: _label_key(v)))
    _value = field_validator("value")(classmethod(lambda cls, v: _label_value(v)))

    def taint(self) -> Taint:
        return Taint(self.key, self.value, self.effect)


class TolerationSpec(_Strict):
    """A pod toleration, as in a Pod's ``spec.tolerations`` (an empty key with ``Exists`` tolerates every taint)."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""

    @model_validator(mode="after")
    def _check(self) -> "TolerationSpec":
        if self.key:
            _label_key(self.key)
        elif self.operator != "Exists":
            raise ValueError("a toleration with an empty key must use operator: Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator: Exists takes no value")
        _label_value(self.value)
        return self

    def toleration(self) -> Toleration:
        return Toleration(self.key, self.operator, self.value, self.effect)


class RequirementSpec(_Strict):
    """A node selector requirement of a required node affinity term (kube's matchExpressions entry)."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "RequirementSpec":
        _label_key(self.key)
        op, vals = self.operator, self.values
        if op in ("In", "NotIn") and not vals:
            raise ValueError(f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and vals:
            raise ValueError(f"operator {op} takes no values")
        if op in ("Gt", "Lt") and (len(vals) != 1 or not re.fullmatch(r"[-+]?[0-9]+", vals[0])):
            raise ValueError(f"operator {op} needs exactly one integer value")
        for v in vals:
            _label_value(v)
        return self


class TermSpec(_Strict):
    """One nodeSelectorTerm: its requirements are ANDed (the terms of a pod are ORed)."""

    match_expressions: list[RequirementSpec] = Field(min_length=1)

    def term(self) -> NodeSelectorTerm:
        return NodeSelectorTerm(tuple(Requirement(r.key, r.operator, tuple(r.values)) for r in self.match_expressions))


class PodPlacement(_Strict):
    """Where a generator's pods may go, as kube-scheduler reads a Pod: ``node_selector`` (labels a node must
    carry), ``tolerations`` (of node taints) and ``required_node_affinity`` (requiredDuringScheduling
    IgnoredDuringExecution's nodeSelectorTerms, ORed). Defaults: none, the pods of before."""

    node_selector: dict[str, str] | None = None
    tolerations: list[TolerationSpec] | None = None
    required_node_affinity: list[TermSpec] | None = Field(None, min_length=1)

    _selector = field_validator("node_selector")(classmethod(lambda cls, v: v if v is None else _labels(v)))

    def constraints(self) -> PodConstraints | None:
        """The filter chain's view (:mod:`joulesched.cluster.filters`); ``None`` when the pods ask nothing."""
        terms = self.required_node_affinity
        return pod_constraints(self.node_selector, [t.toleration() for t in self.tolerations or ()],
                               None if terms is None else [t.term() for t in terms])


class NodeGroup(_Strict):
    """``count`` identical nodes. ``power_watts`` is 11 floats (0..100 % CPU) or a SPECpower profile name."""

    name_prefix: str
    count: int = Field(ge=1, le=100_000)
    cpu_m: int = Field(gt=0, le=MAX_CPU_M)
    memory_mib: int = Field(gt=0, le=MAX_MEMORY_MIB)
    max_pods: int = Field(110, ge=1, le=1_000_000)
    power_watts: Union[list[float], str]
    never_sleep: bool = False  # like the joulesched.io/never-sleep annotation (or a control-plane node)
    # What kube-scheduler's node filters read (cluster/filters.py); defaults: none, the nodes of before.
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    unschedulable: bool = False  # cordoned
    # GPUs (docs/twin.md, "GPUs"): count, model (the nvidia.com/gpu.product label on a cluster), memory per GPU,
    # and one GPU's watts ([idle, max] or 11 values at 0..100 %; default: the model's, power/gpu.py).
    gpu_count: int = Field(0, ge=0, le=MAX_GPUS)
    gpu_model: str = Field("", max_length=63)
    gpu_memory_mib: int = Field(0, ge=0, le=MAX_MEMORY_MIB)
    gpu_power_watts: list[float] | None = None
    # One GPU's speed relative to a V100 (default: the model's, power/gpu.py); read only where the scenario sets
    # gpu_runtime.
    gpu_speed: float | None = Field(None, gt=0, le=100, allow_inf_nan=False)

    _labels_ok = field_validator("labels")(classmethod(lambda cls, v: _labels(v)))

    @model_validator(mode="after")
    def _gpus(self) -> "NodeGroup":
        if self.gpu_count == 0 and (self.gpu_model or self.gpu_memory_mib or self.gpu_power_watts is not None
                                    or self.gpu_speed is not None):
            what = "gpu_model" if self.gpu_model else "gpu_memory_mib" if self.gpu_memory_mib else \
                "gpu_power_watts" if self.gpu_power_watts is not None else "gpu_speed"
            raise ValueError(f"{what} is given but gpu_count is 0: give the group's GPUs per node as gpu_count")
        if self.gpu_model and "|" in self.gpu_model:
            raise ValueError(f"gpu_model {self.gpu_model!r} names one model ('|' separates a pod's allowed ones)")
        if self.gpu_model:
            _label_value(self.gpu_model)
        if self.gpu_count:
            gpu_curve(self.gpu_model, self.gpu_power_watts)  # its errors, named at load time
        return self

    @property
    def gpu_curve(self) -> tuple[float, ...]:
        """One GPU's watts at 0..100 % (zeros without GPUs)."""
        return gpu_curve(self.gpu_model, self.gpu_power_watts) if self.gpu_count else (0.0,) * 11

    @property
    def speed(self) -> float:
        """One GPU's relative speed (1 without GPUs: a pod without GPUs runs as long anywhere)."""
        return gpu_speed(self.gpu_model, self.gpu_speed) if self.gpu_count else 1.0

    @property
    def traits(self) -> NodeTraits:
        return NodeTraits.of(self.labels, [t.taint() for t in self.taints], unschedulable=self.unschedulable)

    @field_validator("name_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not is_dns_label(v, 50):
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


class Synthetic(PodPlacement):
    """A generated workload calibrated to the trace statistics in reference.md section 6.

    Pods arrive until ``pods`` have arrived or ``duration_s`` has passed. Arrivals come in bursts of mean size
    ``burst_mean`` (1 = plain Poisson); ``diurnal`` modulates the rate sinusoidally with a peak/trough ratio of
    ``diurnal_swing`` over ``diurnal_period_s``. Durations are lognormal (median, sigma in ln seconds). CPU
    requests follow the Alibaba 2023 quantiles (cores) times ``cpu_scale``; memory is ``memory_per_core_mib``
    per requested core with lognormal noise. Actual usage is a uniform fraction of the request in
    ``usage_fraction``, with noise. ``best_effort_fraction`` of pods carry no requests at all.

    The pod-model metadata (``owner_kind``, ``app``, ``namespace``, ``priority``, ``slo_class``) is the same for
    every pod of the generator; ``cpu_limit_factor`` / ``memory_limit_factor`` give pods with requests a limit
    of that many times the request. Their defaults leave the pods exactly as they were before the pod model.
    """

    pods: int = Field(ge=1, le=10_000_000)
    arrival: Literal["poisson", "diurnal"] = "poisson"
    mean_interarrival_s: float = Field(gt=0, allow_inf_nan=False)
    burst_mean: float = Field(1.0, ge=1.0, allow_inf_nan=False)
    diurnal_swing: float = Field(4.0, ge=1.0, allow_inf_nan=False)
    diurnal_period_s: float = Field(86_400.0, gt=0, allow_inf_nan=False)
    duration_median_s: float = Field(540.0, gt=0, allow_inf_nan=False)
    duration_sigma: float = Field(1.88, ge=0, le=20, allow_inf_nan=False)
    min_duration_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    max_duration_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    # The largest request drawn is 64 cores times cpu_scale: at most MAX_CPU_M.
    cpu_scale: float = Field(0.0625, gt=0, le=MAX_CPU_M / 64_000, allow_inf_nan=False)
    cpu_granularity_m: int = Field(50, ge=1, le=MAX_CPU_M)
    memory_per_core_mib: float = Field(3789.0, gt=0, le=MAX_MEMORY_MIB, allow_inf_nan=False)
    usage_fraction: tuple[float, float] = (0.5, 0.8)
    usage_noise_sigma: float = Field(0.1, ge=0, le=10, allow_inf_nan=False)
    best_effort_fraction: float = Field(0.05, ge=0, le=1, allow_inf_nan=False)
    # Pod-model metadata (docs/twin.md); the defaults are the pods of before the pod model, unchanged.
    owner_kind: str = Field("", max_length=63)
    app: str = Field("", max_length=253)
    namespace: str = Field("default", max_length=63)
    priority: int = Field(0, ge=-(2**31), lt=2**31)
    slo_class: str = Field("", max_length=63)
    cpu_limit_factor: float | None = Field(None, ge=1, allow_inf_nan=False)  # limit = factor x request
    memory_limit_factor: float | None = Field(None, ge=1, allow_inf_nan=False)

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        return _namespace(v)

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


def _namespace(v: str) -> str:
    if not is_dns_label(v):
        raise ValueError("must be a Kubernetes namespace name (a lowercase DNS label, at most 63 characters)")
    return v


class UsageProfile(_Strict):
    """A service's CPU demand per replica over the day, as a fraction of its CPU request.

    ``sinusoid``: mean ``mean_fraction``, peak/trough ``swing``, peaking ``peak_s`` into each ``period_s``
    (scenario time 0 is midnight). ``hourly``: 24 relative levels, linear between the hours, scaled to the same
    mean. ``constant``: ``mean_fraction`` throughout. The twin sees it piecewise constant over ``step_s``
    (each step holds the exact mean of the curve over it, times lognormal noise of ``noise_sigma``). Across the
    services of one entry the mean varies lognormally (``service_sigma``) and the peak by ``phase_jitter_s``.
    """

    pattern: Literal["constant", "sinusoid", "hourly"] = "sinusoid"
    mean_fraction: float = Field(0.4, gt=0, le=4, allow_inf_nan=False)
    swing: float = Field(4.0, ge=1, allow_inf_nan=False)
    peak_s: float = Field(50_400.0, ge=0, allow_inf_nan=False)
    period_s: float = Field(86_400.0, gt=0, allow_inf_nan=False)
    hourly: list[float] | None = None
    step_s: float = Field(300.0, ge=1, allow_inf_nan=False)
    noise_sigma: float = Field(0.1, ge=0, le=2, allow_inf_nan=False)
    service_sigma: float = Field(0.25, ge=0, le=2, allow_inf_nan=False)
    phase_jitter_s: float = Field(1800.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _hourly(self) -> "UsageProfile":
        if self.pattern == "hourly":
            h = self.hourly
            if h is None or len(h) != 24:
                raise ValueError("pattern hourly needs 'hourly': 24 levels, one per hour from midnight")
            if not all(math.isfinite(x) and x >= 0 for x in h) or max(h) <= 0:
                raise ValueError("hourly levels must be finite, >= 0, and not all 0")
        elif self.hourly is not None:
            raise ValueError("'hourly' is only used with pattern: hourly")
        return self


class Autoscale(_Strict):
    """A HorizontalPodAutoscaler on CPU: ``ceil(demand / (target_fraction x cpu_m))`` replicas, between
    ``min_replicas`` and ``max_replicas`` (default: the entry's ``replicas``), evaluated every usage step;
    scaling down waits ``scale_down_delay_s`` (Kubernetes' default stabilisation window is 300 s)."""

    min_replicas: int = Field(1, ge=1, le=10_000)
    max_replicas: int | None = Field(None, ge=1, le=10_000)
    target_fraction: float = Field(0.6, gt=0, le=4, allow_inf_nan=False)
    scale_down_delay_s: float = Field(300.0, ge=0, allow_inf_nan=False)


class Services(PodPlacement):
    """``count`` long-running services (Deployments) of ``replicas`` pods each, created at ``start_s`` (spread
    uniformly over ``spread_s``). They have no planned end: a service runs until the scenario ends, unless its
    autoscaler removes replicas. ``usage`` is the per-replica demand at ``replicas`` replicas; with
    ``autoscale`` the service's total demand is shared by however many replicas it has."""

    count: int = Field(ge=1, le=100_000)
    replicas: int = Field(3, ge=1, le=10_000)
    cpu_m: int = Field(gt=0, le=MAX_CPU_M)
    memory_mib: int = Field(gt=0, le=MAX_MEMORY_MIB)
    cpu_limit_m: int | None = Field(None, gt=0, le=MAX_CPU_M)
    memory_limit_mib: int | None = Field(None, gt=0, le=MAX_MEMORY_MIB)
    usage: UsageProfile = Field(default_factory=UsageProfile)
    autoscale: Autoscale | None = None
    start_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    spread_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    name: str = Field("svc", max_length=40)
    owner_kind: str = Field("Deployment", max_length=63)
    namespace: str = Field("default", max_length=63)
    priority: int = Field(0, ge=-(2**31), lt=2**31)
    slo_class: str = Field("", max_length=63)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not is_dns_label(v):
            raise ValueError("must be a lowercase DNS label (a-z, 0-9, '-'), at most 63 characters: it names the "
                             "services' Deployments")
        return v

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        return _namespace(v)

    @model_validator(mode="after")
    def _limits(self) -> "Services":
        for lim, req, what in ((self.cpu_limit_m, self.cpu_m, "cpu"), (self.memory_limit_mib, self.memory_mib,
                                                                        "memory")):
            if lim is not None and lim < req:
                raise ValueError(f"the {what} limit {lim} is below the request {req} (Kubernetes refuses it)")
        a = self.autoscale
        if a is not None and a.max_replicas is not None and a.max_replicas < a.min_replicas:
            raise ValueError("autoscale.max_replicas must be >= autoscale.min_replicas")
        return self


class Fitted(_Strict):
    """Pods of applications fitted to a trace (cluster/fitted.py): ``fit`` is a file ``joulesched trace fit``
    wrote (relative to the scenario file); arrivals come at its rate times ``rate_scale`` with its hour-of-day
    profile until ``duration_s`` or ``pods`` pods. ``cpu_only`` keeps the applications that ask for no GPU, at
    their own share of that rate (a CPU cluster running a GPU trace's CPU side)."""

    fit: str = Field(min_length=1)
    pods: int | None = Field(None, ge=1, le=10_000_000)
    rate_scale: float = Field(1.0, gt=0, le=1000, allow_inf_nan=False)
    cpu_only: bool = False


def _as_list(v: object) -> object:
    return [v] if isinstance(v, dict) else v


class WorkloadSpec(_Strict):
    """The pods: one generator or several mixed.

    The original forms stand alone: ``synthetic`` (one job generator) or ``trace`` (a CSV path relative to the
    scenario file). To mix, give any of ``jobs`` (job generators, the fields of ``synthetic``), ``services``
    and ``trace`` (one path or a list). A service's SLO is judged per ``slo_interval_s`` of absolute time.
    """

    synthetic: Synthetic | None = None
    trace: str | list[str] | None = None
    jobs: list[Synthetic] | None = None
    services: list[Services] | None = None
    fitted: list[Fitted] | None = None
    slo_interval_s: float = Field(3600.0, ge=60, allow_inf_nan=False)

    @field_validator("jobs", "services", "fitted", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return _as_list(v)  # one mapping is a list of one

    @model_validator(mode="after")
    def _generators(self) -> "WorkloadSpec":
        mixed = self.jobs is not None or self.services is not None or self.fitted is not None
        if self.synthetic is not None and self.trace is not None:
            raise ValueError("give exactly one of 'synthetic' or 'trace' (to mix a generator with a trace, write "
                             "the generator under 'jobs')")
        if self.synthetic is not None and mixed:
            raise ValueError("'synthetic' stands alone; to mix generators write it under 'jobs'")
        if self.synthetic is None and self.trace is None and not mixed:
            raise ValueError("give exactly one of 'synthetic' or 'trace', or mix 'jobs', 'services', 'fitted' and "
                             "'trace'")
        for name in ("jobs", "services", "fitted"):
            if getattr(self, name) == []:
                raise ValueError(f"'{name}' is empty")
        if isinstance(self.trace, list) and not self.trace:
            raise ValueError("'trace' is an empty list")
        return self

    @property
    def replay(self) -> bool:
        """Traces alone, replayed as they are: every workload seed gives the same pods (a benchmark's seeds then
        vary the policies' tie-breaking only)."""
        return self.synthetic is None and not self.jobs and not self.services and not self.fitted

    @property
    def traces(self) -> list[str]:
        t = self.trace
        return [] if t is None else [t] if isinstance(t, str) else list(t)

    @property
    def job_generators(self) -> list[Synthetic]:
        """``synthetic`` or the ``jobs`` entries, in order (the first one draws from the run's own seed)."""
        return [self.synthetic] if self.synthetic is not None else list(self.jobs or [])


class GpuRuntime(_Strict):
    """How a GPU job's run time follows its GPUs' speed (docs/twin.md, "GPU speed"): on a node whose GPUs have
    speed s (``NodeGroup.gpu_speed``, default the model's) it runs duration x ``reference`` / s. ``reference`` is
    the speed the workload's durations were measured at; ``slo`` limits it to jobs of those service classes (a
    trace's ``qos``, e.g. BE: batch work, where an LS pod serves until it is deleted). Services never scale."""

    reference: float = Field(1.0, gt=0, le=100, allow_inf_nan=False)
    slo: list[str] | None = Field(None, min_length=1)


class Scenario(_Strict):
    """A validated scenario. ``source`` is the file it came from (trace paths resolve against its folder)."""

    name: str = Field(min_length=1, max_length=100)
    seed: int = Field(ge=0)
    duration_s: float = Field(gt=0, le=1e9, allow_inf_nan=False)  # 31 years
    idle_policy: IdlePolicy = Field(default_factory=AlwaysOn)
    nodes: list[NodeGroup] = Field(min_length=1)
    workload: WorkloadSpec
    slo_fraction: float = Field(0.9, gt=0, le=1, allow_inf_nan=False)
    slo_tolerance: float = Field(0.05, ge=0, lt=1, allow_inf_nan=False)
    # Off when absent: a GPU job runs its duration on any GPU. GpuRuntime: run time follows the GPUs' speed.
    gpu_runtime: GpuRuntime | None = None
    source: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _unique_prefixes(self) -> "Scenario":
        seen: set[str] = set()
        for g in self.nodes:
            if g.name_prefix in seen:
                raise ValueError(f"node group name_prefix {g.name_prefix!r} is used twice")
            seen.add(g.name_prefix)
        ip = self.idle_policy
        if isinstance(ip, Sleep) and ip.min_awake > self.node_count:
            raise ValueError(f"idle_policy.min_awake {ip.min_awake} is more than the {self.node_count} nodes")
        if self.gpu_runtime is not None and not any(g.gpu_count for g in self.nodes):
            raise ValueError("gpu_runtime is set but no node group has GPUs (gpu_count)")
        return self

    @property
    def node_count(self) -> int:
        return sum(g.count for g in self.nodes)

    @property
    def has_gpus(self) -> bool:
        """Some node group has GPUs (the GPU-aware heuristics are its references and teachers)."""
        return any(g.gpu_count for g in self.nodes)

    @property
    def trace_path(self) -> Path | None:
        """The (first) trace file, resolved against the scenario's folder."""
        paths = self.trace_paths
        return paths[0] if paths else None

    @property
    def trace_paths(self) -> list[Path]:
        """Every trace file of the workload, resolved against the scenario's folder."""
        base = self.source.parent if self.source else Path.cwd()
        return [(base / t).resolve() for t in self.workload.traces]

    @property
    def fit_paths(self) -> list[Path]:
        """Every fit file of the workload's ``fitted`` generators, resolved against the scenario's folder."""
        base = self.source.parent if self.source else Path.cwd()
        return [(base / f.fit).resolve() for f in self.workload.fitted or []]

    @property
    def input_files(self) -> list[Path]:
        """The files this scenario was read from: itself, its traces and its fits (what a stage depends on, and
        what no command may write its output over)."""
        return [f for f in (self.source, *self.trace_paths, *self.fit_paths) if f is not None]


def _format_validation_error(path: Path | str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
        # Drop pydantic's union-branch names (e.g. "Sleep") so the path reads like the YAML.
        loc = re.sub(r"\.(AlwaysOn|Sleep|always_on|sleep)(?=\.|$)", "", loc)
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)  # a whole-document error names what it is about itself
    return f"{path}: invalid scenario: " + "; ".join(lines)


def read_yaml(path: Path, what: str) -> object:
    """A YAML file a user wrote (a scenario, a node profile, a fit), every problem a :class:`ScenarioError`
    naming the file: missing, unreadable, not UTF-8, not YAML, or a key given twice (:mod:`core.yamlio`)."""
    text = read_text_input(path, f"a {what} file", ScenarioError, missing=f"{path}: {what} file not found")
    try:
        return yamlio.load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}".replace("\n", " ")) from None


def _expand_includes(raw: dict, path: Path, origins: list[str | None] | None = None) -> dict:
    """Node groups may be ``{include: profile.yaml, count: N, ...}``: a node profile from `power calibrate`, or
    ``{include: nodes.yaml}`` of several groups (the machines `trace import --machines` writes). ``origins`` gets,
    per node group of the result, where it came from (None: the scenario itself), for error messages."""
    nodes = raw.get("nodes")
    origins = [] if origins is None else origins
    if not isinstance(nodes, list):
        return raw
    out = []
    for i, group in enumerate(nodes):
        if isinstance(group, dict) and "include" in group:
            if not isinstance(group["include"], str) or not group["include"].strip():
                raise ScenarioError(f"{path}: nodes.{i}.include: expected one file name, got {group['include']!r}")
            inc = path.parent / group["include"]
            data = read_yaml(inc, "node profile")
            if isinstance(data, dict) and isinstance(data.get("nodes"), list) and len(data["nodes"]) > 1:
                # Several groups (`joulesched trace import --machines`): each one, with the entry's other keys.
                if "count" in group:
                    raise ScenarioError(f"{path}: nodes.{i}.include: {inc} holds {len(data['nodes'])} node groups; "
                                        "'count' applies to one")
                over = {k: v for k, v in group.items() if k != "include"}
                out.extend({**g, **over} if isinstance(g, dict) else g for g in data["nodes"])
                origins.extend(f"group {j} of {inc} (nodes.{i}.include)" for j in range(len(data["nodes"])))
                continue
            if isinstance(data, dict) and data.get("nodes") == []:
                raise ScenarioError(f"{path}: nodes.{i}.include: {inc} holds no node group (its nodes: is empty)")
            if isinstance(data, dict) and isinstance(data.get("nodes"), list) and len(data["nodes"]) == 1:
                data = data["nodes"][0]
            if not isinstance(data, dict):
                raise ScenarioError(f"{path}: nodes.{i}.include: {inc} must hold one node group mapping")
            merged = {**data, **{k: v for k, v in group.items() if k != "include"}}
            out.append(merged)
            origins.append(f"{inc} (nodes.{i}.include)")
        else:
            out.append(group)
            origins.append(None)
    return {**raw, "nodes": out}


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises :class:`ScenarioError` naming the field on any problem."""
    path = Path(path)
    raw = read_yaml(path, "scenario")
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario must be a YAML mapping, got {type(raw).__name__}")
    origins: list[str | None] = []
    raw = _expand_includes(raw, path, origins)
    try:
        sc = Scenario.model_validate({**raw, "source": path.resolve()})
    except ValidationError as e:
        message = _format_validation_error(path, e)
        # nodes.N counts the groups after the includes: say which file a group that came from one is in
        where = sorted({(err["loc"][1], origins[err["loc"][1]]) for err in e.errors()
                        if len(err["loc"]) > 1 and err["loc"][0] == "nodes" and isinstance(err["loc"][1], int)
                        and err["loc"][1] < len(origins) and origins[err["loc"][1]] is not None})
        if where:
            message += "".join(f"\n  (nodes.{k} is {o})" for k, o in where)
        raise ScenarioError(message) from None
    for tp in sc.trace_paths:
        if not tp.is_file():
            what = "a directory, not a trace CSV" if tp.is_dir() else "file not found"
            raise ScenarioError(f"{path}: workload.trace: {what}: {tp}")
    return sc
