"""The NVML GPU meter (power/nvml.py) and the exporter's GPU path.

No GPU was lent to this project when the meter was written, so the responses below are not a recording: they
are scripted to NVML's documented contract for one GPU of each kind, in NVML's own units and error objects
(``pynvml.NVMLError`` with its codes):

* a Volta-or-later GPU ("Tesla V100-SXM2-32GB"): ``nvmlDeviceGetTotalEnergyConsumption`` in mJ since the driver
  loaded (a large starting value), ``nvmlDeviceGetPowerUsage`` in mW;
* a Pascal GPU ("Tesla P100-PCIE-16GB"): the energy counter raises ``NVML_ERROR_NOT_SUPPORTED``, power only.

``test_a_live_gpu`` reads a real device where one exists and is skipped elsewhere.
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from joulesched.power.exporter import RefreshStatus, SnapshotCollector
from joulesched.power.meter import MeterError, MeterUnavailable
from joulesched.power.monitor import PowerMonitor
from joulesched.power.nvml import REOPEN_EVERY_S, NvmlMeter
from joulesched.power.powercap import PowercapMeter


class FakeNvml(SimpleNamespace):
    """pynvml's calls the meter makes, answering from per-device response lists (one entry per call)."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED

    def __init__(self, devices: list[dict], init_error: int | None = None) -> None:
        super().__init__()
        self.devices, self.init_error, self.shut = devices, init_error, False

    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.devices[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for d in self.devices:
            if d["uuid"] == uuid:
                return d
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if h.get("energy_mj") is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h["energy_mj"].pop(0)

    def nvmlDeviceGetPowerUsage(self, h):
        return h["power_mw"].pop(0)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _devices():
    # V100: the probe at open, then one reading per read(); 43 W idle, then 250 W for 2 s.
    v100 = {"name": "Tesla V100-SXM2-32GB", "uuid": "GPU-1b2c", "energy_mj": [912_345_678, 912_345_678,
                                                                              912_388_678, 912_888_678]}
    p100 = {"name": "Tesla P100-PCIE-16GB", "uuid": "GPU-9f8e", "energy_mj": None,
            "power_mw": [31_000, 31_000, 151_000]}
    return [v100, p100]


def test_counter_and_power_only_gpus():
    clock = Clock()
    nv = FakeNvml(_devices())
    m = NvmlMeter(nvml=nv, clock=clock)
    assert [(d.name, d.counter) for d in m.devices] == [("Tesla V100-SXM2-32GB", True), ("Tesla P100-PCIE-16GB", False)]
    assert m.zones == m.primary_zones == ("gpu0", "gpu1")
    t0 = clock.t  # opening read the baseline
    clock.t += 1.0
    r = m.read()
    assert r["gpu0"] == pytest.approx(43.0) and r["gpu1"] == pytest.approx(31.0)  # 43 J counted; 31 W x 1 s
    clock.t += 2.0
    r = m.read()
    assert r["gpu0"] == pytest.approx(543.0)  # +500 J
    assert r["gpu1"] == pytest.approx(31.0 + 2.0 * (31.0 + 151.0) / 2)  # trapezoid between readings
    assert m.joules(t0, clock.t) == pytest.approx(543.0 + 31.0 + 182.0)
    m.close()
    assert nv.shut


def test_no_gpu_and_a_counter_that_goes_back():
    with pytest.raises(MeterUnavailable, match="NVML cannot start"):
        NvmlMeter(nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(MeterUnavailable, match="sees no GPU"):
        NvmlMeter(nvml=FakeNvml([]))


def test_a_counter_that_goes_back_is_carried_forward(caplog):
    """A driver reload restarts NVML's counter: the total so far is kept and counting goes on from the new value
    (the reload's own interval counts nothing), so the meter, like a Prometheus counter, never goes back."""
    dev = {"name": "A10", "uuid": "GPU-a", "energy_mj": [5_000, 5_000, 9_000, 10, 2_010, 1_000, 1_500]}
    m = NvmlMeter(nvml=FakeNvml([dev]), clock=Clock())  # the probe and the baseline at open
    assert m.read()["gpu0"] == pytest.approx(4.0)
    with caplog.at_level("WARNING", logger="joulesched.power.nvml"):
        assert m.read()["gpu0"] == pytest.approx(4.0)  # went back from 9000 to 10 mJ: carried, rebased
    assert "went back from 9000 to 10 mJ" in caplog.text
    assert m.read()["gpu0"] == pytest.approx(6.0)  # +2 J after the reload
    assert m.read()["gpu0"] == pytest.approx(6.0)  # back again, to above the first baseline: still detected
    assert m.read()["gpu0"] == pytest.approx(6.5)


class FailingNvml(FakeNvml):
    """A scripted energy reading that is an NVML error code is raised, as a failing call would."""

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        v = super().nvmlDeviceGetTotalEnergyConsumption(h)
        if isinstance(v, pynvml.NVMLError):
            raise v
        return v


class ReloadingNvml(FakeNvml):
    """A driver reload: the handles taken before it answer NVML_ERROR_UNINITIALIZED, nvmlInit gives new ones,
    found by UUID, the GPUs in another order; the counters restart."""

    def __init__(self, devices):
        super().__init__(devices)
        self.generation, self.inits = 0, 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return {**self.devices[i], "gen": self.generation, "dev": self.devices[i]}

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for d in self.devices:
            if d["uuid"] == uuid:
                return {**d, "gen": self.generation, "dev": d}
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _live(self, h):
        if h["gen"] != self.generation:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return h["dev"]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return super().nvmlDeviceGetTotalEnergyConsumption(self._live(h))

    def nvmlDeviceGetPowerUsage(self, h):
        return super().nvmlDeviceGetPowerUsage(self._live(h))

    def reload(self):
        self.generation += 1
        self.devices.reverse()


def test_a_driver_reload_reopens_nvml_and_finds_each_gpu_by_its_uuid(caplog):
    clock = Clock()
    a = {"name": "A10", "uuid": "GPU-a", "energy_mj": [5_000, 5_000, 9_000, 100, 1_100]}
    b = {"name": "P4", "uuid": "GPU-b", "energy_mj": None, "power_mw": [20_000, 20_000, 30_000, 30_000]}
    nv = ReloadingNvml([a, b])
    m = NvmlMeter(nvml=nv, clock=clock)
    clock.t += 1.0
    assert m.read() == pytest.approx({"gpu0": 4.0, "gpu1": 20.0})
    nv.reload()
    clock.t += 10.0  # the gap of the reload counts nothing for either kind
    with caplog.at_level("WARNING", logger="joulesched.power.nvml"):
        r = m.read()
    assert nv.inits == 2 and "re-opening NVML" in caplog.text
    assert r == pytest.approx({"gpu0": 4.0, "gpu1": 20.0})  # zones keep their names though the indices swapped
    clock.t += 1.0
    assert m.read() == pytest.approx({"gpu0": 5.0, "gpu1": 50.0})  # +1 J; 30 W x 1 s
    # A GPU not found after a re-open is gone: named, its total held, and the other GPU counts on. It used to fail
    # every read, so the healthy GPU stopped counting until the exporter restarted.
    nv.devices.pop()  # GPU-a
    b["power_mw"] += [40_000, 40_000, 40_000, 40_000]
    nv.generation += 1
    clock.t += 100.0
    with caplog.at_level("WARNING", logger="joulesched.power.nvml"):
        assert m.read() == pytest.approx({"gpu0": 5.0, "gpu1": 50.0})  # re-opened: gpu1's new baseline
    assert nv.inits == 3 and m.held_zones == ("gpu0",)
    assert "gpu0 (A10, GPU-a) is not found after re-opening NVML" in caplog.text
    clock.t += 1.0
    assert m.read() == pytest.approx({"gpu0": 5.0, "gpu1": 90.0})  # 40 W x 1 s; no re-open in a loop
    assert nv.inits == 3 and m.held_zones == ("gpu0",)
    # Back (a GPU reset): looked for again after REOPEN_EVERY_S, found by its UUID, counted on from a new baseline
    # (its counter may have restarted; what it drew while gone is not known).
    a["energy_mj"] += [7_000, 8_000]
    nv.devices.append(a)
    clock.t += REOPEN_EVERY_S
    with caplog.at_level("WARNING", logger="joulesched.power.nvml"):
        assert m.read() == pytest.approx({"gpu0": 5.0, "gpu1": 90.0 + REOPEN_EVERY_S * 40.0})
    assert "gpu0 (A10, GPU-a) is found again" in caplog.text and m.held_zones == ()
    clock.t += 1.0
    assert m.read() == pytest.approx({"gpu0": 6.0, "gpu1": 130.0 + REOPEN_EVERY_S * 40.0})
    assert nv.inits == 3  # found by a lookup, NVML not re-opened


def test_a_failing_gpu_leaves_the_cpu_metrics_updating(powercap, proc, clock, caplog):
    """An NVML call that fails (or a GPU lost) is counted and the GPU's series hold, while the RAPL zones are
    still read every refresh (their counters wrap: an unsampled one would lose joules)."""
    powercap.add("intel-rapl:0", "package-0")
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    # Lost for two refreshes: the first re-opens NVML and reads again (lost twice), the second does not re-open.
    dev = {"name": "Tesla V100-SXM2-32GB", "uuid": "GPU-1", "energy_mj": [1_000_000, 1_000_000, 1_000_000,
                                                                             1_200_000, lost, lost, lost, 1_800_000]}
    gpus = NvmlMeter(nvml=FailingNvml([dev]), clock=clock)
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock, gpu_meter=gpus)
    mon.refresh()
    totals = []
    for _ in range(4):
        clock.advance(1)
        powercap.advance("intel-rapl:0", 100_000_000)
        proc.tick(user=50, idle=50)
        with caplog.at_level("WARNING", logger="joulesched.power.monitor"):
            s = mon.refresh()
        totals.append((s.zones["package-0"].joules_total, s.gpus["gpu0"], s.gpu_errors))
    assert [t[0] for t in totals] == pytest.approx([100.0, 200.0, 300.0, 400.0])  # every refresh
    assert totals[0][1] == (pytest.approx(200.0), pytest.approx(200.0)) and totals[0][2] == 0
    # While NVML fails the joules hold and the watts read 0: the last value would say the GPU still draws 200 W.
    assert totals[1][1] == totals[2][1] == (pytest.approx(200.0), 0.0)
    assert [t[2] for t in totals] == [0, 1, 2, 2]
    assert "GPU energy not read" in caplog.text and "gpu0: NVML read failed: GPU is lost" in caplog.text
    # Back: the 600 J since the last good reading, over the 3 s since it.
    assert totals[3][1] == (pytest.approx(800.0), pytest.approx(200.0))
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: mon.snapshot, lambda: RefreshStatus(1_700_000_000.0, 0)))
    errors = [(s.labels["part"], s.value) for fam in text_string_to_metric_families(generate_latest(reg).decode())
              for s in fam.samples if s.name == "joulesched_exporter_refresh_errors_total"]
    assert sorted(errors) == [("gpu", 2.0), ("node", 0.0)]


