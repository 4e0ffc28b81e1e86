"""`joulesched trace import`: small files written here by hand in each trace's published schema, converted
through the real CLI, and every conversion checked field by field (units, times, kinds, priorities,
machines); then malformed, truncated and wrong-format files, each refused with exit 2 naming the file, the
line and the column, with nothing written."""

from __future__ import annotations

import gzip
import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.workload import JOB, NO_LIMIT, SERVICE, build_workload, load_trace
from joulesched.pipelines.cli import app

runner = CliRunner()
MEM_2018 = 96 * 3789.0  # alibaba-2018's default: normalised memory 100 = this many MiB


def write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(text, encoding="utf-8")
    return p


def run(*args: str | Path):
    return runner.invoke(app, ["trace", "import", *map(str, args)])


def imported(tmp_path: Path, fmt: str, files: list[Path], *extra: str, nodes: bool = True):
    out, mach = tmp_path / "out" / "pods.csv", tmp_path / "out" / "nodes.yaml"
    args = ["-f", fmt, "-o", out, *(["-m", mach] if nodes else []), "--json", *extra, *files]
    r = run(*args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    groups = yaml.safe_load(mach.read_text())["nodes"] if nodes else None
    return load_trace(out), groups, summary


def by_app(wl, app: str) -> list[int]:
    return [i for i in range(len(wl)) if wl.app_names[wl.app[i]] == app]


def profile(wl, i):
    a, b = wl.profile_bounds(i)
    return wl.prof_t[a:b].tolist(), wl.prof_m[a:b].tolist()


# ---- alibaba-2018 -----------------------------------------------------------------------------------------
def alibaba_2018(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        # task_name, instance_num, job_name, task_type, status, start_time, end_time, plan_cpu, plan_mem
        write(folder, "batch_task.csv", "M1,2,j_1,1,Terminated,100,400,150,0.5\n"
                                        "R2_1,1,j_1,1,Terminated,400,700,50,1.0\n"),
        # instance_name, task_name, job_name, task_type, status, start, end, machine, seq, total, cpu_avg, ...
        write(folder, "batch_instance.csv", "ins_a,M1,j_1,1,Terminated,100,350,m_1,1,1,120,180,0.3,0.4\n"
                                            "ins_b,M1,j_1,1,Terminated,110,400,m_2,1,1,80,100,0.2,0.3\n"
                                            "ins_c,R2_1,j_1,1,Running,450,0,m_1,1,1,40,60,0.1,0.1\n"
                                            "ins_d,R2_1,j_1,1,Waiting,0,0,,,,,,,\n"),
        # container_id, machine_id, time_stamp, app_du, status, cpu_request, cpu_limit, mem_size
        write(folder, "container_meta.csv", "c_1,m_1,0,app_1,started,400,800,1.5\n"
                                            "c_1,m_1,300,app_1,started,400,800,1.5\n"
                                            "c_2,m_2,50,app_2,started,200,,0.75\n"
                                            "c_3,m_3,20,app_3,started,100,100,0.5\n"
                                            "c_3,m_3,600,app_3,stopped,100,100,0.5\n"),
        # container_id, machine_id, time_stamp, cpu_util_percent, mem_util_percent, cpi, mem_gps, mpki, ...
        write(folder, "container_usage.csv", "c_1,m_1,0,25,10,,,,,,\nc_1,m_1,100,35,10,,,,,,\n"
                                             "c_1,m_1,300,50,10,,,,,,\n"),
        # machine_id, time_stamp, failure_domain_1, failure_domain_2, cpu_num, mem_size, status
        write(folder, "machine_meta.csv", "m_1,0,1,a,96,100,USING\nm_2,0,2,b,96,100,USING\n"
                                          "m_3,0,3,c,64,50,USING\nm_1,500,1,a,96,100,USING\n"),
    ]


def test_alibaba_2018_every_field(tmp_path):
    wl, groups, summary = imported(tmp_path, "alibaba-2018", alibaba_2018(tmp_path / "in"))
    assert len(wl) == 6 and summary["instances that never ran (skipped)"] == 1
    # Batch instances: plan_cpu 150 = 1.5 cores; plan_mem 0.5 of 100 normalised; cpu_avg 120 = 1.2 cores.
    a, b = by_app(wl, "j_1/M1")
    assert (wl.submit_s[a], wl.duration_s[a], wl.cpu_req[a], wl.mem_req[a], wl.usage_m[a]) == \
        (100.0, 250.0, 1500, math.ceil(0.005 * MEM_2018), 1200.0)
    assert (wl.submit_s[b], wl.duration_s[b], wl.usage_m[b]) == (110.0, 290.0, 800.0)
    assert wl.kind[a] == JOB and wl.owner_names[wl.owner[a]] == "Job" and wl.cpu_lim[a] == NO_LIMIT
    # Still running at the trace's end (700 s, the latest time seen): cut there.
    (c,) = by_app(wl, "j_1/R2_1")
    assert (wl.submit_s[c], wl.duration_s[c], wl.cpu_req[c], wl.usage_m[c]) == (450.0, 250.0, 500, 400.0)
    assert summary["jobs still running when the trace ends (cut there)"] == 1
    # Containers: services from their first row; cpu_request 400 = 4 cores, cpu_limit 800; mem 1.5 of 100.
    (s1,) = by_app(wl, "app_1")
    assert wl.kind[s1] == SERVICE and wl.owner_names[wl.owner[s1]] == "Deployment"
    assert (wl.submit_s[s1], wl.cpu_req[s1], wl.cpu_lim[s1], wl.mem_req[s1]) == \
        (0.0, 4000, 8000, math.ceil(0.015 * MEM_2018))
    assert math.isinf(wl.duration_s[s1]) and wl.service_end_s(s1) is None
    # Usage: cpu_util_percent of the request, averaged per 300 s step: (25+35)/2 % and 50 % of 4000 m.
    assert profile(wl, s1) == ([0.0, 300.0], [1200.0, 2000.0])
    (s2,) = by_app(wl, "app_2")
    assert wl.cpu_lim[s2] == NO_LIMIT and wl.usage_m[s2] == 0.5 * 2000  # no samples: --usage-fraction
    (s3,) = by_app(wl, "app_3")  # stopped at 600: a service with an end
    assert wl.service_end_s(s3) == 600.0 and wl.meta(s3).qos_class == "Burstable"
    # Machines: the latest row of each; groups by size, largest first.
    assert [(g["count"], g["cpu_m"], g["memory_mib"]) for g in groups] == \
        [(2, 96000, math.ceil(MEM_2018)), (1, 64000, math.ceil(0.5 * MEM_2018))]
    assert all(g["power_watts"] == "ibm-x3550-m3-x5675" and g["max_pods"] == 110 for g in groups)


def test_alibaba_2018_tasks_alone_window_and_units(tmp_path):
    files = alibaba_2018(tmp_path / "in")
    tasks = [f for f in files if f.name == "batch_task.csv"]
    wl, _, summary = imported(tmp_path, "alibaba-2018", tasks, "--memory-unit-mib", "1000",
                              "--usage-fraction", "0.25", nodes=False)
    # Without batch_instance each task is instance_num pods over its own start..end, at the usage fraction.
    assert wl.submit_s.tolist() == [100.0, 100.0, 400.0] and wl.duration_s.tolist() == [300.0, 300.0, 300.0]
    assert wl.mem_req.tolist() == [5, 5, 10] and wl.usage_m.tolist() == [375.0, 375.0, 125.0]
    # A window: trace second 200 becomes 0; what is left of a job alive then is its work.
    wl, _, _ = imported(tmp_path, "alibaba-2018", files, "--window", "200:500", nodes=False)
    a, b = by_app(wl, "j_1/M1")
    assert (wl.submit_s[a], wl.duration_s[a]) == (0.0, 150.0) and (wl.submit_s[b], wl.duration_s[b]) == (0.0, 200.0)
    (s1,) = by_app(wl, "app_1")
    assert wl.submit_s[s1] == 0.0 and profile(wl, s1) == ([-200.0, 100.0], [1200.0, 2000.0])
    assert wl.usage_at(s1, 50.0) == 1200.0 and wl.usage_at(s1, 100.0) == 2000.0
    assert not by_app(wl, "app_3") or wl.service_end_s(by_app(wl, "app_3")[0]) == 400.0


def test_alibaba_2018_tasks_alone_keep_a_running_task_until_the_trace_ends(tmp_path):
    """A task still running (end_time 0) was dropped as a job without an end when batch_task came alone, while
    the batch_instance path runs such an instance until the trace ends (a review): now both do."""
    p = write(tmp_path, "batch_task.csv", "M1,2,j_1,1,Terminated,100,400,150,0.5\n"
                                          "R2_1,3,j_1,1,Running,450,0,50,1.0\n"
                                          "R3_1,1,j_1,1,Terminated,500,900,50,1.0\n")
    wl, _, summary = imported(tmp_path, "alibaba-2018", [p], nodes=False)
    running = by_app(wl, "j_1/R2_1")
    assert len(running) == 3 and all(wl.submit_s[i] == 450.0 for i in running)
    assert all(wl.duration_s[i] == 900.0 - 450.0 for i in running)  # until the trace's last instant
    assert not any("without an end" in k for k in summary), summary


def test_alibaba_2018_a_life_of_zero_or_less_is_skipped_not_run_to_the_end(tmp_path):
    """An instance or task that ended as it started (or before), and a container seen once already stopped, ran
    "until the trace ends" (a day where it had ended at once) or for ever (a review): they are skipped, counted."""
    folder = tmp_path / "in"
    folder.mkdir()
    files = [
        write(folder, "batch_task.csv", "t1,4,j1,1,Terminated,100,500,50,0.5\nt2,1,j1,1,Terminated,300,300,50,0.5\n"),
        write(folder, "batch_instance.csv", "i1,t1,j1,1,Terminated,100,200,m1,1,1,50,60,0.5,0.6\n"
                                            "i2,t1,j1,1,Terminated,300,300,m1,1,1,50,60,0.5,0.6\n"
                                            "i3,t1,j1,1,Terminated,400,350,m1,1,1,50,60,0.5,0.6\n"
                                            "i4,t1,j1,1,Running,500,0,m1,1,1,50,60,0.5,0.6\n"),
        write(folder, "container_meta.csv", "c1,m1,100,app1,stopped,400,800,2.0\n"
                                            "c2,m1,100,app1,started,400,800,2.0\nc2,m1,200,app1,stopped,400,800,2.0\n"),
        write(folder, "machine_meta.csv", "m1,0,1,a,96,100,USING\n"),
    ]
    wl, _, summary = imported(tmp_path, "alibaba-2018", files)
    jobs = sorted((wl.submit_s[i], wl.duration_s[i]) for i in by_app(wl, "j1/t1"))
    assert jobs[0] == (100.0, 100.0) and [t for t, _ in jobs] == [100.0, 500.0]  # i1, and i4 still running
    assert summary["instances that ended when they started, or before (skipped)"] == 2
    (svc,) = by_app(wl, "app1")  # c2 only: c1 was seen once, already stopped
    assert wl.service_end_s(svc) == 200.0 and summary["containers seen only stopped (skipped)"] == 1
    tasks = [f for f in files if f.name == "batch_task.csv"]
    wl, _, summary = imported(tmp_path, "alibaba-2018", tasks, nodes=False)
    assert len(by_app(wl, "j1/t2")) == 0 and summary["tasks that ended when they started, or before (skipped)"] == 1


# ---- alibaba-gpu-2023 -------------------------------------------------------------------------------------
OPENB_PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time\n"
              "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12902960,0\n"
              "openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437500\n"
              "openb-pod-0033,3152,5600,1,1000,,BE,Failed,9965463,9965645,9965463\n"
              "openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,\n"
              "openb-pod-0099,4000,8192,0,0,,Guaranteed,Succeeded,100,200,150\n")
