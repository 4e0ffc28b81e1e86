"""kube-scheduler's scheduler_perf **SchedulingBasic**, for `joulesched serve`, against the API emulator.

Upstream (test/integration/scheduler_perf/misc/performance-config.yaml): 5,000 nodes from
templates/node-default.yaml (4 CPU, 32 Gi, 110 pods, Ready; allocatable = capacity, as the apiserver defaults
it), then ``initPods`` pods scheduled unmeasured, then ``measurePods`` pods measured, all from
templates/pod-default.yaml (one pause container, port 80, requests = limits = 100m / 500Mi). Gates:
5000Nodes_10000Pods (1,000 init) >= 680 pods/s, 5000Nodes_50000Pods (5,000 init) >= 810 pods/s.

Here: the emulator (tests/support/kube_emulator.py, its own process) holds the nodes; a creator process posts
the pods over loopback HTTP at a steady rate (``--rate``) with ``schedulerName: joulesched``; the scheduler
(`live.scheduler.Scheduler`, what `serve` runs) places and binds them. Reported as scheduler_perf computes
SchedulingThroughput (util.go, throughputCollector): a 1 s ticker from the start of the measured creation;
the first tick that sees a bound pod only starts the clock; each later tick records (new bindings) / (time
since the last recorded tick), an interval with none is merged into the next one (recorded once per merged
second); average and the 50/90/95/99th percentiles of the sorted samples (index ceil(n·p/100) - 1). Bindings
are counted where they land, in the emulator. Attempt latency (decision + binding request) p50/p99 comes from
the scheduler's reservoir, measured pods only.

The ceiling: ``noop`` runs a binder with no decisions (each pending pod seen by the same informer is bound to
the next node round-robin) through the same client stack and window, against the same emulator, with the pods
created as fast as the emulator takes them (``--noop-rate 0``), so it measures the stack's capacity;
``noop+events`` also writes the Scheduled Event per pod that the scheduler writes, through the same recorder
(in its helper process, as serve runs it). CPU seconds of each
process over the measured phase show what bounds a figure (the scheduler's as ``scheduler + event writer``
when it writes its Events from a helper process, as serve does by default), and ``thread_cpu_us_per_pod`` (in
the JSON) the scheduler process's CPU per measured pod by thread (the loop, the pod informer, the binding
workers, an in-process Event recorder), from /proc: exact, with no sampling.

    .venv/bin/python bench/scheduler_perf.py                         # 5,000 nodes; 10k and 50k pods; noop, 4 policies
    .venv/bin/python bench/scheduler_perf.py --smoke                 # under 60 s: 1,000 nodes, 20,000 pods
    .venv/bin/python bench/scheduler_perf.py --policy default-k8s --pods 10000 --json out.json
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.procs import emulator_process, free_port  # noqa: E402

#: templates/pod-default.yaml
POD_TEMPLATE = {"apiVersion": "v1", "kind": "Pod", "metadata": {},
                "spec": {"schedulerName": "joulesched",
                         "containers": [{"image": "registry.k8s.io/pause:3.10.1", "name": "pause",
                                         "ports": [{"containerPort": 80}],
                                         "resources": {"limits": {"cpu": "100m", "memory": "500Mi"},
                                                       "requests": {"cpu": "100m", "memory": "500Mi"}}}]}}
#: ``@sample=P``: serve's sample_pct for a policy that does not sample itself (0 = kube's adaptive percentage);
#: the DQN samples itself (``sample=auto``: the nodes that matter to energy always in the sample, issue 28)
DEFAULT_POLICIES = ["default-k8s", "most-allocated", "awake-first", "dqn=models/v2.pt:sample=auto"]
INIT_PODS = {10000: 1000, 50000: 5000}  # upstream's initPods for each measurePods


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def thread_cpu_s() -> dict[str, float]:
    """utime + stime of each of this process's threads, seconds, summed by thread name with its number dropped
    (``bind-0`` .. ``bind-3`` are ``bind``); threads Python did not start are ``native``."""
    names = {t.native_id: t.name.rstrip("0123456789_-") for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            cpu = _stat_cpu_s(f"/proc/self/task/{tid}/stat")
        except OSError:  # the thread ended meanwhile
            continue
        name = names.get(int(tid), "native")
        out[name] = out.get(name, 0.0) + cpu
    return out


def _stat_cpu_s(path: str) -> float:
    """utime + stime of a process or thread, seconds, from its ``stat`` file (Linux /proc)."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


