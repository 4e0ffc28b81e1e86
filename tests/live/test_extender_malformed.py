"""Malformed ExtenderArgs always get an answer, over real HTTP: a quantity or host port no apiserver accepts, a
JSON integer past Python's digit limit, a node name that is not a string, and a bug inside a verb. /filter says
why in ``Error``, /prioritize with HTTP 400 (500 for a bug), and the request counts as an error, never as ok.
Also the parsing underneath (cluster/kube/objects.py): non-finite quantities are refused, huge ones capped."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from joulesched.agent.registry import make_policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.kube.objects import (
    MAX_QUANTITY,
    CurveResolver,
    ObjectError,
    cpu_millis,
    parse_node,
    parse_pod,
    pod_host_ports,
    quantity_value,
)
from joulesched.live.extender import Extender, ExtenderServer
from tests.support.kube_emulator import make_node, make_pod


@pytest.fixture
def served(emu):
    emu.add_node("small", cpu="1", memory="1Gi")
    emu.add_node("big", cpu="8", memory="16Gi")
    cache = KubeCache(api_client_for(emu.url))
    cache.start()
    assert cache.wait_synced(10)
    ext = Extender(cache, make_policy("most-allocated"))
    srv = ExtenderServer(ext, "127.0.0.1", 0).start()
    yield ext, f"http://127.0.0.1:{srv.port}"
    srv.stop()
    cache.stop()


def _post(url: str, raw: bytes) -> tuple[int, object]:
    """(status, JSON answer); a connection closed without an answer raises (what the defects did)."""
    req = urllib.request.Request(url, data=raw, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _count(ext: Extender, verb: str, result: str) -> float:
    return ext.cache.registry.get_sample_value("joulesched_extender_requests_total",
                                               {"verb": verb, "result": result}) or 0.0


def _pod_body(edit, names=("small", "big")) -> bytes:
    pod = make_pod("p", cpu="1")
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    text = json.dumps({"Pod": pod, "NodeNames": list(names)})
    return edit(text).encode()


def _verbs_refuse(ext: Extender, url: str, raw: bytes, *words: str, code: int = 400) -> None:
    """/filter: 200 with Error naming ``words``; /prioritize: ``code``; both counted as errors, not ok."""
    ok = (_count(ext, "filter", "ok"), _count(ext, "prioritize", "ok"))
    err = (_count(ext, "filter", "error"), _count(ext, "prioritize", "error"))
    status, out = _post(url + "/filter", raw)
    assert status == (200 if code == 400 else code), out
    if status == 200:  # filter errors travel in the Error field
        assert out["NodeNames"] is None and out["Nodes"] is None and out["FailedNodes"] == {}
    assert all(w in out["Error"] for w in words), out["Error"]
    status, out = _post(url + "/prioritize", raw)
    assert status == code and all(w in out["Error"] for w in words), (status, out)
    assert (_count(ext, "filter", "ok"), _count(ext, "prioritize", "ok")) == ok
    assert (_count(ext, "filter", "error"), _count(ext, "prioritize", "error")) == (err[0] + 1, err[1] + 1)


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace('"cpu": "1"', '"cpu": "inf"'), ("cpu quantity", "'inf'", "not a finite number")),
    (lambda t: t.replace('"cpu": "1"', '"cpu": "Infinity"'), ("cpu quantity", "not a finite number")),
    (lambda t: t.replace('"cpu": "1"', '"cpu": 1e400'), ("cpu quantity", "not a finite number")),  # a float inf
    (lambda t: t.replace('"cpu": "1"', '"cpu": "1", "memory": "NaN"'), ("memory quantity",)),
    (lambda t: t.replace('"cpu": "1"', '"cpu": "1", "nvidia.com/gpu": "inf"'), ("nvidia.com/gpu quantity",)),
    (lambda t: t.replace('"cpu": "1"', '"cpu": "1", "example.com/x": "-Infinity"'), ("quantity", "finite")),
    (lambda t: t.replace('"cpu": "1"', '"cpu": "-5"'), ("cpu quantity", "'-5'", "negative")),
    (lambda t: t.replace('"cpu": "1"', '"cpu": "1", "memory": -1'), ("memory quantity", "negative")),
    (lambda t: t.replace('"cpu": "1"', '"cpu": true'), ("cpu quantity", "not a string or number")),
    (lambda t: t.replace('"cpu": "1"', '"cpu": {"x": 1}'), ("cpu quantity", "not a string or number")),
    (lambda t: t.replace('"ports"', '"resources": {"limits": {"cpu": "-1"}}, "ports"'), ("cpu quantity", "negative")),
    (lambda t: t.replace('"containers"', '"overhead": {"memory": "-1Mi"}, "containers"'), ("memory", "negative")),
    (lambda t: t.replace('"hostPort": 8080', '"hostPort": 1e400'), ("hostPort inf", "1..65535")),
    (lambda t: t.replace('"hostPort": 8080', '"hostPort": 70000'), ("hostPort 70000",)),
    (lambda t: t.replace('"hostPort": 8080', '"hostPort": -1'), ("hostPort -1",)),
    (lambda t: t.replace('"hostPort": 8080', '"hostPort": "8080"'), ("hostPort 8080", "port number")),
    (lambda t: t.replace('"hostPort": 8080', '"hostPort": true'), ("hostPort True",)),
], ids=["cpu-inf", "cpu-Infinity", "cpu-json-1e400", "memory-NaN", "gpu-inf", "extended--Infinity", "cpu-negative",
        "memory-negative-number", "cpu-true", "cpu-object", "limit-negative", "overhead-negative", "hostPort-1e400",
        "hostPort-70000", "hostPort--1", "hostPort-string", "hostPort-true"])
def test_a_pod_no_apiserver_would_accept_is_answered_as_malformed(served, edit, words):
    ext, url = served
    _verbs_refuse(ext, url, _pod_body(edit), "malformed Pod", *words)


@pytest.mark.parametrize("edit, words", [
    (lambda p: p.update(spec="x"), "spec must be an object, not str"),
    (lambda p: p["spec"].update(containers={"a": 1}), "spec.containers must be a list, not dict"),
    (lambda p: p["spec"]["containers"].append("sidecar"), "spec.containers[1] must be an object, not str"),
    (lambda p: p["spec"]["containers"][0].update(resources=[1]), "spec.containers[0].resources must be an object"),
    (lambda p: p["spec"]["containers"][0]["resources"].update(requests="1"),
     "spec.containers[0].resources.requests must be an object"),
    (lambda p: p["spec"].update(tolerations=["x"]), "spec.tolerations[0] must be an object"),
    (lambda p: p["metadata"].update(labels=["a"]), "metadata.labels must be an object, not list"),
], ids=["spec", "containers", "container", "resources", "requests", "toleration", "labels"])
def test_a_field_of_the_wrong_json_type_is_named(served, edit, words):
    """Said before: malformed Pod: AttributeError: 'str' object has no attribute 'get'."""
    ext, url = served
    pod = make_pod("p", cpu="1")
    edit(pod)
    _verbs_refuse(ext, url, json.dumps({"Pod": pod, "NodeNames": ["small", "big"]}).encode(), "malformed Pod",
                  words)


def test_the_pods_that_are_fine_still_pass(served):
    ext, url = served
    status, out = _post(url + "/filter", _pod_body(lambda t: t))
    assert status == 200 and out["Error"] == "" and out["NodeNames"] == ["small", "big"]
    # A huge but finite quantity is capped as kube caps it (2^63-1): the pod fits nowhere, answered at once.
    t0 = time.monotonic()
    status, out = _post(url + "/filter", _pod_body(lambda t: t.replace('"cpu": "1"', '"cpu": "1e999999999"')))
    assert status == 200 and out["Error"] == "" and out["FailedNodes"] == {"small": "Insufficient cpu",
                                                                          "big": "Insufficient cpu"}
    assert time.monotonic() - t0 < 5
    assert _count(ext, "filter", "ok") == 2 and _count(ext, "filter", "error") == 0


@pytest.mark.parametrize("raw", [b'{"Pod": {}, "NodeNames": ["big"], "x": ' + b"9" * 5000 + b"}", b"{not json",
                                 b"\xff\xfe"], ids=["integer-digit-limit", "syntax", "not-utf8"])
def test_invalid_json_is_answered_and_counted_as_bad_args(served, raw):
    """As docs/live.md says: the Error field on /filter, 400 on /prioritize, each counted as an error (a review:
    both were a 400 before the request was handled, and never counted). Python refuses an integer of more than
    4300 digits with a plain ValueError."""
    ext, url = served
    _verbs_refuse(ext, url, raw, "invalid JSON")


@pytest.mark.parametrize("nodes, words", [
    ({"Nodes": {"items": [{"metadata": {"name": ["x"]}}]}}, ('Nodes.items[0].metadata.name', '["x"]')),
    ({"Nodes": {"items": [{"metadata": {"name": "big"}}, {"metadata": {"name": 7}}]}}, ("Nodes.items[1]", "7")),
    ({"Nodes": {"items": [{"metadata": {"name": ""}}]}}, ("Nodes.items[0].metadata.name", "non-empty")),
    ({"Nodes": {"items": [{"metadata": {}}]}}, ("Nodes.items[0].metadata.name", "null")),
    ({"NodeNames": ["big", ""]}, ("NodeNames", "non-empty strings")),
], ids=["items-list-name", "items-int-name", "items-empty-name", "items-no-name", "NodeNames-empty"])
def test_node_names_must_be_non_empty_strings(served, nodes, words):
    ext, url = served
    _verbs_refuse(ext, url, json.dumps({"Pod": make_pod("p", cpu="1"), **nodes}).encode(), *words)


def test_a_bug_inside_a_verb_is_still_answered_and_counted(served, monkeypatch):
    ext, url = served

    def boom(pod):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ext.cache, "feasible", boom)
    _verbs_refuse(ext, url, _pod_body(lambda t: t), "internal error: RuntimeError", code=500)


# ---- the parsing underneath -----------------------------------------------------------------------------------
def test_non_finite_quantities_are_refused_and_huge_ones_capped():
    for q in ("inf", "Infinity", "-inf", "NaN", "sNaN", float("inf"), float("nan")):
        with pytest.raises(ObjectError, match="cpu quantity .* not a finite number"):
            cpu_millis(q)
        with pytest.raises(ObjectError, match="not a finite number"):
            quantity_value(q)
    t0 = time.monotonic()  # without the cap: a billion-digit integer
    assert quantity_value("1e999999999") == MAX_QUANTITY == 2**63 - 1
    assert cpu_millis(1e308) == (2**63 - 1) * 1000 and quantity_value("-1e400") == -(2**63 - 1)
    assert time.monotonic() - t0 < 1


def test_long_quantity_strings_are_parsed_but_never_kept():
    """The parse cache is keyed on the string: an extender caller's megabyte-long quantities would be held."""
    from joulesched.cluster.kube.objects import _cached_quantity, memory_mib

    _cached_quantity.cache_clear()
    long_q = "1" + "0" * 100_000
    assert cpu_millis(long_q) == MAX_QUANTITY * 1000 and memory_mib(long_q) > 0 and quantity_value(long_q) > 0
    assert cpu_millis("250m") == 250 and memory_mib("1Gi") == 1024
    assert _cached_quantity.cache_info().currsize == 2


def test_a_node_with_non_finite_allocatable_takes_no_pods_instead_of_raising():
    n = make_node("n", pods="Infinity")
    n["status"]["allocatable"]["nvidia.com/gpu"] = "inf"
    info = parse_node(n, CurveResolver())
    assert (info.max_pods, info.cpu_m, info.gpu_count) == (0, 0, 0)


def test_host_ports_are_ports_and_the_watch_still_takes_the_pod():
    spec = {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 0}, {"containerPort": 81}]}]}
    assert pod_host_ports(spec) == ()  # 0 or no hostPort: none
    spec["containers"][0]["ports"].append({"hostPort": float("inf")})
    with pytest.raises(ObjectError, match="container 'c': hostPort inf"):
        pod_host_ports(spec)
    pod = make_pod("p", cpu="1")
    pod["spec"]["containers"][0]["ports"] = [{"hostPort": 65536}]
    assert parse_pod(pod).request.cpu_m is None  # the watch: a request no apiserver stores counts as none
    with pytest.raises(ObjectError, match="hostPort 65536"):
        parse_pod(pod, strict=True)
