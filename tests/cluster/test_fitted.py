"""Applications fitted to a trace (cluster/fitted.py, `joulesched trace fit`, `workload.fitted`): what the fit keeps
per template, honesty at --until, fresh workloads per seed with each application's lifetimes, and bad input."""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from joulesched.cluster.fitted import FORMAT, MIN_OWN, QUANTILES, fit_apps, load_fit, write_fit
from joulesched.cluster.scenario import ScenarioError, load_scenario
from joulesched.cluster.workload import build_workload, load_trace
from joulesched.pipelines.cli import app

runner = CliRunner()
HEAD = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,kind,slo_class,gpu_count,gpu_milli\n"


def _trace(tmp_path):
    """Template A (1 core, a shared GPU): 40 pods living 100-200 s; template B (8 cores): 40 pods living 10-20 h;
    template C: 2 pods (too few for its own lifetimes: it takes its class's); 5 pods at time 0 (left out)."""
    rng = np.random.default_rng(0)
    rows = [f"0,1000,1000,1024,500,job,BE,1,500" for _ in range(5)]
    for k in range(40):
        rows.append(f"{100 + 37 * k},{rng.uniform(100, 200):.1f},1000,1024,500,job,BE,1,500")
        rows.append(f"{120 + 37 * k},{rng.uniform(36000, 72000):.1f},8000,16384,4000,service,LS,0,")
    rows += [f"{3000 + k},50,2000,2048,1000,job,BE,1,300" for k in range(2)]
    p = tmp_path / "t.csv"
    p.write_text(HEAD + "\n".join(rows) + "\n")
    return p


def _apps(fit):
    return {(a["cpu_m"], a["gpu_milli"]): a for a in fit["apps"]}


def test_the_fit_keeps_each_template_with_its_lifetimes_and_leaves_out_the_starting_backlog(tmp_path):
    fit = fit_apps(load_trace(_trace(tmp_path)))
    assert fit["format"] == FORMAT and fit["pods"] == 82  # the 5 pods at time 0 are not fitted
    apps = _apps(fit)
    a, b, c = apps[(1000, 500)], apps[(8000, 1000)], apps[(2000, 300)]
    assert (a["pods"], b["pods"], c["pods"]) == (40, 40, 2)
    assert a["kind"] == "job" and a["gpu_count"] == 1 and b["kind"] == "service" and b["gpu_count"] == 0
    assert a["usage_fraction"] == pytest.approx(0.5) and b["usage_fraction"] == pytest.approx(0.5)
    qa, qb = np.exp(a["log_life_quantiles"]), np.exp(b["log_life_quantiles"])
    assert 100 <= qa[0] <= qa[10] <= qa[-1] <= 200 and 36000 <= qb[0] <= qb[-1] <= 72000
    # C has 2 < MIN_OWN pods: it takes the quantiles of its class (jobs, BE, shared GPU), which is A's plus C's.
    assert not c["own_lifetimes"] and MIN_OWN > 2 and np.exp(c["log_life_quantiles"][0]) == pytest.approx(50.0)
    assert len(fit["hourly_profile"]) == 24 and np.mean(fit["hourly_profile"]) == pytest.approx(1.0)


def test_until_fits_only_what_was_created_before_it_with_lifetimes_censored_there(tmp_path):
    fit = fit_apps(load_trace(_trace(tmp_path)), until_s=1000.0)
    apps = _apps(fit)
    assert (2000, 300) not in apps and apps[(1000, 500)]["pods"] == 25  # submitted at 100..988
    # B's pods live 10-20 h but were seen only until 1000 s: the fit knows no more than that.
    assert np.exp(apps[(8000, 1000)]["log_life_quantiles"][-1]) == pytest.approx(1000.0 - 120.0, rel=1e-5)


