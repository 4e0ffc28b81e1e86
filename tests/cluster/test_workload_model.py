"""The pod model (cluster/workload.py): the workloads of before it are bit-identical, the QoS class follows
Kubernetes, usage segments integrate exactly, the service generator is calibrated as documented, mixed
scenarios are deterministic, and the twin's CSV round-trips the new columns while old files still load."""

from __future__ import annotations

import io
import json
import math
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from joulesched.cluster.scenario import Scenario, ScenarioError, Services, load_scenario
from joulesched.cluster.workload import (
    BURSTABLE,
    GUARANTEED,
    JOB,
    NO_LIMIT,
    NO_REQUEST,
    SERVICE,
    PodMeta,
    Workload,
    build_workload,
    generate_services,
    load_trace,
    merge_workloads,
    qos_codes,
    synthesize,
    write_trace,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("data") / "workload_fixture.json"


def _scenario(workload: dict, duration_s: float = 86_400.0, **kw) -> Scenario:
    return Scenario.model_validate({
        "name": "t", "seed": 7, "duration_s": duration_s, "idle_policy": {"mode": "always_on"},
        "nodes": [{"name_prefix": "n", "count": 4, "cpu_m": 16000, "memory_mib": 65536, "power_watts": "hp-ml110-g5"}],
        "workload": workload, **kw})


# ---- what existed before ----------------------------------------------------------------------------------
def _fixture_maker():
    import sys

    sys.path.insert(0, str(FIXTURE.parent))
    try:
        import make_workload_fixture as maker
    finally:
        sys.path.pop(0)
    return maker


def test_shipped_workloads_are_unchanged():
    """Every shipped scenario (and generator variants) for several seeds gives the workloads the code of before
    the pod model gave: integers bit for bit, floats to 1e-12 (tests/cluster/data/make_workload_fixture.py says
    why floats are not compared by digest: they differ in the last bits between CPU feature levels)."""
    maker = _fixture_maker()
    want = json.loads(FIXTURE.read_text())
    got = json.loads(json.dumps(maker.build()))
    shipped = {k.split("@")[0] for k in want if k.endswith(".yaml@default")}
    assert shipped == set(maker.PRE_POD_MODEL), "a scenario of before the pod model lacks a fingerprint"
    assert shipped <= {p.name for p in (ROOT / "scenarios").glob("*.yaml")}, "a scenario of before was removed"
    assert got.keys() == want.keys()
    diff = maker.compare(want, got)
    assert not diff, "workloads changed:\n" + "\n".join(diff[:8])


def test_the_fixture_tells_last_bits_from_real_changes():
    """The float fingerprint ignores last-bit noise but not a moved value, a permutation or a new seed."""
    maker = _fixture_maker()
    a = np.random.default_rng(3).lognormal(5, 1.5, 12_000)
    want = maker.fingerprint(a)
    noisy = a * (1 + np.random.default_rng(4).choice([-2, 0, 2], a.size) * np.finfo(float).eps)
    assert not np.array_equal(noisy, a) and maker.mismatches(want, maker.fingerprint(noisy)) == []
    moved = a.copy()
    moved[6_000] *= 1 + 1e-6
    assert maker.mismatches(want, maker.fingerprint(moved))
    assert maker.mismatches(want, maker.fingerprint(a[::-1].copy()))
    assert maker.mismatches(want, maker.fingerprint(np.random.default_rng(5).lognormal(5, 1.5, 12_000)))
    ints = np.arange(10, dtype=np.int64)
    bumped = ints.copy()
    bumped[-1] += 1
    assert maker.mismatches(maker.fingerprint(ints), maker.fingerprint(bumped))


def test_defaults_are_the_old_pod_and_old_csvs_load_unchanged(tmp_path):
    wl = synthesize(load_scenario(ROOT / "scenarios" / "tiny.yaml").workload.synthetic, 7200, 5)
    assert not wl.has_pod_model and (wl.kind == JOB).all() and (wl.cpu_lim == NO_LIMIT).all()
    assert (wl.priority == 0).all() and wl.owner_names == ("",) and wl.namespace_names == ("default",)
    assert wl.work_m_s == float(np.dot(wl.usage_m, wl.duration_s))
    buf = io.StringIO()
    write_trace(wl, buf)
    assert buf.getvalue().splitlines()[0] == "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m"
    p = tmp_path / "old.csv"
    p.write_text(buf.getvalue())
    back = load_trace(p)
    for k in ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m"):
        assert np.array_equal(getattr(back, k), getattr(wl, k)), k
    # The shipped trace, an old five-column file, still loads to the same digest.
    sample = load_trace(ROOT / "scenarios" / "traces" / "sample.csv", 7200)
    maker = _fixture_maker()
    want = json.loads(FIXTURE.read_text())["trace-sample.yaml@default"]["submit_s"]
    assert maker.mismatches(want, maker.fingerprint(sample.submit_s)) == []


def test_jobs_entry_is_the_synthetic_generator_and_mixes_are_deterministic():
    spec = {"pods": 300, "mean_interarrival_s": 20, "burst_mean": 2}
    a = build_workload(_scenario({"synthetic": spec}))
    b = build_workload(_scenario({"jobs": spec}))
    for k in ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    mix = {"jobs": [spec, {**spec, "app": "etl", "priority": 5}],
           "services": {"count": 3, "replicas": 2, "cpu_m": 500, "memory_mib": 1024}}
    m1, m2 = (build_workload(_scenario(mix)) for _ in range(2))
    assert np.array_equal(m1.submit_s, m2.submit_s) and np.array_equal(m1.prof_m, m2.prof_m)
    assert (np.diff(m1.submit_s) >= 0).all() and len(m1) == 2 * len(a) + 6
    etl = np.array([m1.app_names[x] == "etl" for x in m1.app])
    assert etl.sum() == len(a) and (m1.priority[etl] == 5).all()
    # The second generator draws from its own stream: not a copy of the first.
    assert not np.array_equal(np.sort(m1.duration_s[etl]), np.sort(a.duration_s))
    other = build_workload(_scenario(mix), seed=8)
    assert not np.array_equal(other.prof_m, m1.prof_m)


def test_a_trace_listed_twice_adds_its_pods_twice_from_one_read(tmp_path, monkeypatch):
    import joulesched.cluster.workload as workload

    sample = ROOT / "scenarios" / "traces" / "sample.csv"
    one = load_trace(sample, 7200)
    reads = []
    real = workload.load_trace
    monkeypatch.setattr(workload, "load_trace", lambda p, h=None: reads.append(p) or real(p, h))
    f = tmp_path / "twice.yaml"
    f.write_text(textwrap.dedent(f"""\
        name: twice
        seed: 1
        duration_s: 7200
        nodes: [{{name_prefix: n, count: 4, cpu_m: 16000, memory_mib: 65536, power_watts: hp-ml110-g5}}]
        workload: {{trace: ["{sample}", "{sample}"], jobs: {{pods: 5, mean_interarrival_s: 5}}}}
        """))
    wl = build_workload(load_scenario(f))
    assert reads == [sample]
    assert len(wl) == 2 * len(one) + 5
    counts = Counter(wl.submit_s.tolist())  # every submission of the trace is there twice (the jobs add to it)
    assert all(counts[t] >= 2 * c for t, c in Counter(one.submit_s.tolist()).items())


def test_pod_model_workloads_build_for_the_twin_and_jobs_keep_the_plain_path():
    sc = _scenario({"services": {"count": 1, "cpu_m": 500, "memory_mib": 1024}})
    wl = build_workload(sc)
    assert len(wl) == 3 and wl.has_pod_model
    assert build_workload(sc, pod_model=False).has_pod_model  # the old flag is accepted and changes nothing
    # Metadata and limits alone change nothing in the twin: they are accepted.
    jobs = _scenario({"jobs": {"pods": 50, "mean_interarrival_s": 5, "owner_kind": "Job", "cpu_limit_factor": 2}})
    wl = build_workload(jobs)
    assert not wl.has_pod_model and wl.owner_names[wl.owner[0]] == "Job"
    ok = wl.cpu_req >= 0
    assert (wl.cpu_lim[ok] == np.ceil(wl.cpu_req[ok] * 2)).all() and (wl.cpu_lim[~ok] == NO_LIMIT).all()


@pytest.mark.parametrize("workload,message", [
    ({"synthetic": {"pods": 1, "mean_interarrival_s": 1}, "jobs": {"pods": 1, "mean_interarrival_s": 1}},
     "'synthetic' stands alone"),
    ({"synthetic": {"pods": 1, "mean_interarrival_s": 1}, "trace": "x.csv"}, "exactly one of 'synthetic' or 'trace'"),
    ({}, "exactly one of 'synthetic' or 'trace', or mix"),
    ({"services": []}, "'services' is empty"),
    ({"services": {"count": 1, "cpu_m": 500, "memory_mib": 64, "cpu_limit_m": 100}}, "cpu limit 100 is below"),
    ({"services": {"count": 1, "cpu_m": 5, "memory_mib": 64, "usage": {"pattern": "hourly"}}}, "24 levels"),
    ({"services": {"count": 1, "cpu_m": 5, "memory_mib": 64, "usage": {"pattern": "hourly", "hourly": [1] * 23}}},
     "24 levels"),
    ({"services": {"count": 1, "cpu_m": 5, "memory_mib": 64, "name": "Web_1"}}, "DNS label"),
    ({"services": {"count": 1, "cpu_m": 5, "memory_mib": 64, "autoscale": {"min_replicas": 4, "max_replicas": 2}}},
     "max_replicas"),
    ({"jobs": {"pods": 1, "mean_interarrival_s": 1, "namespace": "Prod"}}, "namespace"),
])
def test_bad_workload_specs_name_the_field(workload, message):
    with pytest.raises(Exception, match=message):
        _scenario(workload)


# ---- metadata ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("req,lim,qos", [
    ((NO_REQUEST, NO_REQUEST), (NO_LIMIT, NO_LIMIT), "BestEffort"),
    ((0, 0), (NO_LIMIT, NO_LIMIT), "BestEffort"),  # only values > 0 count
    ((500, NO_REQUEST), (NO_LIMIT, NO_LIMIT), "Burstable"),
    ((500, 256), (500, 256), "Guaranteed"),
    ((NO_REQUEST, NO_REQUEST), (500, 256), "Guaranteed"),  # the apiserver defaults requests to the limits
    ((250, 256), (500, 256), "Burstable"),
    ((500, 256), (500, NO_LIMIT), "Burstable"),  # a memory limit is needed too
    ((0, 256), (500, 256), "Burstable"),  # an explicit 0 request is not defaulted, and differs from the limit
])
def test_qos_class_as_kubernetes_computes_it(req, lim, qos):
    a = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    code = qos_codes(a(req[0]), a(req[1]), a(lim[0]), a(lim[1]))[0]
    assert ("BestEffort", "Burstable", "Guaranteed")[code] == qos


