"""Meters on synthetic powercap and MSR trees: zones, wraparound, duplicates, missing zones, permissions."""

from __future__ import annotations

import errno
import os

import pytest

import joulesched.power.meter

from joulesched.power.meter import CounterBank, MeterPermissionError, MeterUnavailable
from joulesched.power.meters import open_meter
from joulesched.power.model import ModelMeter
from joulesched.power.msr import AMD, INTEL, MsrMeter
from joulesched.power.powercap import PowercapMeter
from joulesched.power.units import uj_to_j, wrap_delta

from .conftest import intel_two_socket


def test_wrap_delta_follows_reference_formula():
    assert wrap_delta(150, 100, 1000) == 50
    assert wrap_delta(100, 100, 1000) == 0
    assert wrap_delta(30, 900, 1000) == (1000 - 900) + 30


def test_counter_bank_keeps_exact_totals_over_many_wraps():
    bank = CounterBank()
    raw, total = 0, 0
    bank.update("z", raw, 1000)
    for step in [999, 999, 1, 500, 700, 999, 0, 1000 - 1]:
        raw += step
        if raw > 1000:  # the counter runs 0..max_range and wraps past it
            raw -= 1000
        total += step
        assert bank.update("z", raw, 1000) == total


def test_powercap_zones_labels_and_primary(powercap):
    intel_two_socket(powercap)
    m = PowercapMeter(str(powercap.root))
    assert set(m.zones) == {"package-0", "core-0", "uncore-0", "dram-0", "package-1", "core-1", "dram-1", "psys"}
    # Only the disjoint packages are summed for attribution: never a package with its own core, nor psys.
    assert m.primary_zones == ("package-0", "package-1")
    assert any("MMIO" in n for n in m.notes)


def test_nested_sysfs_layout_gives_the_same_zones(tmp_path):
    from tests.support.sysfs import SyntheticPowercap

    flat, nested = SyntheticPowercap(tmp_path / "flat"), SyntheticPowercap(tmp_path / "nested")
    intel_two_socket(flat)
    intel_two_socket(nested, nested=True)
    assert PowercapMeter(str(flat.root)).zones == PowercapMeter(str(nested.root)).zones


def test_zones_linked_from_the_class_folder_read_only_where_sys_is_whole(tmp_path):
    """Real sysfs: /sys/class/powercap/intel-rapl:0 is a relative link into /sys/devices. Read through a mount
    of /sys they resolve; a mount of the class folder alone leaves them dangling (what the DaemonSet did until a
    review: no zone, and --meter auto fell back to the model), so the manifests mount /sys whole."""
    from tests.support.sysfs import SyntheticPowercap

    sys_root = tmp_path / "host" / "sys"
    devices = SyntheticPowercap(sys_root / "devices" / "virtual" / "powercap" / "intel-rapl")
    devices.add("intel-rapl:0", "package-0", energy_uj=5_000_000)
    cls = sys_root / "class" / "powercap"
    cls.mkdir(parents=True)
    (cls / "intel-rapl:0").symlink_to("../../devices/virtual/powercap/intel-rapl/intel-rapl:0")
    meter = PowercapMeter(str(cls))
    assert list(meter.zones) == ["package-0"]
    alone = tmp_path / "class-only" / "powercap"  # the class folder mounted by itself: links left as they are
    alone.mkdir(parents=True)
    (alone / "intel-rapl:0").symlink_to("../../devices/virtual/powercap/intel-rapl/intel-rapl:0")
    with pytest.raises(MeterUnavailable):
        PowercapMeter(str(alone))


def test_a_meters_window_counts_the_node_zones_packages_and_dram(powercap, clock):
    """What calibration measures (``meter.joules``) is what a cluster run's energy counts: packages and DRAM,
    never core, uncore or psys (a review: the packages alone, so a calibrated curve left DRAM out)."""
    intel_two_socket(powercap)
    m = PowercapMeter(str(powercap.root), clock=clock)
    t0 = m.mark()
    for zone, uj in (("intel-rapl:0", 50e6), ("intel-rapl:0:0", 30e6), ("intel-rapl:0:1", 5e6),
                     ("intel-rapl:0:2", 8e6), ("intel-rapl:1", 40e6), ("intel-rapl:1:0", 20e6),
                     ("intel-rapl:1:1", 6e6), ("intel-rapl:2", 200e6)):
        powercap.advance(zone, int(uj))
    clock.advance(1.0)
    t1 = m.mark()
    assert m.joules(t0, t1) == pytest.approx(50 + 8 + 40 + 6)


ZONES = ["intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:0:2", "intel-rapl:1", "intel-rapl:1:0",
         "intel-rapl:1:1", "intel-rapl:2"]


