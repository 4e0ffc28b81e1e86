"""The DQN training loop: demonstrations from the teacher heuristic, then rounds of epsilon-greedy rollouts and
n-step replay learning, greedy validation on held-out workloads, the best weights kept.

It reads top to bottom:

1. **Episodes** (:func:`episode_specs`): each draws, from the run's seed, its round and its index alone, a
   cluster (a given scenario at a load factor, or a randomised one, agent/randomize.py), a workload seed from
   the training range and an exploration seed.
2. **Rollouts** (:func:`rollout`, a pure function of its :class:`RolloutTask`): one episode in the env with the
   weights it was handed; every step records the rows, the mask, the action, the shaped reward and the
   teacher's choice. It runs in this process, in a local process pool or on Ray (:class:`Executor`); tasks are
   collected in order, so the result depends on the seeds and ``episodes_per_round``, never on ``--workers``
   or the executor.
3. **Learning**: round ``r``'s episodes ran with the weights after round ``r - 2``'s updates (round ``r + 1``
   is collected while round ``r`` is learned from), then ``steps / train_frequency`` updates of masked Double
   DQN plus the decaying margin loss toward the teacher.
4. **Validation** (:class:`Validator`): greedy runs on held-out workload seeds, scored against the best
   sleep-aware heuristic; the best weights are kept and loaded back at the end.

pipelines/training.py wraps it with checkpoints, the executors, the progress bar and the training curve.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from joulesched.agent.config import AUTO_TEACHER, DQNConfig, RewardConfig
from joulesched.agent.dqn import (DQN, ReplayBuffer, Transitions, compact_state, discount, limit_threads,
                                  make_network)
from joulesched.agent.dqn_policy import DQNPolicy, make_predictor
from joulesched.agent.env import SchedulingEnv, scale_load
from joulesched.agent.features import NODE_FEATURES, n_features
from joulesched.agent.randomize import random_scenario
from joulesched.agent.registry import SLEEP_AWARE_HEURISTICS, make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import Scenario, ScenarioError, Sleep
from joulesched.cluster.twin import RunResult, Twin, common_window, extend_run
from joulesched.cluster.workload import build_workload
from joulesched.core.errors import JouleschedError

WATTS_NOW = NODE_FEATURES.index("watts_now")  # the same column in every schema
#: On a cluster with GPUs the validation reference is the best of these too (the FGD paper's heuristics that
#: use the least energy on openb-3days, docs/dqn.md "Schema 3: GPUs", and gpu-energy, which knows GPU power).
#: Validation only picks the checkpoint; the benchmarks' "best heuristic" is the best of every candidate
#: (registry.BEST_HEURISTIC_CANDIDATES: the ``empty=asleep`` variants and gpu-lifetime-aware too), so a
#: validation score below 1 is not a claim against the best heuristic.
GPU_REFERENCES = ("gpu-packing", "gpu-best-fit", "fgd", "gpu-energy")


@dataclass
class EpisodeLog:
    step: int
    episode: int
    wall_s: float
    scenario: str
    episode_return: float
    epsilon: float
    loss: float
    eval_score: float = math.nan  # filled on validation rows


@dataclass
class TrainLog:
    steps: int = 0
    episodes: int = 0
    wall_s: float = 0.0
    best_score: float = math.inf
    best_step: int = 0
    rows: list[EpisodeLog] = field(default_factory=list)
    teachers: dict[str, int] = field(default_factory=dict)  # episodes (demonstrations included) per teacher


def teacher_spec(cfg: DQNConfig, scenario: Scenario) -> str:
    """The teacher heuristic for ``scenario``: ``cfg.teacher``, or for ``auto`` the best heuristic of its kind of
    cluster (:data:`~joulesched.agent.config.AUTO_TEACHER`)."""
    return resolve_teacher(cfg.teacher, scenario)


def resolve_teacher(spec: str, scenario: Scenario) -> str:
    """``spec``, or for ``auto`` the best heuristic of ``scenario``'s kind of cluster."""
    if spec != "auto":
        return spec
    if scenario.has_gpus:
        return AUTO_TEACHER["gpu"]
    return AUTO_TEACHER["sleep" if isinstance(scenario.idle_policy, Sleep) else "always_on"]


