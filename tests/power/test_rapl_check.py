"""bench/power_rapl_check.py runs on a bare python3 (docs/power.md, "Calibration"): no site-packages, no
installed joulesched, no PYTHONPATH, started from an unrelated directory."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sysfs import SyntheticPowercap

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "power_rapl_check.py"


def _bare(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``-I``: no PYTHONPATH, no user site, no script-less cwd; ``-S``: no site-packages (the venv's joulesched,
    numpy and all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_help_on_a_bare_python(tmp_path):
    # The premise: this interpreter cannot import the installed package, so the script must find it itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([sys.executable, "-I", "-S", "-c", "import joulesched"], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "No module named 'joulesched'" in r.stderr
    r = _bare(["--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--powercap-root" in r.stdout


def test_no_meter_on_a_bare_python(tmp_path):
    """Every meter missing: the script imports all it needs, reports each meter, and exits 3."""
    (tmp_path / "powercap").mkdir()
    (tmp_path / "dev").mkdir()
    r = _bare(["--out", "out", "--powercap-root", "powercap", "--dev-root", "dev"], tmp_path)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    assert "no RAPL zones" in r.stdout and "no hardware meter" in r.stdout


@pytest.mark.slow
def test_full_run_on_a_synthetic_powercap_tree(tmp_path):
    """The whole check, burner included: its workers are spawned interpreters that import
    ``joulesched.power.burner`` too, so they need the same stand-in for the package."""
    pc = SyntheticPowercap(tmp_path / "powercap")
    pc.add("intel-rapl:0", "package-0", energy_uj=1_000_000)
    r = _bare(["--out", "out", "--powercap-root", "powercap", "--collections", "1", "--step-seconds", "0.05",
               "--settle-seconds", "0", "--sample-seconds", "0.05"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr  # a worker that failed to start would only print one
    assert "zone package-0" in r.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["meter"] == "powercap" and report["samples"] > 0
    rows = list(csv.reader((tmp_path / "out" / "samples.csv").open()))
    assert rows[0] == ["utilization", "watts"] and len(rows) == report["samples"] + 1
