"""Every knob of the DQN in one place: the network, replay, exploration, validation, seeds and the reward.

Two dataclasses, CleanRL-style (a docstring under each field is its documentation): :class:`DQNConfig` (the
agent and its training loop) and :class:`RewardConfig` (the environment's reward weights), grouped as
:class:`TrainConfig`. ``joulesched train --config FILE`` reads one from YAML (validated by pydantic, every
error naming the field), ``--set dqn.hidden=128`` overrides single knobs, and the checkpoint stores both, so
``--resume`` and ``joulesched test`` see exactly what a model was trained with.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import math
import textwrap
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
import typing
from typing import Any

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from joulesched.core import yamlio
from joulesched.core.errors import UsageError, validation_summary
from joulesched.core.strict import lax_coercion

#: Caps on the sizes a config (or a model file's metadata) may ask for.
LIMITS = {"hidden": 4096, "batch_size": 65_536, "buffer_size": 10_000_000, "replay_memory_mb": 65_536,
          "n_step": 1_000, "inducing_points": 256, "attention_dim": 1024, "head_hidden": 4096,
          "randomize_max_nodes": 5_000, "episodes_per_round": 1_024, "pretrain_episodes": 10_000}
#: What ``teacher: auto`` means, per kind of cluster (the best heuristics of the headroom table).
AUTO_TEACHER = {"sleep": "awake-first:fit=efficient", "always_on": "pabfd",
                # a cluster with GPUs (schema 3's training): the heuristic that knows GPU power (docs/dqn.md, "A
                # heuristic that knows GPU power"); its empty=asleep variant, now the best on the OpenB windows,
                # taught no better model ("What the models knew"), so the documented recipes keep this one
                "gpu": "gpu-energy"}


#: The load factors an episode may run at (agent/env.py ``SchedulingEnv`` checks the same range).
LOAD_SCALE_RANGE = (0.05, 20.0)


def _check_finite(obj: Any) -> None:
    """Refuse NaN and infinite numbers in a config (YAML's ``.nan``/``.inf``, or a model file's metadata): every
    comparison with NaN is false, so the range checks would let one through into the optimizer or the reward."""
    for f in fields(obj):
        v = getattr(obj, f.name)
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(x, float) and not math.isfinite(x):
                raise ValueError(f"{f.name} must be a finite number, got {x}")


def _kind_errors(cls: type, data: Any, prefix: str = "") -> list[str]:
    """What pydantic's lax mode would coerce silently (core.strict), one message per field of ``cls``."""
    if not isinstance(data, dict):
        return []
    hints = typing.get_type_hints(cls)
    return [f"{prefix}{name}: {why}" for name, v in data.items()
            if name in hints and (why := lax_coercion(hints[name], v))]


class ConfigError(UsageError):
    """A training config file or override that does not validate; the message names the field."""


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)  # built once: some milliseconds, paid on every model load otherwise


def from_metadata(cls: type, d: Any) -> Any:
    """A config dataclass from a model file's metadata (JSON), every field's type checked strictly: ``hidden:
    48.5``, ``"48"`` or ``attention: "no"`` is refused (ValueError), not handed to torch. (``--config`` is YAML
    a person wrote, where a quoted number is still read as one; a file we wrote holds none.)"""
    if not isinstance(d, dict):
        raise ValueError(f"expected a mapping, got {type(d).__name__}")
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown key(s): {', '.join(sorted(unknown))}")
    if kinds := _kind_errors(cls, d):
        raise ValueError("; ".join(kinds))
    try:  # strict JSON mode: a JSON array is still a tuple, an integer still a float
        return _adapter(cls).validate_json(json.dumps(d, allow_nan=False), strict=True)
    except ValidationError as e:
        raise ValueError("; ".join((f"{'.'.join(map(str, err['loc']))}: " if err["loc"] else "")
                                   + err["msg"].removeprefix("Value error, ") for err in e.errors())) from None


