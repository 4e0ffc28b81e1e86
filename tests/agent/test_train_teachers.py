"""Training's teachers (agent/train.py, issue 27): a teacher pool labels each episode with the policy that runs
that episode best (clairvoyant ones included), the SLO rule of that choice, rollouts that record it, teachers
with a predictor of their own fed beside the env's, and bad pools refused."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from joulesched.agent import train as train_mod
from joulesched.agent.config import DQNConfig, RewardConfig
from joulesched.agent.env import SchedulingEnv
from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.agent.train import EpisodeSpec, RolloutTask, attach_teacher, episode_teacher, rollout
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "tests" / "support" / "scenarios" / "heldout-hetero-sleep-12.yaml"
POOL = ("auto", "clairvoyant", "most-allocated")


def test_a_pool_teaches_each_episode_with_the_policy_that_runs_it_best():
    sc = load_scenario(HELDOUT)
    wins = set()
    for seed in (1, 2, 3):
        twin = Twin(sc, build_workload(sc, seed))
        runs = {p: run_policy(Twin(sc, twin.workload), make_policy(p), 5) for p in
                ("awake-first:fit=efficient", "clairvoyant", "most-allocated")}
        floor = min(r.slo_violation_rate for r in runs.values()) + DQNConfig().slo_slack
        best = min((r.energy_joules, p) for p, r in runs.items() if r.slo_violation_rate <= floor)[1]
        got = episode_teacher(DQNConfig(teacher_pool=POOL), twin, 5)
        assert got == best
        wins.add(got)
    assert "clairvoyant" in wins  # the future is worth something on some of these episodes
    # Without a pool, or with one policy in it, the teacher is the configured one (auto: the kind's best).
    assert episode_teacher(DQNConfig(), twin, 5) == "awake-first:fit=efficient"
    assert episode_teacher(DQNConfig(teacher_pool=("clairvoyant",)), twin, 5) == "clairvoyant"


def test_the_pool_prefers_energy_only_among_runs_within_the_slo_slack(monkeypatch):
    fake = {"a": (1.0, 0.20), "b": (2.0, 0.0), "c": (3.0, 0.004)}
    calls = []

    def run(twin, policy, seed):
        calls.append(policy.spec)
        e, slo = fake[policy.spec]
        return SimpleNamespace(energy_joules=e, slo_violation_rate=slo, end_s=100.0, window_end_s=100.0)  # one end

    monkeypatch.setattr(train_mod, "run_policy", run)
    monkeypatch.setattr(train_mod, "make_policy", lambda spec: SimpleNamespace(spec=spec))
    twin = SimpleNamespace(scenario=load_scenario(HELDOUT), workload=None)
    monkeypatch.setattr(train_mod, "Twin", lambda sc, wl: None)
    cfg = DQNConfig(teacher_pool=("a", "b", "c", "b"))
    assert episode_teacher(cfg, twin, 0) == "b"  # a saves energy by breaking SLOs; c is within 0.5 pp of b
    assert calls == ["a", "b", "c"]  # a repeated spec runs once
    fake["a"] = (1.0, 0.005)
    assert episode_teacher(cfg, twin, 0) == "a"


def test_a_demonstration_follows_the_pools_choice_and_says_which():
    sc = load_scenario(HELDOUT)
    cfg = DQNConfig(teacher_pool=("auto", "clairvoyant"), max_episode_decisions=120)
    spec = EpisodeSpec(sc, 2, 1.0, 5, "heldout")
    res = rollout(RolloutTask(spec, cfg, RewardConfig(), None, 1.0))
    twin = Twin(sc, build_workload(sc, 2))
    assert res.teacher == episode_teacher(cfg, twin, 5)
    tr = res.transitions
    assert res.steps == 120 and (tr.actions == tr.teacher).all()
    # The labels are that teacher's own decisions on the episode (it acts on every step of a demonstration).
    pol = make_policy(res.teacher)
    pol.attach(twin) if hasattr(pol, "attach") else None
    twin.begin()
    pol.reset(twin.state, np.random.default_rng(5))
    ours = []
    while len(ours) < 120 and (d := twin.next_decision()) is not None:
        ours.append(int(pol.choose(d.state, d.pod, d.mask)))
        twin.bind(d, ours[-1])
    assert ours == tr.actions.tolist()


def test_a_teacher_with_its_own_predictor_is_fed_beside_the_envs():
    sc = load_scenario(HELDOUT)
    env = SchedulingEnv([sc], schema=2)
    env.reset(seed=3, options={"scenario": 0, "workload_seed": 3, "load_scale": 1.0})
    teacher = make_policy("lifetime-aware")
    attach_teacher(teacher, env.twin)
    for _ in range(150):
        env.step(int(np.flatnonzero(env.twin.mask)[0]))
    ours, theirs = env.predictor, teacher.feed.predictor
    assert ours.running > 0 and theirs.running == ours.running
    assert ours.model.observed > 0 and theirs.model.observed == ours.model.observed  # the ends, learned by both


def test_bad_pools_are_refused(tmp_path):
    with pytest.raises(ValueError, match="list of policy specs"):
        DQNConfig(teacher_pool="clairvoyant")
    with pytest.raises(ValueError, match="teacher_pool"):
        DQNConfig(teacher_pool=("auto", " "))
    r = CliRunner().invoke(app, ["train", "-s", str(HELDOUT), "--model", str(tmp_path / "x.pt"), "--steps", "5",
                                 "--set", 'dqn.teacher_pool=["auto", "no-such-policy"]'])
    assert r.exit_code == 2 and "dqn.teacher_pool" in r.output and "no-such-policy" in r.output
    assert not (tmp_path / "x.pt").exists()