# ---- the creator (a subprocess: `scheduler_perf.py --create ...`) -------------------------------------------
def create_pods(port: int, namespace: str, count: int, rate: float, prefix: str, threads: int = 3) -> None:
    """POST ``count`` pods at ``rate`` per second (0 = as fast as the emulator takes them), over keep-alive
    connections, and print the monotonic time of the first request."""
    next_i = itertools.count()
    t0 = time.monotonic()
    errors = []

    def work() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while (i := next(next_i)) < count:
            if rate > 0:
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            pod = dict(POD_TEMPLATE, metadata={"name": f"{prefix}-{i}", "namespace": namespace})
            conn.request("POST", f"/api/v1/namespaces/{namespace}/pods", json.dumps(pod).encode(),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 201:
                errors.append(r.status)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    print(json.dumps({"t0": t0}), flush=True)
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps({"done": time.monotonic(), "errors": len(errors)}), flush=True)


def _start_creator(port: int, namespace: str, count: int, rate: float) -> tuple[subprocess.Popen, float]:
    p = subprocess.Popen([sys.executable, __file__, "--create", str(port), namespace, str(count), str(rate)],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True)
    return p, json.loads(p.stdout.readline())["t0"]


# ---- SchedulingThroughput, as scheduler_perf's throughputCollector ----------------------------------------
def scheduling_throughput(times: list[float], start: float, interval: float = 1.0) -> dict:
    """``times``: when each measured pod was bound; ``start``: when the collector started (the measured
    creation). Ticks every ``interval`` from ``start`` until the last binding."""
    times = sorted(times)
    samples: list[float] = []
    if not times:
        return {"samples": 0}
    k, started, last_count, last_t, skipped = 0, False, 0, start, 0
    tick = start
    while tick + interval <= times[-1] + 1e-9:
        tick += interval
        while k < len(times) and times[k] <= tick:
            k += 1
        if k == 0:
            continue
        if not started:
            started, last_count, last_t = True, k, tick
            continue
        new = k - last_count
        if new == 0:
            skipped += 1
            continue
        samples += [new / (tick - last_t)] * (skipped + 1)
        last_count, last_t, skipped = k, tick, 0
    if not samples:
        return {"samples": 0}
    samples.sort()
    n = len(samples)

    def perc(p: int) -> float:
        return samples[int(math.ceil(n * p / 100)) - 1]

    return {"samples": n, "average": sum(samples) / n, "perc50": perc(50), "perc90": perc(90),
            "perc95": perc(95), "perc99": perc(99)}


# ---- the no-op binder: the same informer, client and window; no decision -----------------------------------
class NoopBinder:
    """Binds each pending pod of ``scheduler_name`` to the next node round-robin, ``window`` requests in flight
    through :class:`FastClient`, optionally writing the Scheduled Event as the scheduler does."""

    def __init__(self, cache, window: int, events: bool, scheduler_name: str = "joulesched") -> None:
        from concurrent.futures import ThreadPoolExecutor

        from joulesched.cluster.kube.client import FastClient

        self.cache, self.events, self.name = cache, events, scheduler_name
        self.http = FastClient(cache.api)
        self.pool = ThreadPoolExecutor(window, thread_name_prefix="noop-bind")  # = the window in flight
        self.rr = itertools.count()
        self.nodes: list[str] | None = None
        self.seen: set[str] = set()
        self.recorder = None  # the Scheduled Events: serve's recorder, in its helper process as serve runs it
        if events:
            from prometheus_client import CollectorRegistry

            from joulesched.cluster.kube.client import client_source
            from joulesched.live.events import EventRecorder, EventWriterProcess
            from joulesched.live.scheduler import SchedulerMetrics

            metrics = SchedulerMetrics(CollectorRegistry())
            self.recorder = EventWriterProcess(
                client_source(cache.api), scheduler_name, "noop", metrics, lambda: math.inf, lambda uid: None,
                lambda: EventRecorder(self.http, scheduler_name, "noop", metrics))
        cache.add_pod_listener(self._on_pod)

    def _on_pod(self, old, new) -> None:  # called with the cache lock held: hand off only
        if new is None or new.node_name or new.scheduler_name != self.name or new.uid in self.seen:
            return
        self.seen.add(new.uid)
        if self.nodes is None:
            self.nodes = sorted(self.cache.nodes)
        self.pool.submit(self._bind, new.namespace, new.name, new.uid, self.nodes[next(self.rr) % len(self.nodes)])

    def _bind(self, ns: str, name: str, uid: str, node: str) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "Binding",
                           "metadata": {"name": name, "namespace": ns, "uid": uid},
                           "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
                          separators=(",", ":")).encode()
        r = self.http.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding", body)
        if r.status < 300 and self.recorder is not None:
            self.recorder.scheduled(ns, name, uid, node)

    def start(self) -> "NoopBinder":
        self.cache.start()
        return self

    def stop(self) -> None:
        self.pool.shutdown(wait=True)
        if self.recorder is not None:
            self.recorder.stop()
        self.cache.stop()
        self.http.close()


