"""The emulator speaks the REST the real `kubernetes` client expects (it stands in for a kube-apiserver, which
cannot run on these machines)."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from joulesched.cluster.kube.client import api_client_for


def _watch_lines(v1, rv, **kw):
    resp = v1.list_pod_for_all_namespaces(watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False,
                                          **kw)
    try:
        return [json.loads(line) for line in resp.read().decode().splitlines() if line.strip()]
    finally:
        resp.release_conn()


def test_list_watch_and_field_selector_transitions(emu):
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    emu.add_node("n")
    emu.add_pod("p", cpu="1")
    emu.add_pod("other", scheduler_name="default-scheduler")
    sel = "spec.schedulerName=joulesched,spec.nodeName="
    lst = v1.list_pod_for_all_namespaces(field_selector=sel)
    assert [p.metadata.name for p in lst.items] == ["p"]
    rv = lst.metadata.resource_version
    emu.bind("default", "p", {"target": {"name": "n"}}, None)  # leaves the selector
    emu.add_pod("q")
    evs = _watch_lines(v1, rv, field_selector=sel)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("DELETED", "p"), ("ADDED", "q")]
    assert int(evs[-1]["object"]["metadata"]["resourceVersion"]) == emu.resource_version


def test_old_resource_version_is_410_gone(emu):
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    emu.add_pod("p")
    emu.compact()
    evs = _watch_lines(v1, "1")
    assert evs[0]["type"] == "ERROR" and evs[0]["object"]["code"] == 410


def test_binding_conflicts_and_uid_precondition(emu):
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    pod = emu.add_pod("p")
    body = {"metadata": {"name": "p", "uid": "wrong"}, "target": {"name": "n"}}
    with pytest.raises(ApiException) as e:
        v1.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
    assert e.value.status == 409
    body["metadata"]["uid"] = pod["metadata"]["uid"]
    assert v1.create_namespaced_pod_binding("p", "default", body, _preload_content=False).status == 201
    with pytest.raises(ApiException) as e:
        v1.create_namespaced_pod_binding("p", "default", body, _preload_content=False)
    assert e.value.status == 409 and "already assigned" in str(e.value.body)
    with pytest.raises(ApiException) as e:
        v1.create_namespaced_pod_binding("ghost", "default", body, _preload_content=False)
    assert e.value.status == 404


def test_status_patch_content_types(emu):
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    emu.add_pod("p")
    patch = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    with pytest.raises(ApiException) as e:
        v1.patch_namespaced_pod_status("p", "default", [{"op": "add", "path": "/status/x", "value": 1}],
                                       _content_type="application/json-patch+json", _preload_content=False)
    assert e.value.status in (400, 415)  # JSON patch is not emulated
    v1.patch_namespaced_pod_status("p", "default", patch, _content_type="application/strategic-merge-patch+json",
                                   _preload_content=False)
    patch["status"]["conditions"][0]["message"] = "m"
    v1.patch_namespaced_pod_status("p", "default", patch, _content_type="application/strategic-merge-patch+json",
                                   _preload_content=False)
    conds = emu.get("pods", "p", "default")["status"]["conditions"]
    assert len(conds) == 1 and conds[0]["message"] == "m"  # merged by type


def test_lease_optimistic_concurrency(emu):
    co = k8s.CoordinationV1Api(api_client_for(emu.url))
    body = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    created = json.loads(co.create_namespaced_lease("default", body, _preload_content=False).data)
    with pytest.raises(ApiException) as e:
        co.create_namespaced_lease("default", body, _preload_content=False)
    assert e.value.status == 409
    upd = {**created, "spec": {"holderIdentity": "b"}}
    co.replace_namespaced_lease("l", "default", upd, _preload_content=False)
    with pytest.raises(ApiException) as e:  # same (now stale) resourceVersion again
        co.replace_namespaced_lease("l", "default", upd, _preload_content=False)
    assert e.value.status == 409


def test_faults(emu):
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    emu.faults.add("500", "list:nodes", times=1)
    with pytest.raises(ApiException) as e:
        v1.list_node(_preload_content=False)
    assert e.value.status == 500
    assert v1.list_node(_preload_content=False).status == 200
    with pytest.raises(ValueError):
        emu.faults.add("explode", "bind")
