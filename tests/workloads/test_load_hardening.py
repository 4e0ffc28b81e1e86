"""Load drivers, hardened: JMeter's XStream allow-list admits only JMeter's classes (a plan naming any other
type is refused, with real JMeter), and a failed JMeter or Locust run leaves no work folder behind."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile

import pytest

from joulesched.workloads.load import jmeter as jm
from joulesched.workloads.load import locust as lc
from joulesched.workloads.load.results import DriverError

# java.lang.ProcessBuilder is the classic XStream gadget: with an any-type allow-list a plan could build one.
GADGET = """<?xml version="1.0" encoding="UTF-8"?>
<jmeterTestPlan version="1.2" properties="2.8" jmeter="2.13">
  <hashTree>
    <java.lang.ProcessBuilder>
      <command><string>touch</string><string>{marker}</string></command>
    </java.lang.ProcessBuilder>
    <hashTree/>
  </hashTree>
</jmeterTestPlan>
"""


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """The drivers' temporary folders go here, so the test sees what they leave."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def _debian_jmeter() -> str | None:
    home = jm.jmeter_home("jmeter")
    if shutil.which("jmeter") is None or home is None:
        return "jmeter not installed (apt-get install jmeter jmeter-http)"
    if not jm.jmeter_version(home).startswith("2.") or not any(j.is_file() for j in jm.BSH_JARS):
        return "the XStream allow-list applies to Debian's JMeter 2.13 launcher (JMeter 5.x keeps its own)"
    return None


def test_the_allow_list_names_jmeter_classes_only():
    script = jm.ALLOW_SCRIPT.read_text()
    code = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("//"))
    assert "AnyTypePermission" not in code and "NoTypePermission" not in code
    assert '"org.apache.jmeter.**"' in code and '"org.apache.jorphan.collections.ListedHashTree"' in code


@pytest.mark.integration
@pytest.mark.slow
def test_a_plan_naming_another_type_is_refused_by_real_jmeter(tmp_path, own_tmp):
    why = _debian_jmeter()
    if why:
        pytest.skip(why)
    marker = tmp_path / "built"
    plan = tmp_path / "gadget.jmx"
    plan.write_text(GADGET.format(marker=marker))
    keep = tmp_path / "work"
    with pytest.raises(DriverError, match="without results"):
        jm.run("http://127.0.0.1:9/", plan=plan, threads=1, rampup_s=0, duration_s=1, workdir=keep)
    log = (keep / "jmeter.log").read_text(errors="replace")
    assert "ForbiddenClassException" in log and "java.lang.ProcessBuilder" in log, log[-2000:]
    assert not marker.exists()


@pytest.mark.integration
@pytest.mark.slow
def test_a_failed_jmeter_run_removes_its_work_folder(tmp_path, own_tmp):
    why = _debian_jmeter()
    if why:
        pytest.skip(why)
    plan = tmp_path / "gadget.jmx"
    plan.write_text(GADGET.format(marker=tmp_path / "x"))
    with pytest.raises(DriverError, match="ForbiddenClassException|jmeter.log ends"):
        jm.run("http://127.0.0.1:9/", plan=plan, threads=1, rampup_s=0, duration_s=1)
    assert list(own_tmp.iterdir()) == []


def test_a_jmeter_that_cannot_start_leaves_nothing(tmp_path, own_tmp):
    fake = tmp_path / "jmeter"
    fake.write_text("#!/bin/sh\necho 'no JVM here' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(DriverError, match="exited 3 without results"):
        jm.run("http://127.0.0.1:9/", jmeter_bin=str(fake), launcher="jmeter", duration_s=1)
    assert list(own_tmp.iterdir()) == []


@pytest.mark.slow
def test_a_failed_locust_run_removes_its_work_folder(tmp_path, own_tmp):
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust not installed (pip install 'joulesched[load]')")
    broken = tmp_path / "locustfile.py"
    broken.write_text("raise SystemExit('this locustfile cannot load')\n")
    with pytest.raises(DriverError, match="without results"):
        lc.run("http://127.0.0.1:9/", users=1, duration_s=1, locustfile=broken)
    assert list(own_tmp.iterdir()) == []


@pytest.mark.slow
def test_a_reused_locust_workdir_does_not_report_the_previous_runs_samples(tmp_path):
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust not installed (pip install 'joulesched[load]')")
    quits = tmp_path / "locustfile.py"
    quits.write_text("import sys\nsys.exit(1)\n")  # exit 1, as Locust does after failed requests, and no samples
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "samples.csv").write_text("start_ms,elapsed_ms,ok\n" + "1000,5,true\n" * 50)  # the last run's
    with pytest.raises(DriverError, match="without results"):
        lc.run("http://127.0.0.1:9/", users=1, duration_s=1, locustfile=quits, workdir=wd)


@pytest.mark.slow
def test_a_request_that_hangs_is_a_failure_not_a_missing_row(monkeypatch):
    """Locust's HttpSession waits forever: a hung request was killed at the run's end and left no row, so a target
    that stopped answering read as 0 % errors. It now fails after the JMeter plan's 5 s. A user's LOCUST_* setting
    (here tags that select no task) no longer changes the driver's run."""
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust not installed (pip install 'joulesched[load]')")
    import http.server
    import threading
    import time

    class Hangs(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(20)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hangs)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("LOCUST_TAGS", "no-such-tag")
    try:
        res = lc.run(f"http://127.0.0.1:{srv.server_address[1]}/x", users=1, spawn_rate=1, duration_s=1)
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.requests >= 1 and res.errors == res.requests
    assert res.latency_ms.min >= lc.REQUEST_TIMEOUT_S * 1000 * 0.9