def test_one_lost_gpu_holds_while_the_others_count_on(powercap, proc, clock, caplog):
    """One GPU lost (NVML_ERROR_GPU_IS_LOST, before and after a re-open): its joules hold and its watts read 0,
    counted as a GPU error, while the other GPU goes on counting; it used to fail every read, so the healthy GPU's
    joules stopped and its watts gauge kept its last value. Only every GPU failing fails the read."""
    powercap.add("intel-rapl:0", "package-0")
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    # Readings: the probe and the baseline at open, the monitor's baseline, then one a refresh (two where NVML is
    # re-opened: the second refresh re-opens it and reads again; the third is within REOPEN_EVERY_S).
    a = {"name": "A100-SXM4-40GB", "uuid": "GPU-a", "energy_mj": [1_000_000] * 3 + [1_100_000, lost, lost, lost,
                                                                                  1_400_000, lost]}
    b = {"name": "A100-SXM4-40GB", "uuid": "GPU-b", "energy_mj": [2_000_000] * 3 + [2_050_000, 2_100_000, 2_100_000,
                                                                                  2_150_000, 2_200_000, lost]}
    gpus = NvmlMeter(nvml=FailingNvml([a, b]), clock=clock)
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock, gpu_meter=gpus)
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: mon.snapshot))
    mon.refresh()
    seen, watts = [], []
    for _ in range(5):
        clock.advance(1)
        powercap.advance("intel-rapl:0", 100_000_000)
        proc.tick(user=50, idle=50)
        with caplog.at_level("WARNING"):
            s = mon.refresh()
        seen.append((s.gpus["gpu0"], s.gpus["gpu1"], s.gpu_errors))
        watts.append({smp.labels["gpu"]: smp.value for fam in text_string_to_metric_families(
            generate_latest(reg).decode()) for smp in fam.samples if smp.name == "joulesched_node_gpu_watts"})
    assert [x[0] for x in seen] == [(100.0, 100.0), (100.0, 0.0), (100.0, 0.0), (400.0, 100.0), (400.0, 0.0)]
    assert [x[1] for x in seen] == [(50.0, 50.0), (100.0, 50.0), (150.0, 50.0), (200.0, 50.0), (200.0, 0.0)]
    # gpu0 back: the 300 J its counter went on counting, over the 3 s since its last good reading.
    assert watts[1] == {"gpu0": 0.0, "gpu1": 50.0} and watts[3] == {"gpu0": 100.0, "gpu1": 50.0}
    assert [x[2] for x in seen] == [0, 1, 2, 2, 3]
    assert "gpu0: NVML read failed: GPU is lost; its total is held at 100.000 J" in caplog.text
    assert "gpu0 reads again" in caplog.text
    # The last refresh: both lost, no re-open within REOPEN_EVERY_S, so the read failed, naming both.
    assert "gpu0: NVML read failed: GPU is lost; gpu1: NVML read failed: GPU is lost" in caplog.text
    assert s.zones["package-0"].joules_total == pytest.approx(500.0)  # the CPU side every refresh


