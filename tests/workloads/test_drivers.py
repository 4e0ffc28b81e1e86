"""Load drivers against the real test app: real JMeter, real Locust, and the parsing they share."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from joulesched.workloads.load import jmeter as jm
from joulesched.workloads.load import locust as lc
from joulesched.workloads.load.results import DriverError, Sample, read_csv_samples, summarise

BIN = Path(sys.executable).parent / "joulesched"


def _jmeter_ready() -> str | None:
    if shutil.which("jmeter") is None:
        return "jmeter not installed (apt-get install jmeter jmeter-http)"
    home = jm.jmeter_home("jmeter")
    if home and not (home / "lib" / "ext" / "ApacheJMeter_http.jar").is_file():
        return f"JMeter at {home} lacks the HTTP sampler (apt-get install jmeter-http)"
    return None


def _check_result(out: dict, tool: str) -> None:
    assert out["tool"] == tool
    assert out["requests"] > 0
    assert out["errors"] == 0 and out["error_rate"] == 0.0
    lat = out["latency_ms"]
    assert 0 <= lat["min"] <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert lat["p50"] >= 1.0  # every request burns 2 ms of CPU in the app
    assert out["throughput_rps"] > 0


def test_testapp_work_endpoint(serve):
    app = serve("testapp", "--default-ms", "3")
    r = app.get("/work", params={"ms": 20})
    assert r.status_code == 200 and r.json()["wall_ms"] >= 19
    assert app.get("/test").json()["ms"] == 3
    for bad in ({"ms": -1}, {"ms": 10**6}, {"ms": "abc"}, {"nope": 1}):
        r = app.get("/work", params=bad)
        assert r.status_code == 400 and r.json()["error"], bad


@pytest.mark.integration
@pytest.mark.slow
def test_real_jmeter_against_test_app(serve, tmp_path):
    why = _jmeter_ready()
    if why:
        pytest.skip(why)
    app = serve("testapp")
    cp = subprocess.run(
        [str(BIN), "load", "jmeter", "--plan", str(jm.DEFAULT_PLAN), "--target", app.url + "/work?ms=2",
         "--threads", "4", "--rampup", "1", "--duration", "3", "--workdir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    _check_result(out, "jmeter")
    assert 2.0 <= out["duration_s"] <= 4.5  # the plan's scheduler really ended the run
    rows = read_csv_samples(tmp_path / "results.jtl", "timeStamp", "elapsed", "success")
    assert len(rows) == out["requests"]


@pytest.mark.integration
@pytest.mark.slow
def test_real_jmeter_counts_errors(serve, tmp_path):
    why = _jmeter_ready()
    if why:
        pytest.skip(why)
    app = serve("testapp")
    res = jm.run(app.url + "/work?ms=-5", threads=2, rampup_s=0, duration_s=1)  # 400 on every request
    assert res.requests > 0 and res.error_rate == 1.0


@pytest.mark.slow
def test_real_locust_against_test_app(serve):
    if importlib.util.find_spec("locust") is None:  # not importorskip: importing locust patches this process with gevent
        pytest.skip("locust not installed (pip install 'joulesched[load]')")
    app = serve("testapp")
    cp = subprocess.run(
        [str(BIN), "load", "locust", "--target", app.url + "/work?ms=2", "--users", "4",
         "--spawn-rate", "4", "--duration", "3", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    _check_result(json.loads(cp.stdout), "locust")


def test_summarise_percentiles_and_rates():
    s = [Sample(1000.0 + i * 10, float(i + 1), ok=i != 0) for i in range(100)]
    r = summarise(s, "t", "http://x")
    assert r.requests == 100 and r.errors == 1 and r.error_rate == 0.01
    assert r.latency_ms.p50 == pytest.approx(50.5) and r.latency_ms.p99 == pytest.approx(99.01)
    assert r.latency_ms.min == 1 and r.latency_ms.max == 100
    assert r.duration_s == pytest.approx((1990 + 100 - 1000) / 1000)


def test_summarise_rejects_an_empty_run():
    with pytest.raises(DriverError, match="no requests"):
        summarise([], "jmeter", "http://x")


def test_jtl_parser_reads_jmeter_csv(tmp_path):
    f = tmp_path / "r.jtl"
    f.write_text("timeStamp,elapsed,label,responseCode,success,bytes,Latency\n"
                 "1000,5,GET,200,true,10,5\n1003,7,GET,500,false,10,7\n")
    rows = read_csv_samples(f, "timeStamp", "elapsed", "success")
    assert [(r.elapsed_ms, r.ok) for r in rows] == [(5, True), (7, False)]
    f.write_text("a,b\n1,2\n")
    with pytest.raises(DriverError, match="lacks column"):
        read_csv_samples(f, "timeStamp", "elapsed", "success")


def test_a_named_jmeter_is_run_as_given_never_swapped_for_the_system_one(tmp_path, monkeypatch):
    """With JMETER_HOME set and Debian's install present, `--jmeter /path/to/wrapper` still runs that wrapper: auto
    chose Debian's 2.13 launcher for whatever binary was named, so /bin/false passed as a JMeter run."""
    fake = tmp_path / "bin" / "my-jmeter"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "ApacheJMeter.jar").write_bytes(b"")
    monkeypatch.setenv("JMETER_HOME", str(home))
    assert jm.jmeter_home(str(fake)) is None and jm.command(str(fake)) == [str(fake)]
    assert jm.jmeter_home("jmeter") == home  # the default name still finds an install the environment names