def test_meta_and_lifetimes():
    wl = Workload(np.array([0.0, 10.0]), np.array([100.0, math.inf]), np.array([500, 200]), np.array([256, 128]),
                  np.array([300.0, 150.0]), kind=np.array([JOB, SERVICE], dtype=np.int8),
                  cpu_lim=np.array([500, NO_LIMIT]), mem_lim=np.array([256, NO_LIMIT]),
                  priority=np.array([0, 1000], dtype=np.int32), owner=np.array([1, 2], dtype=np.int32),
                  owner_names=("", "Job", "Deployment"), app=np.array([0, 1], dtype=np.int32),
                  app_names=("", "web"), namespace=np.array([0, 1], dtype=np.int32),
                  namespace_names=("default", "shop"))
    assert wl.meta(0) == PodMeta(kind="job", owner_kind="Job", priority=0, qos_class="Guaranteed", app="",
                                 namespace="default", cpu_limit_m=500, memory_limit_mib=256)
    assert wl.meta(1) == PodMeta(kind="service", owner_kind="Deployment", priority=1000, qos_class="Burstable",
                                 app="web", namespace="shop")
    assert wl.qos.tolist() == [GUARANTEED, BURSTABLE]
    assert wl.planned_end_s(0, 40.0) == 140.0 and wl.planned_end_s(1, 40.0) is None
    assert wl.service_end_s(0) is None and wl.service_end_s(1) is None
    assert wl.demand_m_s(horizon=110.0) == 300.0 * 100 + 150.0 * 100
    assert math.isinf(wl.work_m_s)
    with pytest.raises(ValueError, match="codes outside"):
        Workload(wl.submit_s, wl.duration_s, wl.cpu_req, wl.mem_req, wl.usage_m, app=np.array([0, 5], dtype=np.int32))