# ---- episodes and rollouts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpisodeSpec:
    """One training episode: the cluster (load scaling applied by the env), its workload seed, the seed of
    its exploration, and a label for the curve."""

    scenario: Scenario
    workload_seed: int
    load_scale: float
    seed: int
    label: str


def episode_specs(cfg: DQNConfig, scenarios: Sequence[Scenario], seed: int, round_: int,
                  count: int, salt: tuple[int, ...] = ()) -> list[EpisodeSpec]:
    """The episodes of one round, each drawn from ``(seed, round, index)`` alone (round -1: demonstrations);
    ``salt`` (a resumed run's: :func:`run_salt`) gives another stream of the same seed."""
    out = []
    lo, hi = cfg.train_seed_range
    for k in range(count):
        g = np.random.default_rng([seed, round_ + 1, k, *salt])
        if cfg.randomize > 0 and g.random() < cfg.randomize:
            sc = random_scenario(g, cfg.randomize_max_nodes, name="random", hardware=cfg.randomize_hardware)
            scale, label = 1.0, f"random-{sc.node_count}{'s' if isinstance(sc.idle_policy, Sleep) else 'a'}"
        else:
            sc = scenarios[int(g.integers(len(scenarios)))]
            scale = float(cfg.load_scales[int(g.integers(len(cfg.load_scales)))])
            label = sc.name + (f" x{scale:g}" if scale != 1.0 else "")
        out.append(EpisodeSpec(sc, int(g.integers(lo, hi)), scale, int(g.integers(2**31 - 1)), label))
    return out


@dataclass
class RolloutTask:
    """What a worker needs for one episode: the spec, the config and reward, the weights (``None``: the teacher
    acts on every step, a demonstration) and epsilon."""

    spec: EpisodeSpec
    cfg: DQNConfig
    reward: RewardConfig
    weights: dict[str, torch.Tensor] | None
    epsilon: float


@dataclass
class RolloutResult:
    transitions: Transitions
    label: str
    episode_return: float
    steps: int
    teacher: str = ""  # the spec that labelled the episode's states


def episode_teacher(cfg: DQNConfig, twin: Twin, seed: int) -> str:
    """The teacher of one episode on ``twin``'s cluster and workload: :func:`teacher_spec`, or with a
    ``teacher_pool`` the pool's policy that runs that very episode best in the twin (each once, in a twin of
    its own, seeded like the episode): the least energy among those whose SLO violation rate is within
    ``slo_slack`` of the pool's lowest. The best schedule known for the episode then labels every state the
    agent visits in it (DAgger's relabelling), and a clairvoyant pool member (agent/clairvoyant.py) teaches
    what knowing the future is worth, while the agent itself only ever sees the present and its predictor. A
    member whose ``accepts(twin)`` is false (``optimum`` where the MIP cannot state the episode) sits it out;
    with none left, :func:`teacher_spec`'s teacher labels it."""
    if not cfg.teacher_pool:
        return teacher_spec(cfg, twin.scenario)
    specs = list(dict.fromkeys(resolve_teacher(p, twin.scenario) for p in cfg.teacher_pool))
    # A member that cannot teach this episode (``optimum`` where the MIP cannot state it) sits it out.
    pols = [(p, make_policy(p)) for p in specs]
    pols = [(p, pol) for p, pol in pols if getattr(pol, "accepts", lambda _twin: True)(twin)]
    if not pols:
        return teacher_spec(cfg, twin.scenario)
    if len(pols) == 1:
        return pols[0][0]
    specs = [p for p, _ in pols]
    runs = list(common_window({k: run_policy(Twin(twin.scenario, twin.workload), pol, seed)
                               for k, (_, pol) in enumerate(pols)}).values())  # one window, as benchmark meters
    floor = min(r.slo_violation_rate for r in runs) + cfg.slo_slack
    ok = [(r.energy_joules, k) for k, r in enumerate(runs) if r.slo_violation_rate <= floor]
    return specs[min(ok)[1]]


def attach_teacher(teacher, twin: Twin) -> None:
    """Give a teacher that follows the run (a predictor of its own, or the twin's knowledge) the twin, keeping
    the env's predictor subscribed: a teacher's feed is added beside it (``Twin.add_pod_observer``), and one that
    replaced the twin's observers gets the env's back beside its own."""
    attach = getattr(teacher, "attach", None)
    if attach is None:
        return
    env_obs = twin.pod_observer
    attach(twin)
    if env_obs is not None:
        twin.add_pod_observer(env_obs)  # a no-op where it is still told


