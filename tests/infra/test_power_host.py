"""Host checks for a provisioned power host (testinfra). Runs against any inventory:

    pytest tests/infra/test_power_host.py --hosts=ansible://power_hosts --ansible-inventory=inventory/hosts.yml

Settings come from the inventory (power_exporter_listen, node_exporter_web_listen_address) when the ansible
backend is used, else from the role defaults. Without --hosts these tests skip: they check a remote host, never
the machine running pytest by accident. On failure the unit's journal is printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

SERVICE = "joulesched-power-exporter"
REPO = Path(__file__).resolve().parents[2]
NODE_SERVICE = "prometheus-node-exporter"
DEFAULTS = {"power_exporter_listen": "127.0.0.1:9102", "node_exporter_web_listen_address": "127.0.0.1:9100",
            "prometheus_web_listen_address": "127.0.0.1:9090"}


@pytest.fixture(autouse=True)
def _needs_hosts(request):
    if not request.config.getoption("hosts", None):
        pytest.skip("host checks need a target: --hosts=ansible://all --ansible-inventory=INVENTORY "
                    "(tests/infra/test_systemd_target.py runs them against a container it provisions)")


@pytest.fixture
def settings(host) -> dict:
    values = dict(DEFAULTS)
    if host.backend.NAME == "ansible":
        v = host.ansible.get_variables()
        values.update({k: v[k] for k in DEFAULTS if k in v})
        values["groups"] = v.get("group_names", [])
    return values


def _journal(host, unit: str) -> str:
    return host.run(f"journalctl -u {unit} --no-pager -n 40").stdout


def _fetch(host, url: str, timeout_s: float = 30.0) -> str:
    """GET url from the host itself (the exporter only accepts loopback), retrying until it answers."""
    code = ("import sys,urllib.request;"
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")
    end = time.monotonic() + timeout_s
    while True:
        r = host.run("python3 -c %s %s", code, url)
        if r.rc == 0 or time.monotonic() > end:
            assert r.rc == 0, f"GET {url} failed: {r.stderr}"
            return r.stdout
        time.sleep(1)


def _show(host, unit: str) -> dict[str, str]:
    out = host.check_output(f"systemctl show {unit} --all --no-pager")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_exporter_enabled_and_running(host):
    svc = host.service(SERVICE)
    assert svc.is_enabled, _journal(host, SERVICE)
    assert svc.is_running, _journal(host, SERVICE)


def test_exporter_listens_where_configured(host, settings):
    addr = settings["power_exporter_listen"]
    deadline = time.monotonic() + 30
    while not host.socket(f"tcp://{addr}").is_listening and time.monotonic() < deadline:
        time.sleep(1)
    assert host.socket(f"tcp://{addr}").is_listening, _journal(host, SERVICE)


def test_exporter_serves_energy(host, settings):
    body = _fetch(host, f"http://{settings['power_exporter_listen']}/metrics")
    assert "joulesched_node_joules_total" in body, body[:2000] + _journal(host, SERVICE)


def test_exporter_unit_is_hardened(host):
    p = _show(host, SERVICE)
    assert p["User"] == "joulesched-power" and p["NoNewPrivileges"] == "yes"
    assert p["ProtectSystem"] == "strict" and p["ProtectHome"] == "yes" and p["PrivateTmp"] == "yes"
    assert p["CapabilityBoundingSet"] == "" and p["AmbientCapabilities"] == ""
    assert p["RestrictSUIDSGID"] == "yes" and p["MemoryDenyWriteExecute"] == "yes"
    assert "127.0.0.0/8" in p.get("IPAddressAllow", "") or "localhost" in p.get("IPAddressAllow", "")
    pid = p["MainPID"]
    assert pid != "0", _journal(host, SERVICE)
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "joulesched-power"


def test_powercap_udev_rule_grants_the_exporters_group(host):
    """The rule that re-grants energy_uj to zones created after the exporter started (a RAPL driver reload): it
    is installed as shipped, its group exists, and the programs it runs are where it says."""
    rule = host.file("/etc/udev/rules.d/70-joulesched-powercap.rules")
    assert rule.is_file and rule.user == "root" and rule.mode == 0o644
    shipped = (REPO / "deploy" / "udev" / "70-joulesched-powercap.rules").read_text()
    assert rule.content_string == shipped
    assert host.group("joulesched-power").exists
    for prog in ("/bin/chgrp", "/bin/chmod"):
        assert f'RUN+="{prog} joulesched-power ' in shipped or f'RUN+="{prog} g+r ' in shipped
        assert host.file(prog).exists and host.file(prog).mode & 0o111


def test_node_exporter_up(host, settings):
    svc = host.service(NODE_SERVICE)
    assert svc.is_enabled and svc.is_running, _journal(host, NODE_SERVICE)
    addr = settings["node_exporter_web_listen_address"]
    body = _fetch(host, f"http://{addr}/metrics")
    assert "node_cpu_seconds_total" in body
    _check_go_exporter_sandbox(_show(host, NODE_SERVICE))


def _check_go_exporter_sandbox(p: dict[str, str]) -> None:
    """The drop-in's sandbox is in effect (and the service, checked running by the caller, lives with it)."""
    assert p["NoNewPrivileges"] == "yes" and p["ProtectKernelLogs"] == "yes" and p["MemoryDenyWriteExecute"] == "yes"
    assert p["RemoveIPC"] == "yes" and p["UMask"] == "0077" and p["CapabilityBoundingSet"] == ""
    # a deny-list filter (~@privileged @resources over @system-service) shows as an allow-list without them
    assert p["SystemCallFilter"] and "setuid" not in p["SystemCallFilter"].split(), p["SystemCallFilter"][:200]
    assert p["SystemCallErrorNumber"] in ("EPERM", "1"), p["SystemCallErrorNumber"]


def test_prometheus_scrapes_the_exporters(host, settings):
    if "monitoring" not in settings.get("groups", []):
        pytest.skip("host is not in the monitoring group")
    assert host.service("prometheus").is_running, _journal(host, "prometheus")
    _check_go_exporter_sandbox(_show(host, "prometheus"))
    url = f"http://{settings['prometheus_web_listen_address']}/api/v1/targets"
    deadline = time.monotonic() + 60
    while True:
        targets = json.loads(_fetch(host, url))["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        if health.get("joulesched-power") == "up" or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert health.get("joulesched-power") == "up", targets
