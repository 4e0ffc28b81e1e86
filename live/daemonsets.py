"""Is a pod that says it belongs to a DaemonSet really one of its pods?

The node power controller lets DaemonSet pods (and mirror pods) keep no node awake and never evicts them: every
node runs some (kube-proxy, the CNI, the power exporter). But the controller reference is written by whoever
creates the pod, so a workload pod could claim a DaemonSet and have its node switched off under it. Before a
pod's word counts, :class:`DaemonSetCheck` reads the DaemonSet it names (``apps/v1``, ``get``) and requires
the same uid and a selector that selects the pod, as ``kubectl drain`` and the cluster-autoscaler look the
controller up before they skip a DaemonSet pod. A pod that passes and is not really the DaemonSet's is one
the DaemonSet controller itself deletes (it keeps one pod per node, on the nodes it targets).

What remains trusted: whoever may create DaemonSets (the built-in ``edit`` role, in its namespace) can make a
pod keep no node awake, by making it a real DaemonSet's; and mirror pods are taken at the kubelet's annotation
(nothing on the API says who created a pod).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from joulesched.cluster.kube.objects import PodInfo, selector_matches

log = logging.getLogger(__name__)

#: Seconds a DaemonSet read stays good for the controller's passes (the last check before a sleep reads afresh).
TTL_S = 60.0
#: Seconds a failed read (RBAC, an error, a timeout) is not retried by the passes: one GET per DaemonSet per
#: this long, not one per pod per pass, while the answer is "unknown".
FAIL_TTL_S = 10.0
_UNKNOWN = object()


class DaemonSetCheck:
    """Answers whether a pod may keep no node awake: a mirror pod, or a pod of the DaemonSet it names."""

    def __init__(self, api_client: k8s.ApiClient, timeout_s: float, ttl_s: float = TTL_S,
                 fail_ttl_s: float = FAIL_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.apps = k8s.AppsV1Api(api_client)
        self.timeout_s, self.ttl_s, self.fail_ttl_s, self.clock = timeout_s, ttl_s, fail_ttl_s, clock
        # (namespace, name) -> (read at, uid or "" when it does not exist, its selector), or (failed at, _UNKNOWN)
        self._seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._warned: set[str] = set()

    def _read(self, namespace: str, name: str, fresh: bool) -> tuple[str, Any] | None:
        key, now = (namespace, name), self.clock()
        hit = self._seen.get(key)
        if hit is not None and not fresh:
            if hit[1] is _UNKNOWN:
                if now - hit[0] < self.fail_ttl_s:
                    return None
            elif now - hit[0] < self.ttl_s:
                return hit[1], hit[2]
        if len(self._seen) > 10_000:  # bounded: DaemonSets are few, names that were never one need not be kept
            self._seen.clear()
        try:
            resp = self.apps.read_namespaced_daemon_set(name, namespace, _preload_content=False,
                                                        _request_timeout=self.timeout_s)
            obj = json.loads(resp.data)
            got = (str((obj.get("metadata") or {}).get("uid") or ""), (obj.get("spec") or {}).get("selector"))
        except ApiException as e:
            if e.status != 404:
                return self._failed(key, f"HTTP {e.status}")
            got = ("", None)
        except Exception as e:  # a timeout or a dropped connection: unknown, not "absent"
            return self._failed(key, str(e) or type(e).__name__)
        if hit is not None and hit[1] is _UNKNOWN:
            self._warned.discard(f"ds/{namespace}/{name}")  # a later failure is told again
            log.info("DaemonSet %s/%s can be read again", namespace, name)
        self._seen[key] = (self.clock(), *got)
        return got

    def _failed(self, key: tuple[str, str], why: str) -> None:
        # Also over a good entry: a fresh read that fails must not leave the passes trusting the last minute's.
        self._seen[key] = (self.clock(), _UNKNOWN)
        self._warn(f"ds/{key[0]}/{key[1]}", "cannot read DaemonSet %s/%s (%s): its pods keep their nodes awake until "
                   "it can be read (the controller's role needs get on apps daemonsets)", key[0], key[1], why)
        return None

    def keeps_no_node_awake(self, pod: PodInfo, fresh: bool = False) -> bool | None:
        """True: a mirror pod, or the DaemonSet its controller reference names exists with that uid and selects
        it. False: it is a workload pod (no such DaemonSet, another uid, not selected, or no claim at all).
        None: the DaemonSet could not be read (the caller decides on the safe side). ``fresh``: read the
        DaemonSet now, not from the last minute's reads."""
        if pod.mirror:
            return True
        if not pod.daemon or not pod.daemonset:
            return False
        name, uid = pod.daemonset
        got = self._read(pod.namespace, name, fresh)
        if got is None:
            return None
        ok = bool(uid) and got[0] == uid and selector_matches(got[1], pod.labels, empty_matches=False)
        if not ok:
            self._warn(pod.uid, "pod %s names DaemonSet %s (uid %s) as its controller, but no such DaemonSet selects "
                       "it: it counts as a workload pod (it keeps its node awake and is not evicted)",
                       pod.key, name, uid or "none")
        return ok

    def _warn(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            if len(self._warned) > 10_000:
                self._warned.clear()
            self._warned.add(key)
            log.warning(msg, *args)
