"""`joulesched extender`: any joulesched policy as a kube-scheduler extender (extender v1 JSON over HTTP).

kube-scheduler keeps doing the binding; for each pod it POSTs ``ExtenderArgs`` to ``{urlPrefix}/filter`` and
``{urlPrefix}/prioritize`` (reference.md section 2). The structs have no json tags, so keys are Go field
names: ``Pod``, ``Nodes`` (a NodeList, unless the extender is ``nodeCacheCapable``), ``NodeNames``.

- ``/filter`` answers ``{"Nodes"|"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}``. Nodes that
  fail on resources go to FailedNodes (preemption may help); unschedulable, tainted or non-matching nodes go
  to FailedAndUnresolvableNodes. Readiness is judged as kube-scheduler judges it (the cache's
  ``kube_readiness``): a NotReady node fails only a pod that does not tolerate ``node.kubernetes.io/not-ready``,
  so a tolerate-all pod that must run before any node is Ready (a CNI's DaemonSet, an operator such as
  tigera-operator) is never kept off a booting cluster by the extender (``serve``, which binds itself, never
  binds to a NotReady node). A node the cache does not know
  yet (just added, the watch behind) passes: kube-scheduler's own filters have already passed it, and
  rejecting it would send kube-scheduler preempting for nothing.
- While the cache is not synced, or has had no answer from the apiserver for ``stale_s`` (60 s), ``/filter``
  answers with its ``Error`` set and ``/prioritize`` with HTTP 503, and ``/healthz`` (= ``/readyz``) fails: with
  ``ignorable: true`` (deploy/kubernetes/scheduler-config.yaml) kube-scheduler then schedules without the
  extender instead of with a view of the cluster that may be minutes old.
- ExtenderArgs that are not valid (invalid JSON, a node name that is not a non-empty string, a Pod no apiserver
  would accept: a non-finite, negative or non-numeric quantity, a ``hostPort`` outside 0..65535) get
  ``/filter``'s ``Error`` field or HTTP 400 on ``/prioritize``, saying why; every request gets an answer.
- ``/prioritize`` answers ``[{"Host": name, "Score": 0..10}]``: the policy's own node scores (kube plugin
  totals, DQN advantages, negative marginal watts) scaled linearly so its favourite node gets 10 and its least
  favourite 0. A policy that only picks gives its pick 10 and the others 0. A NotReady node (not asleep) scores
  0 where a Ready one is among the candidates.

The pods already on each node come from the same :class:`~joulesched.cluster.kube.cache.KubeCache` as ``serve``
uses (list + watch). Pods the scheduler bound a moment ago may not have reached the watch yet; kube-scheduler
calls the extender with its own up-to-date filter results, so this costs at most a slightly stale score.
"""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from joulesched.agent.policy import Policy
from joulesched.cluster.kube.cache import KubeCache
from joulesched.cluster.kube.objects import ObjectError, node_gate_reason, parse_pod
from joulesched.cluster.state import ClusterState
from joulesched.core.errors import UsageError
from joulesched.live.httpd import BackgroundHTTPServer, HardenedHandlerMixin, Limits, reply
from joulesched.live.ratelog import RateLimitedLog
from joulesched.live.scheduler import ATTEMPT_BUCKETS

log = logging.getLogger("joulesched.extender")

MAX_EXTENDER_SCORE = 10
#: The extender is served ``nodeCacheCapable`` (deploy/kubernetes/scheduler-config.yaml): kube-scheduler sends
#: node names, not Node objects (about 5 KB each), so a request is the Pod plus ~60 bytes a node: 4 MiB holds
#: 50,000 names and a large Pod. 32 connections x 4 MiB bounds what requests can hold at once to 128 MiB. A
#: scheduler configured without nodeCacheCapable still works up to ~800 nodes.
EXTENDER_LIMITS = Limits(timeout_s=10.0, max_connections=32, max_body=4 << 20)
VERBS = ("filter", "prioritize")
#: Seconds without an answer from the apiserver after which the cache counts as stale (``serve``'s
#: ``informer_stale_s``): the extender then answers with an error, which an ``ignorable`` extender's caller skips.
STALE_S = 60.0


class ExtenderError(UsageError):
    """A request that is not valid ExtenderArgs."""


class CacheUnavailable(Exception):
    """The cache is not synced yet, or stale: the extender cannot judge the cluster now."""


