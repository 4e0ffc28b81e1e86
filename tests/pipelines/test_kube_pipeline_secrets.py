"""A Prometheus URL with ``user:password@`` never reaches an error, a stage record or results.json: the kube
pipeline against the API emulator, with Prometheus unreachable or faked and the measurement stubbed."""

from __future__ import annotations

import json

import pytest

from joulesched.live.daemon import DaemonInputError, check_url
from joulesched.pipelines import kube_pipeline
from joulesched.pipelines.kube_pipeline import KubePipelineError, run_kube
from tests.support.kube_emulator import KubeEmulator

SECRET = "s3cret-pw"


@pytest.fixture
def kubeconfig(tmp_path):
    e = KubeEmulator().start()
    try:
        e.add_node("node-0")
        yield e.kubeconfig(str(tmp_path / "kubeconfig"))
    finally:
        e.stop()


def test_an_unreachable_prometheus_is_named_without_its_password(kubeconfig, tmp_path):
    with pytest.raises(KubePipelineError) as e:
        run_kube(tmp_path / "out", kubeconfig=kubeconfig, prometheus_url=f"http://alice:{SECRET}@127.0.0.1:1",
                 target="http://127.0.0.1:1/", policies=["default-k8s"], start_scheduler=False)
    assert "cannot query Prometheus at http://<redacted>@127.0.0.1:1" in str(e.value)
    assert SECRET not in str(e.value)


@pytest.mark.parametrize("url", [f"alice:{SECRET}@prometheus:9090", f"ftp://alice:{SECRET}@prometheus"])
def test_a_url_that_is_not_http_is_refused_without_echoing_it(kubeconfig, tmp_path, url):
    with pytest.raises(KubePipelineError, match="must be an http:// or https:// URL") as e:
        run_kube(tmp_path / "out", kubeconfig=kubeconfig, prometheus_url=url, target="http://127.0.0.1:1/")
    with pytest.raises(DaemonInputError, match="must be an http:// or https:// URL") as d:
        check_url(url)
    assert SECRET not in str(e.value) and SECRET not in str(d.value)


_METRICS = {"energy_joules": 10.0, "slo_violation_rate": 0.0, "unschedulable_pods": 0, "mean_pending_s": 0.1,
            "placements": 1, "decision_us_p99": None, "mean_throttling": None, "end_s": 1.0, "completed_pods": 1,
            "latency_p99_ms": 5.0}


class _Prometheus:
    def __init__(self, url, **kw):
        self.url = url

    def custom_query(self, query):
        return [{"value": [0, "1"]}]


def test_the_stage_records_and_results_hold_the_url_without_its_password(kubeconfig, tmp_path, monkeypatch):
    url = f"http://alice:{SECRET}@prometheus.example:9090"
    monkeypatch.setattr("prometheus_api_client.PrometheusConnect", _Prometheus)
    seen = []

    def run_policy(core, prom, policy, **kw):
        seen.append(prom.url)
        return dict(_METRICS)

    monkeypatch.setattr(kube_pipeline, "run_policy", run_policy)
    out = tmp_path / "out"
    run_kube(out, kubeconfig=kubeconfig, prometheus_url=url, target="http://127.0.0.1:1/", policies=["default-k8s"],
             start_scheduler=False, command=f"joulesched pipeline --env kube --prometheus {url} --out {out}")
    assert seen == [url]  # the password is still used to talk to Prometheus
    records = sorted((out / ".stages").glob("*.json"))
    assert records and (out / "results.json").is_file()
    for f in [*records, out / "results.json"]:
        assert SECRET not in f.read_text(), f
    assert any("http://<redacted>@prometheus.example:9090" in f.read_text() for f in records)


def test_a_password_with_a_quote_is_redacted_from_the_command_line(kubeconfig, tmp_path, monkeypatch):
    """The command line shell-quotes each argument, so ``it's`` is spelled ``'...it'"'"'s...'`` there: each
    argument is redacted before it is quoted, not the joined line."""
    from joulesched.pipelines.cli.common import command_line

    url = "http://admin:it's@prom:9090"
    out = tmp_path / "out"
    monkeypatch.setattr("prometheus_api_client.PrometheusConnect", _Prometheus)
    monkeypatch.setattr(kube_pipeline, "run_policy", lambda core, prom, policy, **kw: dict(_METRICS))
    monkeypatch.setattr("sys.argv", ["joulesched", "pipeline", "--env", "kube", "--prometheus", url, "--out",
                                     str(out)])
    command = command_line()
    assert "it'\"'\"'s" in command  # how the shell-quoted line spells the password
    run_kube(out, kubeconfig=kubeconfig, prometheus_url=url, target="http://127.0.0.1:1/", policies=["default-k8s"],
             start_scheduler=False, command=command)
    doc = json.loads((out / "results.json").read_text())
    assert doc["command"] == f"joulesched pipeline --env kube --prometheus 'http://<redacted>@prom:9090' --out {out}"
    for f in [*(out / ".stages").glob("*.json"), out / "results.json"]:
        assert "admin" not in f.read_text(), f


def test_a_target_with_user_info_is_refused_before_any_pod_is_made(kubeconfig, tmp_path):
    """The load drivers refuse credentials in a target; the pipeline's preflight now does too, before the first
    policy's pods are created (it refused them only when the load started)."""
    with pytest.raises(KubePipelineError, match="user-info") as e:
        run_kube(tmp_path / "out", kubeconfig=kubeconfig, prometheus_url="http://127.0.0.1:1",
                 target=f"http://alice:{SECRET}@127.0.0.1:1/", policies=["default-k8s"], start_scheduler=False)
    assert SECRET not in str(e.value)
