"""``joulesched pipeline --env kube --sleep``: the node power controller runs beside the scheduler for each
policy, and the report shows the nodes awake over time as read from the cluster.

The same stand-ins as tests/pipelines/test_kube_pipeline.py (its fixtures are reused): the in-repo API
emulator (no kube-apiserver can run here), a real `joulesched serve` for kube-scheduler, a real Prometheus
scraping the real exporter, a real test app under real Locust. The controller uses the `none` actuator
(cordon and taint only): the emulator's nodes have no machines behind them."""

from __future__ import annotations

import time

import pytest

from joulesched.cluster.kube.client import api_client_for
from joulesched.cluster.nodepower import POWER_STATE_ANNOTATION
from joulesched.pipelines.kube_pipeline import AwakeSampler, KubePipelineError, check_sleep, node_power_controller
from tests.pipelines.test_kube_pipeline import (  # noqa: F401  (fixtures)
    emu,
    kubeconfig,
    needs_prometheus,
    power,
    prometheus,
    schedulers,
    testapp,
)


def test_sleep_options_are_checked_before_anything_starts():
    assert check_sleep({}) == {"actuator": "none", "sleep_after_s": 60.0, "min_awake": 1, "sleep_watts": 10.0,
                               "wake_s": 60.0}
    with pytest.raises(KubePipelineError, match="--sleep-actuator 'zap'"):
        check_sleep({"actuator": "zap"})
    with pytest.raises(KubePipelineError, match="unknown --sleep option 'colour'"):
        check_sleep({"colour": "blue"})
    with pytest.raises(KubePipelineError, match="sleep_watts and wake_s must be >= 0"):
        check_sleep({"wake_s": -1})


def test_our_scheduler_is_told_that_nodes_sleep(monkeypatch, tmp_path):
    """With --sleep the scheduler's cache gets the sleep model (the twin's view of a sleeping cluster, as
    ``serve --node-power``); without it, none."""
    import joulesched.live.daemon as daemon_mod
    from joulesched.pipelines.kube_pipeline import our_scheduler

    seen = []

    class Daemon:
        def __init__(self, **kw):
            seen.append(kw["cache"])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait_ready(self, timeout):
            pass

    monkeypatch.setattr(daemon_mod, "SchedulerDaemon", Daemon)
    for sleep in (check_sleep({"sleep_watts": 7.0, "wake_s": 30.0}), None):
        with our_scheduler("energy-greedy", "kc", "", tmp_path / "s.log", sleep=sleep):
            pass
    assert (seen[0].sleep_watts, seen[0].wake_s) == (7.0, 30.0) and seen[1].sleep_watts is None


def test_the_sampler_counts_nodes_awake_as_the_controller_changes_them(emu, kubeconfig, tmp_path):  # noqa: F811
    from kubernetes import client as k8s

    api = api_client_for(emu.url)
    try:
        core = k8s.CoreV1Api(api)
        opts = check_sleep({"sleep_after_s": 0.2, "min_awake": 1})
        with AwakeSampler(core, interval_s=0.1) as s:
            with node_power_controller(opts, kubeconfig, tmp_path / "np.log"):
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and sum(
                        (n["metadata"].get("annotations") or {}).get(POWER_STATE_ANNOTATION) == "asleep"
                        for n in emu.list("nodes")) < 2:
                    time.sleep(0.05)
                # The sampler polls every 0.1 s; on a loaded machine its next poll may come late, so wait for
                # it to have seen the final state rather than for a fixed time.
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not (s.series and s.series[-1][1] == 1):
                    time.sleep(0.05)
        counts = [n for _, n in s.series]
        assert counts[0] == 3 and counts[-1] == 1  # min_awake 1: two of the three nodes went to sleep
        assert all(b <= a for a, b in zip(counts, counts[1:]))
        assert "asleep" in (tmp_path / "np.log").read_text()
    finally:
        api.close()


@pytest.mark.integration
@needs_prometheus
def test_kube_pipeline_with_sleep_reports_nodes_awake(emu, kubeconfig, schedulers, power, prometheus,  # noqa: F811
                                                      testapp, tmp_path):  # noqa: F811
    from joulesched.pipelines.kube_pipeline import run_kube

    out = tmp_path / "out"
    doc = run_kube(out, kubeconfig=kubeconfig, prometheus_url=prometheus, target=testapp,
                   policies=("energy-greedy",), pods=2, load_seconds=5, users=2, driver="locust",
                   bind_timeout_s=20, delete_timeout_s=20, scrape_wait_s=20, rate_window_s=3,
                   sleep={"sleep_after_s": 1.0, "min_awake": 1}, sample_awake_s=0.5)
    r = doc.scenarios[0].policies["energy-greedy"]
    awake = [n for _, n in r.awake_nodes]
    assert awake[0] == 3 and min(awake) < 3  # nodes left idle by the packing went to sleep during the run
    assert r.placements == 2 and r.unschedulable_pods == 0
    assert (out / "plots" / "awake_0.png").stat().st_size > 0
    assert "awake_0.png" in (out / "report.html").read_text()
    assert (out / "logs").glob("node-power-*.log")