def _inference_net(cfg: DQNConfig, weights: dict) -> torch.nn.Module:
    """The network of a rollout or a validation, made outside inference mode (the callers run inside it): its
    tensors then have version counters, so its folded inference weights are made once (agent/dqn.py), not on
    every decision."""
    with torch.inference_mode(False):
        net = make_network(cfg)
        net.load_state_dict(weights)
        net.eval()
    return net


def _score(net: torch.nn.Module, rows: np.ndarray, idx: np.ndarray) -> torch.Tensor:
    return net.score(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)), torch.from_numpy(idx))


@torch.inference_mode()
def rollout(task: RolloutTask) -> RolloutResult:
    """Run one episode (module docstring, step 2). Pure: the result depends on the task alone."""
    limit_threads(1)
    cfg, spec, rc = task.cfg, task.spec, task.reward
    rng = np.random.default_rng(spec.seed)
    env = SchedulingEnv([spec.scenario], reward=rc, max_decisions=cfg.max_episode_decisions,
                        schema=cfg.feature_schema, predictor=make_predictor(cfg))
    obs, info = env.reset(seed=spec.seed, options={"scenario": 0, "workload_seed": spec.workload_seed,
                                                  "load_scale": spec.load_scale})
    net = None if task.weights is None else _inference_net(cfg, task.weights)
    t_spec = episode_teacher(cfg, env.twin, spec.seed)
    teacher = make_policy(t_spec)
    attach_teacher(teacher, env.twin)
    teacher.reset(env.twin.state, rng)
    t_meta = bool(getattr(teacher, "uses_meta", False))
    n = info["n_nodes"]
    tau, n_step = cfg.gamma_tau_s, cfg.n_step
    # Potential-based shaping (Ng, Harada and Russell 1999), policy-invariant also with per-step discounts:
    # r' = r + gamma(dt) phi(s') - phi(s), phi(s) = -(tau / scale_seconds) x the cluster's watts now (the
    # reward-unit cost of drawing today's power for one discount horizon), phi(terminal) = 0. It removes the
    # large, action-independent part of the values; the environment's reward itself is unchanged.
    coef = -(tau / rc.scale_seconds) if cfg.shaping else 0.0

    def phi(r: np.ndarray) -> float:
        return coef * float(r[:, WATTS_NOW].sum(dtype=np.float64)) if coef else 0.0

    rows = obs["nodes"][:n]
    phi_s = phi(rows)
    obs_l, mask_l, cnt_l, act, act_rows, rew, dts, teach, teach_rows = [], [], [], [], [], [], [], [], []
    ep_return, terminated = 0.0, False
    while True:
        mask = obs["action_mask"][:n].astype(bool)
        tw, d = env.twin, env.decision
        ta = int(teacher.choose(tw.state, tw.request, tw.mask, meta=d.meta) if t_meta
                 else teacher.choose(tw.state, tw.request, tw.mask))
        if net is None:
            a = ta
        elif rng.random() < task.epsilon:
            feas = np.flatnonzero(mask)
            if rng.random() < cfg.heuristic_explore:
                a = ta
            elif feas.size <= 1 or rng.random() < cfg.explore_uniform:
                a = int(feas[rng.integers(feas.size)])
            else:  # one of the agent's own top-k: exploration near what it believes
                adv = _score(net, rows, feas).numpy()
                top = feas[np.argsort(-adv, kind="stable")[:min(cfg.explore_topk, feas.size)]]
                a = int(top[rng.integers(top.size)])
        else:
            feas = np.flatnonzero(mask)
            a = int(feas[0]) if feas.size == 1 else int(feas[int(torch.argmax(_score(net, rows, feas)))])
        inv = _keep_state(rows, mask, cfg.compact_replay, obs_l, mask_l, cnt_l)
        act.append(a)
        act_rows.append(int(inv[a]))
        teach.append(ta)
        teach_rows.append(int(inv[ta]) if ta >= 0 else -1)
        obs, r, terminated, truncated, info = env.step(a)
        ep_return += r
        rows = obs["nodes"][:n]
        phi_next = 0.0 if terminated else phi(rows)
        rew.append(r + discount(info["dt_s"], tau) * phi_next - phi_s)
        dts.append(info["dt_s"])
        phi_s = phi_next
        if terminated or truncated:
            break
    # the state after the last step (all zeros when terminated)
    _keep_state(rows, obs["action_mask"][:n].astype(bool), cfg.compact_replay, obs_l, mask_l, cnt_l)
    t = len(act)
    r_arr, cum = np.asarray(rew), np.concatenate(([0.0], np.cumsum(dts)))
    returns = np.zeros(t, dtype=np.float32)
    discounts = np.zeros(t, dtype=np.float32)
    nxt = np.zeros(t, dtype=np.int64)
    for k in range(t):
        e = min(k + n_step, t)
        returns[k] = float(np.dot(np.exp(-(cum[k:e] - cum[k]) / tau), r_arr[k:e]))
        nxt[k] = e
        discounts[k] = 0.0 if (terminated and e == t) else math.exp(-(cum[e] - cum[k]) / tau)
    offsets = np.concatenate(([0], np.cumsum([c.size for c in cnt_l]))).astype(np.int64)
    i64 = np.int64
    tr = Transitions(np.concatenate(obs_l), np.concatenate(mask_l), np.concatenate(cnt_l), offsets,
                     np.asarray(act, dtype=i64), np.asarray(act_rows, dtype=i64), returns, discounts, nxt,
                     np.asarray(teach, dtype=i64), np.asarray(teach_rows, dtype=i64))
    return RolloutResult(tr, spec.label, ep_return, t, t_spec)


