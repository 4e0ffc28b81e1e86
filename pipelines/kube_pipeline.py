"""The ``kube`` path of ``joulesched pipeline``: each policy in turn on a real cluster, measured.

For every policy: (1) create the workload as Pods rendered from ``workloads.manifests`` with the matching
``schedulerName`` (``default-scheduler`` for ``default-k8s``, ``joulesched`` for ours), (2) wait until they
are bound, (3) drive load against ``target`` with Locust or JMeter, (4) read the energy of the run window as
``sum(increase(joulesched_node_joules_total[W]))`` from Prometheus at the window's end and the service
quality from the load driver, (5) delete the pods and wait until none remain. Then results.json (the schema
of ``pipelines/benchmark.py``; there is no lower bound on a real cluster, so it is ``null``) and the report.

Every policy's measurement is a resumable stage writing ``DIR/runs/<policy>.json``; the report stage
assembles them. By default the pipeline runs our scheduler with policy P itself, in this process
(:class:`joulesched.live.daemon.SchedulerDaemon`), while P is measured, and waits for it to be ready.

With ``sleep`` (``--sleep``) the node power controller (:class:`joulesched.live.nodepower.NodePowerDaemon`)
runs beside the scheduler for every policy, so idle nodes sleep and pending pods wake them, and each run
records the nodes awake over its window as read from the cluster (nodes Ready and not asleep), which the
report plots.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import re
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from joulesched.cluster.nodepower import DEFAULT_SLEEP_WATTS, DEFAULT_WAKE_S
from joulesched.core.errors import UsageError
from joulesched.core.fsio import atomic_write_text, check_output_dir
from joulesched.pipelines.benchmark import write_outputs
from joulesched.pipelines.report import write_report
from joulesched.pipelines.results import SCHEMA_VERSION, Results, from_dict, load_results
from joulesched.pipelines.stages import Stage, StageRunner
from joulesched.power.energy_sources import SOURCES, EnergySource
from joulesched.power.prometheus import ENERGY_METRIC, PrometheusMeter, as_source

DEFAULT_SCHEDULER = "default-scheduler"
JOULESCHED_SCHEDULER = "joulesched"
HEADER = "Measured on a real cluster"
RUN_LABEL = "joulesched.io/pipeline-run"
POLICY_LABEL = "joulesched.io/policy"


class KubePipelineError(UsageError):
    """Bad arguments of the kube pipeline, or a cluster/Prometheus step that could not complete."""


def scheduler_name_for(policy: str) -> str:
    """``default-scheduler`` (kube-scheduler) for ``default-k8s``, else ``joulesched``."""
    return DEFAULT_SCHEDULER if policy == "default-k8s" else JOULESCHED_SCHEDULER


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return s[:20].strip("-") or "p"


def render_pods(policy: str, pods: int, apps: Sequence[str], run_id: str, namespace: str = "default",
                image: str | None = None) -> list[dict[str, Any]]:
    """``pods`` plain Pods, round-robin over ``apps``, each from its Deployment's pod template."""
    from joulesched.workloads.manifests import render

    sched = scheduler_name_for(policy)
    templates = {}
    for app in dict.fromkeys(apps):
        dep = next(o for o in render(app, scheduler_name=sched, image=image, namespace=namespace)
                   if o["kind"] == "Deployment")
        templates[app] = dep["spec"]["template"]
    out = []
    for i in range(pods):
        app = apps[i % len(apps)]
        tpl = copy.deepcopy(templates[app])
        meta = tpl.get("metadata", {})
        labels = {**meta.get("labels", {}), RUN_LABEL: run_id, POLICY_LABEL: _slug(policy)}
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"js-{run_id}-{_slug(policy)}-{app}-{i}", "namespace": namespace,
                                 "labels": labels},
                    "spec": tpl["spec"]})
    return out


def _drive_load(driver: str, target: str, seconds: int, users: int, workdir: Path):
    if driver == "locust":
        from joulesched.workloads.load import locust

        return locust.run(target, users=users, spawn_rate=max(1.0, float(users)), duration_s=seconds,
                          workdir=workdir)
    if driver == "jmeter":
        from joulesched.workloads.load import jmeter

        return jmeter.run(target, threads=users, rampup_s=0, duration_s=seconds, workdir=workdir)
    raise KubePipelineError(f"unknown load driver {driver!r}; use locust or jmeter")


