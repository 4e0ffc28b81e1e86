"""The extender over real HTTP: extender v1 JSON (Go field names), scores 0..10, the backend's pods per node."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.live.extender import Extender, ExtenderServer, scale_scores
from tests.support.kube_emulator import make_pod


@pytest.fixture
def extender(emu):
    emu.add_node("small", cpu="1", memory="1Gi")
    emu.add_node("big", cpu="8", memory="16Gi")
    emu.add_node("tainted", cpu="8", memory="16Gi")
    emu.add_node("big2", cpu="8", memory="16Gi")
    # A pod already running on "big" (bound by someone else): the extender must see it.
    emu.add_pod("running", cpu="6", memory="1Gi", scheduler_name="default-scheduler", node_name="big")
    backend = KubeCache(api_client_for(emu.url))
    tainted = emu.get("nodes", "tainted")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    emu.replace("nodes", "", "tainted", tainted)
    srv_holder = {}

    def make(policy: str = "most-allocated"):
        ext = Extender(backend, make_policy(policy))
        srv = ExtenderServer(ext, "127.0.0.1", 0).start()
        srv_holder["srv"] = srv
        return f"http://127.0.0.1:{srv.port}"

    backend.start()
    assert backend.wait_synced(10)
    yield make
    if "srv" in srv_holder:
        srv_holder["srv"].stop()
    backend.stop()


def _post(url: str, body) -> tuple[int, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_filter_shapes_and_reasons(extender, emu):
    url = extender()
    pod = make_pod("p", cpu="2", memory="512Mi")
    nodes = {"items": [emu.get("nodes", n) for n in ("small", "big", "tainted")]}
    code, out = _post(url + "/filter", {"Pod": pod, "Nodes": nodes})
    assert code == 200 and out["Error"] == ""
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["big"]  # 2 of its 8 cores are free
    assert out["NodeNames"] is None
    assert out["FailedNodes"] == {"small": "Insufficient cpu"}
    assert out["FailedAndUnresolvableNodes"] == {"tainted": "node(s) had untolerated taint {dedicated: gpu}"}
    # nodeCacheCapable form: names in, names out.
    # A node the cache does not know yet passes: kube-scheduler's own filters already passed it.
    code, out = _post(url + "/filter", {"Pod": make_pod("q", cpu="3"), "NodeNames": ["small", "big", "ghost"]})
    assert out["NodeNames"] == ["ghost"] and out["Nodes"] is None
    assert out["FailedNodes"] == {"small": "Insufficient cpu", "big": "Insufficient cpu"}


def test_prioritize_scores_0_to_10_and_sees_running_pods(extender, emu):
    url = extender("most-allocated")
    code, out = _post(url + "/prioritize", {"Pod": make_pod("p", cpu="1", memory="512Mi"),
                                            "NodeNames": ["small", "big", "big2"]})
    assert code == 200
    assert all(set(r) == {"Host", "Score"} and 0 <= r["Score"] <= 10 for r in out)
    scores = {r["Host"]: r["Score"] for r in out}
    # MostAllocated packs: "big" already runs a 6-core pod, so it beats the empty "big2"; "small" (1 core,
    # full after this pod) beats both on cpu but the pod's memory weighs there too.
    assert scores["big"] > scores["big2"]
    assert max(scores.values()) == 10 and min(scores.values()) == 0


def test_prioritize_matches_the_policy_choice(extender, emu):
    url = extender("default-k8s")
    code, out = _post(url + "/prioritize", {"Pod": make_pod("p", cpu="100m"), "NodeNames": ["small", "big"]})
    scores = {r["Host"]: r["Score"] for r in out}
    assert scores["small"] == 10 and scores["big"] == 0  # LeastAllocated: the idle node wins


def test_bad_requests(extender):
    url = extender()
    code, out = _post(url + "/filter", {"Nodes": {"items": []}})
    assert code == 200 and "Pod" in out["Error"]
    code, out = _post(url + "/prioritize", {"Pod": {}, "NodeNames": "x"})
    assert code == 400 and out["Error"]
    req = urllib.request.Request(url + "/bind", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 404
    assert urllib.request.urlopen(url + "/healthz", timeout=5).read() == b"ok"
    assert b"joulesched_extender_requests_total" in urllib.request.urlopen(url + "/metrics", timeout=5).read()


def test_scale_scores():
    assert scale_scores([1.0, 2.0, 3.0]).tolist() == [0, 5, 10]
    assert scale_scores([4.0, 4.0]).tolist() == [10, 10]
    assert scale_scores([float("-inf"), 1.0, 2.0]).tolist() == [0, 0, 10]


def test_a_schema_2_dqn_learns_from_the_pods_the_extender_sees(extender, emu):
    """The extender hands its cache to the DQN (as serve does through run_policy), so the lifetime predictor
    follows the cluster's pods: the pod bound by someone else is running on "big" in the predictor's view once
    the extender has scored a pod."""
    import torch

    from joulesched.agent.config import DQNConfig
    from joulesched.agent.dqn import DQN
    from joulesched.agent.dqn_policy import DQNPolicy

    torch.manual_seed(0)
    cfg = DQNConfig()
    policy = DQNPolicy(net=DQN(cfg, seed=0).q, config=cfg, threads=1)
    cache = KubeCache(api_client_for(emu.url))
    ext = Extender(cache, policy)
    cache.start()
    try:
        assert cache.wait_synced(10)
        assert ext.prioritize({"Pod": make_pod("p", cpu="1", memory="256Mi"),
                               "NodeNames": ["small", "big", "big2"]})
        pred = policy.predictor
        assert pred.running == 1
        empty_in, _ = pred.nodes(0.0, len(pred.names))
        assert empty_in[pred.names.index("big")] > 0 and empty_in[pred.names.index("small")] == 0
    finally:
        cache.stop()


def test_a_schema_1_dqn_is_refused_off_the_twin(emu):
    """Schema 1's departure column reads the twin's true end times of running pods (a review: it moved a
    decision when durations of unfinished pods changed); no cluster has them, so a live backend refuses it."""
    from joulesched.agent.config import DQNConfig
    from joulesched.agent.dqn import DQN
    from joulesched.agent.dqn_policy import DQNPolicy
    from joulesched.agent.policy import PolicyError

    cfg = DQNConfig(feature_schema=1)
    policy = DQNPolicy(net=DQN(cfg, seed=0).q, config=cfg, threads=1)
    cache = KubeCache(api_client_for(emu.url))
    with pytest.raises(PolicyError, match="schema-1 model, which reads the twin's true pod end times"):
        Extender(cache, policy)
