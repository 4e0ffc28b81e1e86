"""The Gymnasium env over the twin: API conformance, masks, reward accounting, vector envs."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from joulesched.agent.config import RewardConfig
from joulesched.agent.env import SchedulingEnv, scale_load
from joulesched.agent.features import N_FEATURES, N_FEATURES_V2
from joulesched.cluster.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny.yaml"
SLEEP = ROOT / "scenarios" / "heterogeneous-sleep.yaml"


def test_check_env_passes():
    env = SchedulingEnv([TINY], max_decisions=40)
    check_env(env, skip_render_check=True)


def test_padded_spaces_and_masks():
    env = SchedulingEnv([TINY, SLEEP])
    assert env.max_nodes == 22
    obs, info = env.reset(seed=3, options={"scenario": 0})
    assert env.n_features == N_FEATURES_V2  # schema 2 by default
    assert obs["nodes"].shape == (22, N_FEATURES_V2) and obs["nodes"].dtype == np.float32
    assert SchedulingEnv([TINY], schema=1).observation_space["nodes"].shape == (3, N_FEATURES)
    assert env.observation_space.contains(obs)
    n = info["n_nodes"]
    assert n == 3
    assert not obs["action_mask"][n:].any() and not obs["nodes"][n:].any()
    assert np.array_equal(info["action_mask"], env.action_masks())
    assert np.array_equal(obs["action_mask"].astype(bool), env.action_masks())


def test_reward_accounts_for_every_joule():
    """With zero penalties the episode's rewards sum to minus the twin's total energy over the reward unit."""
    env = SchedulingEnv([TINY], reward=RewardConfig(slo_joules_per_pod_s=0, pending_joules_per_pod_s=0))
    obs, info = env.reset(seed=0)
    rng = np.random.default_rng(0)
    total, energy, done = 0.0, 0.0, False
    while not done:
        feas = np.flatnonzero(env.action_masks())
        obs, r, done, trunc, info = env.step(int(rng.choice(feas)))
        assert not info["invalid_action"]
        total += r
        energy += info["energy_j"]
    twin = env.twin
    assert twin.done
    scale = twin.state.peak_watts.max() * RewardConfig().scale_seconds
    # Energy before the first decision is not attributed to any action.
    assert energy == pytest.approx(twin.energy_joules - _energy_before_first_decision(env), rel=1e-9)
    assert total == pytest.approx(-energy / scale, rel=1e-9)
    assert not obs["action_mask"].any()


def _energy_before_first_decision(env: SchedulingEnv) -> float:
    twin = env.twin
    twin.reset()
    twin.next_decision()
    return twin.energy_joules


def test_invalid_action_is_redirected_and_penalised():
    env = SchedulingEnv([TINY], max_nodes=5)
    env.reset(seed=1)
    mask = env.action_masks()
    bad = int(np.flatnonzero(~mask)[0])  # a padded index (never feasible)
    _, r, _, _, info = env.step(bad)
    assert info["invalid_action"]
    assert r <= -RewardConfig().invalid_action_penalty


def test_vector_env_steps_with_masks():
    venv = gym.vector.SyncVectorEnv([lambda: SchedulingEnv([TINY], max_decisions=30) for _ in range(2)])
    obs, info = venv.reset(seed=7)
    assert obs["nodes"].shape == (2, 3, N_FEATURES_V2)
    for _ in range(40):
        masks = obs["action_mask"].astype(bool)
        actions = np.array([int(np.flatnonzero(m)[0]) if m.any() else 0 for m in masks])
        obs, rew, term, trunc, info = venv.step(actions)
        assert rew.shape == (2,)
    venv.close()


def test_scale_load_multiplies_pods_and_rate():
    sc = load_scenario(SLEEP)
    heavy = scale_load(sc, 2.0)
    assert heavy.workload.synthetic.pods == 2 * sc.workload.synthetic.pods
    assert heavy.workload.synthetic.mean_interarrival_s == pytest.approx(sc.workload.synthetic.mean_interarrival_s / 2)
    assert scale_load(sc, 1.0) is sc
    with pytest.raises(ValueError):
        SchedulingEnv([TINY], load_scales=[])
