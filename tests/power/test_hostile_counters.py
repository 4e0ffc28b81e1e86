"""Hardware that misbehaves: a RAPL counter that steps back or resets, ranges that cannot be right, zones and
registers that fail to read, a /proc that is not one, a GPU lost while NVML opens. Each is a clear error or a
dropped zone with a note, never a traceback or energy nobody used (found by a review, 2026-12-06)."""

from __future__ import annotations

import errno

import pynvml
import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.power.meter import MeterError, MeterUnavailable, default_read
from joulesched.power.meters import open_meter
from joulesched.power.msr import INTEL, MsrMeter
from joulesched.power.nvml import NvmlMeter
from joulesched.power.powercap import PowercapMeter
from tests.power.test_nvml import FakeNvml

runner = CliRunner()
RANGE = 262_143_328_850


def _package(powercap, clock, energy_uj: int = 100_000_000_000) -> PowercapMeter:
    powercap.add("intel-rapl:0", "package-0", energy_uj=energy_uj)
    return PowercapMeter(str(powercap.root), clock=clock)


@pytest.mark.parametrize("to", [100_000_000_000 - 1_000, 500_000_000], ids=["1 mJ back", "reset by a reload"])
def test_a_counter_that_steps_back_is_a_reset_not_a_wrap(powercap, clock, caplog, to):
    m = _package(powercap, clock)
    powercap.set("intel-rapl:0", to)
    clock.advance(1.0)
    with caplog.at_level("WARNING", logger="joulesched.power.meter"):
        assert m.read()["package-0"] == 0.0  # read as a wrap it was 162-262 kJ in one second
    assert "taken as a reset" in caplog.text
    powercap.advance("intel-rapl:0", 80_000_000)
    clock.advance(1.0)
    assert m.read()["package-0"] == pytest.approx(80.0)  # counted on from the new value


def test_a_real_wrap_is_still_counted(powercap, clock, caplog):
    m = _package(powercap, clock, energy_uj=RANGE - 40_000_000)
    powercap.advance("intel-rapl:0", 300_000_000)  # 300 J in 1 s: 40 J to the top, 260 J past it
    clock.advance(1.0)
    with caplog.at_level("WARNING", logger="joulesched.power.meter"):
        assert m.read()["package-0"] == pytest.approx(300.0)
    assert caplog.text == ""


def test_a_forward_jump_no_zone_could_draw_is_not_counted(powercap, clock):
    m = _package(powercap, clock, energy_uj=0)
    powercap.set("intel-rapl:0", 200_000_000_000)  # 200 kJ in 2 s
    clock.advance(2.0)
    assert m.read()["package-0"] == 0.0


@pytest.mark.parametrize("max_range", [0, -1000, 1])
def test_a_range_that_cannot_be_right_drops_the_zone(powercap, max_range):
    powercap.add("intel-rapl:0", "package-0", max_range_uj=max_range)
    with pytest.raises(MeterUnavailable, match=f"max_energy_range_uj {max_range} is below"):
        PowercapMeter(str(powercap.root))
    # `power read` looped forever in steps of 1e-9 s on a range of 1 µJ
    r = runner.invoke(app, ["power", "read", "--meter", "powercap", "--duration", "0.1",
                            "--powercap-root", str(powercap.root)])
    assert r.exit_code == 2 and "no usable RAPL zones" in r.output, r.output


def test_a_counter_above_its_range_is_an_error(powercap, clock):
    m = _package(powercap, clock)
    powercap.set("intel-rapl:0", RANGE + 5)
    with pytest.raises(MeterError, match=r"outside the counter's range 0\.\.262143328850"):
        m.read()


def test_zones_that_fail_to_read_are_dropped_or_said(powercap, clock):
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:1", "psys")
    powercap.energy_path("intel-rapl:1").unlink()
    powercap.energy_path("intel-rapl:1").mkdir()  # a directory where the counter should be
    m = PowercapMeter(str(powercap.root), clock=clock)
    assert m.zones == ("package-0",) and any("intel-rapl:1: energy_uj cannot be read" in n for n in m.notes)

    def eio(path: str) -> bytes:  # ENODATA/EIO mid-run, as psys gives on some laptops
        if path.endswith("energy_uj"):
            raise OSError(errno.EIO, "Input/output error")
        return default_read(path)

    m._read_fn = eio
    with pytest.raises(MeterError, match="cannot read .*energy_uj: Input/output error"):
        m.read()


def test_a_meter_without_a_package_or_platform_zone_refuses_to_open(powercap):
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:0", "core")
    (powercap.root / "intel-rapl:0" / "max_energy_range_uj").unlink()  # the package dropped, its core kept
    with pytest.raises(MeterUnavailable, match="no package or platform zone to attribute .*only core-0"):
        PowercapMeter(str(powercap.root))


def test_an_unreadable_msr_unit_register_is_unavailable_so_auto_falls_back(msr, proc, tmp_path):
    proc.cpuinfo("GenuineIntel", packages=1, cores_per_package=2)
    for cpu in range(2):
        msr.write(cpu, INTEL.zones["package"][0], 0)  # the energy register, but no unit register (EIO)
    with pytest.raises(MeterUnavailable, match="cannot read the RAPL power unit MSR 0x606 on cpu 0"):
        MsrMeter(dev_root=str(msr.dev_root), proc_root=str(proc.root), opener=msr.opener, pread=msr.pread)
    choice = open_meter("auto", powercap_root=str(tmp_path / "none"), proc_root=str(proc.root),
                        dev_root=str(msr.dev_root), curve=None)
    assert choice.meter.source == "model"


def test_a_proc_root_without_stat_is_named_by_read_and_the_exporter(powercap, proc, tmp_path):
    powercap.add("intel-rapl:0", "package-0")
    (proc.root / "stat").unlink()
    roots = ["--meter", "powercap", "--powercap-root", str(powercap.root), "--proc-root", str(proc.root)]
    for args in (["power", "read", "--duration", "0.05", *roots], ["power", "exporter", "--listen", "127.0.0.1:0",
                                                                     "--gpu", "off", *roots]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        assert f"cannot read {proc.root / 'stat'}" in r.output and "Traceback" not in r.output, r.output
        assert "cannot listen" not in r.output  # the exporter blamed its port
    (proc.root / "stat").write_text("garbage\n")
    r = runner.invoke(app, ["power", "read", "--duration", "0.05", *roots])
    assert r.exit_code == 2 and "not a /proc/stat" in r.output, r.output


@pytest.mark.parametrize("failing", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"])
def test_a_gpu_lost_while_nvml_opens_is_a_meter_error(failing, monkeypatch, proc):
    nv = FakeNvml([{"name": "Tesla T4", "uuid": "GPU-1", "energy_mj": [1, 1, 1]}])

    def lost(*_):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    setattr(nv, failing, lost)
    with pytest.raises(MeterError, match=f"gpu0: {failing.replace('UUID', 'Name/UUID')}"):
        NvmlMeter(nvml=nv)
    # --gpu auto goes on without the GPUs (a warning), where the raw NVMLError killed the exporter
    from joulesched.pipelines.cli import power as power_cli

    monkeypatch.setattr("joulesched.power.nvml._load_nvml", lambda: nv)
    assert power_cli._gpu_meter(power_cli.GpuMode.auto, proc.root) is None
