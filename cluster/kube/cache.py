"""The live backend: a ClusterState kept current from the Kubernetes API (list + watch) and Prometheus.

Nodes give allocatable cpu, memory and pod slots and, through labels or annotations, a power curve (see
:class:`~cluster.kube.objects.CurveResolver`). Pods give requests: every non-terminated pod bound to a node is
accounted on it, like kube-scheduler's cache. A pod the scheduler has just bound is *assumed* on its node
until the watch confirms it, so back-to-back decisions never overcommit a node. A pod waiting for the sleeping
node it was nominated for is *reserved* there (counted on it for other pods, as kube-scheduler counts a
nominated pod's requests on its node), until it is decided again, bound or gone.

Threads: two informers and the optional Prometheus feed write; the scheduler reads. Everything that touches
the cache holds :attr:`KubeCache.lock`; pod listeners are called with it held and must only enqueue.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, Gauge

from joulesched.cluster.kube.informer import Informer
from joulesched.cluster.kube.metrics_feed import FeedConfig, PrometheusFeed
from joulesched.cluster.filters import KUBE_NODE_FILTERS, NODE_FILTERS, FilterChain, NodeFilter
from joulesched.cluster.kube.objects import CurveResolver, NodeInfo, PodInfo, parse_node, parse_pod
from joulesched.cluster.state import ASLEEP, WAKING, ClusterState, PodRequest
from joulesched.power.gpu import gpu_curve

log = logging.getLogger("joulesched.kube")

PodListener = Callable[[PodInfo | None, PodInfo | None], None]

#: Pods that count against capacity: kube-scheduler's informer excludes terminated pods the same way.
ACTIVE_PODS_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
NO_NODES_MESSAGE = "no nodes available to schedule pods"


def kube_unschedulable_message(n: int, reasons: Counter) -> str:
    """kube-scheduler's FitError text: ``0/N nodes are available: `` then ``"<count> <reason>"`` strings in
    sorted order (Go's sort.Strings), comma-separated, and a final period."""
    parts = sorted(f"{c} {r}" for r, c in reasons.items())
    return f"0/{n} nodes are available: {', '.join(parts)}." if parts else f"0/{n} nodes are available."


class KubeCache:
    """Cluster state from a live (or emulated) apiserver.

    :param api_client: a configured ``kubernetes.client.ApiClient``.
    :param curves: resolves each node's power curve.
    :param feed: the Prometheus feed; ``None`` or an empty URL = request-based usage only.
    :param registry: where the backend's gauges go.
    :param watch_timeout_s: server-side timeout of each watch request.
    """

    def __init__(self, api_client: k8s.ApiClient, *, curves: CurveResolver | None = None,
                 feed: FeedConfig | None = None, registry: CollectorRegistry | None = None,
                 watch_timeout_s: int = 300) -> None:
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.curves = curves or CurveResolver()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodInfo] = {}
        self._assumed: dict[str, str] = {}
        self._reserved: dict[str, str] = {}
        self._accounted: dict[str, tuple[str, PodRequest]] = {}
        self._tombstones: dict[str, int] = {}  # uid -> resourceVersion of its deletion, seen by a resync
        self._listeners: list[PodListener] = []
        self._change_listeners: list[Callable[[], None]] = []
        self._state: ClusterState | None = None
        self._index: dict[str, int] = {}
        self._sleep_aware = False
        self._kube_readiness = False
        self._sleep_model: tuple[float, float] | None = None
        self._sleeper: Callable[[NodeInfo], bool] | None = None
        self._dirty = True
        self.epoch = 0
        self._cpu_frac: dict[str, float] = {}
        self._watts: dict[str, float] = {}
        self._m_frac = np.zeros(0)
        self._m_any = False  # some node has a measured CPU fraction
        self._m_base_req = np.zeros(0)
        #: Each node's requested CPU when the measurement was taken: what was bound since is added to it. Kept by
        #: node name, so that a rebuild (a label, a taint, a node added) keeps it until the next scrape.
        self._m_base_by_node: dict[str, float] = {}
        self._m_rebase = False  # a new measurement came: take the requests as they are now as its baseline
        self._t0 = time.monotonic()
        self._nodes_gauge = Gauge("joulesched_cache_nodes", "Nodes in the scheduler's cache.", registry=self.registry)
        self._pods_gauge = Gauge("joulesched_cache_pods", "Non-terminated pods in the scheduler's cache.",
                                 registry=self.registry)
        self.node_informer = Informer("nodes", self.core.list_node, self._replace_nodes, self._node_event,
                                      watch_timeout_s=watch_timeout_s)
        self.pod_informer = Informer("pods", self.core.list_pod_for_all_namespaces, self._replace_pods,
                                     self._pod_event, watch_timeout_s=watch_timeout_s,
                                     on_events=self._pod_events, field_selector=ACTIVE_PODS_SELECTOR)
        self.feed = PrometheusFeed(feed or FeedConfig(), self._apply_metrics, self.registry)

    # ---- lifecycle ----
    def add_pod_listener(self, fn: PodListener) -> None:
        with self.lock:
            self._listeners.append(fn)

    def add_change_listener(self, fn: Callable[[], None]) -> None:
        """``fn()`` after any node or pod change (a subscriber such as the node power controller). Called
        with :attr:`lock` held: it must only take note (set a flag, notify a condition)."""
        with self.lock:
            self._change_listeners.append(fn)

    def _changed(self) -> None:
        for fn in self._change_listeners:
            fn()

    def observe_node(self, obj: dict) -> None:
        """A Node object this process just wrote: applied now if newer than the cache's (the watch will say
        the same a moment later; acting on it at once spares a subscriber a stale pass)."""
        info = parse_node(obj, self.curves)
        with self.lock:
            cur = self.nodes.get(info.name)
            if cur is not None and info.rv and cur.rv and info.rv < cur.rv:
                return
            self._store_node(info)

    def start(self) -> "KubeCache":
        self.node_informer.start()
        self.pod_informer.start()
        self.feed.start()
        return self

    def wait_synced(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        for inf in (self.node_informer, self.pod_informer):
            if not inf.synced.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    @property
    def synced(self) -> bool:
        return self.node_informer.synced.is_set() and self.pod_informer.synced.is_set()

    def stale_for(self) -> float:
        """Seconds the longer-disconnected informer has gone without an answer (0 while both watches are open)."""
        return max(self.node_informer.stale_for(), self.pod_informer.stale_for())

    def stop(self) -> None:
        self.feed.stop()
        self.pod_informer.stop()
        self.node_informer.stop()

    # ---- node cache ----
    def _replace_nodes(self, items: list[dict]) -> None:
        with self.lock:
            fresh = {}
            for obj in items:
                info = parse_node(obj, self.curves)
                fresh[info.name] = info
            if fresh != self.nodes:
                self._dirty = True
            self.nodes = fresh  # (also when equal: heartbeats and resourceVersions are not compared)
            self._nodes_gauge.set(len(self.nodes))
            self._changed()

    def _store_node(self, info: NodeInfo) -> None:
        if self.nodes.get(info.name) != info:  # heartbeats that change nothing we use cost no rebuild
            self._dirty = True
        self.nodes[info.name] = info
        self._changed()

    def _node_event(self, etype: str, obj: dict) -> None:
        with self.lock:
            name = (obj.get("metadata") or {}).get("name", "")
            if etype == "DELETED":
                if self.nodes.pop(name, None) is not None:
                    self._dirty = True
                self._changed()
            else:
                info = parse_node(obj, self.curves)
                cur = self.nodes.get(name)
                if cur is None or not (info.rv and cur.rv and info.rv < cur.rv):  # our own writes may be newer
                    self._store_node(info)
            self._nodes_gauge.set(len(self.nodes))

    # ---- pod cache ----
    def _replace_pods(self, items: list[dict]) -> None:
        with self.lock:
            self._tombstones.clear()
            fresh = {}
            for obj in items:
                info = parse_pod(obj)
                if info.uid:
                    fresh[info.uid] = info
            for uid in [u for u in self.pods if u not in fresh]:
                self._set_pod(uid, None)
            for uid, info in fresh.items():
                self._set_pod(uid, info)

    def _pod_event(self, etype: str, obj: dict) -> None:
        info = parse_pod(obj)
        if not info.uid:
            return
        with self.lock:
            if self._stale(info):
                return
            self._set_pod(info.uid, None if etype == "DELETED" or not info.active else info)

    def _pod_events(self, batch: list[tuple[str, dict]]) -> None:
        """A chunk of watch events: parsed outside the lock, applied under it once (the scheduler's decisions
        hold the same lock, so fewer hand-offs is more decisions)."""
        parsed = [(etype, parse_pod(obj)) for etype, obj in batch]
        with self.lock:
            for etype, info in parsed:
                if info.uid and not self._stale(info):
                    self._set_pod(info.uid, None if etype == "DELETED" or not info.active else info)

    def _stale(self, info: PodInfo) -> bool:
        """An event older than what a resync already put in the cache (or removed from it)."""
        if not info.rv:
            return False
        cur = self.pods.get(info.uid)
        if cur is not None and cur.rv and info.rv < cur.rv:
            return True
        dead = self._tombstones.get(info.uid)
        return dead is not None and info.rv <= dead

    def resync_pods(self) -> None:
        """A fresh consistent list of pods, merged into the cache (newer versions win). A new leader calls it
        before its first decision, so that bindings its predecessor made just before handing over are counted
        even when this replica's watch is lagging."""
        resp = self.core.list_pod_for_all_namespaces(field_selector=ACTIVE_PODS_SELECTOR, _preload_content=False,
                                                     _request_timeout=30)
        data = json.loads(resp.data)
        list_rv = int(data["metadata"]["resourceVersion"]) if str(data["metadata"].get("resourceVersion", "")).isdigit() else 0
        with self.lock:
            fresh = {}
            for obj in data.get("items") or []:
                info = parse_pod(obj)
                if info.uid:
                    fresh[info.uid] = info
            for uid, cur in list(self.pods.items()):
                if uid not in fresh and list_rv and cur.rv and cur.rv <= list_rv:
                    self._tombstones[uid] = list_rv
                    self._set_pod(uid, None)
            for uid, info in fresh.items():
                if not self._stale(info):
                    self._set_pod(uid, info)

    def _set_pod(self, uid: str, info: PodInfo | None) -> None:
        old = self.pods.get(uid)
        if info is None:
            self.pods.pop(uid, None)
            self._assumed.pop(uid, None)
            self._reserved.pop(uid, None)
        else:
            self.pods[uid] = info
            if info.node_name:
                self._assumed.pop(uid, None)  # the binding is confirmed: account where it really is
                self._reserved.pop(uid, None)
        self._reaccount(uid)
        self._pods_gauge.set(len(self.pods))
        if old is None and info is None:
            return
        for fn in self._listeners:
            fn(old, info)
        self._changed()

    def _reaccount(self, uid: str) -> None:
        pod = self.pods.get(uid)
        node = (pod.node_name or self._assumed.get(uid) or self._reserved.get(uid, "")) if pod is not None else ""
        want = (node, pod.request) if node else None
        have = self._accounted.get(uid)
        if want == have:
            return
        st = None if self._dirty else self._state
        if have is not None:
            del self._accounted[uid]
            if st is not None and have[0] in self._index:
                st.unbind(self._index[have[0]], have[1], uid, strict=False)
        if want is not None:
            self._accounted[uid] = want
            if st is not None and want[0] in self._index:
                st.bind(self._index[want[0]], want[1], uid, strict=False)

    # ---- what the scheduler calls (with self.lock held) ----
    def assume(self, uid: str, node: str) -> None:
        """Account ``uid`` on ``node`` before the binding is confirmed by the watch."""
        self._assumed[uid] = node
        self._reaccount(uid)

    def is_assumed(self, uid: str) -> bool:
        """Bound (or being bound) by this scheduler, not yet confirmed by the watch."""
        return uid in self._assumed

    def forget(self, uid: str) -> None:
        """Undo :meth:`assume` (the binding failed or its outcome is unknown)."""
        if self._assumed.pop(uid, None) is not None:
            self._reaccount(uid)

    def reserve(self, uid: str, node: str) -> None:
        """Count pending ``uid`` on ``node``, the sleeping node it waits for, for every other pod's decision."""
        self._reserved[uid] = node
        self._reaccount(uid)

    def unreserve(self, uid: str | None = None) -> None:
        """Undo :meth:`reserve` for ``uid`` (it is decided again), or for every pod (None: leadership lost)."""
        for u in list(self._reserved) if uid is None else [uid]:
            if self._reserved.pop(u, None) is not None:
                self._reaccount(u)

    def reserved_on(self, node: str) -> list[str]:
        """The pods reserved on ``node``."""
        return [u for u, n in self._reserved.items() if n == node]

    def state(self) -> ClusterState | None:
        """The current ClusterState (rebuilt after node changes, which bump :attr:`epoch`); None without nodes."""
        if self._dirty:
            self._rebuild()
        st = self._state
        if st is None:
            return None
        if self._m_any:
            has = ~np.isnan(self._m_frac)
            req = st.req_cpu.astype(np.float64)
            st.usage_cpu = np.where(has, np.nan_to_num(self._m_frac) * st.alloc_cpu
                                    + np.maximum(0.0, req - self._m_base_req), req)
        else:  # no measurement at all (no Prometheus, or it is down): usage is the requests, copied in place
            np.copyto(st.usage_cpu, st.req_cpu, casting="unsafe")
        st.now = time.monotonic() - self._t0
        return st

    def _rebuild(self) -> None:
        self._dirty = False
        self.epoch += 1
        names = sorted(self.nodes)
        if not names:
            self._state, self._index = None, {}
            return
        infos = [self.nodes[n] for n in names]
        st = ClusterState(names, [i.cpu_m for i in infos], [i.memory_mib for i in infos],
                          [i.max_pods for i in infos], [i.curve for i in infos], traits=[i.traits for i in infos],
                          chain=FilterChain(wake_sleeping=self._sleep_aware, node_filters=self.node_filters),
                          **self._sleep_kwargs(infos),
                          **_gpu_kwargs(infos), named_alloc=[i.named_alloc for i in infos])
        self._index = {n: k for k, n in enumerate(names)}
        for uid, (node, req) in self._accounted.items():
            if node in self._index:
                st.bind(self._index[node], req, uid, strict=False)
        for k, i in enumerate(infos):
            if i.asleep:
                st.power_state[k] = WAKING if i.waking else ASLEEP
        self._state = st
        self._refresh_metric_arrays()

    def node_info(self, i: int) -> NodeInfo:
        assert self._state is not None
        return self.nodes[self._state.names[i]]

    def _sleep_kwargs(self, infos: list[NodeInfo]) -> dict:
        if self._sleep_model is None:
            return {}
        watts, wake_s = self._sleep_model
        # A node power controller puts an idle node to sleep unless it is protected (control plane, never-sleep)
        # or, where one shares this cache, unless that controller says it will not (no power address, delegated).
        ok = self._sleeper
        return dict(sleep_watts=[watts] * len(infos), wake_s=wake_s, can_sleep=True,
                    may_sleep=[not (i.never_sleep or i.control_plane) and (ok is None or ok(i)) for i in infos])

    @property
    def sleep_model(self) -> tuple[float, float] | None:
        """(watts of a sleeping node, seconds a node takes to wake) where a node power controller puts idle nodes
        to sleep; None (the default): nodes never sleep. The state's ``can_sleep``, ``sleep_watts``, ``wake_s``
        and ``may_sleep`` follow it as the twin's follow its scenario's idle policy, so a policy trained in the
        twin (the DQN's sleep-saving and wake-time columns, ``empty=asleep``) sees the cluster it was trained on."""
        return self._sleep_model

    @sleep_model.setter
    def sleep_model(self, value: tuple[float, float] | None) -> None:
        if value is not None:
            watts, wake_s = float(value[0]), float(value[1])
            if not (watts >= 0.0 and wake_s >= 0.0):
                raise ValueError(f"sleep model {value!r}: watts and wake seconds must be >= 0")
            value = (watts, wake_s)
        with self.lock:
            if value != self._sleep_model:
                self._sleep_model = value
                self._dirty = True

    @property
    def sleeper(self) -> Callable[[NodeInfo], bool] | None:
        """Which nodes the node power controller sharing this cache would put to sleep (``NodeInfo -> bool``; None:
        every node not protected): the state's ``may_sleep`` reads it. The controller sets it and calls
        :meth:`sleepers_changed` when its answer changes (a node's power address resolved or refused)."""
        return self._sleeper

    @sleeper.setter
    def sleeper(self, fn: Callable[[NodeInfo], bool] | None) -> None:
        with self.lock:
            self._sleeper = fn
            self._dirty = True

    def sleepers_changed(self) -> None:
        """The :attr:`sleeper`'s answers changed: the next state is built anew."""
        with self.lock:
            self._dirty = True

    @property
    def sleep_aware(self) -> bool:
        """Sleeping nodes pass the filters as they will be once awake (the scheduler then waits for them);
        False (the default): they are gated by their taint, cordon and Ready condition like any other node
        (NodeReady keeps out only the NotReady nodes that are not asleep, whether sleep-aware or not, unless
        :attr:`kube_readiness`).
        The filter chain's PowerState profile: changing it rebuilds the state."""
        return self._sleep_aware

    @sleep_aware.setter
    def sleep_aware(self, value: bool) -> None:
        with self.lock:
            if bool(value) != self._sleep_aware:
                self._sleep_aware = bool(value)
                self._dirty = True

    @property
    def kube_readiness(self) -> bool:
        """Readiness as kube-scheduler judges it (:data:`~joulesched.cluster.filters.KUBE_NODE_FILTERS`): a
        NotReady node passes a pod that tolerates ``node.kubernetes.io/not-ready``. The extender's profile: it
        must not refuse what kube-scheduler would place (a CNI's or an operator's tolerate-all pod on a booting
        cluster). False (the default, ``serve``'s and the node power controller's): NodeReady keeps every
        NotReady node that is not asleep out. Changing it rebuilds the state."""
        return self._kube_readiness

    @kube_readiness.setter
    def kube_readiness(self, value: bool) -> None:
        with self.lock:
            if bool(value) != self._kube_readiness:
                self._kube_readiness = bool(value)
                self._dirty = True

    @property
    def node_filters(self) -> tuple[tuple[str, NodeFilter], ...]:
        """The node filters of this cache's profile (:attr:`kube_readiness`)."""
        return KUBE_NODE_FILTERS if self._kube_readiness else NODE_FILTERS

    def feasible(self, pod: PodInfo, st: ClusterState | None = None) -> np.ndarray:
        """Nodes that pass the filter chain for ``pod`` (:mod:`joulesched.cluster.filters`): NodeUnschedulable,
        TaintToleration, NodeAffinity (nodeSelector and required node affinity), NodeReady (no node NotReady
        without being asleep, i.e. down or booting; kube's taint alone under :attr:`kube_readiness`), PowerState, NodePorts and
        NodeResourcesFit (cpu, memory, pod count, GPUs, every other requested resource). ``st``: :meth:`state`'s
        answer, if the caller just had it."""
        st = self.state() if st is None else st
        if st is None:
            return np.zeros(0, dtype=bool)
        return st.feasible(pod.request)

    def node_awake(self, name: str) -> bool:
        """The node is Ready and not asleep or waking: a binding to it may go out."""
        info = self.nodes.get(name)
        return info is not None and info.ready and not info.asleep

    def reasons(self, pod: PodInfo, i: int) -> list[str]:
        """Why node ``i`` fails ``pod`` (kube's wording); empty when it fits."""
        st = self.state()
        assert st is not None
        return st.filter_reasons(i, pod.request)

    def unschedulable_message(self, pod: PodInfo, st: ClusterState | None = None) -> str:
        """kube's FailedScheduling message for ``pod``: every node's :meth:`reasons`, counted in one pass over
        one state (:meth:`ClusterState.filter_reason_counts`); ``st`` as for :meth:`feasible`."""
        st = self.state() if st is None else st
        if st is None:
            return NO_NODES_MESSAGE
        return kube_unschedulable_message(len(st), st.filter_reason_counts(pod.request))

    def get_pod(self, uid: str) -> PodInfo | None:
        with self.lock:
            return self.pods.get(uid)

    # ---- Prometheus ----
    def _apply_metrics(self, cpu_frac: dict[str, float], watts: dict[str, float]) -> int:
        """A new measurement; returns how many of the cache's nodes it names (the feed reports a measurement
        whose samples name none of them, a relabelling that does not give node names, as a fallback)."""
        with self.lock:
            self._cpu_frac = {k: min(max(v, 0.0), 1.0) for k, v in cpu_frac.items()}
            self._watts = dict(watts)
            self._m_rebase = True
            if not self._dirty and self._state is not None:
                self._refresh_metric_arrays()
            return sum(1 for n in set(cpu_frac) | set(watts) if n in self.nodes)

    def _refresh_metric_arrays(self) -> None:
        st = self._state
        assert st is not None
        self._m_frac = np.array([self._cpu_frac.get(n, np.nan) for n in st.names])
        self._m_any = bool((~np.isnan(self._m_frac)).any())
        req = st.req_cpu.astype(np.float64)
        if self._m_rebase:  # a new scrape: what is requested now is in its measurement
            self._m_rebase = False
            self._m_base_req = req.copy()
            self._m_base_by_node = dict(zip(st.names, self._m_base_req.tolist()))
        else:  # a rebuild between scrapes: what was bound since the last one stays added (by node name)
            base = self._m_base_by_node
            self._m_base_req = np.array([base.get(n, r) for n, r in zip(st.names, req.tolist())])
        #: Measured watts per node (NaN where Prometheus has none), for policies and reports that want it.
        st.measured_watts = np.array([self._watts.get(n, np.nan) for n in st.names])


def _gpu_kwargs(infos: list) -> dict:
    """The nodes' GPUs for ClusterState (nothing when none has any: the state of before)."""
    if not any(i.gpu_count for i in infos):
        return {}
    return dict(gpu_count=[i.gpu_count for i in infos], gpu_model=[i.gpu_model for i in infos],
                gpu_curves=[gpu_curve(i.gpu_model) if i.gpu_count else (0.0,) * 11 for i in infos])