def _keep_state(rows: np.ndarray, mask: np.ndarray, dedup: bool, obs_l: list, mask_l: list,
                cnt_l: list) -> np.ndarray:
    """Append one state, compacted (agent/dqn.py :func:`compact_state`), to a rollout's lists; each node's row."""
    r, m, c, inv = compact_state(rows.astype(np.float16), mask, dedup)
    obs_l.append(r)
    mask_l.append(m)
    cnt_l.append(c)
    return inv


# ---- executors -------------------------------------------------------------------------------------------------
class Pending(Protocol):
    def get(self) -> list: ...


class Executor(Protocol):
    """Runs a picklable function over tasks; ``get()`` returns the results in task order."""

    workers: int

    def map_async(self, fn: Callable[[Any], Any], tasks: list) -> Pending: ...


class _Deferred:
    def __init__(self, fn: Callable[[Any], Any], tasks: list) -> None:
        self.fn, self.tasks = fn, tasks

    def get(self) -> list:
        return [self.fn(t) for t in self.tasks]


class SerialExecutor:
    """In this process, each batch when it is asked for (the weights travel in the tasks, so running later
    changes nothing)."""

    workers = 1

    def map_async(self, fn: Callable[[Any], Any], tasks: list) -> Pending:
        return _Deferred(fn, tasks)


def _weights(agent: DQN) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in agent.q.state_dict().items()}


# ---- validation ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ValidationCase:
    scenario: Scenario  # load scaling applied
    seed: int
    e_ref: float  # the reference heuristic's energy (over the references' window)
    slo_ref: float  # default-k8s's SLO violation rate
    pend_ref: float  # the reference heuristic's mean pending seconds
    label: str
    #: The reference's own run (its idle tail) and the latest end among the references': the agent's run and it
    #: are metered over one window, as the benchmark meters policies (docs/twin.md, "The run's window").
    ref_run: RunResult | None = None
    window_s: float = 0.0


@dataclass
class ValidationTask:
    case: ValidationCase
    cfg: DQNConfig
    weights: dict[str, torch.Tensor]


_TWINS: dict[tuple[int, int], Twin] = {}


def _twin(sc: Scenario, seed: int) -> Twin:
    key = (hash(sc.model_dump_json()), seed)
    tw = _TWINS.get(key)
    if tw is None:
        if len(_TWINS) > 32:
            _TWINS.clear()
        tw = _TWINS[key] = Twin(sc, build_workload(sc, seed))
    return tw