def test_the_exporter_exports_gpu_joules(powercap, proc, clock):
    powercap.add("intel-rapl:0", "package-0")
    gpus = NvmlMeter(nvml=FakeNvml(_devices()), clock=clock)
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock, gpu_meter=gpus)
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: mon.snapshot))
    mon.refresh()  # the GPUs' first reading: 43 J on gpu0 since the meter opened is before the exporter's start
    clock.advance(2)
    proc.tick(user=50, idle=50)
    powercap.advance("intel-rapl:0", 4_000_000)
    mon.refresh()
    got = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            got.setdefault(s.name, {})[s.labels.get("gpu", "")] = (s.value, fam.type)
    assert got["joulesched_node_gpu_joules_total"]["gpu0"] == (pytest.approx(500.0), "counter")
    assert got["joulesched_node_gpu_watts"]["gpu0"] == (pytest.approx(250.0), "gauge")
    assert got["joulesched_node_gpu_joules_total"]["gpu1"][0] == pytest.approx(2.0 * (31.0 + 151.0) / 2)
    assert got["joulesched_node_joules_total"][""][0] == pytest.approx(4.0)  # the CPU side is untouched


@pytest.mark.parametrize("driver_loaded, level", [(True, "WARNING"), (False, "INFO")])
def test_gpu_auto_warns_where_a_driver_is_loaded_but_nvml_does_not_open(proc, monkeypatch, caplog, driver_loaded,
                                                                       level):
    """--gpu auto on a GPU host whose NVML cannot open (the unit's PrivateDevices=yes hides /dev/nvidia*) must not
    pass quietly: the GPUs would go unmetered. Without a driver, no GPU is the normal case."""
    import joulesched.power.nvml
    from joulesched.pipelines.cli.power import GpuMode, _gpu_meter

    def no_nvml(*args, **kwargs):
        raise MeterUnavailable("NVML cannot start: Insufficient Permissions (no NVIDIA driver or GPU here)")

    monkeypatch.setattr(joulesched.power.nvml, "NvmlMeter", no_nvml)
    if driver_loaded:
        (proc.root / "driver" / "nvidia").mkdir(parents=True)
    with caplog.at_level("INFO", logger="joulesched.pipelines.cli.power"):
        assert _gpu_meter(GpuMode.auto, proc.root) is None
    [rec] = caplog.records
    assert rec.levelname == level and "Insufficient Permissions" in rec.getMessage()
    assert ("gpu.conf" in rec.getMessage()) is driver_loaded


