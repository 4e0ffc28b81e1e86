"""The DQN training loop: collect with epsilon-greedy (heuristic-guided) exploration, learn from n-step
replay, validate greedily on held-out workload seeds and keep the best weights.

It reads top to bottom: seeding, the exploration schedule, one loop (act, step, store, learn, validate).
pipelines/train.py wraps it with checkpoints, the progress bar and the training curve.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from joulesched.agent.config import DQNConfig
from joulesched.agent.dqn import DQN, ReplayBuffer, discount
from joulesched.agent.dqn_policy import DQNPolicy
from joulesched.agent.env import SchedulingEnv, scale_load
from joulesched.agent.features import N_FEATURES, NODE_FEATURES
from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import Scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload

WATTS_NOW = NODE_FEATURES.index("watts_now")


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


class Validator:
    """Greedy runs on held-out workload seeds, at nominal load and at each extra load factor. Score = mean over
    cases of energy / energy(best of most-allocated and energy-greedy) + 10 x (SLO violation rate above
    default-k8s's + 0.5 pp). Lower is better; below 1 beats both heuristics."""

    def __init__(self, scenarios: list[Scenario], seeds: tuple[int, ...] = DQNConfig.validation_seeds,
                 load_scales: tuple[float, ...] = (1.0,), slo_slack: float = DQNConfig.slo_slack) -> None:
        self.slo_slack = slo_slack
        self.cases = []
        for base in scenarios:
            for f in load_scales:
                sc = scale_load(base, f)
                for s in seeds:
                    twin = Twin(sc, build_workload(sc, s))
                    slo_ref = run_policy(twin, make_policy("default-k8s"), s).slo_violation_rate
                    e_ref = min(run_policy(twin, make_policy(h), s).energy_joules
                                for h in ("most-allocated", "energy-greedy"))
                    self.cases.append((twin, s, e_ref, slo_ref))

    def score(self, agent: DQN) -> float:
        pol = DQNPolicy(net=agent.q, threads=0)
        total = 0.0
        for twin, s, e_ref, slo_ref in self.cases:
            r = run_policy(twin, pol, s)
            total += r.energy_joules / e_ref + 10.0 * max(0.0, r.slo_violation_rate - slo_ref - self.slo_slack)
        return total / len(self.cases)


def train(env: SchedulingEnv, agent: DQN, *, total_steps: int | None = None, total_seconds: float | None = None,
          seed: int = 0, resumed: bool = False, validator: Validator | None = None,
          progress: Callable[[int, float, float], None] | None = None) -> TrainLog:
    """Train ``agent`` on ``env`` for ``total_steps`` decisions or ``total_seconds`` of wall time.

    A resumed run starts epsilon at ``min(eps_start, 0.2)``. When a validator is given, the best validated
    weights are loaded back into ``agent`` at the end (the log says at which step).
    """
    if (total_steps is None) == (total_seconds is None):
        raise ValueError("give exactly one of total_steps or total_seconds")
    cfg: DQNConfig = agent.cfg
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    eps_start = min(cfg.eps_start, 0.2) if resumed else cfg.eps_start
    per_transition = 2 * env.max_nodes * (2 * N_FEATURES + 1) + 32  # obs + next obs (float16) and masks
    capacity = max(cfg.batch_size, min(cfg.buffer_size, cfg.replay_memory_mb * 2**20 // per_transition))
    buffer = ReplayBuffer(capacity, env.max_nodes)
    learning_starts = min(cfg.learning_starts, 1_000) if resumed else cfg.learning_starts
    heuristics = [make_policy("most-allocated"), make_policy("energy-greedy")]
    log = TrainLog()
    t_start = time.perf_counter()
    best_state = None

    def progress_frac() -> float:
        if total_steps is not None:
            return log.steps / max(total_steps, 1)
        return (time.perf_counter() - t_start) / total_seconds

    def epsilon(p: float) -> float:
        f = min(1.0, p / cfg.exploration_fraction)
        return eps_start + f * (cfg.eps_end - eps_start)

    def validate() -> None:
        nonlocal best_state
        if validator is None:
            return
        score = validator.score(agent)
        log.rows.append(EpisodeLog(log.steps, log.episodes, time.perf_counter() - t_start, "validation",
                                   math.nan, eps, last_loss, score))
        if score < log.best_score:
            log.best_score, log.best_step = score, log.steps
            best_state = copy.deepcopy(agent.q.state_dict())

    obs, info = env.reset(seed=seed)
    heur = heuristics[0]
    heur.reset(env.twin.state, rng)
    window: deque = deque()  # (rows, mask, action, shaped reward, dt) of the last n steps
    ep_return, last_loss, eps = 0.0, math.nan, eps_start
    recent: deque = deque(maxlen=20)
    tau, n_step = cfg.gamma_tau_s, cfg.n_step
    # Potential-based shaping (Ng, Harada and Russell 1999), policy-invariant also with per-step discounts:
    # r' = r + gamma(dt) * phi(s') - phi(s), phi(s) = -(tau / scale_seconds) * sum of watts_now (the reward-unit
    # cost of drawing today's power for one discount horizon), phi(terminal) = 0. It removes the large,
    # action-independent part (-tau * P) from the values the network must fit, leaving the power changes that
    # decisions cause; the environment's reward itself is unchanged.
    phi_coef = -(tau / env.reward_cfg.scale_seconds) if cfg.shaping else 0.0
    watts_col = WATTS_NOW

    def phi(o: dict, n_rows: int) -> float:
        return phi_coef * float(o["nodes"][:n_rows, watts_col].sum(dtype=np.float64)) if phi_coef else 0.0

    phi_s = phi(obs, info["n_nodes"])

    def emit(next_rows, next_mask, terminated: bool) -> None:
        rows, mask, a, _, _ = window[0]
        ret, elapsed = 0.0, 0.0
        for _, _, _, r, dt in window:
            ret += discount(elapsed, tau) * r
            elapsed += dt
        disc = 0.0 if terminated else discount(elapsed, tau)
        buffer.add(rows, mask, a, ret, next_rows, next_mask, disc)

    while True:
        p = progress_frac()
        if p >= 1.0:
            break
        eps = epsilon(p)
        n = info["n_nodes"]
        rows = obs["nodes"][:n]
        mask = obs["action_mask"][:n].astype(bool)
        # ---- act: epsilon-greedy; exploration is a baseline's choice or a uniform feasible node -------------
        if rng.random() < eps:
            if rng.random() < cfg.heuristic_explore:
                tw = env.twin
                a = heur.choose(tw.state, tw.request, tw.mask)
            else:
                feas = np.flatnonzero(mask)
                a = int(feas[rng.integers(feas.size)])
        else:
            a = agent.greedy(rows, mask)
        obs, r, terminated, truncated, info = env.step(a)
        log.steps += 1
        ep_return += r
        phi_next = 0.0 if terminated else phi(obs, n)
        window.append((rows, mask, a, r + discount(info["dt_s"], tau) * phi_next - phi_s, info["dt_s"]))
        phi_s = phi_next
        next_rows = obs["nodes"][:n]
        next_mask = obs["action_mask"][:n].astype(bool)
        if len(window) == n_step:
            emit(next_rows, next_mask, terminated)
            window.popleft()
        if terminated or truncated:
            while window:
                emit(next_rows, next_mask, terminated)
                window.popleft()
        # ---- learn ------------------------------------------------------------------------------------------
        if len(buffer) >= max(learning_starts, cfg.batch_size) and log.steps % cfg.train_frequency == 0:
            last_loss = agent.update(buffer.sample(cfg.batch_size, rng))
        if log.steps % cfg.target_update_interval == 0:
            agent.sync_target()
        if validator is not None and log.steps % cfg.eval_every_steps == 0 and len(buffer) >= learning_starts:
            validate()
        # ---- episode bookkeeping ----------------------------------------------------------------------------
        if terminated or truncated:
            log.episodes += 1
            recent.append(ep_return)
            name = env.scenarios[env.scenario_index].name
            if env.load_scale != 1.0:
                name += f" x{env.load_scale:g}"
            log.rows.append(EpisodeLog(log.steps, log.episodes, time.perf_counter() - t_start, name, ep_return,
                                       eps, last_loss))
            ep_return = 0.0
            obs, info = env.reset()
            phi_s = phi(obs, info["n_nodes"])
            heur = heuristics[log.episodes % len(heuristics)]
            heur.reset(env.twin.state, rng)
        if progress is not None and log.steps % 250 == 0:
            progress(log.steps, float(np.mean(recent)) if recent else math.nan, eps)
    validate()
    if best_state is not None:
        agent.q.load_state_dict(best_state)
        agent.sync_target()
    log.wall_s = time.perf_counter() - t_start
    return log