def test_the_fits_horizon_is_the_datas_end_and_no_life_outlasts_a_scenario(tmp_path):
    """A review: the service submitted last lived 1 s (open services lived to the last submission), an --until past
    the data divided the rate by hours in which nothing could be seen, and a life of 1e12 s made a fit that the
    loader then refused."""
    head = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m,kind\n"
    rows = [f"{10 * k},100,1000,1024,500,job" for k in range(1, 21)] + ["150,inf,2000,2048,1000,service"]
    p = tmp_path / "h.csv"
    p.write_text(head + "\n".join(rows) + "\n")
    fit = fit_apps(load_trace(p))
    svc = np.exp(_apps(fit)[(2000, 1000)]["log_life_quantiles"])
    assert svc[0] == pytest.approx(300.0 - 150.0, rel=1e-5)  # to the data's last end (200 + 100), not 1 s
    assert fit["rate_per_s"] == pytest.approx(21 / 200.0)  # arrivals over the submissions' span
    far = fit_apps(load_trace(p), until_s=1e7)
    assert far["rate_per_s"] == pytest.approx(21 / 300.0)  # not 21 / 1e7: nothing was seen after 300 s
    assert np.exp(_apps(far)[(2000, 1000)]["log_life_quantiles"][0]) == pytest.approx(150.0, rel=1e-5)  # nor lived
    assert fit_apps(load_trace(p), until_s=250.0)["rate_per_s"] == pytest.approx(21 / 250.0)
    p.write_text(head + "\n".join(rows + ["190,1e12,4000,4096,1000,job"]) + "\n")
    fit = fit_apps(load_trace(p))
    assert fit["rate_per_s"] == pytest.approx(22 / 200.0)  # a long job's end says nothing of arrivals
    assert np.exp(_apps(fit)[(4000, 1000)]["log_life_quantiles"][-1]) == pytest.approx(1e9, rel=1e-5)
    write_fit(fit, tmp_path / "f.yaml")
    assert load_fit(tmp_path / "f.yaml")["pods"] == 22  # what trace fit writes, the loader takes


