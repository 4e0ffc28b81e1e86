"""The exporter's metric families, rendered from snapshots, and its HTTP endpoint on loopback."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from joulesched.core.net import parse_listen
from joulesched.power.exporter import Exporter, SnapshotCollector
from joulesched.power.monitor import PowerMonitor
from joulesched.power.powercap import PowercapMeter
from tests.support.sysfs import FakeProcess, pod_cgroup_v2

NAMES = {
    "joulesched_node_joules_total": ("counter", {"zone", "source"}),
    "joulesched_node_active_joules_total": ("counter", {"zone"}),
    "joulesched_node_idle_joules_total": ("counter", {"zone"}),
    "joulesched_node_watts": ("gauge", {"zone", "source"}),
    "joulesched_node_cpu_usage_ratio": ("gauge", set()),
    "joulesched_process_joules_total": ("counter", {"pid", "comm"}),
    "joulesched_pod_joules_total": ("counter", {"pod_uid", "container_id"}),
    "joulesched_vm_joules_total": ("counter", {"vm_name"}),
}
UID = "11111111-2222-4333-8444-555555555555"


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value, fam.type))
    return out


def test_metric_names_types_labels_and_values(powercap, proc, clock):
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl-mmio:0", "package-0")
    proc.add(FakeProcess(10, "web server", cgroup=pod_cgroup_v2(UID, "c" * 64)))
    proc.add(FakeProcess(11, "qemu", cmdline=b"qemu-system-x86_64\0-name\0guest=vm1,debug-threads=on\0"))
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock)
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: mon.snapshot))
    mon.refresh()
    clock.advance(1)
    powercap.advance("intel-rapl:0", 8_000_000)
    proc.tick(user=75, idle=25)
    proc.run(10, utime=30)
    proc.run(11, utime=10)
    mon.refresh()

    got = _samples(generate_latest(reg).decode())
    for name, (kind, labels) in NAMES.items():
        assert name in got, name
        for lab, _, typ in got[name]:
            assert set(lab) == labels and typ == kind
    assert got["joulesched_node_joules_total"] == [({"zone": "package-0", "source": "powercap"}, 8.0, "counter")]
    assert got["joulesched_node_active_joules_total"][0][1] == pytest.approx(6.0)
    assert got["joulesched_node_watts"][0][1] == pytest.approx(8.0)
    assert got["joulesched_node_cpu_usage_ratio"][0][1] == pytest.approx(0.75)
    assert got["joulesched_pod_joules_total"] == [({"pod_uid": UID, "container_id": "c" * 64}, 4.5, "counter")]
    assert got["joulesched_vm_joules_total"] == [({"vm_name": "vm1"}, 1.5, "counter")]
    assert {lab["comm"] for lab, _, _ in got["joulesched_process_joules_total"]} == {"web server", "qemu"}


@pytest.mark.parametrize("listen, expected", [("127.0.0.1:9102", ("127.0.0.1", 9102)),
                                              ("[::1]:9102", ("::1", 9102)), ("0.0.0.0:0", ("0.0.0.0", 0))])
def test_parse_listen(listen, expected):
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("bad", ["9102", ":9102", "host:", "host:http", "127.0.0.1:70000"])
def test_parse_listen_rejects(bad):
    with pytest.raises(ValueError, match="--listen"):
        parse_listen(bad)


def test_exporter_serves_on_loopback_and_refreshes(powercap, proc):
    powercap.add("intel-rapl:0", "package-0")
    exp = Exporter(PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root)), port=0,
                   interval_s=0.05).start()
    try:
        assert exp._server.server_address[0] == "127.0.0.1"
        powercap.advance("intel-rapl:0", 3_000_000)
        import time

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            body = urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=5).read().decode()
            value = _samples(body)["joulesched_node_joules_total"][0][1]
            if value > 0:
                break
            time.sleep(0.05)
        assert value == pytest.approx(3.0)
    finally:
        exp.stop()


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_failed_refreshes_are_counted_and_a_stale_snapshot_fails_healthz(powercap, proc, clock, caplog):
    """The refresh loop is held off (a one-hour interval); the test refreshes by hand on its own clock."""
    powercap.add("intel-rapl:0", "package-0")
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock)
    exp = Exporter(mon, port=0, interval_s=3600, max_age_s=10, clock=clock,
                   wall=lambda: 1_700_000_000.0 + clock.now).start()
    try:
        assert _get(exp.port, "/healthz") == (200, b"ok\n")
        clock.advance(5)
        powercap.advance("intel-rapl:0", 2_000_000)
        assert exp.refresh()
        powercap.energy_path("intel-rapl:0").write_text("garbage\n")  # the meter now fails
        clock.advance(5)
        with caplog.at_level("WARNING", logger="joulesched.power.exporter"):
            assert not exp.refresh()
        # A meter's own error is one line a refresh (it says what broke), not a traceback each interval.
        assert "power refresh failed (" in caplog.text and "not an integer" in caplog.text
        assert "Traceback" not in caplog.text
        got = _samples(_get(exp.port, "/metrics")[1].decode())
        assert got["joulesched_node_joules_total"][0][1] == pytest.approx(2.0)  # the last good snapshot
        assert got["joulesched_exporter_last_refresh_timestamp_seconds"] == [({}, 1_700_001_005.0, "gauge")]
        errors = {lab["part"]: (v, typ) for lab, v, typ in got["joulesched_exporter_refresh_errors_total"]}
        assert errors == {"node": (1.0, "counter"), "gpu": (0.0, "counter")}
        assert _get(exp.port, "/healthz")[0] == 200  # 5 s old: within max_age_s
        clock.advance(6)
        code, body = _get(exp.port, "/healthz")
        assert code == 503 and b"stale: the last successful refresh was 11.0 s ago" in body
        assert _get(exp.port, "/readyz")[0] == 503
        powercap.set("intel-rapl:0", 3_000_000)  # the meter reads again
        assert exp.refresh() and _get(exp.port, "/healthz") == (200, b"ok\n")
    finally:
        exp.stop()