def _candidates(args: dict) -> tuple[list[str], list[dict] | None, bool]:
    if not isinstance(args, dict) or not isinstance(args.get("Pod"), dict):
        raise ExtenderError("ExtenderArgs needs a Pod object")
    names = args.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise ExtenderError("NodeNames must be a list of non-empty strings")
        return list(names), None, True
    nodes = args.get("Nodes")
    if isinstance(nodes, dict):
        items = nodes.get("items") or []
        if not isinstance(items, list) or not all(isinstance(n, dict) and isinstance(n.get("metadata") or {}, dict)
                                                  for n in items):
            raise ExtenderError("Nodes.items must be a list of Node objects")
        names = [(n.get("metadata") or {}).get("name") for n in items]
        # Names are the answer's keys and what /filter keeps items by: a list or a number there is no node name.
        bad = next((k for k, n in enumerate(names) if not isinstance(n, str) or not n), None)
        if bad is not None:
            raise ExtenderError(f"Nodes.items[{bad}].metadata.name must be a non-empty string, not "
                                f"{json.dumps(names[bad])[:60]}")
        return names, items, False
    raise ExtenderError("ExtenderArgs needs Nodes (a NodeList) or NodeNames")


#: The Pod's fields the scheduler reads that must be objects (or absent), and those that must be lists of objects.
_POD_OBJECTS = ("metadata", "spec", "status", "spec.resources", "spec.overhead", "spec.nodeSelector", "spec.affinity",
                "metadata.labels", "metadata.annotations")
_POD_LISTS = ("spec.containers", "spec.initContainers", "spec.tolerations")


def _field(obj: dict, dotted: str):
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _check_pod_shape(pod: dict) -> None:
    """Name the first field of a wrong JSON type (the parser would only say "'str' object has no attribute")."""
    for name in _POD_OBJECTS:
        v = _field(pod, name)
        if v is not None and not isinstance(v, dict):
            raise ExtenderError(f"malformed Pod: {name} must be an object, not {type(v).__name__}")
    for name in _POD_LISTS:
        v = _field(pod, name)
        if v is None:
            continue
        if not isinstance(v, list):
            raise ExtenderError(f"malformed Pod: {name} must be a list, not {type(v).__name__}")
        for i, item in enumerate(v):
            if not isinstance(item, dict):
                raise ExtenderError(f"malformed Pod: {name}[{i}] must be an object, not {type(item).__name__}")
            if name != "spec.tolerations":
                for sub in ("resources", "resources.requests", "resources.limits"):
                    w = _field(item, sub)
                    if w is not None and not isinstance(w, dict):
                        raise ExtenderError(f"malformed Pod: {name}[{i}].{sub} must be an object, not "
                                            f"{type(w).__name__}")


def _pod(args: dict):
    """The Pod of ExtenderArgs, parsed strictly; a malformed one (a list where an object belongs, a quantity or
    host port no apiserver accepts) is an ExtenderError."""
    if isinstance(args.get("Pod"), dict):
        _check_pod_shape(args["Pod"])
    try:
        return parse_pod(args["Pod"], strict=True)
    except ObjectError as e:
        raise ExtenderError(f"malformed Pod: {str(e)[:200]}") from None
    except (AttributeError, TypeError, KeyError, ValueError, ArithmeticError) as e:
        raise ExtenderError(f"malformed Pod: {type(e).__name__}: {str(e)[:200]}") from None


def scale_scores(raw: np.ndarray) -> np.ndarray:
    """Linear map of finite scores to integers 0..10 (best = 10); all equal → all 10; non-finite → 0."""
    raw = np.asarray(raw, dtype=np.float64)
    out = np.zeros(raw.shape, dtype=np.int64)
    ok = np.isfinite(raw)
    if not ok.any():
        return out
    lo, hi = raw[ok].min(), raw[ok].max()
    if hi <= lo:
        out[ok] = MAX_EXTENDER_SCORE
    else:
        out[ok] = np.rint((raw[ok] - lo) * MAX_EXTENDER_SCORE / (hi - lo)).astype(np.int64)
    return out


