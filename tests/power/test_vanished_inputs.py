"""Inputs that vanish or are not what they should be: a powercap zone whose energy_uj goes away mid-run (a
package hot-removed, the RAPL driver reloading), and a file given as --proc-root."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.power.exporter import Exporter
from joulesched.power.meter import MeterError
from joulesched.power.monitor import PowerMonitor
from joulesched.power.powercap import PowercapMeter

runner = CliRunner()


def test_a_zone_that_goes_away_holds_its_total_while_the_others_go_on(powercap, clock, caplog):
    powercap.add("intel-rapl:0", "package-0", energy_uj=1_000_000_000)
    powercap.add("intel-rapl:1", "package-1", energy_uj=2_000_000_000)
    m = PowercapMeter(str(powercap.root), clock=clock)
    powercap.advance("intel-rapl:0", 30_000_000)
    powercap.advance("intel-rapl:1", 20_000_000)
    clock.advance(1.0)
    assert m.read() == {"package-0": pytest.approx(30.0), "package-1": pytest.approx(20.0)}

    powercap.energy_path("intel-rapl:1").unlink()  # socket 1 hot-removed: its counter file is gone
    powercap.advance("intel-rapl:0", 40_000_000)
    clock.advance(1.0)
    with caplog.at_level("WARNING", logger="joulesched.power.powercap"):
        assert m.read() == {"package-0": pytest.approx(70.0), "package-1": pytest.approx(20.0)}
    assert "package-1" in caplog.text and "has gone" in caplog.text

    # It comes back ten minutes later, its counter restarted near zero: a new baseline, not a 262 kJ "wrap"
    # (ten minutes at the implausible rate would have let the wrap through).
    clock.advance(600.0)
    powercap.set("intel-rapl:1", 5_000_000)
    powercap.advance("intel-rapl:0", 50_000_000)
    assert m.read() == {"package-0": pytest.approx(120.0), "package-1": pytest.approx(20.0)}
    powercap.advance("intel-rapl:1", 7_000_000)
    clock.advance(1.0)
    assert m.read()["package-1"] == pytest.approx(27.0)


def test_a_zone_that_answers_an_io_error_is_held_too(powercap, clock, caplog):
    """ENODATA from psys (some laptops), EIO: one zone's error stopped every read, packages included (a review:
    the exporter then served a frozen snapshot). It is held like a zone that has gone."""
    import errno

    from joulesched.power.meter import default_read

    powercap.add("intel-rapl:0", "package-0")
    psys = powercap.add("intel-rapl:1", "psys")
    broken = {"on": False}

    def read(path: str) -> bytes:
        if broken["on"] and path == str(psys / "energy_uj"):
            raise OSError(errno.ENODATA, "No data available")
        return default_read(path)

    m = PowercapMeter(str(powercap.root), read_fn=read, clock=clock)
    broken["on"] = True
    powercap.advance("intel-rapl:0", 30_000_000)
    powercap.advance("intel-rapl:1", 4_000_000)  # drawn while it could not be read
    clock.advance(1.0)
    with caplog.at_level("WARNING", logger="joulesched.power.powercap"):
        assert m.read()["package-0"] == pytest.approx(30.0)
    assert "psys" in caplog.text and "No data available" in caplog.text
    broken["on"] = False
    powercap.advance("intel-rapl:1", 9_000_000)
    clock.advance(1.0)
    # back: its counter did not restart, so the whole gap since its last good reading counts (a review: taken as
    # a new baseline, the energy of the unreadable seconds was lost)
    assert m.read()["psys"] == pytest.approx(13.0)


def test_every_primary_zone_gone_is_a_meter_error_the_exporter_counts(powercap, proc, clock):
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:0", "core")
    m = PowercapMeter(str(powercap.root), clock=clock)
    exp = Exporter(PowerMonitor(m, proc_root=str(proc.root), clock=clock), clock=clock)
    assert exp.refresh()
    powercap.energy_path("intel-rapl:0").unlink()  # the core subzone alone says nothing to attribute
    clock.advance(1.0)
    with pytest.raises(MeterError, match="no primary zone \\(package-0\\) can be read"):
        m.read()
    assert not exp.refresh()  # one logged line and a counted error, not a traceback a second
    assert exp._status.refresh_errors == 1


@pytest.mark.parametrize("meter", ["auto", "msr", "model"])
@pytest.mark.parametrize("command", ["read", "exporter"])
def test_a_file_as_the_proc_root_exits_2(meter, command, tmp_path):
    proc_file = tmp_path / "proc.txt"
    proc_file.write_text("not a procfs\n")
    args = ["power", command, "--meter", meter, "--proc-root", str(proc_file), "--powercap-root",
            str(tmp_path / "none"), "--dev-root", str(tmp_path / "dev")]
    args += ["--duration", "0.05"] if command == "read" else ["--listen", "127.0.0.1:0", "--gpu", "off"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "is --proc-root a procfs?" in r.output and "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_a_garbled_cpuinfo_is_a_meter_error(proc, tmp_path):
    (proc.root / "cpuinfo").write_text("processor\t: zero\nvendor_id\t: GenuineIntel\n")
    r = runner.invoke(app, ["power", "read", "--meter", "msr", "--proc-root", str(proc.root), "--dev-root",
                            str(tmp_path / "dev")])
    assert r.exit_code == 2 and f"cannot read {proc.root}/cpuinfo" in r.output, r.output