OPENB_NODES = ("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,32000,262144,0,\n"
               "openb-node-0001,96000,786432,8,V100M32\nopenb-node-0002,32000,262144,0,\n")


def test_alibaba_gpu_2023_every_field(tmp_path):
    files = [write(tmp_path, "openb_pod_list_default.csv", OPENB_PODS),
             write(tmp_path, "openb_node_list_all_node.csv", OPENB_NODES)]
    wl, groups, summary = imported(tmp_path, "alibaba-gpu-2023", files)
    assert len(wl) == 4 and summary["pods never scheduled in the trace (Pending, skipped)"] == 1
    assert summary["gpu pods"] == 3 and summary["GPUs V100M32"] == 8
    assert sorted(zip(wl.gpu.tolist(), wl.gpu_milli.tolist())) == [(0, 1000), (1, 1000), (1, 1000), (8, 1000)]
    rows = {(float(wl.submit_s[i]), int(wl.cpu_req[i])): i for i in range(len(wl))}
    svc = rows[(0.0, 12000)]  # Running when the trace ends: a service until its deletion
    assert wl.kind[svc] == SERVICE and wl.service_end_s(svc) == 12902960.0 and wl.mem_req[svc] == 16384
    assert wl.slo_names[wl.slo[svc]] == "LS" and wl.usage_m[svc] == 6000.0  # no usage: --usage-fraction 0.5
    job = rows[(9437497.0, 88000)]  # a job from scheduled_time to deletion_time
    assert wl.kind[job] == JOB and wl.duration_s[job] == 10769854 - 9437500 and wl.mem_req[job] == 327680
    assert wl.slo_names[wl.slo[job]] == "Burstable" and wl.priority[job] == 0
    assert wl.duration_s[rows[(9965463.0, 3152)]] == 182.0
    assert [(g["count"], g["cpu_m"], g["memory_mib"], g.get("gpu_count"), g.get("gpu_model")) for g in groups] == \
        [(1, 96000, 786432, 8, "V100M32"), (2, 32000, 262144, None, None)]