def _scenario(tmp_path, fit_name="fit.yaml", extra=""):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: f
        seed: 3
        duration_s: 200000
        nodes:
          - {{name_prefix: g, count: 4, cpu_m: 32000, memory_mib: 131072, power_watts: ibm-x3250-x3470,
              gpu_count: 4, gpu_model: T4}}
        workload:
          fitted: {{fit: {fit_name}, rate_scale: 4}}
        {extra}"""))
    return p


def test_a_scenario_draws_a_fresh_workload_per_seed_with_each_applications_lifetimes(tmp_path):
    write_fit(fit_apps(load_trace(_trace(tmp_path))), tmp_path / "fit.yaml")
    sc = load_scenario(_scenario(tmp_path))
    w1, w1b, w2 = build_workload(sc, 1), build_workload(sc, 1), build_workload(sc, 2)
    assert np.array_equal(w1.submit_s, w1b.submit_s) and not np.array_equal(w1.submit_s[:50], w2.submit_s[:50])
    assert len(w1) > 500  # 82 pods in ~3,000 s of trace, 4x the rate, over 200,000 s
    apps = {name: k for k, name in enumerate(w1.app_names)}
    short = w1.duration_s[w1.app == apps["job-BE-c1000-m1024-g1x500"]]
    long = w1.duration_s[w1.app == apps["service-LS-c8000-m16384"]]
    assert 100 <= short.min() and short.max() <= 200 and 36000 <= long.min() and long.max() <= 72000
    assert (w1.gpu[w1.app == apps["job-BE-c1000-m1024-g1x500"]] == 1).all()
    assert set(w1.gpu_milli[w1.gpu > 0].tolist()) <= {500, 300}
    # Shares: A and B are 40 of 82 pods each.
    assert abs(short.size / len(w1) - 40 / 82) < 0.06


def test_cpu_only_keeps_the_applications_without_gpus_at_their_own_share_of_the_rate(tmp_path):
    write_fit(fit_apps(load_trace(_trace(tmp_path))), tmp_path / "fit.yaml")
    every = build_workload(load_scenario(_scenario(tmp_path)), 1)
    p = tmp_path / "cpu.yaml"
    p.write_text(_scenario(tmp_path).read_text().replace("rate_scale: 4}", "rate_scale: 4, cpu_only: true}")
                 .replace(",\n      gpu_count: 4, gpu_model: T4", ""))
    sc = load_scenario(p)
    assert not any(g.gpu_count for g in sc.nodes)  # a CPU cluster: no GPU pod could run there
    cpu = build_workload(sc, 1)
    assert (cpu.gpu == 0).all() and set(cpu.app_names[int(a)] for a in np.unique(cpu.app)) == {
        "service-LS-c8000-m16384"}
    # B is 40 of the fit's 82 pods: the same arrival process thinned to its share, not the whole rate on B.
    assert abs(len(cpu) / len(every) - 40 / 82) < 0.08
    long = cpu.duration_s
    assert 36000 <= long.min() and long.max() <= 72000


def test_cpu_only_refuses_a_fit_with_only_gpu_applications(tmp_path):
    fit = fit_apps(load_trace(_trace(tmp_path)))
    fit["apps"] = [a for a in fit["apps"] if a["gpu_count"]]
    write_fit(fit, tmp_path / "fit.yaml")
    p = tmp_path / "cpu.yaml"
    p.write_text(_scenario(tmp_path).read_text().replace("rate_scale: 4}", "rate_scale: 4, cpu_only: true}"))
    with pytest.raises(ScenarioError, match=r"fit\.yaml: cpu_only: every application of the fit asks for GPUs"):
        build_workload(load_scenario(p), 1)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(format="other/1"), "not a fit file"),
    (lambda d: d.update(rate_per_s=-1), "rate_per_s must be a positive number"),
    (lambda d: d.update(hourly_profile=[1.0] * 23), "hourly_profile must be 24 positive numbers"),
    (lambda d: d.update(apps=[]), "apps is empty"),
    (lambda d: d["apps"][0].update(log_life_quantiles=[3.0, 2.0] + [1.0] * (QUANTILES.size - 2)),
     "non-decreasing"),
    (lambda d: d["apps"][0].update(gpu_count=2, gpu_milli=500), "a share below 1000 is of one GPU"),
    (lambda d: d["apps"][0].update(kind="daemon"), "kind 'daemon' is not one of job, service"),
    (lambda d: d["apps"][0].pop("cpu_m"), "apps[0]: missing or malformed field"),
    (lambda d: d["apps"][0].update(gpu_count=float("inf")), "apps[0]: gpu_count: expected a whole number, got inf"),
    (lambda d: d["apps"][0].update(pods=float("inf")), "apps[0]: pods: expected a whole number, got inf"),
    # What int() and float() read silently before (a review): a quoted or fractional count, a switch as a number.
    (lambda d: d["apps"][0].update(pods="48"), "apps[0]: pods: expected a whole number, got '48'"),
    (lambda d: d["apps"][0].update(pods=48.9), "apps[0]: pods: expected a whole number, got 48.9"),
    (lambda d: d["apps"][0].update(cpu_m=True), "apps[0]: cpu_m: expected a whole number, got True"),
    (lambda d: d.update(rate_per_s=True), "rate_per_s: expected a number, got True"),
    (lambda d: d.update(until_s="yesterday"), "until_s: expected a number, got 'yesterday'"),
    (lambda d: d["apps"][0].update(own_lifetimes="banana"), "apps[0]: own_lifetimes must be true or false"),
    (lambda d: d["apps"][0].update(log_life_quantiles=["1"] * QUANTILES.size),
     "apps[0]: log_life_quantiles: expected a number, got '1'"),
    (lambda d: d["apps"][0].pop("name"), "apps[0]: name must be a non-empty string, got None"),  # was a KeyError
    (lambda d: d["apps"][0].update(name=""), "apps[0]: name must be a non-empty string"),
    (lambda d: d["apps"][0].update(slo_class=["x"]), "apps[0]: slo_class must be a string (or null)"),
])
def test_a_malformed_fit_is_refused_naming_the_problem(tmp_path, edit, words):
    write_fit(fit_apps(load_trace(_trace(tmp_path))), tmp_path / "fit.yaml")
    doc = yaml.safe_load((tmp_path / "fit.yaml").read_text())
    edit(doc)
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ScenarioError, match=re.escape(words)):
        load_fit(tmp_path / "fit.yaml")
    r = runner.invoke(app, ["benchmark", "-s", str(_scenario(tmp_path)), "-p", "random", "--out",
                            str(tmp_path / "out"), "--no-report"])
    assert r.exit_code == 2 and words.split()[0] in r.output, r.output


def test_trace_fit_cli(tmp_path):
    out = tmp_path / "fit.yaml"
    r = runner.invoke(app, ["trace", "fit", str(_trace(tmp_path)), "-o", str(out), "--until", "1000", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["pods"] == 25 + 24 and summary["apps"] == 2  # A at 100 + 37k, B at 120 + 37k, before 1000 s and load_fit(out)["until_s"] == 1000.0
    bad = tmp_path / "bad.csv"
    bad.write_text(HEAD + "1,x,1,1,1,job,,0,\n")
    r = runner.invoke(app, ["trace", "fit", str(bad), "-o", str(tmp_path / "no.yaml")])
    assert r.exit_code == 2 and "duration_s" in r.output and not (tmp_path / "no.yaml").exists()
    r = runner.invoke(app, ["trace", "fit", str(_trace(tmp_path)), "-o", str(tmp_path / "n2.yaml"), "--until", "50"])
    assert r.exit_code == 2 and "nothing to fit" in r.output and not (tmp_path / "n2.yaml").exists()
