"""`load jmeter` and `load locust` with --plan / --workdir relative to the caller's folder: the tools run inside
the work folder, so the drivers must hand them absolute paths."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess

import pytest

from joulesched.workloads.load import jmeter as jm
from tests.workloads.conftest import BIN
from tests.workloads.test_drivers import _jmeter_ready


@pytest.mark.integration
@pytest.mark.slow
def test_real_jmeter_with_relative_plan_and_workdir(serve, tmp_path):
    why = _jmeter_ready()
    if why:
        pytest.skip(why)
    app = serve("testapp")
    (tmp_path / "plans").mkdir()
    shutil.copy(jm.DEFAULT_PLAN, tmp_path / "plans" / "plan.jmx")
    cp = subprocess.run(
        [str(BIN), "load", "jmeter", "--plan", "plans/plan.jmx", "--target", app.url + "/work?ms=1",
         "--threads", "2", "--rampup", "0", "--duration", "1", "--workdir", "wd", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["requests"] > 0
    assert (tmp_path / "wd" / "results.jtl").is_file() and (tmp_path / "wd" / "jmeter.log").is_file()
    assert not (tmp_path / "wd" / "wd").exists()


@pytest.mark.slow
def test_real_locust_with_relative_workdir(serve, tmp_path):
    if importlib.util.find_spec("locust") is None:  # not importorskip: importing locust patches this process with gevent
        pytest.skip("locust not installed (pip install 'joulesched[load]')")
    app = serve("testapp")
    cp = subprocess.run(
        [str(BIN), "load", "locust", "--target", app.url + "/work?ms=1", "--users", "2", "--spawn-rate", "2",
         "--duration", "1", "--workdir", "wd", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["requests"] > 0
    assert (tmp_path / "wd" / "samples.csv").is_file()
    assert not (tmp_path / "wd" / "wd").exists()