# ---- usage over time --------------------------------------------------------------------------------------
def _profiled() -> Workload:
    # pod 0: a job whose demand changes with progress; pod 1: a service following the clock; pod 2: constant.
    return Workload(np.array([0.0, 0.0, 5.0]), np.array([30.0, math.inf, 10.0]), np.array([1000, 1000, 100]),
                    np.array([64, 64, 64]), np.array([0.0, 0.0, 70.0]),
                    kind=np.array([JOB, SERVICE, JOB], dtype=np.int8), profile=np.array([0, 1, -1], dtype=np.int32),
                    prof_ptr=np.array([0, 3, 5]), prof_t=np.array([0.0, 10.0, 20.0, 100.0, 200.0]),
                    prof_m=np.array([100.0, 400.0, 200.0, 50.0, 80.0]))


def test_usage_steps_cursor_and_exact_integrals():
    wl = _profiled()
    assert wl.usage_step(0, 0.0) == (100.0, 10.0) and wl.usage_step(0, 10.0) == (400.0, 20.0)
    assert wl.usage_step(0, 25.0) == (200.0, math.inf)
    assert wl.usage_step(1, 0.0) == (50.0, 100.0)  # before its first breakpoint: the first value
    assert wl.usage_step(1, 150.0) == (50.0, 200.0) and wl.usage_step(1, 500.0) == (80.0, math.inf)
    assert wl.usage_step(2, 3.0) == (70.0, math.inf)
    assert wl.profile_bounds(0) == (0, 3) and wl.profile_bounds(2) == (0, 0)
    assert wl.usage_integral(0, 0.0, 30.0) == 100 * 10 + 400 * 10 + 200 * 10
    assert wl.usage_integral(0, 5.0, 15.0) == 100 * 5 + 400 * 5
    assert wl.usage_integral(1, 150.0, 250.0) == 50 * 50 + 80 * 50
    assert wl.usage_integral(2, 0.0, 10.0) == 700.0
    t, m = wl.usage_segments(2)
    assert t.tolist() == [0.0] and m.tolist() == [70.0]
    assert wl.demand_m_s(horizon=300.0) == 7000 + (50 * 200 + 80 * 100) + 700