def test_split_target():
    assert jm.split_target("http://127.0.0.1:9000/work?ms=5") == {
        "protocol": "http", "host": "127.0.0.1", "port": "9000", "path": "/work?ms=5"}
    assert jm.split_target("https://h")["port"] == "443"
    for bad in ("ftp://h/x", "http://h:99999/", "http://h:abc/", "http://[::1/"):
        with pytest.raises(DriverError, match="--target"):
            jm.split_target(bad)


def test_credentials_in_a_target_are_refused_by_both_drivers(tmp_path):
    for url in ("http://alice:s3cret@127.0.0.1:9/x", "http://alice@127.0.0.1:9/x"):
        with pytest.raises(DriverError, match="user-info") as exc:
            jm.split_target(url)
        assert "s3cret" not in str(exc.value)
        with pytest.raises(DriverError, match="user-info"):
            lc.run(url, duration_s=1, workdir=tmp_path)


def test_a_relative_jmeter_is_run_from_the_callers_folder(tmp_path, monkeypatch):
    # JMeter runs inside its work folder: a relative --jmeter named nothing there (a FileNotFoundError traceback).
    (tmp_path / "jm" / "bin").mkdir(parents=True)
    fake = tmp_path / "jm" / "bin" / "jmeter"
    fake.write_text(FAKE_JMETER)
    fake.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    res = jm.run("http://127.0.0.1:9/", jmeter_bin="jm/bin/jmeter", launcher="jmeter", duration_s=1)
    assert res.requests == 1


def test_results_are_forced_to_one_row_per_request_whatever_jmeter_properties_say():
    # JMeter 5 writes a redirect's hops as rows of their own unless subresults are off; a user.properties may
    # change the delimiter; timeStamp must be the start for start + elapsed to be the end.
    assert jm.RESULT_PROPS["jmeter.save.saveservice.subresults"] == "false"
    assert jm.RESULT_PROPS["jmeter.save.saveservice.default_delimiter"] == ","
    assert jm.RESULT_PROPS["sampleresult.timestamp.start"] == "true"


def test_plan_is_parameterised_and_finite():
    text = jm.DEFAULT_PLAN.read_text()
    for prop in ("host", "port", "path", "threads", "rampup", "duration", "protocol"):
        assert f"${{__P({prop}," in text, prop
    assert '<boolProp name="ThreadGroup.scheduler">true</boolProp>' in text


@pytest.mark.parametrize("args", [
    ["load", "jmeter", "--target", "ftp://x/y"],
    ["load", "jmeter", "--target", "http://127.0.0.1:1/", "--threads", "0"],
    ["load", "jmeter", "--target", "http://127.0.0.1:1/", "--plan", "/nonexistent.jmx"],
    ["load", "locust", "--target", "nope"],
    # Credentials in a target would be printed and kept; JMeter would drop them where Locust sends them.
    ["load", "locust", "--target", "http://alice:s3cret@127.0.0.1:1/"],
    ["load", "jmeter", "--target", "http://alice@127.0.0.1:1/"],
    ["load", "jmeter", "--target", "http://127.0.0.1:1/", "--rampup", "20", "--duration", "10"],
    ["workload", "manifest", "shop-cart", "--replicas", "2"],
    ["workload", "serve", "cpu", "--listen", "127.0.0.1"],
    ["workload", "serve", "cpu", "--listen", "127.0.0.1:99999"],
    ["workload", "serve", "gpu"],
    ["workload", "manifest", "cpu", "--scheduler-name", "Bad_Name"],
    ["workload", "manifest", "cpu", "--cpu-request", "0"],
    ["workload", "manifest", "cpu", "--memory-request", "0Mi"],
    ["workload", "manifest", "memory", "--memory-request", "8Gi", "--memory-limit", "1Gi"],
])
def test_cli_bad_input_exits_2(args):
    cp = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
    assert cp.stderr.strip(), args