def test_alibaba_gpu_2023_odd_rows_a_review_found(tmp_path):
    """A Running pod deleted at its creation was a service that never ends (its GPUs held through every later
    window); a phase in another case was a job that ran; a gpu_spec of "nan" (pandas' empty cell) a GPU model."""
    pods = (OPENB_PODS.replace(",BE,Failed,", ",BE,failed,")
            + "openb-pod-0100,8000,1024,8,1000,,LS,Running,500,500,500\n"
            + "openb-pod-0101,1000,1024,1,1000,nan,LS,pending,600,700,\n"
            + "openb-pod-0102,1000,1024,1,1000,NaN,LS,Succeeded,800,900,800\n")
    files = [write(tmp_path, "openb_pod_list_default.csv", pods),
             write(tmp_path, "openb_node_list_all_node.csv", OPENB_NODES)]
    wl, _, summary = imported(tmp_path, "alibaba-gpu-2023", files)
    rows = {(float(wl.submit_s[i]), int(wl.cpu_req[i])): i for i in range(len(wl))}
    zero = rows[(500.0, 8000)]
    assert wl.kind[zero] == SERVICE and wl.service_end_s(zero) == 501.0  # stretched to 1 s, not forever
    assert wl.kind[rows[(9965463.0, 3152)]] == JOB  # "failed": a job, as "Failed"
    assert summary["pods never scheduled in the trace (Pending, skipped)"] == 2  # "pending" too
    nan = rows[(800.0, 1000)]
    assert wl.gpu[nan] == 1 and wl.gpu_spec_table[int(wl.gpu_spec[nan])] is None  # any model


# ---- alibaba-2023 -----------------------------------------------------------------------------------------
def alibaba_2023(folder: Path, header: bool) -> list[Path]:
    from joulesched.cluster.traces.alibaba2023 import NODE_USAGE, POD_META, POD_USAGE

    folder.mkdir(parents=True, exist_ok=True)
    h = (lambda cols: ",".join(cols) + "\n") if header else (lambda cols: "")
    psi = '"0.0;0.01;0.05;1.0","0;0;0;0;0;0;0;0","0;0;0;0;0;0;0;0"'
    return [
        write(folder, "pod_meta_info.csv", h(POD_META) +
              "-3390,p1,0.0390625,0.01,0,0.046875,0.02,0,LS\n"
              "100,p2,0.0078125,0.005,0,0,0,0,BE\n"
              "200,p3,0.015625,0.004,0,0,0,0,\n"),
        write(folder, "pod_resource_usage_0.csv", h(POD_USAGE) +
              f"0,n1,p1,app-a,0.1,0.5,0.5,0.01,0,0,0,0,0,0,{psi},0,0,0\n"
              f"150,n1,p1,app-a,0.1,0.25,0.5,0.01,0,0,0,0,0,0,{psi},0,0,0\n"
              f"300,n1,p1,app-a,0.1,0.75,0.5,0.01,0,0,0,0,0,0,{psi},0,0,0\n"
              f"100,n2,p2,app-b,0.1,1.0,0.5,0.01,0,0,0,0,0,0,{psi},0,0,0\n"
              f"400,n2,p2,app-b,0.1,-1,0.5,0.01,0,0,0,0,0,0,{psi},0,0,0\n"),
        write(folder, "node_resource_usage_0.csv", h(NODE_USAGE) +
              "0,n1,0.1,0.3,0.5,0.1,0,0,0.5,0\n0,n2,0.1,0.3,1.0,0.1,0,0,1.0,0\n"
              "300,n1,0.1,0.3,0.5,0.1,0,0,0.5,0\n"),
    ]