# ---- a sampling profile of this process's threads (--profile): where the scheduler's wall time goes ----------
class StackSampler:
    """Every ``interval`` s, the innermost frame of each of this process's threads (wall clock: waiting counts),
    by thread name; :meth:`report` lists the top frames per thread, and the "own code" frame under the waits
    (a thread blocked in a lock, a queue or a socket is shown as that). A stand-in for py-spy where it is not
    installed: it adds one thread that holds the GIL a few microseconds per sample."""

    WAITS = ("wait", "acquire", "get", "select", "poll", "recv_into", "readinto", "sleep", "accept", "_wait_for_tstate_lock")

    def __init__(self, interval: float = 0.005) -> None:
        from collections import Counter

        self.interval, self.counts, self.samples = interval, Counter(), 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, "?").rstrip("0123456789_-")
                f, own = frame, None
                while f is not None and own is None:  # the innermost frame in this repository
                    if "/joulesched/" in f.f_code.co_filename or str(ROOT) in f.f_code.co_filename:
                        own = f
                    f = f.f_back
                top = frame.f_code.co_name
                wait = top in self.WAITS
                where = own or frame
                site = f"{Path(where.f_code.co_filename).name}:{where.f_code.co_name}"
                self.counts[(name, ("wait in " if wait else "") + site)] += 1
            self.samples += 1

    def start(self) -> "StackSampler":
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def report(self, top: int = 12) -> dict:
        by_thread: dict[str, list] = {}
        for (name, site), c in self.counts.most_common():
            rows = by_thread.setdefault(name, [])
            if len(rows) < top:
                rows.append([site, round(c / max(self.samples, 1), 3)])
        return {"samples": self.samples, "share_of_wall_time": by_thread}