def test_diurnal_service_integral_matches_a_per_second_brute_force():
    """The piecewise-constant series integrates exactly: a per-second sum agrees to well within 0.1 %."""
    sv = Services(count=2, replicas=1, cpu_m=2000, memory_mib=1024, start_s=1234.5,
                  usage={"step_s": 300, "noise_sigma": 0.2})
    wl = generate_services(sv, 86_400.0, np.random.default_rng(3))
    for i in range(len(wl)):
        lo, hi = wl.life_window(i, 86_400.0)
        exact = wl.usage_integral(i, lo, hi)
        grid = np.arange(math.floor(lo), math.ceil(hi)) + 0.5
        a, b = wl.profile_bounds(i)
        t, m = wl.prof_t[a:b], wl.prof_m[a:b]
        brute = float(m[np.maximum(np.searchsorted(t, grid, side="right") - 1, 0)].sum())
        assert abs(brute - exact) / exact < 1e-3
        assert wl.usage_m[i] == pytest.approx(exact / (hi - lo), rel=1e-12)


def test_service_generator_follows_its_calibration():
    """Mean fraction of the request, peak/trough swing, the peak's hour, replicas sharing one profile."""
    u = {"mean_fraction": 0.4, "swing": 4.0, "peak_s": 14 * 3600, "noise_sigma": 0.0, "service_sigma": 0.0,
         "phase_jitter_s": 0.0}
    sv = Services(count=2, replicas=3, cpu_m=1000, memory_mib=512, usage=u)
    wl = generate_services(sv, 86_400.0, np.random.default_rng(0))
    assert len(wl) == 6 and (wl.kind == SERVICE).all() and np.isinf(wl.duration_s).all()
    assert set(wl.profile.tolist()) == {0, 1} and len(wl.prof_ptr) == 3  # one profile per service
    assert [wl.app_names[a] for a in wl.app] == ["svc-0"] * 3 + ["svc-1"] * 3
    a, b = wl.profile_bounds(0)
    t, m = wl.prof_t[a:b], wl.prof_m[a:b]
    assert len(t) == 288 and np.allclose(np.diff(t), 300.0)
    assert float(np.mean(m)) == pytest.approx(400.0, rel=1e-9)  # the exact step means keep the mean
    assert m.max() / m.min() == pytest.approx(4.0, rel=0.01)  # the steps soften the extremes only slightly
    assert abs(t[np.argmax(m)] + 150 - 14 * 3600) <= 150
    hourly = dict(u, pattern="hourly", hourly=[1.0] * 12 + [3.0] * 12)
    wh = generate_services(Services(count=1, replicas=1, cpu_m=1000, memory_mib=512, usage=hourly), 86_400.0,
                           np.random.default_rng(0))
    assert float(np.mean(wh.prof_m)) == pytest.approx(400.0, rel=1e-9)
    assert wh.usage_at(0, 3 * 3600) == pytest.approx(200.0) and wh.usage_at(0, 18 * 3600) == pytest.approx(600.0)


