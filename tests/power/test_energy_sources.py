"""The ``joulesched`` energy source's PromQL, evaluated by Prometheus's own engine (``promtool test rules``, no
server, no scrapes: input series at fixed steps, so the expected joules are exact), and the meter's default."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from joulesched.power.energy_sources import JOULESCHED, energy_source
from joulesched.power.prometheus import ENERGY_METRIC, PrometheusMeter, as_source

#: Joules per minute (whole watts: promtool compares values exactly): node n1 has GPUs, n2 none. core-0 lies
#: inside package-0 and psys contains everything: neither may be summed.
CPU = {("n1", "package-0"): 120, ("n1", "core-0"): 60, ("n1", "dram-0"): 60, ("n1", "psys"): 600,
       ("n2", "package-0"): 60, ("n2", "dram-0"): 60}
GPU = {("n1", "gpu0"): 240, ("n1", "gpu1"): 60}
#: What a whole node used per minute: packages + DRAM + GPUs.
NODE = {"n1": 120 + 60 + 240 + 60, "n2": 60 + 60}


def _series() -> list[dict]:
    cpu = [{"series": f'joulesched_node_joules_total{{instance="{n}:9102",zone="{z}",source="powercap"}}',
            "values": f"0+{j}x10"} for (n, z), j in CPU.items()]
    gpu = [{"series": f'joulesched_node_gpu_joules_total{{instance="{n}:9102",gpu="{g}"}}', "values": f"0+{j}x10"}
           for (n, g), j in GPU.items()]
    return cpu + gpu


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_the_joulesched_source_sums_cpu_zones_and_gpus(tmp_path):
    tests = [{"interval": "1m", "input_series": _series(), "promql_expr_test": [
        # Ten minutes of samples, a window that starts on the first: increase() needs no extrapolation.
        {"expr": JOULESCHED.joules(600), "eval_time": "10m",
         "exp_samples": [{"labels": "{}", "value": 10 * sum(NODE.values())}]},
        {"expr": JOULESCHED.watts(300), "eval_time": "10m",
         "exp_samples": [{"labels": f'{{instance="{n}:9102"}}', "value": j / 60} for n, j in NODE.items()]},
    ]}]
    f = tmp_path / "test.yml"
    f.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    r = subprocess.run([shutil.which("promtool"), "test", "rules", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_kepler_platform_watts_count_only_while_a_node_reports_them(tmp_path):
    """A node that appears late (woken) or goes stale early (asleep: its failed scrapes mark its series stale)
    is charged its platform watts only while it reported them; the preset multiplied their average by the whole
    window, so a node up for the last 90 s of 600 was charged 240 kJ instead of about 38 kJ."""
    from joulesched.power.energy_sources import KEPLER

    # Each node on its own BMC (Kepler labels every reading with its BMC's key, bmc_id).
    series = [{"series": f'kepler_platform_watts{{node_name="{n}",bmc_id="bmc-{n}",chassis_id="1"}}', "values": v}
              for n, v in (("late", "_x34 400x6"), ("always", "400x40"), ("early", "400x9 stale"))]
    # 15 s scrapes over 600 s; presence counted on 6 s steps: late 510-600 s (16 steps), early 0-144 s (25 steps
    # of 101, Prometheus 2's closed range), always every step (clamped to the whole window)
    want = 400 * 600 * (16 / 100) + 400 * 600 + 400 * 600 * (25 / 100)
    tests = [{"interval": "15s", "input_series": series, "promql_expr_test": [
        {"expr": KEPLER.joules(600), "eval_time": "600s", "exp_samples": [{"labels": "{}", "value": want}]}]}]
    f = tmp_path / "test.yml"
    f.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "15s", "tests": tests}))
    r = subprocess.run([shutil.which("promtool"), "test", "rules", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _promtool(tmp_path, interval: str, series: list[dict], exprs: list[dict]) -> None:
    tests = [{"interval": interval, "input_series": series, "promql_expr_test": exprs}]
    f = tmp_path / "test.yml"
    f.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": interval, "tests": tests}))
    r = subprocess.run([shutil.which("promtool"), "test", "rules", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_kepler_counts_a_host_its_vms_share_once(tmp_path):
    """Kepler in two VMs on one bare-metal host reports the host's platform watts twice (one BMC: Kepler's design,
    EP-001): the cluster's joules count that chassis once, where summing the nodes counted it once per VM. Each
    VM's own watts stay the host's (per node nothing else is known). A node with no platform reading counts its
    package + DRAM + GPU; a VM's RAPL-like counters are not added to its host's platform energy."""
    from joulesched.power.energy_sources import KEPLER

    def plat(node, bmc, chassis, pc, watts):
        return {"series": f'kepler_platform_watts{{source="redfish",node_name="{node}",bmc_id="{bmc}",'
                          f'chassis_id="{chassis}",power_control_id="{pc}"}}', "values": f"{watts}x40"}

    def counter(metric, node, per_step, **labels):
        extra = "".join(f',{k}="{v}"' for k, v in labels.items())
        return {"series": f'{metric}{{node_name="{node}"{extra}}}', "values": f"0+{per_step}x40"}

    series = [
        # vm1 and vm2 on one host (bmc-a): its server entry and its CPU subsystem's, seen from both VMs.
        *(plat(vm, "bmc-a", "System.Embedded.1", pc, w) for vm in ("vm1", "vm2") for pc, w in (("PC1", 400),
                                                                                              ("PC2", 150))),
        counter("kepler_node_cpu_joules_total", "vm1", 1500, zone="package", path="intel-rapl:0"),
        plat("bm", "bmc-b", "1", "PC1", 300),  # bare metal on its own BMC
        # No BMC: 1 W package, 2 W DRAM, 3 W GPU (15 s steps).
        counter("kepler_node_cpu_joules_total", "rapl", 15, zone="package", path="intel-rapl:0"),
        counter("kepler_node_cpu_joules_total", "rapl", 30, zone="dram", path="intel-rapl:0:2"),
        counter("kepler_node_gpu_joules_total", "rapl", 45, gpu="0"),
    ]
    want = 400 * 600 + 300 * 600 + (1 + 2 + 3) * 600  # the host once, the bare-metal node, the RAPL node
    _promtool(tmp_path, "15s", series, [
        {"expr": KEPLER.joules(600), "eval_time": "600s", "exp_samples": [{"labels": "{}", "value": want}]},
        {"expr": KEPLER.watts(300), "eval_time": "600s", "exp_samples": [
            {"labels": f'{{node_name="{n}"}}', "value": w} for n, w in (("vm1", 400), ("vm2", 400), ("bm", 300),
                                                                         ("rapl", 6))]}])


class _Prometheus:
    """Answers every query with one sample; keeps the queries."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def custom_query(self, query, params=None):
        self.queries.append(query)
        return [{"metric": {}, "value": [0, "2e9" if "timestamp" in query else "42"]}]


def test_the_default_meter_and_the_named_source_count_gpus():
    assert as_source(ENERGY_METRIC) is JOULESCHED is energy_source("joulesched")
    prom = _Prometheus()
    assert PrometheusMeter(prom, scrape_wait_s=0).joules(0.0, 60.0) == 42.0
    assert prom.queries[-1] == ('sum(increase(joulesched_node_joules_total{zone=~"package-.*|dram-.*|platform.*"}'
                                '[60000ms]) or increase(joulesched_node_gpu_joules_total[60000ms]))')