@torch.inference_mode()
def validate_case(task: ValidationTask) -> tuple[float, float, float, float]:
    """(energy, SLO violation rate, mean pending seconds) of the greedy agent on one case, and the reference's
    energy over the same window."""
    c = task.case
    net = _inference_net(task.cfg, task.weights)
    r = run_policy(_twin(c.scenario, c.seed), DQNPolicy(net=net, config=task.cfg, threads=1), c.seed)
    if c.ref_run is None:
        return r.energy_joules, r.slo_violation_rate, r.mean_pending_s, c.e_ref
    until = max(r.end_s, c.window_s)
    e, e_ref = extend_run(r, until).energy_joules, extend_run(c.ref_run, until).energy_joules
    return e, r.slo_violation_rate, r.mean_pending_s, e_ref


class Validator:
    """Greedy runs on held-out workload seeds of each training scenario at each validation load factor, and on
    ``cfg.validation_random`` randomised clusters of their own seeds. Score = mean over cases of energy /
    reference energy + 10 x (SLO violation rate above default-k8s's + slack) + ``validation_pending_weight`` x
    (mean pending time above the reference's + 10 %, relative to it, at least 1 s). The reference is the best
    sleep-aware heuristic per case (``validation_reference``); below 1 beats it. Lower is better."""

    def __init__(self, scenarios: Sequence[Scenario], cfg: DQNConfig | None = None, *,
                 seeds: tuple[int, ...] | None = None, load_scales: tuple[float, ...] | None = None,
                 slo_slack: float | None = None, random_clusters: int | None = None) -> None:
        cfg = cfg or DQNConfig()
        self.cfg = cfg
        seeds = cfg.validation_seeds if seeds is None else seeds
        load_scales = cfg.validation_load_scales if load_scales is None else load_scales
        self.slo_slack = cfg.slo_slack if slo_slack is None else slo_slack
        refs = (SLEEP_AWARE_HEURISTICS if cfg.validation_reference == "sleep-aware"
                else ("most-allocated", "energy-greedy"))
        unique: dict[str, Scenario] = {}
        for sc in scenarios:
            unique.setdefault(sc.model_dump_json(), sc)
        plan, planned = [], set()
        for base in unique.values():
            for f in load_scales:
                sc = scale_load(base, f)
                for s in seeds:
                    # One case per distinct workload: a load factor changes only a synthetic workload, and a
                    # seed nothing of a trace replayed as it is (which is then no held-out case at all).
                    key = (sc.model_dump_json(), None if sc.workload.replay else s)
                    if key not in planned:
                        planned.add(key)
                        plan.append((sc, s, base.name + (f" x{f:g}" if f != 1.0 else "")))
        n_random = cfg.validation_random if random_clusters is None else random_clusters
        for k in range(n_random):
            g = np.random.default_rng([seeds[0], 7, k])  # not a training stream: those are [seed, round, index]
            sc = random_scenario(g, cfg.randomize_max_nodes, name=f"validation-random-{k}",
                                 hardware=cfg.randomize_hardware)
            plan.append((sc, seeds[0], f"{sc.name} ({sc.node_count} nodes)"))
        self.cases: list[ValidationCase] = []
        for sc, s, label in plan:
            twin = _twin(sc, s)
            slo_ref = run_policy(twin, make_policy("default-k8s"), s).slo_violation_rate
            names = refs + (GPU_REFERENCES if sc.has_gpus else ())
            runs = [run_policy(twin, make_policy(h), s) for h in names]
            window = max(r.end_s for r in runs)
            e = [extend_run(r, window).energy_joules for r in runs]
            k = int(np.argmin(e))
            if e[k] <= 0:  # the score is energy / this: nothing to measure a model against
                raise ScenarioError(f"validation case {label}: {names[k]} "
                                    "draws 0 J (the nodes' power curves draw nothing at the load it runs): the "
                                    "validation score is energy / that; give the nodes curves that draw power")
            self.cases.append(ValidationCase(sc, s, e[k], slo_ref, runs[k].mean_pending_s, label, runs[k], window))
        self.last: list[tuple[float, float, float, float]] = []

    def score(self, agent: DQN, executor: Executor | None = None) -> float:
        executor = executor or SerialExecutor()
        w = _weights(agent)
        self.last = executor.map_async(validate_case, [ValidationTask(c, agent.cfg, w) for c in self.cases]).get()
        total = 0.0
        pw = self.cfg.validation_pending_weight
        for c, (e, slo, pend, e_ref) in zip(self.cases, self.last):
            total += e / e_ref + 10.0 * max(0.0, slo - c.slo_ref - self.slo_slack)
            total += pw * max(0.0, pend - 1.1 * c.pend_ref) / max(c.pend_ref, 1.0)
        return total / len(self.cases)