def test_autoscaled_services_scale_with_load_and_keep_the_demand():
    u = {"mean_fraction": 0.4, "swing": 4.0, "noise_sigma": 0.0, "service_sigma": 0.0, "phase_jitter_s": 0.0}
    fixed = generate_services(Services(count=1, replicas=6, cpu_m=1000, memory_mib=512, usage=u), 86_400.0,
                              np.random.default_rng(1))
    sv = Services(count=1, replicas=6, cpu_m=1000, memory_mib=512, usage=u,
                  autoscale={"min_replicas": 1, "target_fraction": 0.6})
    wl = generate_services(sv, 86_400.0, np.random.default_rng(1))
    assert len(wl) >= 6 and (wl.kind == SERVICE).all() and len(set(wl.profile.tolist())) == 1
    ends = [wl.service_end_s(i) for i in range(len(wl))]
    assert any(e is not None for e in ends) and any(e is None for e in ends)  # scaled down, and still running
    # Replicas alive at each step times the per-pod demand is the service's total demand, as without scaling.
    a, b = wl.profile_bounds(0)
    t, per_pod = wl.prof_t[a:b], wl.prof_m[a:b]
    alive = np.array([sum(1 for i in range(len(wl)) if wl.submit_s[i] <= x < (ends[i] or math.inf)) for x in t])
    assert np.allclose(alive * per_pod, 6 * fixed.prof_m)
    assert alive.min() >= 1 and alive.max() <= 6 and alive.max() > alive.min()
    # No replica flaps: every scale-down outlives the 300 s stabilisation window.
    lives = [e - wl.submit_s[i] for i, e in enumerate(ends) if e is not None]
    assert min(lives) >= 300.0


# ---- the twin's CSV ---------------------------------------------------------------------------------------
def test_csv_round_trips_the_pod_model(tmp_path):
    sc = _scenario({"jobs": {"pods": 40, "mean_interarrival_s": 10, "owner_kind": "Job", "app": "etl",
                             "namespace": "batch", "priority": -5, "slo_class": "BE", "memory_limit_factor": 1.5},
                    "services": [{"count": 2, "replicas": 2, "cpu_m": 500, "memory_mib": 256, "cpu_limit_m": 1000,
                                  "priority": 1000, "autoscale": {"min_replicas": 1}}]}, duration_s=7200)
    wl = build_workload(sc)
    p = tmp_path / "pods.csv"
    write_trace(wl, p)
    head = p.read_text().splitlines()[0].split(",")
    assert head[:5] == ["submit_s", "duration_s", "cpu_request_m", "memory_request_mib", "cpu_usage_m"]
    assert {"kind", "cpu_limit_m", "memory_limit_mib", "priority", "owner_kind", "app", "namespace", "slo_class",
            "usage_profile"} <= set(head)
    back = load_trace(p)
    for k in ("submit_s", "duration_s", "cpu_req", "mem_req", "usage_m", "kind", "cpu_lim", "mem_lim", "priority"):
        assert np.array_equal(getattr(back, k), getattr(wl, k)), k
    for i in range(len(wl)):
        assert back.meta(i) == wl.meta(i)
        assert np.array_equal(back.usage_segments(i)[1], wl.usage_segments(i)[1])
    assert len(back.prof_ptr) == len(wl.prof_ptr)  # replicas' identical series are shared again
    merged = merge_workloads([back, wl])
    assert len(merged) == 2 * len(wl) and set(merged.app_names) == set(wl.app_names)


TRACE_HEAD = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m"