JTL_HEAD = "timeStamp,elapsed,label,responseCode,success,bytes,Latency\n"


@pytest.mark.parametrize("rows,where", [
    ("1000,5,GET,200,true,10,5\n1003,7,GE", "line 3: no success field"),  # the last line cut short
    ("1000,5,GET,200,true,10,5\n1003\n", "line 3: no elapsed field"),
    ("1000,x,GET,200,true,10,5\n", "line 2: elapsed 'x' is not a number"),
    ("2024/01/01 10:00:00,5,GET,200,true,10,5\n", "line 2: timeStamp '2024/01/01 10:00:00' is not a number"),
    (",5,GET,200,true,10,5\n", "line 2: timeStamp '' is not a number"),  # used to be skipped silently
    ("1000,nan,GET,200,true,10,5\n", "line 2: elapsed 'nan' is not a number of milliseconds"),
    ("1000,inf,GET,200,true,10,5\n", "line 2: elapsed 'inf' is not a number of milliseconds"),
    ("1000,-3,GET,200,true,10,5\n", "line 2: elapsed '-3' is not a number of milliseconds"),
    ("-1000,3,GET,200,true,10,5\n", "line 2: timeStamp '-1000' is not a number"),
    ("1000,1e308,GET,200,true,10,5\n", "line 2: elapsed '1e308' is not a number of milliseconds in 0..1e15"),
    ("1e308,3,GET,200,true,10,5\n", "line 2: timeStamp '1e308' is not a number of milliseconds in 0..1e15"),
    ("1_000,3,GET,200,true,10,5\n", "line 2: timeStamp '1_000' is not a number"),
    ("1000,\u0661\u0662,GET,200,true,10,5\n", "line 2: elapsed '\u0661\u0662' is not a number"),
    ("1000,5,GET,200,yes,10,5\n", "line 2: success 'yes' is neither true nor false"),  # used to count as a failure
    ('1000,5,GET,200,true,10,5\n1001,5,"GET,200,true,10,5\n', "line 3: not readable as CSV"),  # a quote left open
    (b"1000,5,GET,200,true,10,5\n1001,5,G\xe9T,200,true,10,5\n", "line 3: not UTF-8 text"),
])
def test_jtl_parser_names_the_file_line_and_field_of_a_bad_row(tmp_path, rows, where):
    f = tmp_path / "r.jtl"
    f.write_bytes(JTL_HEAD.encode() + (rows if isinstance(rows, bytes) else rows.encode()))
    with pytest.raises(DriverError, match=f"^{re.escape(f'{f} {where}')}"):
        read_csv_samples(f, "timeStamp", "elapsed", "success")


def test_jtl_parser_takes_blank_lines_any_case_and_extra_columns(tmp_path):
    f = tmp_path / "r.jtl"
    f.write_text(JTL_HEAD + "1000,5,GET,200,TRUE,10,5\n\n1001,6,GET,500,False,10,6,extra\n")
    rows = list(read_csv_samples(f, "timeStamp", "elapsed", "success"))
    assert rows == [Sample(1000, 5, True), Sample(1001, 6, False)]


# A stand-in for JMeter that writes its -l file as JMeter does: appending, with a header only to a new file.
FAKE_JMETER = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in -l) jtl="$2"; shift;; -j) log="$2"; shift;; esac
  shift
done
[ -f "$log" ] && exit 7
[ -f "$jtl" ] || echo "timeStamp,elapsed,success" > "$jtl"
echo "2000,5,true" >> "$jtl"
echo "this run" > "$log"
"""


def test_a_reused_workdir_does_not_mix_in_the_previous_runs_samples(tmp_path):
    fake = tmp_path / "jmeter"
    fake.write_text(FAKE_JMETER)
    fake.chmod(0o755)
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "results.jtl").write_text("timeStamp,elapsed,success\n" + "1000,900,false\n" * 5)  # the last run's
    (wd / "jmeter.log").write_text("last run\n")
    res = jm.run("http://127.0.0.1:9/", jmeter_bin=str(fake), launcher="jmeter", duration_s=1, workdir=wd)
    assert res.requests == 1 and res.errors == 0
    assert (wd / "jmeter.log").read_text() == "this run\n"
    (wd / "results.jtl").unlink()
    (wd / "results.jtl").mkdir()  # cannot be removed: said so, not a traceback
    with pytest.raises(DriverError, match="cannot remove the previous run's .*results.jtl"):
        jm.run("http://127.0.0.1:9/", jmeter_bin=str(fake), launcher="jmeter", duration_s=1, workdir=wd)