def _live_nvml() -> str:
    try:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return "" if n else "NVML sees no GPU"
    except pynvml.NVMLError as e:
        return f"no NVIDIA GPU or driver here ({e})"


@pytest.mark.skipif(bool(_live_nvml()), reason=_live_nvml() or "a GPU is here")
def test_a_live_gpu():
    import time

    m = NvmlMeter()
    t0 = m.mark()
    time.sleep(0.5)
    t1 = m.mark()
    j = m.joules(t0, t1)
    # Any GPU draws something: between 1 W and 1.5 kW over half a second, per GPU.
    assert 0.5 * len(m.devices) <= j <= 750.0 * len(m.devices)
    m.close()


def test_a_gpu_found_again_whose_next_read_fails_holds_what_it_had_counted():
    """Found again after it was gone, its baseline is reset; a failing read before a new one held 0 J (an
    operator-precedence slip dropped what had been carried), and the meter's total went back: 10 J, 0, 10 J."""
    class Hiding(FakeNvml):
        hide = False

        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            v = h["energy_mj"].pop(0)
            if isinstance(v, int) and v < 0:
                raise pynvml.NVMLError(-v)
            return v

        def nvmlDeviceGetHandleByUUID(self, uuid):
            if self.hide and uuid == "A":
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return super().nvmlDeviceGetHandleByUUID(uuid)

    a = {"name": "A", "uuid": "A", "energy_mj": [1000, 1000, 11000, -pynvml.NVML_ERROR_GPU_IS_LOST,
                                                 -pynvml.NVML_ERROR_UNKNOWN, 31000, 41000]}
    b = {"name": "B", "uuid": "B", "energy_mj": [5000] * 20}
    nv, clock = Hiding([a, b]), Clock()
    meter = NvmlMeter(nvml=nv, clock=clock)
    seen = []
    for step, hide in ((1, False), (1, True), (REOPEN_EVERY_S + 1, False), (1, False), (1, False)):
        nv.hide = hide
        clock.t += step
        seen.append(meter.read()["gpu0"])
    assert seen[0] == pytest.approx(10.0) and min(seen[1:]) >= seen[0]
    assert seen == sorted(seen)  # never back
