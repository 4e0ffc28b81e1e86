"""The live scenarios against a real cluster. Runs only when JOULESCHED_E2E_KUBECONFIG names a kubeconfig
(kind, k3s, a test cluster); otherwise every test is skipped, visibly (pytest -ra prints the reason).

What it needs: permission to create and delete pods, events and one Lease in the namespace
``JOULESCHED_E2E_NAMESPACE`` (default ``default``), and to list nodes and pods. It uses its own scheduler name
(``joulesched-e2e-<random>``), so it never touches other pods; everything it creates is deleted afterwards.
The pods it creates are pause containers with small requests; they are bound but their image may never pull
(no registry is assumed), which does not matter for scheduling.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

KUBECONFIG = os.environ.get("JOULESCHED_E2E_KUBECONFIG", "")
NAMESPACE = os.environ.get("JOULESCHED_E2E_NAMESPACE", "default")
pytestmark = pytest.mark.skipif(not KUBECONFIG, reason="set JOULESCHED_E2E_KUBECONFIG to run against a real cluster "
                                                       "(none can run on these machines, see machines.md)")


def _wait(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def cluster():
    from kubernetes import client as k8s

    from joulesched.cluster.kube.client import load_api_client

    api = load_api_client(KUBECONFIG)
    name = f"joulesched-e2e-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(api)
    created: list[str] = []
    yield api, core, name, created
    for pod in created:
        try:
            core.delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)
        except k8s.ApiException:
            pass
    try:
        k8s.CoordinationV1Api(api).delete_namespaced_lease(name, NAMESPACE)
    except k8s.ApiException:
        pass


def _pod(name: str, scheduler: str, cpu: str) -> dict:
    from tests.support.kube_emulator import make_pod

    pod = make_pod(name, NAMESPACE, cpu=cpu, memory="16Mi", scheduler_name=scheduler)
    pod["spec"]["containers"][0]["image"] = "registry.k8s.io/pause:3.9"
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


def _scheduler(api, name):
    from joulesched.agent.registry import make_policy
    from joulesched.cluster.kube.cache import KubeCache
    from joulesched.live.scheduler import Scheduler, ServeConfig

    cfg = ServeConfig(scheduler_name=name, lease_namespace=NAMESPACE, lease_name=name, backoff_max_s=2.0)
    return Scheduler(KubeCache(api), make_policy("default-k8s"), cfg).start()


def test_binds_pods_and_records_events(cluster):
    api, core, name, created = cluster
    for i in range(3):
        core.create_namespaced_pod(NAMESPACE, _pod(f"{name}-{i}", name, "10m"))
        created.append(f"{name}-{i}")
    s = _scheduler(api, name)
    try:
        _wait(lambda: all(core.read_namespaced_pod(p, NAMESPACE).spec.node_name for p in created), what="bindings")
        events = core.list_namespaced_event(NAMESPACE, field_selector="reason=Scheduled").items
        assert {e.involved_object.name for e in events} >= set(created)
    finally:
        s.stop()


def test_unschedulable_pod_reports_reason(cluster):
    api, core, name, created = cluster
    core.create_namespaced_pod(NAMESPACE, _pod(f"{name}-huge", name, "100000"))
    created.append(f"{name}-huge")
    s = _scheduler(api, name)
    try:
        def cond():
            conds = core.read_namespaced_pod(f"{name}-huge", NAMESPACE).status.conditions or []
            return [c for c in conds if c.type == "PodScheduled" and c.reason == "Unschedulable"]
        (c,) = _wait(cond, what="PodScheduled=False")
        assert c.message.startswith("0/") and "Insufficient cpu" in c.message
    finally:
        s.stop()


def test_two_replicas_bind_each_pod_once(cluster):
    api, core, name, created = cluster
    a, b = _scheduler(api, name), _scheduler(api, name)
    try:
        for i in range(5):
            core.create_namespaced_pod(NAMESPACE, _pod(f"{name}-r{i}", name, "10m"))
            created.append(f"{name}-r{i}")
        _wait(lambda: all(core.read_namespaced_pod(p, NAMESPACE).spec.node_name for p in created), what="bindings")
        assert not (a.is_leader() and b.is_leader())
        assert a.bound_count + b.bound_count == 5
    finally:
        a.stop()
        b.stop()