def _ours(pod, names: set[str]) -> bool:
    return pod.metadata.name in names


def _wait(cond: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


@contextlib.contextmanager
def _log_to(log_path: Path) -> Iterator[None]:
    """joulesched's own log records (INFO and up) also go to ``log_path`` while the block runs: the in-process
    daemons' logs, kept beside each policy's run."""
    handler = logging.FileHandler(log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("joulesched")
    root.addHandler(handler)
    level = root.level
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


@contextlib.contextmanager
def our_scheduler(policy: str, kubeconfig: str, prometheus_url: str, log_path: Path,
                  start_timeout_s: float = 30.0, context: str | None = None,
                  energy_source: str = "joulesched", sleep: dict | None = None) -> Iterator[None]:
    """Run our scheduler with ``policy``, in this process, for the duration of one policy's run (kube-scheduler
    binds the default-k8s pods; every other policy is ours, so it must be the one binding
    ``schedulerName: joulesched``). Returns once it is ready (caches synced); its log goes to ``log_path``.
    With ``sleep`` (:func:`check_sleep`'s options) it is told that nodes sleep, as ``serve --node-power`` is."""
    if scheduler_name_for(policy) != JOULESCHED_SCHEDULER:
        yield
        return
    from joulesched.live.daemon import CacheOptions, SchedulerDaemon

    daemon = SchedulerDaemon(policy=policy, scheduler_name=JOULESCHED_SCHEDULER, listen="127.0.0.1:0",
                             leader_elect=False,
                             cache=CacheOptions(kubeconfig=kubeconfig, context=context, prometheus=prometheus_url,
                                                energy_source=energy_source,
                                                sleep_watts=None if sleep is None else float(sleep["sleep_watts"]),
                                                wake_s=DEFAULT_WAKE_S if sleep is None else float(sleep["wake_s"])))
    with _log_to(log_path), daemon:
        daemon.wait_ready(start_timeout_s)
        yield


#: What ``--sleep`` gives the node power controller unless told otherwise (docs/node-power.md); ``sleep_watts``
#: and ``wake_s`` also tell our scheduler that nodes sleep (the cache's sleep model: the view the twin trains on).
SLEEP_DEFAULTS = {"actuator": "none", "sleep_after_s": 60.0, "min_awake": 1, "sleep_watts": DEFAULT_SLEEP_WATTS,
                  "wake_s": DEFAULT_WAKE_S}


def check_sleep(sleep: dict | None) -> dict | None:
    """``sleep`` options filled with :data:`SLEEP_DEFAULTS` and checked before anything starts."""
    if sleep is None:
        return None
    from joulesched.cluster.nodepower import PowerPolicy
    from joulesched.live.actuators import NAMES

    unknown = set(sleep) - {*SLEEP_DEFAULTS, "credentials", "addresses", "libvirt_uri"}
    if unknown:
        raise KubePipelineError(f"unknown --sleep option {sorted(unknown)[0]!r}")
    opts = {**SLEEP_DEFAULTS, **sleep}
    if opts["actuator"] not in NAMES:
        raise KubePipelineError(f"--sleep-actuator {opts['actuator']!r}: known: {', '.join(NAMES)}")
    try:
        PowerPolicy(sleep_after_s=float(opts["sleep_after_s"]), min_awake=int(opts["min_awake"]))
        if not (float(opts["sleep_watts"]) >= 0 and float(opts["wake_s"]) >= 0):
            raise ValueError(f"sleep_watts and wake_s must be >= 0, got {opts['sleep_watts']} and {opts['wake_s']}")
    except (TypeError, ValueError) as e:
        raise KubePipelineError(f"--sleep: {e}") from None
    return opts


@contextlib.contextmanager
def node_power_controller(sleep: dict | None, kubeconfig: str, log_path: Path, context: str | None = None,
                          start_timeout_s: float = 30.0) -> Iterator[None]:
    """Run the node power controller (one replica, no Lease) in this process for one policy's run."""
    if sleep is None:
        yield
        return
    from joulesched.cluster.nodepower import PowerPolicy
    from joulesched.live.nodepower import NodePowerDaemon

    daemon = NodePowerDaemon(actuator=sleep["actuator"], kubeconfig=kubeconfig, context=context,
                             policy=PowerPolicy(sleep_after_s=float(sleep["sleep_after_s"]),
                                                min_awake=int(sleep["min_awake"])),
                             leader_elect=False, status=False, credentials=sleep.get("credentials"),
                             sleep_watts=float(sleep["sleep_watts"]),
                             addresses=sleep.get("addresses"),
                             actuator_options={"libvirt_uri": sleep["libvirt_uri"]} if sleep.get("libvirt_uri")
                             else None)
    with _log_to(log_path), daemon:
        daemon.wait_ready(start_timeout_s)
        yield


class AwakeSampler:
    """Counts, every ``interval_s``, the nodes that are awake as the cluster says: Ready, and not put to sleep
    by the node power controller. ``series``: [[seconds since start, nodes awake], ...]."""

    def __init__(self, core, interval_s: float = 2.0) -> None:
        self.core, self.interval_s = core, interval_s
        self.series: list[list[float]] = []
        self._stop = threading.Event()
        self._t0 = time.time()
        self._thread = threading.Thread(target=self._loop, name="awake-sampler", daemon=True)

    @staticmethod
    def awake(node) -> bool:
        from joulesched.cluster.nodepower import POWER_STATE_ANNOTATION

        conds = {c.type: c.status for c in (node.status.conditions or [])} if node.status else {}
        state = (node.metadata.annotations or {}).get(POWER_STATE_ANNOTATION, "awake")
        return conds.get("Ready", "True") == "True" and state not in ("sleeping", "asleep")

    def sample(self) -> None:
        try:
            nodes = self.core.list_node(_request_timeout=10).items
        except Exception:  # a missed sample is a gap in the plot, not a failed run
            return
        self.series.append([round(time.time() - self._t0, 3), float(sum(self.awake(n) for n in nodes))])

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> "AwakeSampler":
        self._t0 = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)
        self.sample()


def run_policy(core, prom, policy: str, *, pods: int, apps: Sequence[str], namespace: str, run_id: str,
               target: str, load_seconds: int, users: int, driver: str, workdir: Path, bind_timeout_s: float,
               delete_timeout_s: float, energy_selector: str | EnergySource, scrape_wait_s: float,
               image: str | None,
               on_event: Callable[[str, str], None], rate_window_s: float = 60.0,
               sample_awake_s: float | None = None) -> dict:
    """One policy's measured run; returns its metrics (the benchmark schema plus kube-only fields)."""
    from kubernetes.client.rest import ApiException

    manifests = render_pods(policy, pods, apps, run_id, namespace, image)
    names = {m["metadata"]["name"] for m in manifests}
    selector = f"{RUN_LABEL}={run_id},{POLICY_LABEL}={_slug(policy)}"

    def listed():
        return [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items if _ours(p, names)]

    start = time.time()
    created_at: dict[str, float] = {}
    bound_at: dict[str, float] = {}
    nodes: dict[str, int] = {}
    sampler = AwakeSampler(core, sample_awake_s) if sample_awake_s else None
    if sampler is not None:
        sampler.__enter__()
    try:
        on_event(policy, f"creating {pods} pods with schedulerName {scheduler_name_for(policy)}")
        for m in manifests:
            core.create_namespaced_pod(namespace, m)
            created_at[m["metadata"]["name"]] = time.time()

        def all_bound() -> bool:
            for p in listed():
                if p.spec.node_name and p.metadata.name not in bound_at:
                    bound_at[p.metadata.name] = time.time()
                    nodes[p.spec.node_name] = nodes.get(p.spec.node_name, 0) + 1
            return len(bound_at) == len(names)

        _wait(all_bound, bind_timeout_s, 0.05)
        on_event(policy, f"{len(bound_at)}/{pods} pods bound; driving load for {load_seconds} s")
        load = _drive_load(driver, target, load_seconds, users, workdir / _slug(policy))
        end = time.time()
        meter = PrometheusMeter(prom, energy_selector, scrape_wait_s=scrape_wait_s)
        joules = meter.joules(start, end)
        query = meter.last_query
        per_node = meter.watts_by_node(start, end, rate_window_s=rate_window_s)
        on_event(policy, f"{joules:.1f} J over {end - start:.1f} s")
        uncovered = nodes_without_energy([n.metadata.name for n in core.list_node().items], per_node)
        if uncovered:
            on_event(policy, f"warning: no energy series for node(s) {', '.join(uncovered)} in the window: "
                             "their energy is not in the total")
    finally:
        # Always tear down, also after a failure: a half-measured cluster must not carry pods into the next run.
        for name in names:
            try:
                core.delete_namespaced_pod(name, namespace)
            except ApiException as e:
                if e.status != 404:
                    raise
        gone = _wait(lambda: not listed(), delete_timeout_s, 0.1)
        if sampler is not None:
            sampler.__exit__()
        if not gone:
            raise KubePipelineError(f"pods of {policy} still exist {delete_timeout_s:.0f} s after deletion")
    pending = [bound_at[n] - created_at[n] for n in bound_at]
    extra = {"awake_nodes": sampler.series} if sampler is not None else {}
    return {**extra,
        "energy_joules": joules,
        "slo_violation_rate": float(load.error_rate),
        "unschedulable_pods": len(names) - len(bound_at),
        "mean_pending_s": float(np.mean(pending)) if pending else 0.0,
        "placements": len(bound_at),
        # Not observable from outside the schedulers (kube-scheduler's own metrics hold its latency; ours are
        # benchmarked in bench/) nor on a cluster: null, shown as n/a, never a made-up zero.
        "decision_us_p99": None,
        "mean_throttling": None,
        "end_s": end - start,
        "completed_pods": len(bound_at),
        # kube-only fields
        "scheduler_name": scheduler_name_for(policy),
        "window_start_unix": start,
        "window_end_unix": end,
        "energy_query": query,
        "latency_p50_ms": load.latency_ms.p50,
        "latency_p95_ms": load.latency_ms.p95,
        "latency_p99_ms": load.latency_ms.p99,
        "throughput_rps": load.throughput_rps,
        "requests": load.requests,
        "load_tool": load.tool,
        "nodes_used": nodes,
        "node_power": per_node,
        "nodes_without_energy": uncovered,
    }


def nodes_without_energy(names: Sequence[str], per_node: dict) -> list[str]:
    """The cluster's nodes that had no energy series in the window, where the series name nodes at all (the
    source's node label: ``node`` relabelled from the scrape target, or Kepler's ``node_name``). A node whose
    exporter is not deployed, not scraped, or failing adds 0 J to the total, so a policy packing pods onto it
    would look cheaper; an empty list where the series carry only addresses (nothing to compare)."""
    if not set(per_node) & set(names):
        return []
    return sorted(set(names) - set(per_node))


def summarize_kube(doc: dict) -> dict:
    """The summary of ``benchmark.summarize`` for measured runs: no lower bound, ratios to default-k8s."""
    out = {}
    for e in doc["scenarios"]:
        rows = {}
        ref = e["policies"].get("default-k8s")
        for pol in doc["policies"]:
            v = e["policies"][pol]
            row = {k: None if v[k] is None else float(v[k])
                   for k in ("energy_joules", "slo_violation_rate", "mean_throttling", "mean_pending_s",
                             "unschedulable_pods", "decision_us_p99")}
            row["energy_vs_lower_bound"] = None
            row["latency_p99_ms"] = float(v["latency_p99_ms"])
            if ref and ref["energy_joules"] > 0:
                row["energy_vs_default"] = v["energy_joules"] / ref["energy_joules"]
                row["energy_vs_default_ci95"] = None  # one measured run: no interval
            rows[pol] = row
        out[e["name"]] = {"seeds": 1, "lower_bound_joules": None, "policies": rows}
    return out


def policy_key(policy: str) -> str:
    """A file-name-safe, collision-free key of a policy spec: readable slug plus a short hash."""
    return f"{_slug(policy)}-{hashlib.sha256(policy.encode()).hexdigest()[:6]}"


def _policy_inputs(policy: str) -> list[Path]:
    """Files a policy's behaviour depends on (a DQN's model), so a retrained model is re-measured."""
    from joulesched.agent.policy import parse_spec

    _, _, path = parse_spec(policy)
    return [Path(path)] if path else []


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _redact_command(command: str, url: str, shown: str) -> str:
    """``command`` with ``url`` shown as ``shown`` (its user-info redacted) in each argument. The line is
    shell-quoted argument by argument (``cli.common.command_line``), so a password with a quote or a space in it
    is not spelled in the line as in the URL: each argument is redacted, then quoted again."""
    if url == shown:
        return command
    try:
        argv = shlex.split(command)
    except ValueError:  # not a shell-quoted line (unbalanced quotes): the text as it is
        return command.replace(url, shown)
    return shlex.join(a.replace(url, shown) for a in argv)


def run_kube(out: Path, *, kubeconfig: str, prometheus_url: str, target: str,
             policies: Sequence[str] | None = None, pods: int = 4,
             apps: Sequence[str] = ("testapp",), load_seconds: int = 30, users: int = 4,
             driver: Literal["locust", "jmeter"] = "locust", namespace: str = "default",
             scenario_name: str = "kube", bind_timeout_s: float = 120.0, delete_timeout_s: float = 180.0,
             energy_selector: str | EnergySource = ENERGY_METRIC, scrape_wait_s: float = 120.0,
             image: str | None = None,
             command: str = "", on_event: Callable[[str, str], None] | None = None,
             start_scheduler: bool = True, kube_context: str | None = None, force: bool = False,
             on_plan: Callable[[list[str]], None] | None = None, rate_window_s: float = 60.0,
             sleep: dict | None = None, sample_awake_s: float = 2.0) -> Results:
    """Measure every policy in turn (default: the registry's default set) on the cluster of ``kubeconfig``;
    write results.json and report.html.

    Each policy's measurement is a resumable stage (``pipelines/stages.py``) whose output is
    ``DIR/runs/<policy>.json``: a re-run skips policies already measured with the same parameters (and model
    file), and an interrupted run (Ctrl-C) tears its pods down and records nothing for the policy it was
    measuring. The report stage assembles results.json and report.html from the run files.

    With ``start_scheduler`` the pipeline runs ``joulesched serve --policy P`` itself (out of cluster, with the
    same kubeconfig) while policy P is measured; without it, a scheduler already deployed on the cluster binds
    ``schedulerName: joulesched`` pods, and only one non-default policy can be measured meaningfully.

    ``sleep`` (options of :data:`SLEEP_DEFAULTS`; ``{}`` for the defaults) runs the node power controller for
    every policy and records ``awake_nodes`` (sampled every ``sample_awake_s``) in each run.

    ``energy_selector`` is a PromQL selector of joule counters, or an energy source preset
    (:data:`joulesched.power.energy_sources.SOURCES`, such as Kepler's); the scheduler's power feed uses the same
    preset.
    """
    from kubernetes import client as k8s
    from prometheus_api_client import PrometheusConnect

    from joulesched.agent.registry import DEFAULT_POLICIES, make_policy, refuse_twin_only
    from joulesched.cluster.kube.client import load_api_client
    from joulesched.live.actuators.base import redact
    from joulesched.workloads.load.results import DriverError, check_target
    from joulesched.workloads.manifests import APPS

    check_output_dir(out, "--out")
    if not kubeconfig:
        raise KubePipelineError("--env kube needs --kubeconfig FILE")
    if not prometheus_url:
        raise KubePipelineError("--env kube needs --prometheus URL (the Prometheus that scrapes the exporter)")
    # Messages and records show the URL without its user-info: a password in it must not reach a log, an error
    # or the stage records. The value itself is echoed only once it parses as a URL.
    if not prometheus_url.startswith(("http://", "https://")):
        raise KubePipelineError("--prometheus must be an http:// or https:// URL (like http://prometheus:9090)")
    try:
        shown = redact(prometheus_url)
    except ValueError:
        raise KubePipelineError("--prometheus is not a valid URL") from None
    if not target:
        raise KubePipelineError("--env kube needs --target URL (the test app's Service) to drive load against")
    try:  # the load drivers' own check (user-info refused), before any pod is made
        check_target(target)
    except DriverError as e:
        raise KubePipelineError(str(e)) from None
    if pods < 1 or load_seconds < 1 or users < 1:
        raise KubePipelineError("--pods, --load-seconds and users must be at least 1")
    policies = DEFAULT_POLICIES if policies is None else policies
    if not policies or len(set(policies)) != len(policies):
        raise KubePipelineError("give each --policy once, at least one")
    for p in policies:
        refuse_twin_only(make_policy(p), p)  # a bad spec, or one for the twin only, fails before anything is made
    for a in apps:
        if a not in APPS:
            raise KubePipelineError(f"unknown app {a!r}; expected one of {', '.join(APPS)}")
    sleep = check_sleep(sleep)
    on_event = on_event or (lambda name, what: None)

    api = load_api_client(kubeconfig, kube_context)
    core = k8s.CoreV1Api(api)
    prom = PrometheusConnect(url=prometheus_url.rstrip("/"), disable_ssl=False)
    # Preflight, before any pod exists: Prometheus answers and holds the exporter's counters.
    source = as_source(energy_selector)
    preset = next((n for n, s in SOURCES.items() if s is source), "joulesched")
    try:
        have = prom.custom_query(f"count({source.fresh})")
    except Exception as e:  # requests' connection errors, PrometheusApiClientException
        api.close()
        raise KubePipelineError(f"cannot query Prometheus at {shown}: {e}") from None
    if not have:
        api.close()
        raise KubePipelineError(f"Prometheus at {shown} has no {source.fresh} series; "
                                "is the power exporter running and scraped?")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runner = StageRunner(out, force=force, on_event=on_event)
    runs = out / "runs"
    run_files = {pol: runs / f"{policy_key(pol)}.json" for pol in policies}
    if on_plan:
        on_plan([f"measure {pol}" for pol in policies] + ["report"])
    # What a measurement depends on: the same cluster, load and selection re-measured is a cache hit.
    command = _redact_command(command, prometheus_url, shown)  # the command line as typed goes into results.json
    common = {"cluster": api.configuration.host, "namespace": namespace, "prometheus": shown,
              "target": target, "pods": pods, "apps": list(apps), "load_seconds": load_seconds, "users": users,
              "driver": driver, "energy_selector": energy_selector if isinstance(energy_selector, str) else source.name,
              "image": image,
              "start_scheduler": start_scheduler, "rate_window_s": rate_window_s,
              **({"sleep": sleep, "sample_awake_s": sample_awake_s} if sleep is not None else {})}
    try:
        (out / "logs").mkdir(exist_ok=True)
        for pol in policies:
            def measure(pol: str = pol) -> None:
                t0 = time.perf_counter()
                log = out / "logs" / f"serve-{policy_key(pol)}.log"
                sched = (our_scheduler(pol, kubeconfig, prometheus_url, log, context=kube_context,
                                       energy_source=preset, sleep=sleep)
                         if start_scheduler else contextlib.nullcontext())
                power = node_power_controller(sleep, kubeconfig, out / "logs" / f"node-power-{policy_key(pol)}.log",
                                              context=kube_context)
                with sched, power:
                    res = run_policy(core, prom, pol, pods=pods, apps=list(apps), namespace=namespace,
                                     run_id=uuid.uuid4().hex[:6], target=target, load_seconds=load_seconds,
                                     users=users, driver=driver, workdir=out / "load",
                                     bind_timeout_s=bind_timeout_s, delete_timeout_s=delete_timeout_s,
                                     energy_selector=energy_selector, scrape_wait_s=scrape_wait_s, image=image,
                                     on_event=on_event, rate_window_s=rate_window_s,
                                     sample_awake_s=sample_awake_s if sleep is not None else None)
                _write_json(run_files[pol], {"policy": pol, "nodes": len(core.list_node().items),
                                             "wall_s": time.perf_counter() - t0, "metrics": res})

            runner.run(Stage(f"measure-{policy_key(pol)}", _policy_inputs(pol), {**common, "policy": pol},
                             [run_files[pol]], measure))
    finally:
        api.close()

    def report() -> None:
        measured = {pol: json.loads(run_files[pol].read_text()) for pol in policies}
        doc = {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "env": "kube",
            "created_unix": time.time(),
            "wall_s": sum(m["wall_s"] for m in measured.values()),
            "policies": list(policies),
            "seeds": 1,
            "scenarios": [{"name": scenario_name, "seed": 0, "nodes": max(m["nodes"] for m in measured.values()),
                           "pods": pods, "lower_bound_joules": None, "target": target, "apps": list(apps),
                           "policies": {pol: m["metrics"] for pol, m in measured.items()}}],
        }
        doc["summary"] = summarize_kube(doc)
        for pol, m in measured.items():
            if missing := m["metrics"].get("nodes_without_energy"):
                doc["summary"][scenario_name].setdefault("warnings", []).append(
                    f"{pol}: no energy series for node(s) {', '.join(missing)} in its window; their energy is not "
                    "in its total (an exporter not deployed, not scraped or failing; or a node asleep throughout)")
        write_outputs(out, from_dict(doc), {}, {})
        write_report(out, header=HEADER)

    runner.run(Stage("report", list(run_files.values()), {"command_policies": list(policies),
                                                         "scenario": scenario_name},
                     [out / "results.json", out / "report.html"], report))
    return load_results(out / "results.json")