@pytest.mark.parametrize("header", [False, True], ids=["headerless", "with-header"])
def test_alibaba_2023_every_field(tmp_path, header):
    wl, groups, summary = imported(tmp_path, "alibaba-2023", alibaba_2023(tmp_path / "in", header))
    assert summary["pods in pod_meta_info"] == 3
    (p1,) = by_app(wl, "app-a")  # LS: a service; created before the trace: submitted at 0
    assert wl.kind[p1] == SERVICE and wl.submit_s[p1] == 0.0 and math.isinf(wl.duration_s[p1])
    assert (wl.cpu_req[p1], wl.cpu_lim[p1]) == (5000, 6000)  # 5/128 and 6/128 of the 128-core default
    assert wl.mem_req[p1] == math.ceil(0.01 * 1_048_576) and wl.slo_names[wl.slo[p1]] == "LS"
    # pod_cpu_request_util is the fraction of the request: (0.5 + 0.25) / 2 and 0.75 of 5000 m per 300 s.
    assert profile(wl, p1) == ([0.0, 300.0], [1875.0, 3750.0])
    (p2,) = by_app(wl, "app-b")  # BE: a job from its first to one step after its last sample (-1 is "n/a")
    assert wl.kind[p2] == JOB and wl.submit_s[p2] == 100.0 and wl.duration_s[p2] == 200.0
    assert wl.cpu_req[p2] == 1000 and wl.cpu_lim[p2] == NO_LIMIT and wl.usage_m[p2] == 1000.0
    assert summary["jobs without usage samples (no run time known, skipped)"] == 1  # p3
    assert [(g["count"], g["cpu_m"], g["memory_mib"]) for g in groups] == [(1, 128000, 1048576), (1, 64000, 524288)]


# ---- google-2019 ------------------------------------------------------------------------------------------
def google_2019(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    ev = [  # BigQuery exports INT64 as strings or numbers; both appear here, and an event type by name.
        {"time": "0", "type": 0, "collection_id": "7", "instance_index": 0, "priority": 200, "scheduling_class": 2,
         "collection_type": 0, "resource_request": {"cpus": 0.0625, "memory": 0.03125}},
        {"time": "600000000", "type": 3, "collection_id": "7", "instance_index": 0, "machine_id": "11"},
        {"time": 1_000_000_000, "type": "SUBMIT", "collection_id": 9, "instance_index": 3, "priority": 25,
         "collection_type": 1, "resource_request": {"cpus": 0.125, "memory": 0.0625}},
        {"time": 1_200_000_000, "type": 3, "collection_id": 9, "instance_index": 3},
        {"time": 1_500_000_000, "type": 10, "collection_id": 9, "instance_index": 3,
         "resource_request": {"cpus": 0.25, "memory": 0.0625}},
        {"time": 4_200_000_000, "type": 6, "collection_id": 9, "instance_index": 3},
        {"time": 2_000_000_000, "type": 0, "collection_id": 9, "instance_index": 4, "priority": 25},
        {"time": str(2**63 - 1), "type": 7, "collection_id": 7, "instance_index": 0},
    ]
    usage = [
        {"start_time": "600000000", "end_time": "900000000", "collection_id": "7", "instance_index": 0,
         "average_usage": {"cpus": 0.03125, "memory": 0.01}, "maximum_usage": {"cpus": 0.05}},
        {"start_time": 900_000_000, "end_time": 1_200_000_000, "collection_id": 7, "instance_index": 0,
         "average_usage": {"cpus": 0.046875, "memory": 0.01}},
        {"start_time": 1_200_000_000, "end_time": 1_500_000_000, "collection_id": 9, "instance_index": 3,
         "average_usage": {"cpus": 0.0625}},
    ]
    machines = [
        {"time": 0, "machine_id": "11", "type": 1, "capacity": {"cpus": 0.5, "memory": 0.25}, "platform_id": "x"},
        {"time": 0, "machine_id": "12", "type": 1, "capacity": {"cpus": 1.0, "memory": 1.0}},
        {"time": 5_000_000, "machine_id": "11", "type": 3, "capacity": {"cpus": 0.5, "memory": 0.5}},
    ]
    lines = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)  # noqa: E731
    p = folder / "instance_events-000000000000.json.gz"
    p.write_bytes(gzip.compress(lines(ev).encode()))
    return [p, write(folder, "instance_usage-000000000000.json", lines(usage)),
            write(folder, "machine_events-000000000000.json", lines(machines))]


