"""`power read|exporter` and the powercap tree: a file given as the tree, the notes on skipped zones, the bound port."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.power.meter import MeterError, MeterUnavailable
from joulesched.power.powercap import PowercapMeter
from tests.support.procs import stop_process

runner = CliRunner()


def _roots(root, proc, tmp_path):
    return ["--powercap-root", str(root), "--proc-root", str(proc.root), "--dev-root", str(tmp_path / "dev")]


@pytest.mark.parametrize("meter", ["powercap", "auto"])
def test_a_file_as_the_powercap_tree_exits_2(meter, proc, tmp_path):
    tree = tmp_path / "powercap.txt"
    tree.write_text("not a tree\n")
    r = runner.invoke(app, ["power", "read", "--duration", "0.05", "--meter", meter, *_roots(tree, proc, tmp_path)])
    assert r.exit_code == 2, r.output
    assert f"--powercap-root {tree} is not a directory" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_the_meter_on_a_file_raises_a_meter_error(tmp_path):
    tree = tmp_path / "powercap.txt"
    tree.write_text("")
    with pytest.raises(MeterError, match="is not a directory") as e:
        PowercapMeter(str(tree))
    assert not isinstance(e.value, MeterUnavailable)  # a wrong path, not an absent driver


def test_read_shows_the_notes_on_skipped_zones(powercap, proc, tmp_path):
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:2", "dram")
    os.unlink(powercap.root / "intel-rapl:0:2" / "max_energy_range_uj")
    args = ["power", "read", "--duration", "0.05", "--meter", "powercap", *_roots(powercap.root, proc, tmp_path)]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert list(data["zones"]) == ["package-0"]
    assert len(data["notes"]) == 1 and data["notes"][0].startswith("intel-rapl:0:2: no usable max_energy_range_uj")
    assert "note: powercap: intel-rapl:0:2: no usable max_energy_range_uj" in r.stderr
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "intel-rapl:0:2: no usable max_energy_range_uj" in r.stderr


def test_every_zone_dropped_says_why(powercap, proc, tmp_path):
    powercap.add("intel-rapl:0", "package-0")
    os.unlink(powercap.root / "intel-rapl:0" / "max_energy_range_uj")
    with pytest.raises(MeterUnavailable, match=r"no usable RAPL zones under .*intel-rapl:0: no usable max_energy"):
        PowercapMeter(str(powercap.root))
    r = runner.invoke(app, ["power", "read", "--meter", "powercap", *_roots(powercap.root, proc, tmp_path)])
    assert r.exit_code == 2 and "intel-rapl:0: no usable max_energy_range_uj" in r.output
    assert "with energy_uj" not in r.output  # the zone has its energy_uj: that was not the reason


def _lines(stream) -> queue.Queue:
    """The lines of ``stream`` as a reader thread reads them, then ``""`` at its end: read with a deadline."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
        q.put("")

    threading.Thread(target=pump, daemon=True).start()
    return q


def test_exporter_on_port_0_prints_the_bound_port(powercap, proc, tmp_path):
    powercap.add("intel-rapl:0", "package-0")
    exe = Path(sys.executable).parent / "joulesched"
    p = subprocess.Popen([str(exe), "power", "exporter", "--listen", "127.0.0.1:0", "--gpu", "off",
                          *_roots(powercap.root, proc, tmp_path)], stderr=subprocess.PIPE, text=True)
    try:
        lines = _lines(p.stderr)
        deadline, line = time.monotonic() + 20, ""
        while not line.startswith("serving"):
            try:  # a stalled exporter fails the test here, in 20 s, not at pytest's global timeout
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail("the exporter did not say it was serving within 20 s")
            assert line, "exporter ended before serving"
        url = line.split(" on ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and not url.startswith("http://127.0.0.1:0/"), line
        assert "joulesched_node_joules_total" in urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        stop_process(p, timeout=10)
    assert p.returncode == 0
