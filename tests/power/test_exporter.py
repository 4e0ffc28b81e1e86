"""The exporter's metric families, rendered from snapshots, and its HTTP endpoint on loopback."""

from __future__ import annotations

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
