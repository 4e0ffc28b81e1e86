"""The live backend's pod view: the pod model's metadata filled from the Pod object itself (ownerReferences
with ReplicaSet -> Deployment, priority, QoS class, labels, namespace, limits), read through the real
`kubernetes` client from the API emulator over HTTP (no kube-apiserver can run here), and equal to what the
twin gives a policy for the same pod."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from kubernetes import client as k8s

from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.kube.objects import pod_limits, pod_meta, pod_owner, qos_class
from joulesched.cluster.scenario import Services
from joulesched.cluster.workload import PodMeta, generate_services
from tests.live.conftest import wait_until
from tests.support.kube_emulator import make_pod


def container(name: str, requests: dict | None = None, limits: dict | None = None) -> dict:
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"name": name, "image": "registry.invalid/pause:3.9", "resources": res}


def pod(name: str, ns: str = "default", *, containers: list[dict], owner: tuple[str, str] | None = None,
        labels: dict | None = None, **spec) -> dict:
    p = make_pod(name, ns, labels=labels)
    p["spec"]["containers"] = containers
    p["spec"].update(spec)
    if owner:
        p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                             "uid": f"uid-{owner[1]}", "controller": True}]
    return p


GUARANTEED = container("c", {"cpu": "500m", "memory": "256Mi"}, {"cpu": "500m", "memory": "256Mi"})
PODS = {
    # A Deployment's pod: the ReplicaSet web-5d8f7c9b4 with the pod-template-hash label resolves to web.
    "web-5d8f7c9b4-x7k2p": (
        pod("web-5d8f7c9b4-x7k2p", "shop", containers=[GUARANTEED], owner=("ReplicaSet", "web-5d8f7c9b4"),
            labels={"pod-template-hash": "5d8f7c9b4"}, priority=1000, priorityClassName="shop-high"),
        PodMeta(kind="service", owner_kind="Deployment", priority=1000, qos_class="Guaranteed", app="web",
                namespace="shop", cpu_limit_m=500, memory_limit_mib=256)),
    # A Job's pod: Burstable, Alibaba's class from Koordinator's label, a system class without spec.priority.
    "etl-1-abcde": (
        pod("etl-1-abcde", "batch", containers=[container("c", {"cpu": "1"}, {"cpu": "2"})], owner=("Job", "etl-1"),
            labels={"koordinator.sh/qosClass": "BE", "app.kubernetes.io/name": "etl"}, restartPolicy="Never",
            priorityClassName="system-cluster-critical"),
        PodMeta(kind="job", owner_kind="Job", priority=2_000_000_000, qos_class="Burstable", app="etl",
                namespace="batch", slo_class="BE", cpu_limit_m=2000)),
    # A bare pod that restarts Always is a service; nothing requested or limited: BestEffort.
    "bare": (pod("bare", containers=[container("c")]), PodMeta(kind="service", qos_class="BestEffort")),
    # A bare pod that does not restart is a job; limits only: the apiserver's defaulting makes it Guaranteed.
    "once": (pod("once", containers=[container("c", None, {"cpu": "1", "memory": "1Gi"})], restartPolicy="OnFailure"),
             PodMeta(kind="job", qos_class="Guaranteed", cpu_limit_m=1000, memory_limit_mib=1024)),
    # Two containers, one unlimited: the pod has no CPU limit and is Burstable; a StatefulSet's pod, app label.
    "db-0": (pod("db-0", containers=[GUARANTEED, container("side", {"cpu": "100m", "memory": "64Mi"})],
                 owner=("StatefulSet", "db"), labels={"app": "postgres"}),
             PodMeta(kind="service", owner_kind="StatefulSet", qos_class="Burstable", app="postgres")),
    # A ReplicaSet that no Deployment made (no pod-template-hash label) stays a ReplicaSet.
    "bare-rs-q9": (pod("bare-rs-q9", containers=[GUARANTEED], owner=("ReplicaSet", "bare-rs")),
                   PodMeta(kind="service", owner_kind="ReplicaSet", qos_class="Guaranteed", app="bare-rs",
                           cpu_limit_m=500, memory_limit_mib=256)),
}


def test_pod_meta_through_the_real_client_and_cache(emu):
    core = k8s.CoreV1Api(api_client_for(emu.url))
    for name, (obj, _) in PODS.items():
        core.create_namespaced_pod(obj["metadata"]["namespace"], copy.deepcopy(obj))
    cache = KubeCache(api_client_for(emu.url)).start()
    try:
        assert cache.wait_synced(10)
        wait_until(lambda: len(cache.pods) == len(PODS), what="every pod in the cache")
        got = {info.name: info for info in cache.pods.values()}
        for name, (_, want) in PODS.items():
            assert got[name].meta == want, name
        web = got["web-5d8f7c9b4-x7k2p"]
        assert web.owner_name == "web" and web.labels == {"pod-template-hash": "5d8f7c9b4"}
    finally:
        cache.stop()


def test_status_qos_class_wins_and_init_containers_count():
    p = pod("p", containers=[GUARANTEED])
    p["status"]["qosClass"] = "Burstable"  # what a real apiserver has computed
    assert qos_class(p) == "Burstable"
    q = pod("q", containers=[GUARANTEED], initContainers=[container("init", {"cpu": "100m"})])
    assert qos_class(q) == "Burstable"  # an init container without limits breaks Guaranteed, as in kube
    r = pod("r", containers=[GUARANTEED], initContainers=[container("init", None, {"cpu": "2", "memory": "1Gi"})],
            overhead={"cpu": "50m"})
    assert pod_limits(r) == (2050, 1024)  # the largest init limit, plus the overhead
    assert pod_owner(pod("s", containers=[GUARANTEED], owner=("ReplicaSet", "abc"),
                         labels={"pod-template-hash": "abc"})) == ("ReplicaSet", "abc")  # not <deploy>-<hash>


def test_live_and_twin_views_agree_for_the_same_service():
    """A generated service and the pod its Deployment would create give a policy the same metadata."""
    sv = Services(count=1, replicas=1, cpu_m=500, memory_mib=256, cpu_limit_m=500, memory_limit_mib=256,
                  name="web", namespace="shop", priority=1000)
    wl = generate_services(sv, 3600.0, np.random.default_rng(0))
    live = pod_meta(PODS["web-5d8f7c9b4-x7k2p"][0])
    twin = wl.meta(0)
    assert twin.app == "web-0"  # the generator numbers its Deployments
    assert twin == dataclasses.replace(live, app="web-0")


@pytest.mark.parametrize("priority,cls,want", [(None, None, 0), (None, "system-node-critical", 2_000_001_000),
                                               (7, "system-node-critical", 7), (None, "my-class", 0)])
def test_priority(priority, cls, want):
    spec = {k: v for k, v in (("priority", priority), ("priorityClassName", cls)) if v is not None}
    assert pod_meta(pod("p", containers=[GUARANTEED], **spec)).priority == want


class _SeesMeta:
    """The first feasible node; remembers the metadata each decision handed it (``uses_meta``)."""

    name = "sees-meta"
    scorer = None
    uses_meta = True

    def __init__(self) -> None:
        self.seen: list[PodMeta] = []

    def reset(self, state, rng) -> None:
        pass

    def choose(self, state, pod, mask, meta=None) -> int:
        self.seen.append(meta)
        return int(np.flatnonzero(mask)[0])


def test_the_live_scheduler_hands_a_policy_each_pods_metadata(emu):
    """Scheduler decisions carry PodInfo.meta (Decision.meta), and run_policy passes it to a policy asking for it,
    as the twin does: the same PodMeta values for the same pods."""
    from collections import Counter

    from joulesched.live.scheduler import Scheduler, ServeConfig
    from tests.live.conftest import FAST

    emu.add_node("n0", cpu="16", memory="64Gi")
    core = k8s.CoreV1Api(api_client_for(emu.url))
    for obj, _ in PODS.values():
        core.create_namespaced_pod(obj["metadata"]["namespace"], copy.deepcopy(obj))
    pol = _SeesMeta()
    s = Scheduler(KubeCache(api_client_for(emu.url)), pol,
                  ServeConfig(**{**FAST, "leader_elect": False, "lease_namespace": "default"})).start()
    try:
        wait_until(lambda: len(emu.bindings) == len(PODS), what="every pod bound")
    finally:
        s.stop()
    assert Counter(pol.seen) == Counter(want for _, want in PODS.values())