def test_google_2019_every_field(tmp_path):
    wl, groups, summary = imported(tmp_path, "google-2019", google_2019(tmp_path / "in"),
                                   "--cpu-unit-m", "64000", "--memory-unit-mib", "262144")
    assert len(wl) == 2 and summary["instances never scheduled in the trace (skipped)"] == 1
    (svc,) = by_app(wl, "7")  # priority 200: production tier, a service; its KILL comes after the trace
    assert wl.kind[svc] == SERVICE and wl.priority[svc] == 200 and wl.slo_names[wl.slo[svc]] == "production"
    assert wl.submit_s[svc] == 0.0 and math.isinf(wl.duration_s[svc])  # submitted before the trace (time 0)
    assert (wl.cpu_req[svc], wl.mem_req[svc]) == (4000, 8192)  # normalised to the largest machine
    # usage windows: µs -> s, cpus x 64000 m, in absolute time for a service
    assert profile(wl, svc) == ([600.0, 900.0], [2000.0, 3000.0])
    assert wl.owner_names[wl.owner[svc]] == "BorgJob"
    (job,) = by_app(wl, "9")  # priority 25: free tier, a job from SCHEDULE (1200 s) to FINISH (4200 s)
    assert wl.kind[job] == JOB and wl.submit_s[job] == 1000.0 and wl.duration_s[job] == 3000.0
    assert wl.cpu_req[job] == 16000  # the latest request (UPDATE_RUNNING) counts
    assert wl.owner_names[wl.owner[job]] == "AllocSet" and wl.slo_names[wl.slo[job]] == "free"
    assert wl.usage_m[job] == 4000.0  # one usage step: constant
    assert [(g["count"], g["cpu_m"], g["memory_mib"]) for g in groups] == [(1, 64000, 262144), (1, 32000, 131072)]


# ---- azure-packing-2020 -----------------------------------------------------------------------------------
def azure_db(path: Path, vms: list[tuple], types: list[tuple] | None = None, *, drop: str = "") -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE vm (vmId INTEGER, tenantId INTEGER, vmTypeId INTEGER, priority INTEGER, "
                "starttime REAL, endtime REAL)")
    con.execute("CREATE TABLE vmType (id INTEGER, vmTypeId INTEGER, machineId INTEGER, core REAL, memory REAL, "
                "hdd REAL, ssd REAL, nic REAL)")
    con.executemany("INSERT INTO vm VALUES (?,?,?,?,?,?)", vms)
    con.executemany("INSERT INTO vmType VALUES (?,?,?,?,?,?,?,?)", types if types is not None else [
        (1, 0, 1, 0.125, 0.0625, 0, 0.1, 0.1), (2, 0, 2, 0.25, 0.125, 0, 0.1, 0.1),
        (3, 1, 1, 0.5, 0.25, 0, 0.1, 0.1), (4, 2, 2, 1.0, 1.0, 0, 0.1, 0.1)])
    if drop:
        con.execute(f"DROP TABLE {drop}")
    con.commit()
    con.close()
    return path


AZURE_VMS = [(1, 10, 0, 0, -0.5, 1.0), (2, 10, 1, 1, 0.25, 0.5), (3, 11, 1, 0, 0.4, None), (4, 12, 2, 0, 0.1, 0.2)]


def test_azure_packing_2020_every_field(tmp_path):
    db = azure_db(tmp_path / "packing_trace_zone_a_v1.sqlite", AZURE_VMS)
    wl, groups, summary = imported(tmp_path, "azure-packing-2020", [db], "--cpu-unit-m", "48000",
                                   "--memory-unit-mib", "196608")
    # Machine 1 hosts two VM types (0 and 1), machine 2 too; ties go to the smaller id: machine 1. Type 2 is
    # only on machine 2, so VM 4 is skipped.
    assert summary["machine type"] == "1" and len(wl) == 3
    v1, v2, v3 = range(3)  # sorted by submission: VM 1 (alive before: 0), VM 2 (0.25 d), VM 3 (0.4 d)
    assert wl.submit_s.tolist() == [0.0, 0.25 * 86400, 0.4 * 86400]
    assert all(wl.kind == SERVICE)  # a VM's life does not stretch: a service with an end
    assert wl.service_end_s(v1) == 86400.0 and wl.service_end_s(v2) == 0.5 * 86400 and wl.service_end_s(v3) is None
    assert (wl.cpu_req[v1], wl.mem_req[v1]) == (6000, 12288) and (wl.cpu_req[v2], wl.mem_req[v2]) == (24000, 49152)
    assert wl.priority.tolist() == [1, 0, 1] and [wl.slo_names[s] for s in wl.slo] == ["high", "low", "high"]
    assert [wl.app_names[a] for a in wl.app] == ["tenant-10", "tenant-10", "tenant-11"]
    assert wl.owner_names[wl.owner[0]] == "VirtualMachine" and wl.usage_m[v1] == 3000.0
    # Peak of the summed core fractions: 0.125 + 0.5 + 0.5 from 0.4 d to 0.5 d -> 2 machines of that type.
    assert groups == [{"name_prefix": "azure-m1", "count": 2, "cpu_m": 48000, "memory_mib": 196608,
                       "max_pods": 110, "power_watts": "ibm-x3550-m3-x5675"}]
    wl2, groups2, _ = imported(tmp_path, "azure-packing-2020", [db], "--machine-id", "2")
    assert len(wl2) == 2 and groups2[0]["name_prefix"] == "azure-m2" and wl2.cpu_req.tolist() == [24000, 96000]