@pytest.mark.parametrize("wrapping", ZONES)
def test_wraparound_on_every_zone(powercap, wrapping):
    intel_two_socket(powercap)
    max_range = 262_143_328_850
    powercap.set(wrapping, max_range - 1_000_000)  # 1 J below the wrap point
    m = PowercapMeter(str(powercap.root))
    before = m.read()
    injected = {}
    for z in ZONES:
        injected[z] = 3_500_000 if z == wrapping else 250_000
        powercap.advance(z, injected[z])
    after = m.read()
    assert int(open(powercap.energy_path(wrapping)).read()) < max_range - 1_000_000, "the counter did wrap"
    labels = dict(zip(ZONES, ["package-0", "core-0", "uncore-0", "dram-0", "package-1", "core-1", "dram-1", "psys"]))
    for z, label in labels.items():
        assert after[label] - before[label] == pytest.approx(uj_to_j(injected[z]), abs=1e-9)
        assert after[label] >= before[label]


def test_mmio_duplicate_is_counted_once_and_used_when_alone(powercap, tmp_path):
    intel_two_socket(powercap)
    m = PowercapMeter(str(powercap.root))
    assert list(m.zones).count("package-0") == 1
    powercap.advance("intel-rapl-mmio:0", 9_000_000)  # the duplicate moving must not add energy
    powercap.advance("intel-rapl:0", 2_000_000)
    assert m.read()["package-0"] == pytest.approx(2.0)

    from tests.support.sysfs import SyntheticPowercap

    only_mmio = SyntheticPowercap(tmp_path / "mmio")
    only_mmio.add("intel-rapl-mmio:0", "package-0")
    m2 = PowercapMeter(str(only_mmio.root))
    assert m2.zones == ("package-0",) and m2.primary_zones == ("package-0",)


def test_amd_has_package_and_core_only(powercap):
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:0", "core")
    m = PowercapMeter(str(powercap.root))
    assert m.zones == ("package-0", "core-0") and m.primary_zones == ("package-0",)


def test_missing_zones_and_trees(powercap, tmp_path):
    with pytest.raises(MeterUnavailable, match="does not exist"):
        PowercapMeter(str(tmp_path / "nope"))
    with pytest.raises(MeterUnavailable, match="no RAPL zones"):
        PowercapMeter(str(powercap.root))  # exists, empty
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:2", "dram")
    os.unlink(powercap.root / "intel-rapl:0:2" / "max_energy_range_uj")
    (powercap.root / "intel-rapl").mkdir()  # the control-type directory has no counter
    m = PowercapMeter(str(powercap.root))
    assert m.zones == ("package-0",)
    assert any("max_energy_range_uj" in n for n in m.notes)


def _deny_energy(path: str) -> bytes:
    if path.endswith("energy_uj"):
        raise PermissionError(errno.EACCES, "Permission denied", path)
    with open(path, "rb") as f:
        return f.read()


def test_permission_denied_says_what_to_do(powercap):
    intel_two_socket(powercap)
    with pytest.raises(MeterPermissionError) as e:
        PowercapMeter(str(powercap.root), read_fn=_deny_energy)
    msg = str(e.value)
    assert "energy_uj" in msg and "permission denied" in msg
    assert "root" in msg and "joulesched-power-exporter.service" in msg


def test_auto_falls_back_to_model_and_keeps_the_reason(powercap, proc, tmp_path, monkeypatch):
    intel_two_socket(powercap)
    monkeypatch.setattr(joulesched.power.meter, "read_bytes", _deny_energy)
    choice = open_meter("auto", powercap_root=str(powercap.root), proc_root=str(proc.root),
                        dev_root=str(tmp_path / "dev"))
    assert choice.meter.source == "model"
    assert "permission denied" in choice.skipped[0] and choice.skipped[1].startswith("msr:")
    with pytest.raises(MeterPermissionError):
        open_meter("powercap", powercap_root=str(powercap.root))


# --- MSR -------------------------------------------------------------------------------------------------

