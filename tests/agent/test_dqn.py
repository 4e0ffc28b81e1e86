"""The DQN agent: masking in training and inference, checkpoints (round trip, refusals), size independence,
and a short fixed-seed training run that beats a random policy. The masking and checkpoint tests use schema 1's
network (models/small.pt's); tests/agent/test_dqn_v2.py has schema 2's."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from joulesched.agent.checkpoint import (META_KEY, load_agent, load_checkpoint, load_network, save_checkpoint,
                                         tensors_digest)
from joulesched.agent.config import DQNConfig
from joulesched.agent.dqn import DQN, NEG, QNetwork, ReplayBatch
from joulesched.agent.dqn_policy import DQNPolicy
from joulesched.agent.env import SchedulingEnv
from joulesched.agent.features import N_FEATURES, FeatureBuilder
from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.agent.train import train
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import ClusterState, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny.yaml"
SLEEP = ROOT / "scenarios" / "heterogeneous-sleep.yaml"


def _state(n: int = 6) -> ClusterState:
    curves = [[40 + 10 * k for k in range(11)], [90 + 3 * k for k in range(11)]] * (n // 2)
    st = ClusterState([f"n{i}" for i in range(n)], [4000] * n, [8192] * n, [110] * n, curves)
    return st


def _adversarial_net(hidden: int = 16) -> QNetwork:
    """A network whose advantage is huge exactly where req_cpu_frac is high: it 'wants' the full nodes."""
    torch.manual_seed(0)
    net = QNetwork(hidden)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.trunk[0].weight[0, 0] = 100.0  # h0 = relu(100 * req_cpu_frac)
        net.trunk[2].weight[0, 0] = 1.0
        net.adv.weight[0, 0] = 1.0
    return net


def test_inference_never_picks_an_infeasible_node():
    st = _state(6)
    pod = PodRequest(1000, 1024)
    # Fill nodes 0, 2, 4 so that the pod no longer fits them: the adversarial net scores them highest.
    for i in (0, 2, 4):
        st.bind(i, PodRequest(3500, 1024))
    mask = st.feasible(pod)
    assert mask.tolist() == [False, True, False, True, False, True]
    pol = DQNPolicy(net=_adversarial_net(), threads=0)
    pol.reset(st, np.random.default_rng(0))
    assert np.argmax(pol.scores(st, pod, np.ones(6, bool))) in (0, 2, 4)  # it would pick a full node...
    assert mask[pol.choose(st, pod, mask)]  # ...but the mask wins
    agent = DQN(DQNConfig(feature_schema=1, hidden=16, buffer_size=64, batch_size=8))
    agent.q.load_state_dict(_adversarial_net().state_dict())
    rows = FeatureBuilder(st).build(st, pod, mask)
    assert mask[agent.greedy(rows, mask)]
    q = agent.q(torch.from_numpy(rows)[None], torch.from_numpy(mask)[None])
    assert (q[0, ~torch.from_numpy(mask)] == NEG).all()


def test_target_max_ignores_infeasible_next_nodes():
    cfg = DQNConfig(feature_schema=1, hidden=16, buffer_size=64, batch_size=2, learning_rate=1e-9)
    agent = DQN(cfg)
    agent.q.load_state_dict(_adversarial_net().state_dict())
    agent.sync_target()
    x = torch.zeros(2, 4, N_FEATURES)
    x[:, 0, 0] = 1.0  # node 0 looks great to both nets (advantage 100) but is infeasible in s'
    next_mask = torch.tensor([[False, True, True, True]] * 2)
    batch = ReplayBatch(x, torch.ones(2, 4, dtype=torch.bool), torch.tensor([1, 1]), torch.zeros(2), x, next_mask,
                        torch.ones(2))
    with torch.no_grad():
        best = agent.q(x, next_mask).argmax(-1)
        target_q = agent.q_target(x, next_mask)
    assert (best != 0).all()
    assert (target_q.max(-1).values < 50).all()
    loss = agent.update(batch)
    assert np.isfinite(loss)


def test_training_never_takes_an_infeasible_action(monkeypatch):
    """Every action of every rollout (greedy, teacher, top-k and uniform exploration) is feasible."""
    original = SchedulingEnv.step
    taken = []

    def checked_step(self, action):
        assert self.action_masks()[int(action)], f"infeasible action {action}"
        taken.append(int(action))
        return original(self, action)

    monkeypatch.setattr(SchedulingEnv, "step", checked_step)
    cfg = DQNConfig(hidden=16, buffer_size=2_000, batch_size=16, learning_starts=100, eps_start=0.5,
                    heuristic_explore=0.3, explore_uniform=0.5, target_update_interval=100, load_scales=(1.0, 2.0),
                    pretrain_episodes=1, pretrain_updates=10, randomize=0.5, randomize_max_nodes=8,
                    max_episode_decisions=150)
    train([load_scenario(TINY)], DQN(cfg, seed=1), total_steps=600, seed=1)
    assert len(taken) >= 750  # the demonstration and the 600-step budget in whole rounds


def test_same_weights_run_on_any_cluster_size():
    net = QNetwork(16)
    pol = DQNPolicy(net=net, threads=0)
    for n in (3, 40, 1000):
        st = _state(n if n % 2 == 0 else n + 1)
        mask = st.feasible(PodRequest(500, 512))
        pol.reset(st, np.random.default_rng(0))
        assert 0 <= pol.choose(st, PodRequest(500, 512), mask) < len(st)


# ---- checkpoints ------------------------------------------------------------------------------------------------
def _saved(tmp_path: Path) -> tuple[Path, DQN]:
    agent = DQN(DQNConfig(feature_schema=1, hidden=16, buffer_size=64, batch_size=8), seed=3)
    # Take one optimizer step so that Adam has state to save.
    x = torch.rand(8, 5, N_FEATURES)
    m = torch.ones(8, 5, dtype=torch.bool)
    agent.update(ReplayBatch(x, m, torch.zeros(8, dtype=torch.long), torch.ones(8), x, m, torch.full((8,), 0.9)))
    path = save_checkpoint(tmp_path / "m.pt", agent, {"scenarios": ["tiny"], "seed": 3, "steps": 1, "wall_s": 0.1})
    return path, agent


def test_checkpoint_round_trip(tmp_path):
    path, agent = _saved(tmp_path)
    net, meta = load_network(path)
    x = torch.rand(1, 7, N_FEATURES)
    m = torch.ones(1, 7, dtype=torch.bool)
    assert torch.allclose(net(x, m), agent.q(x, m))
    assert meta["feature_schema"] >= 1 and meta["config"]["hidden"] == 16
    assert meta["training"]["scenarios"] == ["tiny"] and meta["training"]["steps"] == 1
    assert json.loads((tmp_path / "m.json").read_text())["format"] == "joulesched-dqn"
    restored, _ = load_agent(path)
    assert restored.optimizer.state_dict()["state"][0]["exp_avg"].shape == agent.q.trunk[0].weight.shape
    pol = make_policy(f"dqn={path}")
    st = _state(4)
    pol.reset(st, np.random.default_rng(0))
    assert 0 <= pol.choose(st, PodRequest(100, 100), np.ones(4, bool)) < 4


class _Payload:
    """Unpickling this creates a file: proof that a loader ran the payload."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_pickle_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"state_dict": _Payload(marker)}, protocol=4))
    with pytest.raises(PolicyError, match="pickle"):
        load_checkpoint(evil)
    with pytest.raises(PolicyError):
        make_policy(f"dqn={evil}")
    assert not marker.exists()
    # A torch.save archive (zip) carrying the same payload is refused too.
    zipped = tmp_path / "evil_zip.pt"
    torch.save({"x": torch.zeros(1)}, zipped)
    with zipfile.ZipFile(zipped, "a") as z:
        z.writestr("archive/extra.pkl", pickle.dumps(_Payload(marker)))
    with pytest.raises(PolicyError, match="pickle"):
        load_checkpoint(zipped)
    assert not marker.exists()


