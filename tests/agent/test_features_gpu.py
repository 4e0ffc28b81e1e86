"""Feature schema 3 (agent/features_gpu.py): the GPU columns' meaning on a small hand-computed GPU state, zero on a
CPU cluster, schema 2's part unchanged, checkpoints of schema 3 round-trip, schema 2 models still load as before,
and a schema this code does not know is refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from joulesched.agent.checkpoint import KNOWN_SCHEMAS, META_KEY, load_checkpoint, load_model, save_checkpoint
from joulesched.agent.config import AUTO_TEACHER, DQNConfig
from joulesched.agent.dqn import DQN, SetQNetwork
from joulesched.agent.dqn_policy import DQNPolicy
from joulesched.agent.env import SchedulingEnv
from joulesched.agent.features import FeatureBuilderV2, feature_names, n_features
from joulesched.agent.features_gpu import (CONTEXT_FEATURES_GPU, N_CTX_V2, N_CTX_V3, N_FEATURES_V3, N_NODE_V2,
                                           N_NODE_V3, NODE_FEATURES_GPU, POD_FEATURES_GPU, FeatureBuilderV3,
                                           feature_names_v3)
from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import make_policy
from joulesched.agent.runner import run_policy
from joulesched.agent.train import teacher_spec
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import ASLEEP, ClusterState, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny.yaml"
GPU_SCENARIO = ROOT / "scenarios" / "trace-alibaba-gpu-2023.yaml"
V2_PT = ROOT / "models" / "v2.pt"
T4 = [10.0 + 6.0 * k for k in range(11)]  # one GPU: 10 W idle, 70 W at its full share (6 W per 100 milli)
CPU = [100.0] * 11  # a node's CPU: 100 W flat, so the cluster's largest peak incl. GPUs is 100 + 4 x 70 = 380 W
MAXP = 380.0


def _state(counts=(2, 4, 0), models=("T4", "V100M16", "")) -> ClusterState:
    n = len(counts)
    return ClusterState([f"n{i}" for i in range(n)], [64000] * n, [262144] * n, [110] * n, [CPU] * n,
                        sleep_watts=[8.0] * n, can_sleep=True, gpu_count=list(counts), gpu_model=list(models),
                        gpu_curves=[T4 if c else [0.0] * 11 for c in counts])


def _cols(feat: FeatureBuilderV3, st: ClusterState, pod: PodRequest) -> tuple[dict, dict]:
    """The GPU node columns by name (one value per node) and the GPU pod and context columns by name."""
    rows = feat.build(st, pod, st.feasible(pod)).astype(np.float64)
    node = {k: rows[:, N_NODE_V2 + j] for j, k in enumerate(NODE_FEATURES_GPU)}
    ctx_names = POD_FEATURES_GPU + CONTEXT_FEATURES_GPU
    ctx = {k: rows[0, N_NODE_V3 + N_CTX_V2 + j] for j, k in enumerate(ctx_names)}
    assert np.allclose(rows[:, N_NODE_V3:], rows[0, N_NODE_V3:])  # the pod and context part is on every row
    return node, ctx


def test_gpu_columns_on_a_hand_computed_state():
    st = _state()
    st.bind(0, PodRequest(1000, 100, gpu=1, gpu_milli=600), "a")  # n0's GPUs: 400 and 1000 milli free
    feat = FeatureBuilderV3(st)
    pod = PodRequest(1000, 100, gpu=1, gpu_milli=300)
    node, ctx = _cols(feat, st, pod)
    close = np.testing.assert_allclose
    close(node["has_gpu"], [1, 1, 0])
    close(node["gpu_count"], [0.5, 1, 0])
    close(node["gpu_free_share"], [1400 / 2000, 1, 0], rtol=1e-6)
    close(node["gpu_whole_free"], [0.5, 1, 0])
    close(node["gpu_fit_left"], [0.1, 0.7, 0], rtol=1e-6)  # n0: the share goes to the GPU with 400 free
    close(node["gpu_idle_watts"], [20 / MAXP, 40 / MAXP, 0], rtol=1e-6)
    close(node["gpu_peak_watts"], [140 / MAXP, 280 / MAXP, 0], rtol=1e-6)
    close(node["gpu_marginal_watts"], [18 / MAXP, 18 / MAXP, 0], rtol=1e-6)  # 300 milli x 60 W / 1000 milli
    close(node["gpu_model_ok"], [1, 1, 0])
    close(node["pick_gpu_best_fit"], [1, 0, 0])  # n0 is left with less CPU + GPU share free
    close([ctx[k] for k in POD_FEATURES_GPU], [1 / 8, 0.3, 1, 0], rtol=1e-6)
    close([ctx[k] for k in CONTEXT_FEATURES_GPU], [600 / 6000, 5 / 6, 2 / 3], rtol=1e-6)

    # A sleeping node: waking it turns all its GPUs on at their idle draw; gpu-best-fit wakes only when no
    # awake node fits.
    st.power_state[1] = ASLEEP
    node, _ = _cols(feat, st, pod)
    close(node["gpu_marginal_watts"], [18 / MAXP, (40 + 18) / MAXP, 0], rtol=1e-6)
    close(node["pick_gpu_best_fit"], [1, 0, 0])
    st.power_state[1] = 0

    # Two whole GPUs: n0 has one whole free GPU (does not fit), n1 keeps 2 of 4; allowed models narrow it.
    whole = PodRequest(1000, 100, gpu=2, gpu_models=frozenset({"V100M16"}))
    node, ctx = _cols(feat, st, whole)
    close(node["gpu_fit_left"], [0, 0.5, 0])
    close(node["gpu_model_ok"], [0, 1, 0])
    close(node["gpu_marginal_watts"], [120 / MAXP, 120 / MAXP, 0], rtol=1e-6)
    close(node["pick_gpu_best_fit"], [0, 1, 0])
    close([ctx[k] for k in POD_FEATURES_GPU], [2 / 8, 1, 1, 1])

    # A CPU pod: its GPU-fit columns are 0, and gpu-best-fit keeps it off the nodes with free GPUs.
    node, ctx = _cols(feat, st, PodRequest(1000, 100))
    close(node["gpu_fit_left"], [0, 0, 0])
    close(node["gpu_model_ok"], [0, 0, 0])
    close(node["pick_gpu_best_fit"], [0, 0, 1])
    close([ctx[k] for k in POD_FEATURES_GPU], [0, 0, 0, 0])


def test_schema_2_part_is_schema_2s_and_gpu_columns_are_zero_without_gpus():
    for counts in ((0, 0, 0), (2, 4, 0)):
        st = _state(counts, ("", "", "") if not any(counts) else ("T4", "V100M16", ""))
        st.bind(2, PodRequest(3000, 1000), "c")
        pod = PodRequest(500, 100)
        mask = st.feasible(pod)
        v3 = FeatureBuilderV3(st).build(st, pod, mask).copy()
        v2 = FeatureBuilderV2(st).build(st, pod, mask)
        assert v3.shape == (3, N_FEATURES_V3)
        np.testing.assert_array_equal(v3[:, :N_NODE_V2], v2[:, :N_NODE_V2])
        np.testing.assert_array_equal(v3[:, N_NODE_V3:N_NODE_V3 + N_CTX_V2], v2[:, N_NODE_V2:])
        gpu_part = np.concatenate((v3[:, N_NODE_V2:N_NODE_V3], v3[:, N_NODE_V3 + N_CTX_V2:]), axis=1)
        assert (gpu_part == 0).all() == (not any(counts))
    # The names and sizes agree with the rows.
    assert n_features(3) == (N_FEATURES_V3, N_CTX_V3) and len(feature_names(3)) == N_FEATURES_V3
    assert feature_names(3)[:N_NODE_V2] == feature_names(2)[:N_NODE_V2]
    assert feature_names(3) == feature_names_v3()


def test_empty_nodes_with_other_gpus_are_not_stand_ins_for_each_other():
    st = _state((0, 2, 2, 0), ("", "T4", "T4", ""))
    feat = FeatureBuilderV3(st)
    assert feat.node_class[1] == feat.node_class[2] and feat.node_class[0] == feat.node_class[3]
    assert feat.node_class[0] != feat.node_class[1]  # schema 2's classes read CPU, memory and watts alone
    assert FeatureBuilderV2(st).node_class[0] == FeatureBuilderV2(st).node_class[1]
    reps, cnt = feat.groups(st, np.ones(4, dtype=bool))
    assert reps.tolist() == [0, 1] and cnt.tolist() == [2, 2]


def test_env_serves_schema_3_rows_and_refuses_unknown_schemas():
    env = SchedulingEnv([GPU_SCENARIO], schema=3, max_decisions=5)
    obs, info = env.reset(seed=0, options={"scenario": 0, "workload_seed": 1})
    assert obs["nodes"].shape[1] == N_FEATURES_V3 and isinstance(env._feat, FeatureBuilderV3)
    assert obs["nodes"][:info["n_nodes"], N_NODE_V2].any()  # has_gpu somewhere
    with pytest.raises(ValueError, match="schema must be 1, 2 or 3"):
        SchedulingEnv([TINY], schema=4)
    with pytest.raises(ValueError, match="feature_schema must be 1, 2 or 3"):
        DQNConfig(feature_schema=4)
    assert 3 in KNOWN_SCHEMAS


def test_the_auto_teacher_of_a_gpu_cluster_is_gpu_aware():
    assert teacher_spec(DQNConfig(), load_scenario(GPU_SCENARIO)) == "gpu-energy"
    assert teacher_spec(DQNConfig(), load_scenario(TINY)) == AUTO_TEACHER["always_on"]  # tiny: always on, no GPU


def test_schema_3_round_trip_and_run_on_a_gpu_trace(tmp_path):
    cfg = DQNConfig(feature_schema=3, hidden=16, attention_dim=8, head_hidden=8, buffer_size=64, batch_size=8)
    agent = DQN(cfg, seed=5)
    path = save_checkpoint(tmp_path / "gpu.pt", agent, {"scenarios": ["trace-alibaba-gpu-2023"], "seed": 5})
    net, cfg2, meta = load_model(path)
    assert meta["feature_schema"] == 3 and meta["features"] == feature_names(3) and cfg2.feature_schema == 3
    assert isinstance(net, SetQNetwork) and net.n_features == N_FEATURES_V3
    x = torch.rand(1, 6, N_FEATURES_V3)
    m = torch.ones(1, 6, dtype=torch.bool)
    assert torch.allclose(net(x, m), agent.q(x, m))
    assert json.loads((tmp_path / "gpu.json").read_text())["feature_schema"] == 3
    pol = make_policy(f"dqn={path}")
    assert pol.uses_meta and pol.schema == 3
    sc = load_scenario(GPU_SCENARIO)
    twin = Twin(sc, build_workload(sc, sc.seed))
    r = run_policy(twin, pol, sc.seed)
    assert isinstance(pol._feat, FeatureBuilderV3) and r.placements > 0
    # The greedy choice is the argmax of the batched network over the schema-3 rows.
    st = twin.state
    pod = PodRequest(1000, 1024, gpu=1, gpu_milli=500)
    mask = st.feasible(pod)
    if mask.sum() >= 2:
        rows = FeatureBuilderV3(st, prediction=False).build(st, pod, mask)
        q = net(torch.from_numpy(rows)[None], torch.from_numpy(mask)[None])[0]
        pol2 = DQNPolicy(net=net, config=DQNConfig(feature_schema=3, prediction=False, hidden=16, attention_dim=8,
                                                       head_hidden=8), threads=0)
        pol2.reset(st, np.random.default_rng(0))
        assert pol2.choose(st, pod, mask) == int(torch.argmax(q))
    # Schema 3's tensors under schema 2's number: refused (the columns must be the schema's).
    ckpt = load_checkpoint(path)
    mixed = tmp_path / "mixed.pt"
    save_file(ckpt.tensors, str(mixed), metadata={META_KEY: json.dumps(dict(ckpt.meta, feature_schema=2))})
    with pytest.raises(PolicyError, match="columns"):
        load_checkpoint(mixed)


@pytest.mark.skipif(not V2_PT.exists(), reason="models/v2.pt (the shipped schema-2 model) is not in this checkout")
def test_the_schema_2_model_loads_and_reads_schema_2_rows():
    net, cfg, meta = load_model(V2_PT)
    assert cfg.feature_schema == 2 and net.n_features == n_features(2)[0]
    pol = make_policy(f"dqn={V2_PT}")
    sc = load_scenario(TINY)
    twin = Twin(sc, build_workload(sc, sc.seed))
    r = run_policy(twin, pol, sc.seed)
    assert type(pol._feat) is FeatureBuilderV2 and r.placements > 0
    st = twin.state
    pod = PodRequest(500, 512)
    mask = st.feasible(pod)
    rows = FeatureBuilderV2(st, prediction=False).build(st, pod, mask)
    pol2 = DQNPolicy(net=net, config=DQNConfig.from_dict({**cfg.to_dict(), "prediction": False}), threads=0)
    pol2.reset(st, np.random.default_rng(0))
    with torch.inference_mode():
        a = net.score(torch.from_numpy(rows), torch.from_numpy(np.flatnonzero(mask)))
    assert pol2.choose(st, pod, mask) == int(np.flatnonzero(mask)[int(torch.argmax(a))])


def test_unknown_schema_is_refused_with_exit_2(tmp_path):
    r = CliRunner().invoke(app, ["train", "--model", str(tmp_path / "m.pt"), "-s", str(TINY), "--steps", "10",
                                 "--set", "dqn.feature_schema=4", "--no-progress"])
    assert r.exit_code == 2 and "feature_schema" in r.output, r.output
    agent = DQN(DQNConfig(feature_schema=3, hidden=8, attention_dim=4, head_hidden=4), seed=1)
    path = save_checkpoint(tmp_path / "gpu.pt", agent, {"seed": 1})
    ckpt = load_checkpoint(path)
    future = tmp_path / "schema4.pt"
    save_file(ckpt.tensors, str(future), metadata={META_KEY: json.dumps(dict(ckpt.meta, feature_schema=4))})
    r = CliRunner().invoke(app, ["test", "--model", str(future), "-s", str(TINY), "--no-optimum"])
    assert r.exit_code == 2 and "feature schema 4, which this joulesched does not know" in r.output