@pytest.mark.parametrize("extra,row,message", [
    (",kind", "0,10,100,100,50,daemon", "column kind: 'daemon' is not one of job, service"),
    (",kind", "0,inf,100,100,50,job", "column duration_s: 'inf' is not finite"),
    (",cpu_limit_m", "0,10,100,100,50,80", "column cpu_limit_m: limit 80 is below the request 100"),
    (",memory_limit_mib", "0,10,100,100,50,lots", "column memory_limit_mib: 'lots' is not an integer"),
    (",priority", "0,10,100,100,50,high", "column priority: 'high' is not an integer"),
    (",usage_profile", "0,10,100,100,50,0:50 5:x", "column usage_profile: step 2 '5:x'"),
    (",usage_profile", "0,10,100,100,50,0:50 0:60", "does not come after"),
    (",usage_profile", "0,10,100,100,50,3:50", "must start at 0"),
])
def test_bad_model_columns_name_line_and_column(tmp_path, extra, row, message):
    p = tmp_path / "pods.csv"
    p.write_text(f"{TRACE_HEAD}{extra}\n{row}\n")
    with pytest.raises(ScenarioError, match=message) as ei:
        load_trace(p)
    assert "line 2" in str(ei.value)


def test_model_columns_default_and_limits_default_requests(tmp_path):
    p = tmp_path / "pods.csv"
    p.write_text(textwrap.dedent(f"""\
        {TRACE_HEAD},kind,cpu_limit_m,memory_limit_mib,namespace,usage_profile
        0,,,,40,service,500,256,,0:10 60:30
        1,20,100,,50,,,,prod,
        """))
    wl = load_trace(p)
    assert wl.kind.tolist() == [SERVICE, JOB] and math.isinf(wl.duration_s[0])
    assert (wl.cpu_req[0], wl.mem_req[0]) == (500, 256) and wl.meta(0).qos_class == "Guaranteed"
    assert wl.meta(1).namespace == "prod" and wl.meta(0).namespace == "default" and wl.meta(1).qos_class == "Burstable"
    assert wl.usage_step(0, 59.0) == (10.0, 60.0)


def test_cpu_use_stops_at_the_limit_in_every_consumer(tmp_path):
    """A container's CPU use stops at its limit (CFS quota); the twin let a pod above it raise node power and
    throttle its neighbours (a review: 135,000 J where the limit gives 117,400 J, and a job stretched from 600 s
    to 900 s). Cut in the workload itself, so the twin, the bounds and the optimum see one demand."""
    from joulesched.agent.runner import run_policy
    from joulesched.cluster.twin import Twin
    from tests.cluster.test_twin import First

    (tmp_path / "pods.csv").write_text("submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,"
                                       "cpu_limit_m,kind\n0,inf,1000,100,4000,1000,service\n0,600,1000,100,2000,,job\n")
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        name: capped
        seed: 1
        duration_s: 1000
        idle_policy: {mode: always_on}
        nodes:
          - {name_prefix: n, count: 1, cpu_m: 4000, memory_mib: 16384, power_watts: hp-ml110-g5}
        workload:
          trace: pods.csv
        """))
    sc = load_scenario(tmp_path / "s.yaml")
    wl = build_workload(sc)
    assert wl.usage_m.tolist() == [1000, 2000]
    r = run_policy(Twin(sc, wl), First(), 0)
    # hp-ml110-g5 at 75 % (3000 m) 127 W for 600 s, then at 25 % 103 W for 400 s; nothing throttled
    assert r.energy_joules == pytest.approx(127 * 600 + 103 * 400) and r.mean_throttling == 0
    # A service generator's replicas: every profile step within the limit, each pod's mean from the cut steps
    svc = _scenario({"services": {"count": 2, "replicas": 2, "cpu_m": 1000, "memory_mib": 64, "cpu_limit_m": 1200,
                                  "usage": {"mean_fraction": 1.0, "swing": 3, "noise_sigma": 0.3}}}, 86_400.0)
    wl = build_workload(svc)
    assert wl.prof_m.max() <= 1200 and (wl.usage_m <= 1200).all() and wl.prof_m.max() == 1200
    # A limit of 0 sets no quota (Kubernetes reads it as none): the pod keeps its use
    from joulesched.cluster.workload import PodBuilder, cap_at_limits

    b = PodBuilder()
    b.add(0.0, 10.0, -1, -1, 1500.0, cpu_lim=0)
    b.add(0.0, 10.0, 1000, -1, 1500.0, cpu_lim=1000)
    assert cap_at_limits(b.build()).usage_m.tolist() == [1500.0, 1000.0]
