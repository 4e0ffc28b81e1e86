"""explain shows the scores the choice reads: a policy that reads the pod's metadata (``uses_meta``) is scored
with it too (a review, 2026-12-07: the DQN's rows and target-load-packing's prediction were built without it)."""

from __future__ import annotations

import numpy as np
import torch

from joulesched.agent.config import DQNConfig
from joulesched.agent.dqn import make_network
from joulesched.agent.dqn_policy import DQNPolicy
from joulesched.agent.registry import make_policy
from joulesched.cluster.state import ClusterState, PodRequest
from joulesched.cluster.workload import PodMeta
from joulesched.pipelines.explain import explain
from tests.helpers import LINEAR_100_200


def _state() -> ClusterState:
    st = ClusterState(["a", "b", "c"], [8000] * 3, [32768] * 3, [110] * 3, [LINEAR_100_200] * 3)
    st.bind(0, PodRequest(3000, 4096), "p0")
    st.usage_cpu[:] = [1600.0, 0.0, 400.0]
    return st


def _shown(out: dict, plugin: str) -> list:
    return [n["scores"][plugin] for n in out["nodes"] if n.get("scores")]


def test_explain_scores_the_dqn_with_the_pod_metadata():
    torch.manual_seed(0)
    cfg = DQNConfig(prediction=False, hidden=16, attention_dim=8, head_hidden=8)
    pol = DQNPolicy(net=make_network(cfg).eval(), config=cfg, threads=0)
    st, pod = _state(), PodRequest(1000, 2048)
    meta = PodMeta(kind="service", qos_class="Guaranteed")  # two context columns the rows carry
    out = explain(pol, st, pod, meta=meta)
    mask = st.feasible(pod)
    with_meta, without = pol.scores(st, pod, mask, meta)[mask], pol.scores(st, pod, mask)[mask]
    assert not np.allclose(with_meta, without)  # the metadata moves the advantages
    np.testing.assert_allclose(_shown(out, "Advantage"), with_meta, rtol=1e-5, atol=1e-6)


def test_explain_scores_target_load_packing_with_the_pod_cpu_limit():
    st, pod = _state(), PodRequest(1000, 2048)
    out = explain(make_policy("target-load-packing"), st, pod, meta=PodMeta(cpu_limit_m=2000))
    # Predicted 2000m (the limit): U = 45, 25, 30 -> round(40 * 55 / 60) = 37, round(60 * 25 / 40 + 40) = 78, 85
    assert _shown(out, "TargetLoadPacking") == [37, 78, 85]
    assert out["chosen"] == "c"


def test_the_extender_scores_a_metadata_reading_policy_with_the_pods_metadata():
    # target-load-packing predicts a pod by its CPU limit (2000m here, not 1.5 x its 1000m request): with it, the
    # busier node a is past the 40 % target and b scores higher; scored without it, a would.
    from joulesched.live.extender import Extender

    curve = [86, 89.4, 92.6, 96, 99.5, 102, 106, 108, 112, 114, 117]
    st = ClusterState(["a", "b"], [8000, 8000], [32768, 32768], [110, 110], [curve, curve])
    st.usage_cpu[:] = [1600.0, 0.0]
    pol = make_policy("target-load-packing")
    pol.reset(st, np.random.default_rng(0))
    ext = Extender.__new__(Extender)  # only _raw_scores is exercised: no cache, no server
    ext.policy = pol
    idx, mask = np.arange(2), np.ones(2, dtype=bool)
    meta = PodMeta(kind="service", cpu_limit_m=2000, qos_class="Burstable")
    with_meta = ext._raw_scores(st, PodRequest(1000, 2048), idx, mask, meta)
    without = ext._raw_scores(st, PodRequest(1000, 2048), idx, mask)
    assert with_meta[1] > with_meta[0] and without[0] > without[1]
