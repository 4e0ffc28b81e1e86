"""The ``kube`` path of ``joulesched pipeline`` end to end, on loopback.

What stands in for what:

- The Kubernetes API is the in-repo emulator (``cluster/kube_emulator.py``) over real HTTP, spoken to by the
  real ``kubernetes`` client, because no kube-apiserver (nor kind, k3s, minikube) can run here. The
  real-cluster path is ``tests/e2e/``, which skips visibly without a kubeconfig.
- kube-scheduler is stood in for by ``joulesched serve --scheduler-name default-scheduler --policy
  default-k8s`` (joulesched's re-implementation of kube-scheduler's default scoring), started by the test;
  our scheduler (``joulesched serve --scheduler-name joulesched --policy energy-greedy``) is started by the
  pipeline itself for its policy's run. Both run as real processes.
- The nodes' power comes from the real exporter (``power/exporter.py``) reading a synthetic powercap tree whose
  counters this test advances at a constant rate, scraped every second by a REAL Prometheus server
  (Debian's /usr/bin/prometheus) on 127.0.0.1.
- The load target is a real test app (``joulesched workload serve testapp``) driven by real Locust.

Why a constant injected power: ``increase()`` extrapolates the first and last samples of a range to the
window's edges; at a constant rate that extrapolation is exact, so the measured joules must match the joules
the test injected between each policy's window start and end (recorded in results.json) within 5 %.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from joulesched.power.exporter import Exporter
from joulesched.power.monitor import PowerMonitor
from joulesched.power.powercap import PowercapMeter
from tests.support.kube_emulator import KubeEmulator
from tests.support.procs import PROMETHEUS, free_port, prometheus_server, stop_process, wait_for
from tests.support.sysfs import SyntheticPowercap, SyntheticProc

ROOT = Path(__file__).resolve().parents[2]
ZONES = {"intel-rapl:0": ("package-0", 40.0), "intel-rapl:0:2": ("dram", 10.0)}  # dirname -> (name, watts)
STEP_S = 0.02
POLICIES = ("default-k8s", "energy-greedy")

needs_prometheus = pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                                      reason=f"{PROMETHEUS} not found: apt-get install prometheus (make test does)")


def _http_ok(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=1).status == 200
    except OSError:
        return False


def _stop(proc: subprocess.Popen, log=None) -> None:
    stop_process(proc, timeout=10)
    if log is not None:
        log.close()


class Injector:
    """Advances the synthetic counters at a constant power and logs (unix time, joules) of every step."""

    def __init__(self, pc: SyntheticPowercap) -> None:
        self.pc = pc
        self.log: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="test-power-injector", daemon=True)

    def _loop(self) -> None:
        last = time.time()
        while not self._stop.wait(STEP_S):
            now = time.time()
            dt = now - last
            last = now
            for d, (_, watts) in ZONES.items():
                self.pc.advance(d, round(watts * dt * 1e6))
            self.log.append((now, sum(w for _, w in ZONES.values()) * dt))

    def joules_between(self, start: float, end: float) -> float:
        return sum(j for t, j in self.log if start < t <= end)

    def start(self) -> "Injector":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def emu(tmp_path):
    e = KubeEmulator().start()
    try:
        for i in range(3):
            e.add_node(f"node-{i}", cpu="4", memory="8Gi")
        yield e
    finally:
        e.stop()


@pytest.fixture
def kubeconfig(emu, tmp_path) -> str:
    return emu.kubeconfig(str(tmp_path / "kubeconfig"))


@pytest.fixture
def schedulers(kubeconfig, tmp_path):
    """The kube-scheduler stand-in, a real `joulesched serve` process (ours is started by the pipeline)."""
    procs = []
    try:
        for name, policy in (("default-scheduler", "default-k8s"),):
            port = free_port()
            log = open(tmp_path / f"serve-{name}.log", "wb")
            proc = subprocess.Popen([sys.executable, "-m", "joulesched.pipelines.cli", "serve", "--scheduler-name", name,
                                     "--policy", policy, "--kubeconfig", kubeconfig, "--no-leader-elect",
                                     "--listen", f"127.0.0.1:{port}"], cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT)
            procs.append((proc, log, port, name))
        for proc, _, port, name in procs:
            wait_for(lambda: proc.poll() is not None or _http_ok(f"http://127.0.0.1:{port}/healthz"), 30,
                  f"scheduler {name}")
            assert proc.poll() is None, (tmp_path / f"serve-{name}.log").read_text()[-2000:]
        yield
    finally:
        for proc, log, _, _ in procs:
            _stop(proc, log)


@pytest.fixture
def power(tmp_path):
    pc = SyntheticPowercap(tmp_path / "powercap")
    for d, (name, _) in ZONES.items():
        pc.add(d, name, energy_uj=1_000_000)
    proc = SyntheticProc(tmp_path / "proc")
    exp = Exporter(PowerMonitor(PowercapMeter(str(pc.root)), proc_root=str(proc.root)), port=0,
                   interval_s=STEP_S).start()
    inj = Injector(pc)
    try:
        inj.start()
        yield exp, inj
    finally:
        inj.stop()
        exp.stop()


@pytest.fixture
def prometheus(tmp_path, power):
    exp, _ = power
    from prometheus_api_client import PrometheusConnect

    with prometheus_server(tmp_path, free_port(), [f"127.0.0.1:{exp.port}"]) as url:
        prom = PrometheusConnect(url=url)

        def scraped_twice():
            res = prom.custom_query("min(count_over_time(joulesched_node_joules_total[1m]))")
            return res and float(res[0]["value"][1]) >= 2

        wait_for(scraped_twice, 30, "two scrapes of the exporter", interval=0.25)
        yield url


@pytest.fixture
def testapp(tmp_path):
    port = free_port()
    log = open(tmp_path / "testapp.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "joulesched.pipelines.cli", "workload", "serve", "testapp", "--listen",
                             f"127.0.0.1:{port}"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is not None or _http_ok(f"http://127.0.0.1:{port}/healthz"), 30, "test app")
        assert proc.poll() is None, (tmp_path / "testapp.log").read_text()[-2000:]
        yield f"http://127.0.0.1:{port}/work?ms=2"
    finally:
        _stop(proc, log)


def _pods_seen(emu: KubeEmulator) -> dict[str, dict]:
    """Every pod the emulator ever held, replayed from its watch history through the real client."""
    from kubernetes import client as k8s
    from kubernetes import watch

    from joulesched.cluster.kube.client import api_client_for

    api = api_client_for(emu.url)
    try:
        seen: dict[str, dict] = {}
        w = watch.Watch()
        for ev in w.stream(k8s.CoreV1Api(api).list_namespaced_pod, "default", resource_version="1",
                           timeout_seconds=1):
            pod = ev["object"]
            entry = seen.setdefault(pod.metadata.name, {"scheduler": pod.spec.scheduler_name, "node": None,
                                                        "deleted": False, "labels": pod.metadata.labels})
            entry["node"] = pod.spec.node_name or entry["node"]
            entry["deleted"] = entry["deleted"] or ev["type"] == "DELETED"
        return seen
    finally:
        api.close()


@pytest.mark.integration
@needs_prometheus
def test_kube_pipeline_two_policies(emu, kubeconfig, schedulers, power, prometheus, testapp, tmp_path):
    from joulesched.pipelines.kube_pipeline import POLICY_LABEL, run_kube

    _, inj = power
    out = tmp_path / "out"
    events: list[tuple[str, str]] = []
    doc = run_kube(out, kubeconfig=kubeconfig, prometheus_url=prometheus, target=testapp, policies=POLICIES,
                   pods=3, load_seconds=4, users=2, driver="locust", bind_timeout_s=20, delete_timeout_s=20,
                   scrape_wait_s=20, rate_window_s=3, on_event=lambda n, w: events.append((n, w)))

    # Pods: created with the right schedulerName, bound by that scheduler, all deleted again.
    seen = _pods_seen(emu)
    by_policy: dict[str, list[dict]] = {}
    for p in seen.values():
        by_policy.setdefault(p["labels"][POLICY_LABEL], []).append(p)
    assert sorted(by_policy) == sorted(POLICIES), seen
    assert {p["scheduler"] for p in by_policy["default-k8s"]} == {"default-scheduler"}
    assert {p["scheduler"] for p in by_policy["energy-greedy"]} == {"joulesched"}
    for pods in by_policy.values():
        assert len(pods) == 3 and all(p["node"] and p["deleted"] for p in pods), pods
    assert emu.list("pods") == []
    assert len(emu.bindings) == 6 and not emu.conflicts

    # Energy: read through PromQL, within 5 % of what was injected in each policy's window, plus what the
    # scrapes' own latency allows: Prometheus stamps a sample when the scrape starts, the exporter answers with
    # the counter as it is when it answers, so a scrape that took d seconds (this process starved on a loaded
    # machine: seen up to ~1 s in CI) reads up to d s of energy ahead of its stamp, at the window's first and
    # last sample alike, and increase() extrapolates that by up to half again.
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus)
    watts = sum(w for _, w in ZONES.values())
    entry = doc.scenarios[0]
    assert entry.lower_bound_joules is None and entry.nodes == 3
    for pol in POLICIES:
        r = entry.policies[pol]
        assert r.energy_query.startswith("sum(increase(joulesched_node_joules_total{")
        injected = inj.joules_between(r.window_start_unix, r.window_end_unix)
        assert injected > 50, (pol, injected)
        span = max(1, int(r.window_end_unix - r.window_start_unix + 2))
        lat = prom.custom_query(f"max(max_over_time(scrape_duration_seconds[{span}s]))",
                                params={"time": f"{r.window_end_unix + 1:.3f}"})
        skew = float(lat[0]["value"][1])
        assert skew <= 1.0, (pol, skew)  # the scrape timeout: a slower one is no sample at all
        allowed = 0.05 * injected + 3 * skew * watts
        assert abs(r.energy_joules - injected) <= allowed, (pol, r, injected, skew)
        assert r.unschedulable_pods == 0 and r.placements == 3
        assert r.requests > 0 and r.slo_violation_rate == 0.0 and r.latency_p99_ms > 0
        assert r.decision_us_p99 is None and r.mean_throttling is None  # not observable: no fake zeros
        # Per-node power over the window, from a range query: the exporter's one target at the injected 50 W.
        (series,) = r.node_power.values()
        late = [w for t, w in series if t >= 3]
        assert late and all(abs(w - 50.0) < 5 for w in late), series
    # The two windows do not overlap: policies ran one after the other, torn down in between.
    a, b = (entry.policies[p] for p in POLICIES)
    assert a.window_end_unix <= b.window_start_unix

    # Outputs.
    saved = json.loads((out / "results.json").read_text())
    assert saved["schema_version"] == 2 and saved["policies"] == list(POLICIES) and saved["env"] == "kube"
    html = (out / "report.html").read_text()
    assert "Measured on a real cluster" in html and "energy-greedy" in html and "<td>n/a</td>" in html
    for png in ("energy_ratio.png", "placement_0.png", "node_power_0.png"):
        assert (out / "plots" / png).stat().st_size > 0, png


@pytest.mark.parametrize("args,needle", [
    ([], "--env kube needs --kubeconfig, --prometheus, --target"),
    (["--kubeconfig", "KC"], "--env kube needs --prometheus, --target"),
    (["--kubeconfig", "KC", "--target", "http://127.0.0.1:1/"], "--env kube needs --prometheus"),
    (["--kubeconfig", "/does/not/exist", "--prometheus", "http://127.0.0.1:1", "--target", "http://127.0.0.1:1/"],
     "kubeconfig /does/not/exist does not exist"),
    (["--kubeconfig", "KC", "--prometheus", "127.0.0.1:9090", "--target", "http://127.0.0.1:1/"],
     "must be an http:// or https:// URL"),
    (["--kubeconfig", "KC", "--prometheus", "http://127.0.0.1:1", "--target", "http://127.0.0.1:1/",
      "--policy", "nope"], "unknown policy 'nope'"),
])
def test_kube_cli_bad_input_exits_2(tmp_path, args, needle):
    from typer.testing import CliRunner

    from joulesched.pipelines.cli import app

    kc = tmp_path / "kc"
    kc.write_text("{}")
    args = [str(kc) if a == "KC" else a for a in args]
    r = CliRunner().invoke(app, ["pipeline", "--env", "kube", "--out", str(tmp_path / "out"), *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


FAKE_PULUMI = '''#!{python}
"""Stands in for the Pulumi CLI, which cannot be installed here: answers what the Automation API asks."""
import json, sys
args = [a for a in sys.argv[1:] if a != "--non-interactive"]
if args[:1] == ["version"]:
    print("v3.200.0")
elif args[:2] == ["stack", "select"]:
    pass
elif args[:2] == ["stack", "output"]:
    outputs = json.load(open({outputs!r}))
    if "--show-secrets" not in args:  # the masked view: secret outputs are redacted
        outputs = {{k: "[secret]" if k == "kubeconfig" else v for k, v in outputs.items()}}
    print(json.dumps(outputs))
else:
    sys.exit("fake pulumi: unexpected " + " ".join(args))
'''


def _fake_pulumi(tmp_path: Path, outputs: dict) -> Path:
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "pulumi"
    exe.write_text(FAKE_PULUMI.format(python=sys.executable, outputs=str(tmp_path / "outputs.json")))
    exe.chmod(0o755)
    return bin_dir


def _leftover_schedulers(kubeconfig: str, policy: str) -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if kubeconfig in (cmd := " ".join(p.info["cmdline"] or [])) and f"--policy {policy}" in cmd]


@pytest.mark.integration
@needs_prometheus
def test_ctrl_c_leaves_dir_consistent_and_the_stack_run_resumes(emu, kubeconfig, schedulers, power, prometheus,
                                                               testapp, tmp_path, monkeypatch):
    """Ctrl-C (SIGINT to the real CLI process) while the second policy is running: its pods are deleted, its
    scheduler stopped, DIR holds the first policy's finished run and nothing half-written, exit 130. The re-run
    goes through ``--stack`` (the environment read from Pulumi stack outputs through the real Automation API;
    the ``pulumi`` binary it drives is a stand-in script, as the CLI cannot be installed here) and measures only
    the policy that was interrupted."""
    from typer.testing import CliRunner

    from joulesched.pipelines.cli import app
    from joulesched.pipelines.kube_pipeline import POLICY_LABEL

    out = tmp_path / "out"
    common = ["--pods", "3", "--load-seconds", "4", "-p", "default-k8s", "-p", "energy-greedy", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "joulesched.pipelines.cli", "pipeline", "--env", "kube", "--kubeconfig",
                             kubeconfig, "--prometheus", prometheus, "--target", testapp, *common], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def second_policy_running() -> bool:
            return proc.poll() is not None or any(
                p["metadata"]["labels"].get(POLICY_LABEL) == "energy-greedy" for p in emu.list("pods"))

        wait_for(second_policy_running, 90, "the energy-greedy pods")
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        _stop(proc)
    assert proc.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output, output
    assert emu.list("pods") == []
    assert _leftover_schedulers(kubeconfig, "energy-greedy") == []
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert len(runs) == 1 and runs[0].startswith("default-k8s-"), runs
    first = json.loads((out / "runs" / runs[0]).read_text())
    records = sorted(p.name for p in (out / ".stages").iterdir())
    assert records == [f"measure-{runs[0]}"], records
    assert not (out / "results.json").exists() and not (out / "report.html").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]

    bin_dir = _fake_pulumi(tmp_path, {"kubeconfig": Path(kubeconfig).read_text(), "prometheus_url": prometheus,
                                      "target_url": testapp, "namespace": "joulesched"})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "pulumi-home"))
    r = CliRunner().invoke(app, ["pipeline", "--env", "kube", "--stack", "cluster", *common])
    assert r.exit_code == 0, r.output
    assert f"measure-{runs[0][:-len('.json')]}: skipped (inputs unchanged)" in r.output
    from joulesched.pipelines.results import load_results

    doc = load_results(out / "results.json")  # through the typed model, as a reader would
    entry = doc.scenarios[0].policies
    assert entry["default-k8s"].model_dump(mode="json", exclude_unset=True) == first["metrics"]
    assert entry["energy-greedy"].placements == 3 and entry["energy-greedy"].energy_joules > 0
    assert (out / "report.html").is_file()
    assert not list(Path(tempfile.gettempdir()).glob("joulesched-kubeconfig-*"))  # the stack's kubeconfig is gone


def test_stack_without_pulumi_cli_says_how_to_install(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from joulesched.pipelines.cli import app

    monkeypatch.setenv("PATH", str(tmp_path))  # no pulumi binary anywhere
    r = CliRunner().invoke(app, ["pipeline", "--env", "kube", "--stack", "cluster", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "get.pulumi.com" in r.output and not (tmp_path / "o").exists()


@pytest.mark.parametrize("outputs,needle", [
    ({"prometheus_url": "prometheus:9090"}, "output prometheus_url must be an http(s) URL"),
    ({"hosts": "node-1"}, "output hosts must be a list"),
    ({"prometheus_url": "http://127.0.0.1:1"}, "--env kube needs --kubeconfig, --target (stack cluster does not export them)"),
])
def test_stack_outputs_of_the_wrong_shape_exit_2(tmp_path, monkeypatch, outputs, needle):
    from typer.testing import CliRunner

    from joulesched.pipelines.cli import app

    monkeypatch.setenv("PATH", f"{_fake_pulumi(tmp_path, outputs)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "pulumi-home"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    r = CliRunner().invoke(app, ["pipeline", "--env", "kube", "--stack", "cluster", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split()) and not (tmp_path / "o").exists()


def test_a_node_without_energy_series_is_named_not_counted_as_zero_silently():
    """A node whose exporter is not deployed, scraped or working added 0 J to the total without a word, so a
    policy that packed pods onto it looked cheaper (a review). Where the series name nodes, the missing ones are
    listed (results, a warning); where they carry only addresses there is nothing to compare."""
    from joulesched.pipelines.kube_pipeline import nodes_without_energy

    names = ["node-0", "node-1", "node-2"]
    assert nodes_without_energy(names, {"node-0": [[0, 50.0]], "node-2": [[0, 40.0]]}) == ["node-1"]
    assert nodes_without_energy(names, {n: [[0, 1.0]] for n in names}) == []
    assert nodes_without_energy(names, {"127.0.0.1:9102": [[0, 50.0]]}) == []