def test_corrupt_and_foreign_files_are_refused(tmp_path):
    path, _ = _saved(tmp_path)
    data = path.read_bytes()
    cases = {
        "truncated.pt": data[: len(data) // 2],
        "empty.pt": b"",
        "garbage.pt": bytes(range(256)) * 4,
    }
    for name, blob in cases.items():
        p = tmp_path / name
        p.write_bytes(blob)
        with pytest.raises(PolicyError, match="corrupt"):
            load_checkpoint(p)
    with pytest.raises(PolicyError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")
    # A valid safetensors file without our metadata, and one with another feature schema.
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(PolicyError, match="metadata"):
        load_checkpoint(plain)
    ckpt = load_checkpoint(path)
    meta = dict(ckpt.meta, feature_schema=999)
    other = tmp_path / "schema.pt"
    save_file(ckpt.tensors, str(other), metadata={META_KEY: json.dumps(meta)})
    with pytest.raises(PolicyError, match="feature schema"):
        load_checkpoint(other)
    # Weights of the wrong shape.
    wrong = tmp_path / "shape.pt"
    changed = {k: (v + 1 if k == "q.adv.bias" else v) for k, v in ckpt.tensors.items()}
    save_file(changed, str(wrong), metadata={META_KEY: json.dumps(ckpt.meta)})
    with pytest.raises(PolicyError, match="checksum"):  # not the tensors the file was written with
        load_checkpoint(wrong)
    # Written so (an older joulesched, another tool), checksum or not: refused from the header, before the tensors
    # are read; the message names the tensor and its shapes.
    bad = {k: (torch.zeros(3) if k == "q.adv.bias" else v) for k, v in ckpt.tensors.items()}
    for meta in (ckpt.meta, dict(ckpt.meta, tensors_sha256=tensors_digest(bad))):
        save_file(bad, str(wrong), metadata={META_KEY: json.dumps(meta)})
        with pytest.raises(PolicyError, match=r"do not fit the network \(size mismatch for adv.bias"):
            load_checkpoint(wrong)


# ---- learning ---------------------------------------------------------------------------------------------------
def test_short_training_beats_random_policy():
    """Behaviour, not timing: a fixed-seed run of a few thousand decisions on the sleep scenario must use
    clearly less energy than uniformly random placement on a held-out workload."""
    torch.set_num_threads(1)
    sc = load_scenario(SLEEP)
    # Reinforcement learning alone: no demonstrations, no margin loss, no teacher in the exploration.
    cfg = DQNConfig(hidden=32, buffer_size=10_000, batch_size=32, learning_starts=1_000, train_frequency=4,
                    target_update_interval=500, exploration_fraction=0.5, load_scales=(1.0,), eps_start=1.0,
                    pretrain_episodes=0, bc_weight=0.0, bc_weight_end=0.0, heuristic_explore=0.0, randomize=0.0,
                    train_seed_range=(1000, 1010))
    agent = DQN(cfg, seed=0)
    train([sc], agent, total_steps=6_000, seed=0)
    twin = Twin(sc, build_workload(sc, 42))
    trained = run_policy(twin, DQNPolicy(net=agent.q, config=cfg, threads=1), 42).energy_joules
    rand = run_policy(twin, make_policy("random"), 42).energy_joules
    assert trained < 0.9 * rand, (trained / rand)


def test_scoring_identical_empty_nodes_once_keeps_the_choice():
    """The latency shortcut (score one of several identical empty nodes) must choose what full scoring does."""
    sc = load_scenario(ROOT / "scenarios" / "large.yaml")
    twin = Twin(sc, build_workload(sc, 3))
    torch.manual_seed(5)
    net = QNetwork(16)
    pol = DQNPolicy(net=net, threads=0)
    pol.reset(twin.state, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    checked = 0
    while twin.next_decision() is not None and checked < 300:
        st, pod, mask = twin.state, twin.request, twin.mask
        full = np.flatnonzero(mask)[np.argmax(pol.scores(st, pod, mask)[mask])]
        assert pol.choose(st, pod, mask) == full
        feas = np.flatnonzero(mask)
        twin.place(int(rng.choice(feas)) if rng.random() < 0.5 else int(full))
        checked += 1
    assert checked == 300