# ---- the outputs ------------------------------------------------------------------------------------------
def test_imported_nodes_include_into_a_scenario_and_gz_streams_like_plain(tmp_path):
    files = alibaba_2018(tmp_path / "in")
    wl, _, _ = imported(tmp_path, "alibaba-2018", files)
    gz = tmp_path / "gz"
    gz.mkdir()
    gfiles = []
    for f in files:
        g = gz / (f.name + ".gz")
        g.write_bytes(gzip.compress(f.read_bytes()))
        gfiles.append(g)
    r = run("-f", "alibaba-2018", "-o", tmp_path / "gz.csv", *gfiles)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "gz.csv").read_text() == (tmp_path / "out" / "pods.csv").read_text()
    sc = tmp_path / "out" / "s.yaml"
    sc.write_text("name: imported\nseed: 1\nduration_s: 3600\nnodes:\n  - {include: nodes.yaml}\n"
                  "workload: {trace: pods.csv}\n")
    loaded = load_scenario(sc)
    assert [g.count for g in loaded.nodes] == [2, 1] and loaded.node_count == 3
    w = build_workload(loaded)
    assert np.array_equal(w.submit_s, wl.submit_s) and np.array_equal(w.prof_m, wl.prof_m)


# ---- malformed input --------------------------------------------------------------------------------------
def _a18(tmp_path, name: str, text: str) -> list[Path]:
    files = alibaba_2018(tmp_path / "in")
    return [write(tmp_path / "in", name, text) if f.name == name else f for f in files]


def _google_bad(tmp_path, name: str, text: bytes) -> list[Path]:
    files = google_2019(tmp_path / "in")
    p = tmp_path / "in" / name
    p.write_bytes(text)
    return [f for f in files if not f.name.startswith(name.split("-")[0])] + [p]


MALFORMED = {
    "alibaba-2018: a number that is not": (
        "alibaba-2018", lambda t: _a18(t, "batch_task.csv", "M1,2,j_1,1,Terminated,100,400,lots,0.5\n"),
        ["batch_task.csv", "line 1", "column plan_cpu", "'lots' is not a number"]),
    "alibaba-2018: truncated last line": (
        "alibaba-2018", lambda t: _a18(t, "batch_instance.csv",
                                       "ins_a,M1,j_1,1,Terminated,100,350,m_1,1,1,120,180,0.3,0.4\nins_b,M1,j_1,1,Te"),
        ["batch_instance.csv", "line 2", "5 columns; this table has 14", "truncated"]),
    "alibaba-2018: a header line where the data starts": (
        "alibaba-2018", lambda t: _a18(t, "machine_meta.csv", "machine_id,time_stamp,failure_domain_1,failure_domain_2,"
                                       "cpu_num,mem_size,status\nm_1,0,1,a,96,100,USING\n"),
        ["machine_meta.csv", "line 1", "column time_stamp", "'time_stamp' is not a number"]),
    "alibaba-2018: memory above its normalised 100": (
        "alibaba-2018", lambda t: _a18(t, "container_meta.csv", "c_1,m_1,0,app_1,started,400,800,150\n"),
        ["container_meta.csv", "line 1", "column mem_size", "above 100"]),
    "alibaba-2018: a file of another table": (
        "alibaba-2018", lambda t: [write(t, "pods.csv", "0,10,100,100,50\n")],
        ["pods.csv", "cannot tell which alibaba-2018 table"]),
    "alibaba-2018: instances without their tasks": (
        "alibaba-2018", lambda t: [f for f in alibaba_2018(t / "in") if f.name == "batch_instance.csv"],
        ["batch_instance.csv", "give the batch_task file"]),
    "alibaba-2018: a gzip cut short": (
        "alibaba-2018", lambda t: [_cut_gzip(t / "batch_task.csv.gz", "M1,2,j_1,1,Terminated,100,400,150,0.5\n" * 400)],
        ["batch_task.csv.gz", "line", "truncated"]),
    "alibaba-gpu-2023: a pod list without times (multigpu)": (
        "alibaba-gpu-2023", lambda t: [write(t, "openb_pod_list_multigpu50.csv",
                                             "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nopenb-pod-1,1000,1024,2,1000\n")],
        ["openb_pod_list_multigpu50.csv", "line 1", "lacks column(s) creation_time, deletion_time"]),
    "alibaba-gpu-2023: deleted before created": (
        "alibaba-gpu-2023",
        lambda t: [write(t, "openb_pod_list_x.csv", OPENB_PODS.replace(",100,200,150", ",300,200,150"))],
        ["openb_pod_list_x.csv", "line 6", "column deletion_time", "before the creation_time"]),
    "alibaba-gpu-2023: a phase that is none of the trace's": (
        "alibaba-gpu-2023",
        lambda t: [write(t, "openb_pod_list_x.csv", OPENB_PODS.replace(",BE,Failed,", ",BE,Evicted,"))],
        ["openb_pod_list_x.csv", "line 4", "column pod_phase", "'Evicted' is not one of"]),
    "alibaba-gpu-2023: the node list given as a pod list": (
        "alibaba-gpu-2023", lambda t: [write(t, "openb_pod_list_nodes.csv", OPENB_NODES)],
        ["openb_pod_list_nodes.csv", "line 1", "lacks column(s) name, creation_time, deletion_time"]),
    "alibaba-2023: not UTF-8": (
        "alibaba-2023", lambda t: [_bytes(t / "pod_meta_info.csv", b"100,p1,0.5,0.1,0,0,0,0,\xff\xfeLS\n")],
        ["pod_meta_info.csv", "line 1", "column 24", "not UTF-8"]),
    "alibaba-2023: a wrong header": (
        "alibaba-2023", lambda t: [write(t, "node_resource_usage_1.csv", "collect_timestamp,node,cores\n0,n1,0.5\n")],
        ["node_resource_usage_1.csv", "line 1", "3 columns; this table has 10"]),
    "google-2019: a JSON line cut short": (
        "google-2019", lambda t: _google_bad(t, "instance_events-1.json",
                                             b'{"time": 0, "type": 0, "collection_id": 1, "instance_index": 0}\n'
                                             b'{"time": 5, "type": 3, "collec'),
        ["instance_events-1.json", "line 2", "column 24", "not JSON", "truncated"]),
    "google-2019: a required field missing": (
        "google-2019", lambda t: _google_bad(t, "instance_usage-1.json",
                                             b'{"start_time": 0, "end_time": 10, "instance_index": 0}\n'),
        ["instance_usage-1.json", "line 1", "column collection_id", "is missing"]),
    "google-2019: a request that is not a number": (
        "google-2019", lambda t: _google_bad(t, "instance_events-2.json",
                                             b'{"time": 1, "type": 0, "collection_id": 1, "instance_index": 0, '
                                             b'"resource_request": {"cpus": "half"}}\n'),
        ["instance_events-2.json", "line 1", "column resource_request.cpus", "'half' is not a number"]),
    "google-2019: an unknown event type": (
        "google-2019", lambda t: _google_bad(t, "instance_events-3.json",
                                             b'{"time": 1, "type": 42, "collection_id": 1, "instance_index": 0}\n'),
        ["instance_events-3.json", "line 1", "column type", "42 is not an event type"]),
    "azure-packing-2020: not a sqlite file": (
        "azure-packing-2020", lambda t: [write(t, "packing.sqlite", "vmId,tenantId\n1,2\n")],
        ["packing.sqlite", "line 1, column 1", "not a sqlite database"]),
    "azure-packing-2020: a table missing": (
        "azure-packing-2020", lambda t: [azure_db(t / "p.sqlite", AZURE_VMS, drop="vmType")],
        ["p.sqlite", "no table vmType"]),
    "azure-packing-2020: a time that is not a number": (
        "azure-packing-2020", lambda t: [azure_db(t / "p.sqlite", AZURE_VMS + [(5, 1, 0, 0, "soon", 1.0)])],
        ["p.sqlite", "table vm, row 5", "column starttime", "'soon' is not a number"]),
    "azure-packing-2020: a time beyond 2^53": (
        "azure-packing-2020", lambda t: [azure_db(t / "p.sqlite", AZURE_VMS + [(5, 1, 0, 0, 1e300, None)])],
        ["p.sqlite", "table vm, row 5", "column starttime", "too large"]),
    "azure-packing-2020: ends before it starts": (
        "azure-packing-2020", lambda t: [azure_db(t / "p.sqlite", [(1, 1, 0, 0, 2.0, 1.0)])],
        ["p.sqlite", "table vm, row 1 (vmId 1)", "column endtime", "before the starttime"]),
    "azure-packing-2020: a truncated database": (
        "azure-packing-2020", lambda t: [_truncate(azure_db(t / "p.sqlite", AZURE_VMS * 300), 3000)],
        ["p.sqlite", "the file may be truncated"]),
    "any format: an empty file": (
        "alibaba-2018", lambda t: [write(t, "batch_task.csv", "")],
        ["batch_task.csv", "empty file"]),
}


