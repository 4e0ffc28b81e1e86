"""The emulator's additions for the scheduler's hot path and the benchmarks, checked through the real
`kubernetes` client and raw HTTP: Event merge patches, the Event TTL, generated names drawn again when taken, a
403 fault, copy-on-write stores (what a client gets back can be changed without touching the store), its own
header parser (any case, Connection: close, HTTP/1.0), and the binding times it reports."""

from __future__ import annotations

import http.client
import json
import socket

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from joulesched.cluster.kube.client import api_client_for
from tests.support.kube_emulator import KubeEmulator


def test_event_merge_patch_and_change_log(emu):
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    emu.add_pod("p")
    v1.create_namespaced_event("default", {"metadata": {"name": "p.1"}, "involvedObject": {"name": "p"},
                                           "reason": "FailedScheduling", "count": 1})
    v1.patch_namespaced_event("p.1", "default", {"count": 7, "series": {"count": 7}},
                              _content_type="application/merge-patch+json")
    ev = emu.get("events", "p.1", "default")
    assert ev["count"] == 7 and ev["series"] == {"count": 7} and ev["reason"] == "FailedScheduling"
    assert [(t, e["count"]) for t, e in emu.changes("events")] == [("ADDED", 1), ("MODIFIED", 7)]


def test_events_expire_after_the_ttl():
    import time

    with KubeEmulator(event_ttl_s=0.2) as emu:
        v1 = k8s.CoreV1Api(api_client_for(emu.url))
        v1.create_namespaced_event("default", {"metadata": {"name": "old"}, "involvedObject": {}, "reason": "x"})
        time.sleep(0.3)
        v1.create_namespaced_event("default", {"metadata": {"name": "new"}, "involvedObject": {}, "reason": "x"})
        assert [e["metadata"]["name"] for e in emu.list("events")] == ["new"]
        assert ("DELETED", "old") in [(t, e["metadata"]["name"]) for t, e in emu.changes("events")]


def test_generated_names_are_drawn_again_when_taken(emu, monkeypatch):
    import uuid as uuid_mod

    from tests.support import kube_emulator

    emu.add_pod("pod-aaaaa")
    draws = iter([uuid_mod.UUID("aaaaa000-0000-4000-8000-000000000000"),
                  uuid_mod.UUID("bbbbb000-0000-4000-8000-000000000000")])
    real = uuid_mod.uuid4
    monkeypatch.setattr(kube_emulator.uuid, "uuid4", lambda: next(draws, None) or real())
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    made = v1.create_namespaced_pod("default", {"metadata": {"generateName": "pod-"},
                                                "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert made.metadata.name == "pod-bbbbb"


def test_forbidden_fault(emu):
    v1 = k8s.CoreV1Api(api_client_for(emu.url))
    emu.add_pod("p")
    emu.faults.add("403", "get:pods", times=1)
    with pytest.raises(ApiException) as e:
        v1.read_namespaced_pod("p", "default")
    assert e.value.status == 403 and "forbidden" in json.loads(e.value.body)["message"]
    assert v1.read_namespaced_pod("p", "default").metadata.name == "p"


def test_answers_do_not_share_state_with_the_store(emu):
    emu.add_node("n")
    emu.add_pod("p", labels={"app": "a"})
    got = emu.get("pods", "p", "default")
    got["metadata"]["labels"]["app"] = "changed"
    emu.bind("default", "p", {"target": {"name": "n"}}, None)  # copy on write: the old version is untouched
    old = [e for t, e in emu.changes("pods") if t == "ADDED"][0]
    assert old["spec"].get("nodeName") is None and old["metadata"]["labels"] == {"app": "a"}
    new = emu.get("pods", "p", "default")
    assert new["spec"]["nodeName"] == "n" and new["metadata"]["labels"] == {"app": "a"}
    assert int(new["metadata"]["resourceVersion"]) > int(old["metadata"]["resourceVersion"])


def test_header_parsing_connection_handling_and_binding_times(emu):
    emu.add_node("n")
    emu.add_pod("p")
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=5)
    body = json.dumps({"target": {"name": "n"}}).encode()
    conn.putrequest("POST", "/api/v1/namespaces/default/pods/p/binding")
    conn.putheader("content-TYPE", "application/json")  # header names in any case
    conn.putheader("CONTENT-LENGTH", str(len(body)))
    conn.endheaders(body)
    r = conn.getresponse()
    assert r.status == 201 and not r.will_close
    r.read()
    conn.request("GET", "/version", headers={"Connection": "close"})
    r = conn.getresponse()
    assert r.status == 200 and r.will_close
    r.read()
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=5)
    conn._http_vsn, conn._http_vsn_str = 10, "HTTP/1.0"  # an HTTP/1.0 client: the server closes after answering
    conn.request("GET", "/emulator/bindings?namespace=default")
    r = conn.getresponse()
    times = json.loads(r.read())
    assert r.will_close and times["count"] == 1 and len(times["times"]) == 1
    conn.close()
    with socket.create_connection(("127.0.0.1", emu.port), timeout=5) as s:  # a malformed request line
        s.sendall(b"NONSENSE\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):  # the server answers 400 and closes, as http.server does
            data += chunk
        assert b"400" in data