# ---- one run --------------------------------------------------------------------------------------------------
def _wait_bound(url: str, namespace: str, count: int, timeout: float, times: list[float]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = _get(f"{url}/emulator/bindings?namespace={namespace}&since={len(times)}")
        times += got["times"]
        if len(times) >= count:
            return True
        time.sleep(0.5)
    return False


def run(policy: str, nodes: int, init_pods: int, pods: int, rate: float, window: int, timeout: float,
        leader_elect: bool = False, profile: bool = False, batch: int = 8) -> dict:
    from joulesched.cluster.kube.cache import KubeCache
    from joulesched.cluster.kube.client import api_client_for

    port = free_port()
    sched = None
    creator = None
    with emulator_process("--nodes", str(nodes), "--node-cpu", "4", "--node-memory", "32Gi", "--quiet",
                          port=port) as (url, emu):
        try:
            cache = KubeCache(api_client_for(url))
            if policy in ("noop", "noop+events"):
                sched = NoopBinder(cache, window, events=policy == "noop+events").start()
            else:
                from joulesched.agent.registry import make_policy
                from joulesched.live.scheduler import Scheduler, ServeConfig

                spec, _, opt = policy.partition("@sample=")
                cfg = ServeConfig(leader_elect=leader_elect, lease_namespace="default", bind_workers=window,
                                  latency_reservoir=200_000, sample_pct=int(opt) if opt else None, batch=batch)
                sched = Scheduler(cache, make_policy(spec), cfg).start()
            if not cache.wait_synced(60):
                raise RuntimeError("the cache never synced")
            if init_pods:
                c, _ = _start_creator(port, "init", init_pods, 0)
                init_times: list[float] = []
                if not _wait_bound(url, "init", init_pods, timeout, init_times):
                    raise RuntimeError(f"{policy}: init pods not all bound within {timeout} s")
                c.wait(30)
            if hasattr(sched, "latency"):
                sched.latency.clear()
            writer = getattr(getattr(sched, "recorder", None), "proc", None)  # serve's Event writer process
            cpu0 = {"emulator": _cpu_s(emu.pid), "scheduler": time.process_time()}
            if writer is not None:
                cpu0["event_writer"] = _cpu_s(writer.pid)
            threads0 = thread_cpu_s()
            creator, t_start = _start_creator(port, "measure", pods, rate)
            sampler = StackSampler().start() if profile else None
            times: list[float] = []
            ok = _wait_bound(url, "measure", pods, timeout, times)
            wall = time.monotonic() - t_start
            if sampler is not None:
                sampler.stop()
            cpu = {"emulator": _cpu_s(emu.pid) - cpu0["emulator"], "scheduler": time.process_time() - cpu0["scheduler"]}
            if writer is not None:
                cpu["event_writer"] = _cpu_s(writer.pid) - cpu0["event_writer"]
            threads = thread_cpu_s()
            try:
                cpu["creator"] = _cpu_s(creator.pid)
            except OSError:
                cpu["creator"] = float("nan")
            tp = scheduling_throughput(times, t_start)
            out = {"policy": policy, "nodes": nodes, "init_pods": init_pods, "pods": pods, "rate": rate,
                   "window": window, "batch": batch, "bound": len(times), "complete": ok, "wall_s": wall,
                   "span_pods_per_s": (len(times) - 1) / (max(times) - min(times)) if len(times) > 1 else None,
                   "throughput": tp, "cpu_s": cpu,
                   "cpu_share": {k: v / wall for k, v in cpu.items()},
                   # the scheduler process's CPU per measured pod, by thread: where the no-op gap goes
                   "thread_cpu_us_per_pod": {k: round((v - threads0.get(k, 0.0)) / max(len(times), 1) * 1e6, 1)
                                             for k, v in threads.items() if v - threads0.get(k, 0.0) > 0}}
            if hasattr(sched, "latency"):
                lat = sched.latency
                out["attempt_ms"] = {"p50": lat.percentile(50) * 1e3, "p99": lat.percentile(99) * 1e3,
                                     "samples": lat.count}
                out["events_dropped"] = sched.metrics.events_dropped._value.get()
            if sampler is not None:
                out["profile"] = sampler.report()
            st = _get(url + "/emulator/stats")
            out["bound_twice"] = st["pods_bound_twice"]
            return out
        finally:
            if creator is not None:
                creator.kill()
                creator.wait()
            if sched is not None:
                sched.stop()


def _row(r: dict) -> str:
    tp, lat = r["throughput"], r.get("attempt_ms") or {}

    def f(v, d=0):
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"

    share = r["cpu_share"]
    writer = f" + {share['event_writer']:.2f}" if "event_writer" in share else ""
    return (f"| {r['policy']} | {r['nodes']} | {r['pods']} | {f(tp.get('average'))} | {f(tp.get('perc50'))} | "
            f"{f(tp.get('perc90'))} | {f(tp.get('perc99'))} | {f(lat.get('p50'), 2)} | {f(lat.get('p99'), 2)} | "
            f"{share['emulator']:.2f} / {share['scheduler']:.2f}{writer} / {share['creator']:.2f} | "
            f"{'yes' if r['complete'] else 'NO'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--policy", action="append", help="repeatable; also noop, noop+events (the ceiling); "
                    f"default: noop, noop+events, {', '.join(DEFAULT_POLICIES)}")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, action="append", help="measured pods, repeatable (default 10000, 50000)")
    ap.add_argument("--init-pods", type=int, default=None, help="unmeasured pods first (default: upstream's, "
                    "1,000 for 10k and 5,000 for 50k, else 10 %%)")
    ap.add_argument("--rate", type=float, default=1500, help="measured pods created per second (0: as fast as "
                    "the emulator takes them)")
    ap.add_argument("--noop-rate", type=float, default=0, help="creation rate of the noop runs (0: as fast as "
                    "the emulator takes them, so that they measure its capacity)")
    ap.add_argument("--window", type=int, default=4, help="binding requests in flight (serve --bind-workers)")
    ap.add_argument("--batch", type=int, default=8, help="decisions in a row under one hold of the cache lock "
                    "(serve --batch; 1: the lock per pod)")
    ap.add_argument("--timeout", type=float, default=600, help="per phase, seconds")
    ap.add_argument("--leader-elect", action="store_true", help="run the scheduler with leader election on")
    ap.add_argument("--smoke", action="store_true", help="under 60 s: 1,000 nodes, 500 + 20,000 pods, noop and "
                    "default-k8s")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--profile", action="store_true", help="sample every thread's stack during the measured "
                    "phase (StackSampler) and add the top frames per thread to each result")
    ap.add_argument("--create", nargs=4, metavar=("PORT", "NS", "COUNT", "RATE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.create:
        create_pods(int(a.create[0]), a.create[1], int(a.create[2]), float(a.create[3]), "pod")
        return
    if a.smoke:
        a.nodes, a.pods, a.init_pods = 1000, a.pods or [20000], 500 if a.init_pods is None else a.init_pods
        a.policy = a.policy or ["noop", "default-k8s"]
    policies = a.policy or ["noop", "noop+events", *DEFAULT_POLICIES]
    sizes = a.pods or [10000, 50000]
    results = []
    for n in sizes:
        init = a.init_pods if a.init_pods is not None else INIT_PODS.get(n, n // 10)
        for p in policies:
            rate = a.noop_rate if p.startswith("noop") else a.rate
            r = run(p, a.nodes, init, n, rate, a.window, a.timeout, a.leader_elect, a.profile, a.batch)
            results.append(r)
            print(json.dumps(r), flush=True)
    print()
    print("| policy | nodes | pods | pods/s avg | p50 | p90 | p99 | attempt p50 ms | attempt p99 ms | "
          "CPU emulator / scheduler (+ event writer) / creator | complete |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(_row(r))
    if a.json:
        from joulesched.core.fsio import atomic_write_text

        atomic_write_text(a.json, json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