def _cut_gzip(p: Path, text: str) -> Path:
    data = gzip.compress(text.encode())
    p.write_bytes(data[: len(data) // 2])
    return p


def _bytes(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


def _truncate(p: Path, size: int) -> Path:
    data = p.read_bytes()
    assert len(data) > size
    p.write_bytes(data[:size])
    return p


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_input_exits_2_naming_the_place_and_writes_nothing(tmp_path, case):
    fmt, make, needles = MALFORMED[case]
    files = make(tmp_path)
    out, nodes = tmp_path / "res" / "pods.csv", tmp_path / "res" / "nodes.yaml"
    out.parent.mkdir()
    nodes.write_text("old nodes\n")  # an earlier result must survive a failed import untouched
    r = run("-f", fmt, "-o", out, "-m", nodes, *files)
    text = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for needle in needles:
        assert needle in text, (needle, text)
    assert not out.exists() and nodes.read_text() == "old nodes\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["nodes.yaml"]  # no temporary left either


def test_bad_options_exit_2(tmp_path):
    files = alibaba_2018(tmp_path / "in")
    for args, needle in [(["--window", "5:1"], "--window '5:1'"), (["--power-profile", "toaster"], "toaster"),
                         (["-m", str(tmp_path / "same.csv")], "same file")]:
        out = tmp_path / "same.csv"
        r = run("-f", "alibaba-2018", "-o", out, *args, *files)
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), r.output
        assert not out.exists()
    r = run("-f", "alibaba-2018", "-o", tmp_path / "x.csv", "-m", tmp_path / "n.yaml",
            *[f for f in files if f.name == "batch_task.csv"])
    assert r.exit_code == 2 and "no machine table" in r.output and not (tmp_path / "x.csv").exists()


def test_trace_stays_the_export_command_beside_import(tmp_path):
    tiny = str(Path(__file__).resolve().parents[2] / "scenarios" / "tiny.yaml")
    r = runner.invoke(app, ["trace", "-s", tiny, "-o", "-"])
    assert r.exit_code == 0 and r.stdout.startswith("submit_s,duration_s,") and len(r.stdout.splitlines()) == 184
    for args, needle in [([], "Missing option '--scenario' / '-s'"), (["-s", tiny], "Missing option '--out' / '-o'"),
                         (["-s", tiny, "import", "-f", "google-2019", "-o", "x.csv", "y.json"],
                          "an option of the export")]:
        r = runner.invoke(app, ["trace", *args])
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), r.output
    r = runner.invoke(app, ["trace", "import", "--help"])
    assert r.exit_code == 0 and "azure-packing-2020" in " ".join(r.output.split())


# ---- the summary (issue 33) ---------------------------------------------------------------------------------
def test_summary_counts_follow_the_window_and_show_the_span(tmp_path):
    files = [write(tmp_path, "openb_pod_list_default.csv", OPENB_PODS),
             write(tmp_path, "openb_node_list_all_node.csv", OPENB_NODES)]
    wl, _, summary = imported(tmp_path, "alibaba-gpu-2023", files, "--window", "9000000:9500000")
    # Kept: the service alive across the window and the job submitted in it; both have GPUs.
    assert len(wl) == 2 and summary["gpu pods"] == 2
    # The job and the Pending pod created after the window closes; the job before it opened ran and ended then.
    assert summary["pods submitted after the window (dropped)"] == 2
    assert summary["pods gone before the window (dropped)"] == 1
    assert "pods never scheduled in the trace (Pending, skipped)" not in summary
    span = summary["span"]  # of the whole file, whatever the window: it is what a window is chosen from
    assert span["first_submit_s"] == 0 and span["last_submit_s"] == 9965463 and span["last_end_s"] == 12902960
    # 1 % of 4 submissions is reached by the first (t=0): the window starts there and ends at the last end.
    assert span["suggested_window"] == "0:12906000" and span["submitted_before_suggested_window"] == 0
    r = run("-f", "alibaba-gpu-2023", "-o", tmp_path / "h.csv", "--window", "9000000:9500000", *files)
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "(window 9000000:9500000)" in text
    assert "submissions in the file (trace days) │ 0.0 – 115.3" in text
    assert "trace import --window 0:12906000" in text and "duration_s: 12906000" in text


def test_the_suggested_window_skips_an_idle_prefix():
    from joulesched.cluster.traces.common import ImportOptions, PodSink

    sink = PodSink(ImportOptions())
    day = 86400.0
    sink.add(submit=3 * day, start=3 * day, end=3 * day + 60, kind=JOB, cpu_req=100, mem_req=64)  # a straggler
    for k in range(200):  # the activity: days 30.5 to 31.9
        t = 30.5 * day + k * 600
        sink.add(submit=t, start=t, end=t + 3600, kind=JOB, cpu_req=100, mem_req=64)
    span = sink.span()
    last_end = 30.5 * day + 199 * 600 + 3600
    assert span["last_end_s"] == last_end  # from day 30 (the 1 % mark, to the day) to the last end, to the hour:
    assert span["suggested_window"] == f"{30 * day:.0f}:{math.ceil(last_end / 3600) * 3600:.0f}"
    assert span["submitted_before_suggested_window"] == 1 and span["pods_read"] == 201


def test_the_suggested_window_never_starts_before_0():
    """A trace whose pods were created before its time 0 (Azure's sample) was told --window -10800:..., which
    --window then refused."""
    from joulesched.cluster.traces.common import ImportOptions, PodSink

    sink = PodSink(ImportOptions())
    for k in range(100):
        t = -3 * 3600 + k * 600
        sink.add(submit=t, start=t, end=t + 7200, kind=JOB, cpu_req=100, mem_req=64)
    span = sink.span()
    assert span["suggested_window"].startswith("0:") and span["submitted_before_suggested_window"] == 18


@pytest.mark.skipif(not (Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-gpu-2023").is_dir(),
                    reason="the real OpenB trace (../shared/data/alibaba-gpu-2023) is not on this machine")
def test_the_real_openb_trace_suggests_its_active_days(tmp_path):
    d = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-gpu-2023"
    files = [d / "openb_pod_list_default.csv", d / "openb_node_list_all_node.csv"]
    _, _, summary = imported(tmp_path, "alibaba-gpu-2023", files, "--window", "0:86400")
    assert summary["pods"] == 1 and summary["gpu pods"] <= 1  # not the file's 6,203
    assert summary.get("pods never scheduled in the trace (Pending, skipped)", 0) < 897  # nor its 897 Pending
    span = summary["span"]
    start, end = (float(x) for x in span["suggested_window"].split(":"))
    assert start == 115 * 86400 and span["submitted_before_suggested_window"] == 27 and end > 149 * 86400


def test_a_negative_window_start_exits_2(tmp_path):
    files = [write(tmp_path, "openb_pod_list_default.csv", OPENB_PODS)]
    r = run("-f", "alibaba-gpu-2023", "-o", tmp_path / "x.csv", "--window", "-100:50", *files)
    assert r.exit_code == 2 and "START must be at least 0" in r.output and not (tmp_path / "x.csv").exists()


def test_the_hint_says_when_the_window_already_holds_the_activity(tmp_path):
    files = [write(tmp_path, "openb_pod_list_default.csv", OPENB_PODS)]
    r = run("-f", "alibaba-gpu-2023", "-o", tmp_path / "w.csv", "--window", "0:13000000", *files)
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "this window holds it: in the scenario duration_s: 12906000" in text
    assert "to simulate it" not in text


def test_an_option_the_format_does_not_read_is_refused(tmp_path):
    """--cpu-unit-m and --machine-id on an OpenB import made a byte-identical file, exit 0 (a review)."""
    pods = write(tmp_path, "openb_pod_list_default.csv", OPENB_PODS)
    for extra in (["--cpu-unit-m", "7"], ["--machine-id", "7"]):
        r = run("-f", "alibaba-gpu-2023", "-o", tmp_path / "out.csv", *extra, pods)
        assert r.exit_code == 2 and f"{extra[0]} does not apply to alibaba-gpu-2023" in r.output, r.output
        assert not (tmp_path / "out.csv").exists()