class Extender:
    """Filter and prioritize with a policy over the cache's cluster state."""

    def __init__(self, cache: KubeCache, policy: Policy, seed: int = 0, stale_s: float = STALE_S) -> None:
        self.cache, self.policy, self.stale_s = cache, policy, stale_s
        self.rng = np.random.default_rng(seed)
        self._epoch = -1
        if cache.sleep_aware:  # serve's: switching its readiness would hand serve NotReady nodes
            raise ValueError("the extender needs a cache of its own, not the scheduler's")
        cache.kube_readiness = True  # pass what kube-scheduler would place (see the module's docstring)
        attach = getattr(policy, "attach", None)
        if attach is not None:  # the DQN's lifetime predictor learns from the cache's pod events, as in serve
            attach(self)
        warm = getattr(policy, "warm", None)
        if warm is not None:  # compiled code built before the first request, not inside it
            warm()
        reg = cache.registry
        self.requests = Counter("joulesched_extender_requests", "Extender requests by verb and result.",
                                ["verb", "result"], registry=reg)
        self.duration = Histogram("joulesched_extender_request_duration_seconds", "Extender request time.",
                                  ["verb"], buckets=ATTEMPT_BUCKETS, registry=reg)
        self._warn = RateLimitedLog(log)

    def unavailable(self) -> str:
        """Why the cache cannot be trusted now ("" when it can): not synced yet, or no answer from the apiserver
        for more than :attr:`stale_s`."""
        if not self.cache.synced:
            return "the joulesched cache is not synced yet"
        stale = self.cache.stale_for()
        if stale > self.stale_s:
            return f"the joulesched cache has had no answer from the apiserver for {stale:.0f} s"
        return ""

    def _check(self) -> None:
        why = self.unavailable()
        if why:
            raise CacheUnavailable(why)

    def _state(self) -> ClusterState | None:
        st = self.cache.state()
        if st is not None and self.cache.epoch != self._epoch:
            self.policy.reset(st, self.rng)
            self._epoch = self.cache.epoch
        return st

    def filter(self, args: dict) -> dict:
        names, items, by_name = _candidates(args)
        pod = _pod(args)
        self._check()
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        with self.cache.lock:
            st = self._state()
            mask = self.cache.feasible(pod) if st is not None else np.zeros(0, dtype=bool)
            index = {n: i for i, n in enumerate(st.names)} if st is not None else {}
            for name in names:
                i = index.get(name)
                if i is None or mask[i]:  # unknown to the cache yet: kube-scheduler's filters passed it
                    passed.append(name)
                else:
                    gate = node_gate_reason(self.cache.nodes[name], pod, self.cache.node_filters)
                    if gate:
                        unresolvable[name] = gate
                    else:
                        failed[name] = ", ".join(st.filter_reasons(i, pod.request))
        keep = set(passed)
        return {"Nodes": None if by_name else {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                                               "items": [n for n in items or [] if
                                                         (n.get("metadata") or {}).get("name") in keep]},
                "NodeNames": passed if by_name else None,
                "FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}

    def prioritize(self, args: dict) -> list[dict]:
        names, _, _ = _candidates(args)
        pod = _pod(args)
        self._check()
        with self.cache.lock:
            st = self._state()
            if st is None:
                return [{"Host": n, "Score": 0} for n in names]
            index = {n: i for i, n in enumerate(st.names)}
            known = [n for n in names if n in index]
            idx = np.array([index[n] for n in known], dtype=np.int64)
            feasible = self.cache.feasible(pod)
            cand = np.zeros(len(st), dtype=bool)
            cand[idx] = True
            cand &= feasible
            scores: dict[str, int] = {n: 0 for n in names}
            use = idx[cand[idx]]
            # Filter passes a NotReady node to a pod tolerating the not-ready taint, as kube does; but a policy that
            # likes empty nodes would rank a dead one first. Where a Ready (or sleeping) candidate exists, the
            # NotReady ones score 0 (kube still decides; with no Ready node at all, bootstrap, they are scored).
            down = np.array([not (i.ready or i.asleep) for i in map(self.cache.node_info, use.tolist())], dtype=bool)
            if down.any() and not down.all():
                use = use[~down]
            if use.size:
                # The policy picks among the nodes scored: handed the NotReady ones too, a pick-only policy took
                # one, and every Ready node then scored alike (a review).
                mask = np.zeros(len(st), dtype=bool)
                mask[use] = True
                raw = self._raw_scores(st, pod.request, use, mask, pod.meta)
                for k, s in zip(use, scale_scores(raw)):
                    scores[st.names[k]] = int(s)
        return [{"Host": n, "Score": scores[n]} for n in names]

    def _raw_scores(self, st: ClusterState, req, idx: np.ndarray, mask: np.ndarray, meta=None) -> np.ndarray:
        """The policy's own totals over ``idx`` (its Scorer), or 1 for its pick and 0 elsewhere; a policy that
        reads the pod's metadata (its CPU limit, its kind) is handed it, as ``serve`` hands it to ``choose``."""
        if idx.size == 1:
            return np.ones(1)
        kw = {"meta": meta} if getattr(self.policy, "uses_meta", False) else {}
        scorer = self.policy.scorer
        if scorer is not None:
            return np.asarray(scorer.node_scores(st, req, idx, **kw).total, dtype=np.float64)
        pick = int(self.policy.choose(st, req, mask, **kw))
        return (idx == pick).astype(np.float64)

    def handle(self, verb: str, args: Any) -> tuple[int, Any]:
        """(HTTP status, JSON body) for one request; nothing raises: bad ExtenderArgs (invalid JSON too: an
        :class:`InvalidJSON`) are 400 (``Error`` on /filter), a bug 500, both counted as ``result="error"``."""
        t0 = time.perf_counter()
        result = "ok"
        try:
            if verb == "filter":
                try:
                    if isinstance(args, InvalidJSON):
                        raise ExtenderError(str(args))
                    return 200, self.filter(args)
                except (ExtenderError, CacheUnavailable) as e:  # filter errors travel in the Error field
                    result = "error" if isinstance(e, ExtenderError) else "unavailable"
                    return 200, {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                                 "FailedAndUnresolvableNodes": {}, "Error": str(e)}
            try:
                if isinstance(args, InvalidJSON):
                    raise ExtenderError(str(args))
                return 200, self.prioritize(args)
            except ExtenderError as e:
                result = "error"
                return 400, {"Error": str(e)}
            except CacheUnavailable as e:  # a HostPriorityList has no Error field: kube-scheduler ignores the scores
                result = "unavailable"
                return 503, {"Error": str(e)}
        except Exception as e:  # a bug: still an answer (kube-scheduler would wait out its timeout), counted
            result = "error"
            self._warn.warn(f"internal:{verb}", "extender %s failed: %s: %s", verb, type(e).__name__, str(e)[:200])
            log.debug("extender %s failed", verb, exc_info=True)
            return 500, {"Error": f"internal error: {type(e).__name__}"}
        finally:
            self.requests.labels(verb, result).inc()
            self.duration.labels(verb).observe(time.perf_counter() - t0)


class InvalidJSON(str):
    """A request body that is not JSON, handed to :meth:`Extender.handle` as its arguments, which answers it as
    any bad ExtenderArgs (the Error field on /filter, 400 on /prioritize) and counts it."""


class ExtenderServer(BackgroundHTTPServer):
    """HTTP front: ``POST /filter``, ``POST /prioritize``, ``GET /healthz``, ``GET /metrics``."""

    def __init__(self, extender: Extender, host: str = "127.0.0.1", port: int = 8888,
                 limits: Limits = EXTENDER_LIMITS) -> None:
        ext = extender

        class H(HardenedHandlerMixin, BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *a: Any) -> None:
                pass

            def _send(self, code: int, data: bytes, ctype: str = "application/json") -> None:
                reply(self, code, data, ctype)

            def do_POST(self) -> None:
                verb = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
                if verb not in VERBS:  # before reading: an unknown path costs no body (its connection is closed)
                    self._send(404, b'{"Error":"unknown verb; use /filter or /prioritize"}')
                    return
                raw = self.read_body()  # Content-Length checked by the hardened base (400 / 413)
                try:
                    args: Any = json.loads(raw or b"null")
                except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
                    args = InvalidJSON(f"invalid JSON: {str(e)[:200]}")  # answered and counted as bad args are
                code, body = ext.handle(verb, args)
                self._send(code, json.dumps(body, separators=(",", ":")).encode())

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    self._send(200, generate_latest(ext.cache.registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz", "/livez"):
                    why = ext.unavailable()
                    self._send(503 if why else 200, why.encode() if why else b"ok", "text/plain")
                else:
                    self._send(404, b"not found", "text/plain")

        super().__init__(H, host, port, "extender-server", limits)