# ---- the loop --------------------------------------------------------------------------------------------------
class TrainingDiverged(JouleschedError):
    """The TD loss became NaN or infinite: the weights are lost, so the run stops before anything is written."""


def run_salt(agent: DQN, resumed: bool) -> tuple[int, ...]:
    """What keeps a resumed run's episodes and replay draws apart from the runs before it: the number of gradient
    steps the model has had (from its file, so a resume is as reproducible as the first run). A fresh run has none:
    its streams are the seed's alone, as they always were."""
    return (1, agent.updates) if resumed else ()


def train(env_or_scenarios, agent: DQN, *, total_steps: int | None = None, total_seconds: float | None = None,
          seed: int = 0, resumed: bool = False, validator: Validator | None = None,
          progress: Callable[[int, float, float], None] | None = None, reward: RewardConfig | None = None,
          executor: Executor | None = None) -> TrainLog:
    """Train ``agent`` for ``total_steps`` decisions or ``total_seconds`` of wall time on the given scenarios
    (a list, or a :class:`SchedulingEnv` whose scenarios and reward weights are used).

    A resumed run skips the demonstrations and starts epsilon at ``min(eps_start, 0.2)``. When a validator is
    given, the best validated weights are loaded back into ``agent`` at the end (the log says at which step;
    step 0 is the agent before its first rollout, i.e. right after the demonstrations).
    """
    if (total_steps is None) == (total_seconds is None):
        raise ValueError("give exactly one of total_steps or total_seconds")
    if isinstance(env_or_scenarios, SchedulingEnv):
        scenarios, reward = list(env_or_scenarios.scenarios), reward or env_or_scenarios.reward_cfg
    else:
        scenarios = list(env_or_scenarios)
    reward = reward or RewardConfig()
    executor = executor or SerialExecutor()
    cfg: DQNConfig = agent.cfg
    # A resumed run with the same --seed would otherwise replay the first run's workloads, exploration and replay
    # draws, round for round.
    salt = run_salt(agent, resumed)
    rng = np.random.default_rng([seed, *salt] if salt else seed)
    torch.manual_seed(seed)
    if cfg.compact_replay:  # states of any size: the cap is on the bytes held
        buffer = ReplayBuffer(cfg.buffer_size, memory_bytes=cfg.replay_memory_mb * 2**20)
    else:  # every node a row: the capacity the largest cluster's rows fit in (the layout before compaction)
        nf = n_features(cfg.feature_schema)[0]
        max_nodes = max([s.node_count for s in scenarios]
                        + ([cfg.randomize_max_nodes] if cfg.randomize > 0 else []))
        per = ReplayBuffer.bytes_per_transition(max_nodes, nf)
        buffer = ReplayBuffer(max(cfg.batch_size, min(cfg.buffer_size, cfg.replay_memory_mb * 2**20 // per)))
    eps_start = min(cfg.eps_start, 0.2) if resumed else cfg.eps_start
    # A resumed model has had its teacher: the margin loss goes on at the weight it ended with, not from the top
    # (a fine-tune was pulled back toward the teacher at up to 20x that weight).
    bc_start = cfg.bc_weight_end if resumed else cfg.bc_weight
    learning_starts = min(cfg.learning_starts, 1_000) if resumed else cfg.learning_starts
    log = TrainLog()
    t_start = time.perf_counter()
    best_state = None
    recent: deque = deque(maxlen=20)
    state = {"loss": math.nan, "eps": eps_start}
    sync_every = max(1, cfg.target_update_interval // cfg.train_frequency)

    def progress_frac(steps: int) -> float:
        if total_steps is not None:
            return steps / max(total_steps, 1)
        return (time.perf_counter() - t_start) / total_seconds

    def epsilon(p: float) -> float:
        f = min(1.0, p / cfg.exploration_fraction)
        return eps_start + f * (cfg.eps_end - eps_start)

    def bc_weight(p: float) -> float:
        f = min(1.0, p / cfg.exploration_fraction)
        return bc_start + f * (cfg.bc_weight_end - bc_start)

    validated_at: tuple[int, int] | None = None

    def validate() -> None:
        nonlocal best_state, validated_at
        # Once per set of weights: the same weights score the same (a round that crossed several validation steps,
        # or the last one, validated them again, each a full set of greedy runs).
        if validator is None or validated_at == (log.steps, agent.updates):
            return
        validated_at = (log.steps, agent.updates)
        score = validator.score(agent, executor)
        log.rows.append(EpisodeLog(log.steps, log.episodes, time.perf_counter() - t_start, "validation",
                                   math.nan, state["eps"], state["loss"], score))
        if score < log.best_score:
            log.best_score, log.best_step = score, log.steps
            # The optimizer's moments with the weights they belong to: the file keeps both, and --resume goes on
            # from the best weights with their own moments, not those of the last update.
            best_state = (copy.deepcopy(agent.q.state_dict()), copy.deepcopy(agent.optimizer.state_dict()))

    def learn(n_updates: int, bc: float) -> None:
        for _ in range(n_updates):
            state["loss"] = agent.update(buffer.sample(cfg.batch_size, rng), bc_weight=bc)
            if not math.isfinite(state["loss"]):
                raise TrainingDiverged(f"training diverged: the loss is {state['loss']} at gradient step "
                                       f"{agent.updates:,}; nothing was written. Try a smaller dqn.learning_rate "
                                       "or dqn.max_grad_norm")
            if agent.updates % sync_every == 0:
                agent.sync_target()

    def record(results: list[RolloutResult], eps: float, demo: bool = False) -> int:
        steps = 0
        for res in results:
            buffer.add_many(res.transitions)
            steps += res.steps
            log.teachers[res.teacher] = log.teachers.get(res.teacher, 0) + 1
            if demo:  # the teacher's episodes: not the agent's, and not in the step budget
                log.rows.append(EpisodeLog(0, 0, time.perf_counter() - t_start, f"demo {res.label}",
                                           res.episode_return, 1.0, state["loss"]))
                continue
            log.episodes += 1
            recent.append(res.episode_return)
            log.rows.append(EpisodeLog(log.steps + steps, log.episodes, time.perf_counter() - t_start, res.label,
                                       res.episode_return, eps, state["loss"]))
        return steps

    # 1. Demonstrations: the teacher's own episodes, then gradient steps on them (margin loss plus TD).
    if not resumed and cfg.pretrain_episodes > 0:
        specs = episode_specs(cfg, scenarios, seed, -1, cfg.pretrain_episodes)
        demo = executor.map_async(rollout, [RolloutTask(s, cfg, reward, None, 1.0) for s in specs]).get()
        record(demo, 1.0, demo=True)
        learn(cfg.pretrain_updates, cfg.bc_weight)
        agent.sync_target()
    validate()

    # 2-4. Rounds: collect round r + 1 with the current weights while learning from round r.
    def submit(r: int, eps: float) -> Pending:
        specs = episode_specs(cfg, scenarios, seed, r, cfg.episodes_per_round, salt)
        return executor.map_async(rollout, [RolloutTask(s, cfg, reward, _weights(agent), eps) for s in specs])

    round_ = 0
    pending_eps = epsilon(0.0)
    pending = submit(round_, pending_eps)
    next_eval = cfg.eval_every_steps
    carry = 0
    while True:
        # The epsilon the round ran with (with --minutes, one computed now would be later on the clock than that).
        eps = state["eps"] = pending_eps
        results = pending.get()
        steps = sum(r.steps for r in results)
        finishing = progress_frac(log.steps + steps) >= 1.0
        if not finishing:
            round_ += 1
            pending_eps = epsilon(progress_frac(log.steps + steps))
            pending = submit(round_, pending_eps)
        record(results, eps)
        log.steps += steps
        carry += steps
        if len(buffer) >= max(learning_starts, cfg.batch_size):
            n_up, carry = divmod(carry, cfg.train_frequency)
            learn(n_up, bc_weight(progress_frac(log.steps)))
        if log.steps >= next_eval:
            next_eval += cfg.eval_every_steps * (1 + (log.steps - next_eval) // cfg.eval_every_steps)
            validate()
        if progress is not None:
            progress(log.steps, float(np.mean(recent)) if recent else math.nan, eps)
        if finishing:
            break
    validate()
    if best_state is not None:
        agent.q.load_state_dict(best_state[0])
        agent.optimizer.load_state_dict(best_state[1])
        agent.sync_target()
    log.wall_s = time.perf_counter() - t_start
    return log
