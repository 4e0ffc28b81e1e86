"""Counters that wrap must be read inside half a wrap period at a high power (units.PEAK_ZONE_WATTS): the
exporter refuses a longer --interval, ``power read`` steps through a long --duration, and a meter read late
says so. Two wraps between readings look like one and lose a whole range of joules."""

from __future__ import annotations

import json
import socket
import time

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.power.powercap import PowercapMeter

runner = CliRunner()
RANGE_UJ = 1_000_000_000  # 1 kJ: 500 W goes round it in 2 s, so readings must come at most 1 s apart


def _roots(powercap, proc, tmp_path):
    return ["--powercap-root", str(powercap.root), "--proc-root", str(proc.root), "--dev-root", str(tmp_path / "dev")]


def test_the_exporter_refuses_an_interval_past_half_a_wrap(powercap, proc, tmp_path):
    powercap.add("intel-rapl:0", "package-0", max_range_uj=RANGE_UJ)
    assert PowercapMeter(str(powercap.root)).max_read_interval_s() == pytest.approx(1.0)
    with socket.socket() as busy:  # were the interval let through, serving would fail at once (exit 2, another line)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = runner.invoke(app, ["power", "exporter", "--listen", f"127.0.0.1:{busy.getsockname()[1]}",
                                "--interval", "5", *_roots(powercap, proc, tmp_path)])
    assert r.exit_code == 2, r.output
    assert "--interval 5 s is too long for the powercap meter" in r.output and "at most 1 s" in r.output


def test_read_steps_through_a_long_duration_so_no_wrap_is_missed(powercap, proc, tmp_path, monkeypatch):
    """300 W for 10 s is 3 kJ: three times round the counter. Read once at the end, it would show 0 J."""
    powercap.add("intel-rapl:0", "package-0", max_range_uj=RANGE_UJ)
    path = powercap.energy_path("intel-rapl:0")

    def sleep(seconds):  # the host's package draws 300 W while the command waits
        path.write_text(f"{(int(path.read_text()) + round(300 * seconds * 1e6)) % RANGE_UJ}\n")

    monkeypatch.setattr(time, "sleep", sleep)
    r = runner.invoke(app, ["power", "read", "--duration", "10", "--json", *_roots(powercap, proc, tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["zones"]["package-0"]["joules"] == pytest.approx(3000.0)


def test_a_meter_read_later_than_a_wrap_at_peak_power_warns(powercap, clock, caplog):
    powercap.add("intel-rapl:0", "package-0", max_range_uj=RANGE_UJ)
    m = PowercapMeter(str(powercap.root), clock=clock)
    with caplog.at_level("WARNING", logger="joulesched.power.meter"):
        clock.advance(1.9)  # 950 J at 500 W: inside one range
        m.read()
        assert caplog.text == ""
        clock.advance(2.5)
        m.read()
    assert "powercap meter: 2.5 s between readings, longer than a counter wrap at 500 W" in caplog.text
    assert "read at least every 1 s" in caplog.text