def _intel_msrs(msr, proc, cpus=4, packages=2, esu=14):
    proc.cpuinfo("GenuineIntel", packages=packages, cores_per_package=cpus // packages)
    for cpu in range(cpus):
        msr.write(cpu, INTEL.unit, (esu << 8) | 0x3)
        for name, (reg, _) in INTEL.zones.items():
            msr.write(cpu, reg, 0)


def test_msr_intel_units_zones_and_wraparound_on_every_zone(msr, proc):
    _intel_msrs(msr, proc)
    first_cpu = {0: 0, 1: 2}
    for pkg, cpu in first_cpu.items():
        for name, (reg, _) in INTEL.zones.items():
            msr.write(cpu, reg, 0xFFFF_FFF0 | (0xABCD << 32))  # high bits are reserved and must be masked
    m = MsrMeter(dev_root=str(msr.dev_root), proc_root=str(proc.root), opener=msr.opener, pread=msr.pread)
    assert set(m.zones) == {f"{z}-{p}" for z in ("package", "core", "dram") for p in (0, 1)}
    assert m.primary_zones == ("package-0", "package-1")
    before = m.read()
    for pkg, cpu in first_cpu.items():
        for name, (reg, _) in INTEL.zones.items():
            msr.write(cpu, reg, 0x10)  # wrapped: 0x10 units past the wrap point, 0x20 in all
    after = m.read()
    unit = 1 / 2**14
    for z in m.zones:
        assert after[z] - before[z] == pytest.approx(0x20 * unit)


def test_msr_amd_sums_per_core_counters(msr, proc):
    proc.cpuinfo("AuthenticAMD", packages=1, cores_per_package=2, threads=2)  # 4 CPUs, 2 cores
    for cpu in range(4):
        msr.write(cpu, AMD.unit, 16 << 8)
        msr.write(cpu, AMD.zones["package"][0], 0)
        msr.write(cpu, AMD.zones["core"][0], 0)
    m = MsrMeter(dev_root=str(msr.dev_root), proc_root=str(proc.root), opener=msr.opener, pread=msr.pread)
    assert m.zones == ("package-0", "core-0")
    msr.write(0, AMD.zones["package"][0], 65536 * 5)
    msr.write(0, AMD.zones["core"][0], 65536 * 2)  # core 0 (cpu 0)
    msr.write(2, AMD.zones["core"][0], 65536 * 1)  # core 1 (cpu 2); cpus 1 and 3 are SMT siblings
    msr.write(1, AMD.zones["core"][0], 65536 * 100)  # a sibling's copy must not be read
    r = m.read()
    assert r["package-0"] == pytest.approx(5.0) and r["core-0"] == pytest.approx(3.0)


def test_msr_missing_dram_and_permission(msr, proc, tmp_path):
    _intel_msrs(msr, proc, cpus=2, packages=1)

    for cpu in msr.registers:
        del msr.registers[cpu][INTEL.zones["dram"][0]]  # client parts have no DRAM domain: reads fail
    m = MsrMeter(dev_root=str(msr.dev_root), proc_root=str(proc.root), opener=msr.opener, pread=msr.pread)
    assert m.zones == ("package-0", "core-0")

    def deny(path, flags):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    with pytest.raises(MeterPermissionError, match="root"):
        MsrMeter(dev_root=str(msr.dev_root), proc_root=str(proc.root), opener=deny)
    with pytest.raises(MeterUnavailable, match="msr"):
        MsrMeter(dev_root=str(tmp_path / "nodev"), proc_root=str(proc.root))  # the real os.open


def test_msr_through_a_real_file_with_pread(tmp_path, proc):
    """Intel's registers are 8 bytes apart at least, so a sparse file can stand in for the device here and the
    default os.open/os.pread path runs for real."""
    proc.cpuinfo("GenuineIntel", packages=1, cores_per_package=1)
    dev = tmp_path / "dev" / "cpu" / "0"
    dev.mkdir(parents=True)
    values = {INTEL.unit: 10 << 8, 0x611: 1024 * 7, 0x639: 1024 * 3, 0x619: 1024}
    with open(dev / "msr", "wb") as f:
        for reg, v in values.items():
            f.seek(reg)
            f.write(v.to_bytes(8, "little"))
    m = MsrMeter(dev_root=str(tmp_path / "dev"), proc_root=str(proc.root))
    with open(dev / "msr", "r+b") as f:
        f.seek(0x611)
        f.write((1024 * 9).to_bytes(8, "little"))
    assert m.read() == {"package-0": pytest.approx(2.0), "core-0": 0.0, "dram-0": 0.0}
    m.close()


# --- model -----------------------------------------------------------------------------------------------

def test_model_meter_integrates_the_curve_over_time(proc, clock):
    curve = (100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200)
    m = ModelMeter(curve, proc_root=str(proc.root), clock=clock)
    assert m.read() == {"platform": 0.0}
    clock.advance(2.0)
    proc.tick(user=50, idle=50)  # 50 % busy
    assert m.read()["platform"] == pytest.approx(2.0 * 150)
    clock.advance(1.0)
    proc.tick(user=25, iowait=50, idle=25)  # iowait is not busy: 25 %
    assert m.read()["platform"] == pytest.approx(300 + 125)
    assert m.last_utilization == pytest.approx(0.25)


def test_model_meter_rejects_a_bad_curve(proc):
    with pytest.raises(joulesched.power.meter.MeterError, match="non-decreasing"):
        ModelMeter([200, 100] + [300] * 9, proc_root=str(proc.root))