@dataclass
class DQNConfig:
    """Hyperparameters of the agent and its training loop (CleanRL's ``Args``, reference.md section 7)."""

    feature_schema: int = 2
    """Feature schema of a new model: 2 (predicted lifetimes and load, where the sleep-aware heuristics would put
    the pod, the arrival rate; agent/features.py), 3 (schema 2 plus GPU columns: count, share, model, per-GPU
    free share, GPU watts; agent/features_gpu.py) or 1 (the original columns, models/small.pt)."""
    hidden: int = 48
    """Width of the shared node scorer's two hidden layers."""
    attention: bool = True
    """Schema 2: the set-attention block over the nodes (False: each node is scored from its own row and the
    shared context columns alone; the ablation)."""
    inducing_points: int = 4
    """Schema 2: seed vectors of the set-attention block (summaries of the cluster each node reads)."""
    attention_dim: int = 16
    """Schema 2: width of the attention's keys and queries."""
    head_hidden: int = 32
    """Schema 2: width of the summaries' values and of the advantage head's hidden layer."""
    prediction: bool = True
    """Schema 2: the online lifetime and load predictor's columns (False: zeros; the ablation)."""
    prediction_horizon_s: float = 600.0
    """Schema 2: how far ahead a node's predicted load looks, seconds."""
    predictor_shrink: float = 3.0
    """Pseudo-count of the predictor's shrinkage of a key's lifetimes toward its more general class."""
    predictor_prior_s: float = 600.0
    """The predictor's remaining life at age 0 before any pod has ended (then Lindy's: as long as it has lived)."""
    learning_rate: float = 3e-4
    """Adam step size (CleanRL uses 2.5e-4)."""
    gamma_tau_s: float = 1800.0
    """Discount time constant in simulated seconds: a reward dt seconds later is worth exp(-dt/tau)."""
    n_step: int = 8
    """n-step returns: energy consequences of a placement (waking a node, keeping it awake) come late."""
    buffer_size: int = 60_000
    """Replay capacity in transitions."""
    replay_memory_mb: int = 512
    """Cap on replay memory: the oldest transitions go when their states exceed it."""
    compact_replay: bool = True
    """Store and train on each state's distinct rows, each with the number of nodes it stands for (exact: the
    networks read a row with its count as its copies). 1,523 OpenB nodes make about 35 rows, so full-size
    clusters train as fast as small ones. False: every node a row and a capacity from the largest cluster, the
    layout of the models trained before 2026-12-05 (their recipes reproduce with it)."""
    batch_size: int = 128
    learning_starts: int = 3_000
    """Transitions collected (with the heuristic-guided exploration) before the first update."""
    train_frequency: int = 4
    """Environment steps per gradient step."""
    target_update_interval: int = 1_000
    """Environment steps between hard copies of the online net into the target net."""
    eps_start: float = 0.3
    """Exploration at the start (schema 2 starts from the teacher's demonstrations; schema 1's recipe used 1.0)."""
    eps_end: float = 0.03
    exploration_fraction: float = 0.4
    """Share of the training budget over which epsilon decays linearly from eps_start to eps_end."""
    heuristic_explore: float = 0.5
    """Probability that an exploratory action is the teacher's choice (``teacher``; models/small.pt's run
    alternated most-allocated and energy-greedy per episode) instead of a node drawn by explore_topk /
    explore_uniform."""
    teacher: str = "auto"
    """Schema 2: the heuristic that pretrains the agent, guides exploration and labels the margin loss: a policy
    spec, or auto (awake-first:fit=efficient where nodes sleep, pabfd where they are always on)."""
    teacher_pool: tuple[str, ...] = ()
    """Issue 27: policy specs (auto and clairvoyant ones allowed); when given, each episode's teacher is the
    pool's policy that runs that episode best in the twin (least energy within slo_slack of the pool's lowest
    SLO rate), so the best schedule known for the episode labels the states the agent visits (DAgger). Empty:
    ``teacher`` always."""
    pretrain_episodes: int = 4
    """Schema 2: episodes of the teacher's own choices collected before learning starts (demonstrations)."""
    pretrain_updates: int = 2_000
    """Schema 2: gradient steps on the demonstrations (margin loss plus TD) before the first rollout of the agent."""
    bc_weight: float = 1.0
    """Weight of the margin loss toward the teacher's choices at the start of training (0: pure RL)."""
    bc_weight_end: float = 0.05
    """... decaying linearly to this over the exploration fraction: the agent starts at the teacher and may leave
    it only where the TD targets say a different node is worth more than bc_margin."""
    bc_margin: float = 0.05
    """Margin of the DQfD loss, in reward units (one large node's peak draw for 10 minutes)."""
    bc_margin_twins: bool = False
    """Compacted replay: whether a node identical to the teacher's (an empty node of the same kind) is another
    action that takes the margin, as in DQfD on node actions, where the margin against every other kind of node
    then vanishes wherever the teacher's node has a twin. False (the default): identical nodes are one choice,
    the teacher's, and the margin holds against every other row; taught by gpu-energy:empty=asleep on the OpenB
    windows that imitates it better (docs/dqn.md, "Compacted states"). The old layout (every node a row) always
    counts the twins."""
    explore_topk: int = 3
    """Schema 2: a non-teacher exploratory action is drawn from the agent's own top-k nodes ..."""
    explore_uniform: float = 0.25
    """... or, with this probability, uniformly from every feasible node."""
    randomize: float = 0.5
    """Schema 2: share of training episodes on randomised clusters (agent/randomize.py: node mixes, curves around
    the SPECpower tables, sleep parameters, load levels, service and job mixes); the rest run the given
    scenarios. 0 trains on the given scenarios only (the ablation)."""
    randomize_max_nodes: int = 40
    """Largest randomised training cluster."""
    randomize_hardware: str = "specpower"
    """How the randomised clusters' power curves are drawn (agent/randomize.py ``HARDWARE``): ``specpower``,
    around the SPECpower tables; ``wide``, half of the node groups by watts per core (1.5-12 W), so that peaks in
    one cluster differ by up to about 70x. The validation's random clusters are drawn the same way."""
    episodes_per_round: int = 2
    """Schema 2: episodes collected per round (with the weights of two rounds back), then their gradient steps.
    Results depend on this, never on --workers or the executor."""
    max_episode_decisions: int = 3_000
    """Schema 2: an episode is truncated after this many decisions (the rest of a long run is not collected)."""
    shaping: bool = True
    """Potential-based reward shaping with phi(s) = -tau x current cluster power (agent/train.py): same optimal
    policy, far smaller values to fit."""
    huber_delta: float = 1.0
    max_grad_norm: float = 10.0
    eval_every_steps: int = 25_000
    """Greedy validation on held-out workload seeds every this many steps; the best weights are kept."""
    load_scales: tuple[float, ...] = (1.0, 1.0, 1.5, 2.0)
    """Training-load randomisation: each episode runs its scenario at one of these load factors
    (cluster/env.py ``scale_load``), so the agent meets overload and learns what the SLO penalty costs."""
    validation_load_scales: tuple[float, ...] = (1.0, 1.5)
    """Load factors of the validation runs."""
    train_seed_range: tuple[int, int] = (1_000, 9_000)
    """Training episodes draw workload seeds from [low, high). The benchmark uses scenario.seed + 0..k (5..45 for
    the suite), which training never sees."""
    validation_seeds: tuple[int, ...] = (10_007,)
    """Workload seeds of the greedy validation runs (outside the training range)."""
    validation_random: int = 2
    """Randomised clusters in the validation set besides the training scenarios (their own seeds: never trained on)."""
    slo_slack: float = 0.005
    """Validation tolerates default-k8s's SLO violation rate plus this (0.5 percentage points)."""
    validation_reference: str = "sleep-aware"
    """What validation divides energy by: sleep-aware (the better of the registry's sleep-aware heuristics,
    awake-first and pabfd, per case; the benchmarks also count awake-first:fit=efficient) or upstream (the better
    of most-allocated and energy-greedy, the schema-1 recipe)."""
    validation_pending_weight: float = 0.2
    """Validation adds this times the mean pending time's excess over the reference's + 10 %, relative to it."""

    def __post_init__(self) -> None:
        _check_finite(self)
        if self.hidden < 1 or self.batch_size < 1 or self.buffer_size < self.batch_size:
            raise ValueError("hidden, batch_size must be >= 1 and buffer_size >= batch_size")
        # Upper bounds: a model file's metadata builds the network and the buffer, so it must not be able to ask
        # for gigabytes.
        for name, cap in LIMITS.items():
            if getattr(self, name) > cap:
                raise ValueError(f"{name} must be <= {cap:,}, got {getattr(self, name):,}")
        if self.n_step < 1 or self.train_frequency < 1 or self.target_update_interval < 1:
            raise ValueError("n_step, train_frequency and target_update_interval must be >= 1")
        if self.replay_memory_mb < 1:  # 0 or less sized the compacted buffer at one batch, without a word
            raise ValueError("replay_memory_mb must be >= 1")
        if not (0.0 <= self.eps_end <= self.eps_start <= 1.0):
            raise ValueError("need 0 <= eps_end <= eps_start <= 1")
        if not (0.0 < self.exploration_fraction <= 1.0) or not (0.0 <= self.heuristic_explore <= 1.0):
            raise ValueError("exploration_fraction must be in (0, 1] and heuristic_explore in [0, 1]")
        self.load_scales = tuple(float(f) for f in self.load_scales)
        self.validation_load_scales = tuple(float(f) for f in self.validation_load_scales)
        if not self.load_scales or not self.validation_load_scales:
            raise ValueError("load_scales and validation_load_scales must not be empty")
        lo_f, hi_f = LOAD_SCALE_RANGE
        if any(not lo_f <= f <= hi_f for f in self.load_scales + self.validation_load_scales):
            raise ValueError(f"load_scales and validation_load_scales must be factors in [{lo_f:g}, {hi_f:g}]")
        if self.gamma_tau_s <= 0 or self.learning_rate <= 0:
            raise ValueError("gamma_tau_s and learning_rate must be > 0")
        # 0 or less: clip_grad_norm_ zeroes every gradient (0) or flips its sign (< 0: gradient ascent on the loss);
        # F.huber_loss refuses delta <= 0 at the first update; eval_every_steps <= 0 validates forever.
        if self.max_grad_norm <= 0 or self.huber_delta <= 0:
            raise ValueError("max_grad_norm and huber_delta must be > 0")
        if self.eval_every_steps < 1 or self.learning_starts < 0:
            raise ValueError("eval_every_steps must be >= 1 and learning_starts >= 0")
        self.train_seed_range = tuple(int(v) for v in self.train_seed_range)  # type: ignore[assignment]
        self.validation_seeds = tuple(int(v) for v in self.validation_seeds)
        lo, hi = self.train_seed_range
        if not 0 <= lo < hi or not self.validation_seeds or not 0 <= self.slo_slack < 1:
            raise ValueError("need 0 <= train_seed_range low < high, validation_seeds, and 0 <= slo_slack < 1")
        if any(lo <= s < hi for s in self.validation_seeds):
            raise ValueError("validation_seeds must lie outside train_seed_range")
        if any(not 0 <= s < 2**63 for s in self.validation_seeds):  # numpy's seeds: a traceback at the first one
            raise ValueError("validation_seeds must be integers in 0..2^63-1")
        if self.feature_schema not in (1, 2, 3):
            raise ValueError(f"feature_schema must be 1, 2 or 3, got {self.feature_schema}")
        if self.validation_random < 0:
            raise ValueError("validation_random must be >= 0")
        for name in ("inducing_points", "attention_dim", "head_hidden", "episodes_per_round",
                     "max_episode_decisions", "randomize_max_nodes", "explore_topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.randomize_max_nodes < 3:
            raise ValueError("randomize_max_nodes must be >= 3")
        if self.randomize_hardware not in ("specpower", "wide"):
            raise ValueError("randomize_hardware must be specpower or wide")
        for name in ("randomize", "explore_uniform"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if min(self.bc_weight, self.bc_weight_end, self.bc_margin, self.pretrain_episodes, self.pretrain_updates,
               self.validation_pending_weight) < 0:
            raise ValueError("bc_weight, bc_weight_end, bc_margin, pretrain_episodes, pretrain_updates and "
                             "validation_pending_weight must be >= 0")
        if self.prediction_horizon_s <= 0 or self.predictor_shrink <= 0 or self.predictor_prior_s <= 0:
            raise ValueError("prediction_horizon_s, predictor_shrink and predictor_prior_s must be > 0")
        if self.validation_reference not in ("sleep-aware", "upstream"):
            raise ValueError("validation_reference must be sleep-aware or upstream")
        if not self.teacher.strip():
            raise ValueError("teacher must be a policy spec or auto")
        if isinstance(self.teacher_pool, str):
            raise ValueError("teacher_pool must be a list of policy specs, not one string")
        self.teacher_pool = tuple(str(p) for p in self.teacher_pool)
        if any(not p.strip() for p in self.teacher_pool):
            raise ValueError("teacher_pool: every entry must be a policy spec or auto")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DQNConfig":
        """The hyperparameters in a model file's metadata (:func:`from_metadata`)."""
        return from_metadata(cls, d)


@dataclass(frozen=True)
class RewardConfig:
    """Reward weights. Penalties are in joule-equivalents per pod-second; see the module docstring."""

    slo_joules_per_pod_s: float = 200.0
    """Cost of one pod-second served below the scenario's SLO fraction (about a large node's peak draw)."""
    pending_joules_per_pod_s: float = 10.0
    """Cost of one pod-second spent pending or waiting for its node to wake."""
    scale_seconds: float = 600.0
    """The reward unit is (largest peak watts) x scale_seconds joules."""
    invalid_action_penalty: float = 1.0
    """Subtracted when an infeasible node is asked for (only blind samplers do that)."""

    def __post_init__(self) -> None:
        _check_finite(self)
        if self.slo_joules_per_pod_s < 0 or self.pending_joules_per_pod_s < 0 or self.invalid_action_penalty < 0:
            raise ValueError("reward penalties must be >= 0")
        if self.scale_seconds <= 0:
            raise ValueError("scale_seconds must be > 0")


@dataclass
class TrainConfig:
    """What ``joulesched train`` trains with: the agent's hyperparameters and the reward weights."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    dqn: DQNConfig = field(default_factory=lambda: DQNConfig())
    """The agent, replay, exploration and validation."""
    reward: RewardConfig = field(default_factory=lambda: RewardConfig())
    """The environment's reward weights."""

    def to_dict(self) -> dict:
        return {"dqn": self.dqn.to_dict(), "reward": asdict(self.reward)}


_ADAPTER = TypeAdapter(TrainConfig)


def _errors(source: str, err: ValidationError) -> ConfigError:
    return ConfigError(f"{source}: invalid training config: {validation_summary(err)}")


def validate_config(data: Any, source: str = "config") -> TrainConfig:
    """A :class:`TrainConfig` from plain data (a mapping with ``dqn`` and ``reward`` sections)."""
    if isinstance(data, dict):
        kinds = [m for section, cls in (("dqn", DQNConfig), ("reward", RewardConfig))
                 for m in _kind_errors(cls, data.get(section), f"{section}.")]
        if kinds:
            raise ConfigError(f"{source}: invalid training config: {'; '.join(kinds)}")
    try:
        return _ADAPTER.validate_python(data if data is not None else {})
    except ValidationError as e:
        raise _errors(source, e) from None


def load_config(path: str | Path) -> TrainConfig:
    """Read a YAML training config; unknown keys and bad values are errors naming the field."""
    path = Path(path)
    try:
        data = yamlio.load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read config: {e}".replace("\n", " ")) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: a training config is a mapping with dqn: and reward: sections")
    return validate_config(data, str(path))


def with_overrides(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """``cfg`` with ``section.key=value`` overrides (values parsed as YAML: ``128``, ``[1.0, 2.0]``, ``true``)."""
    data = cfg.to_dict()
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or section not in data or name not in data[section]:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE with a key of `joulesched train "
                              "--help` (e.g. dqn.hidden=128)")
        try:
            data[section][name] = yamlio.load(raw)
        except yaml.YAMLError:
            data[section][name] = raw
    return validate_config(data, "--set")


def dump_config(cfg: TrainConfig) -> str:
    """The config as the YAML ``--config`` reads."""
    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    return yaml.safe_dump(plain(cfg.to_dict()), sort_keys=False)


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string literal under it), as CleanRL's Args documents them."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def describe() -> list[tuple[str, Any, str]]:
    """(``section.key``, default, description) of every knob, for ``train --help``."""
    cfg = TrainConfig()
    rows = []
    for section in ("dqn", "reward"):
        obj = getattr(cfg, section)
        docs = field_docs(type(obj))
        for f in fields(obj):
            rows.append((f"{section}.{f.name}", getattr(obj, f.name), docs.get(f.name, "")))
    return rows

