"""Write the small hand-made sample of each public trace format (in its published schema) and convert it with
`joulesched trace import`, as the trace scenarios of the standard suite (scenarios/trace-<format>.yaml) use them.

The raw samples go to ``scenarios/traces/<format>/``, the converted pods to ``<format>.pods.csv`` and the
machines to ``<format>.nodes.yaml``. Everything is drawn from a fixed seed, so rerunning gives the same
bytes; tests/cluster/test_trace_samples.py checks that the shipped files are what the importer makes of the
shipped samples. Run from the repository root:

    .venv/bin/python scenarios/traces/make_samples.py
"""

from __future__ import annotations

import gzip
import json
import math
import sqlite3
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
HOURS = 6
SPAN = HOURS * 3600

#: format -> (raw files, the `trace import` options used for the shipped conversion)
SAMPLES: dict[str, dict] = {
    "alibaba-2018": {"options": ["--window", f"0:{SPAN}"]},
    "alibaba-gpu-2023": {"options": []},
    "alibaba-2023": {"options": ["--usage-step", "900"]},
    "google-2019": {"options": ["--usage-step", "900", "--cpu-unit-m", "64000", "--memory-unit-mib", "262144"]},
    "azure-packing-2020": {"options": ["--cpu-unit-m", "64000", "--memory-unit-mib", "262144", "--window",
                                       f"0:{SPAN}"]},
}


def _diurnal(t: np.ndarray, peak_h: float = 3.0) -> np.ndarray:
    """A day's shape squeezed into the sample's six hours (1 +- 0.6), so the short sample shows a swing."""
    return 1.0 + 0.6 * np.cos(2 * math.pi * (t - peak_h * 3600) / SPAN)


def _csv(path: Path, rows, gz: bool = False) -> None:
    text = "".join(",".join("" if v is None else str(v) for v in r) + "\n" for r in rows)
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text, encoding="utf-8")


def alibaba_2018(d: Path, rng: np.random.Generator) -> None:
    _csv(d / "machine_meta.csv", [(f"m_{k}", 0, k % 4, "a", 96, 100, "USING") for k in range(8)]
         + [(f"m_{k}", 0, k % 4, "b", 64, 50, "USING") for k in range(8, 12)])
    meta, usage = [], []
    for c in range(36):
        cpu = int(rng.choice([200, 400, 800]))
        app = f"app_{c % 9}"
        t0 = 0 if c < 30 else int(rng.integers(600, SPAN // 2))
        meta.append((f"c_{c}", f"m_{c % 12}", t0, app, "started", cpu, cpu * 2, round(float(cpu / 400), 2)))
        level = rng.uniform(15, 45)
        for t in range(t0, SPAN, 300):
            u = level * _diurnal(np.array([t]))[0] * float(rng.lognormal(0, 0.1))
            usage.append((f"c_{c}", f"m_{c % 12}", t, int(round(u)), 40, 1.2, 3.1, 2, 10.5, 9.8, 4))
        if c % 12 == 5:
            meta.append((f"c_{c}", f"m_{c % 12}", SPAN - 1800, app, "stopped", cpu, cpu * 2,
                         round(float(cpu / 400), 2)))
    _csv(d / "container_meta.csv", meta)
    _csv(d / "container_usage.csv", usage, gz=True)
    tasks, inst = [], []
    for j in range(25):
        job = f"j_{j}"
        start = int(rng.uniform(0, SPAN - 1200))
        for k, name in enumerate(("M1", "R2_1", "J3_1_2")[: int(rng.integers(1, 4))]):
            n = int(rng.integers(1, 9))
            plan = int(rng.choice([50, 100, 200, 400]))
            dur = int(rng.lognormal(math.log(540), 1.0)) + 10
            s0 = start + k * 200
            tasks.append((name, n, job, 1, "Terminated", s0, s0 + dur, plan, round(float(plan / 200), 2)))
            for i in range(n):
                st = s0 + int(rng.integers(0, 30))
                en = st + max(5, int(dur * rng.uniform(0.6, 1.0)))
                avg = round(float(plan * rng.uniform(0.4, 0.9)), 1)
                status = "Running" if en >= SPAN else "Terminated"
                inst.append((f"ins_{j}_{k}_{i}", name, job, 1, status, st, 0 if status == "Running" else en,
                             f"m_{i % 12}", 1, 1, avg, round(avg * 1.3, 1), 0.2, 0.3))
    _csv(d / "batch_task.csv", tasks)
    _csv(d / "batch_instance.csv", inst)


def alibaba_gpu_2023(d: Path, rng: np.random.Generator) -> None:
    nodes = [("sn", "cpu_milli", "memory_mib", "gpu", "model")]
    nodes += [(f"openb-node-{k:04d}", 32000, 262144, 0, "") for k in range(6)]
    nodes += [(f"openb-node-{k:04d}", 96000, 786432, 8, "V100M32") for k in range(6, 10)]
    _csv(d / "openb_node_list_all_node.csv", nodes)
    pods = [("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
             "creation_time", "deletion_time", "scheduled_time")]
    for k in range(240):
        cores = float(np.interp(rng.random(), [0, 0.25, 0.5, 0.75, 0.9, 1], [1, 4, 11.3, 12, 16.4, 32]))
        cpu = int(round(cores * 1000 / 50) * 50)
        mem = int(round(cores * 3789 / 64) * 64)
        created = int(rng.uniform(0, SPAN))
        phase = str(rng.choice(["Running", "Succeeded", "Failed", "Pending"], p=[0.5, 0.25, 0.2, 0.05]))
        life = int(rng.lognormal(6.44, 1.88)) + 1
        qos = str(rng.choice(["LS", "BE", "Burstable"], p=[0.55, 0.4, 0.05]))
        gpu = int(rng.choice([0, 1, 2], p=[0.3, 0.6, 0.1]))
        sched = "" if phase == "Pending" else created + int(rng.integers(0, 5))
        deleted = SPAN if phase == "Running" else created + life
        pods.append((f"openb-pod-{k:04d}", cpu, mem, gpu, 1000 if gpu else 0, "", qos, phase, created, deleted,
                     sched))
    _csv(d / "openb_pod_list_default.csv", pods)


def alibaba_2023(d: Path, rng: np.random.Generator) -> None:
    from joulesched.cluster.traces.alibaba2023 import NODE_USAGE, POD_META, POD_USAGE

    _csv(d / "node_resource_usage_0.csv", [NODE_USAGE] + [
        (0, f"node{k}", 0.2, 0.4, 0.5 if k < 6 else 1.0, 0.1, 0.0, 0.0, 0.5 if k < 6 else 1.0, 0.01)
        for k in range(10)])
    meta, usage = [POD_META], [POD_USAGE]
    psi = '"0.0;0.01;0.05;1.0","0;0;0;0;0;0;0;0","0;0;0;0;0;0;0;0"'
    for k in range(40):
        qos = "LS" if k < 24 else "BE"
        cpu = float(rng.choice([1, 2, 4, 8])) / 128
        mem = cpu / 4  # 2 GiB per core at the default units (1.0 = 128 cores, 1 TiB)
        created = -3600 if k < 20 else int(rng.uniform(0, SPAN / 2))
        meta.append((created, f"pod{k}", cpu, round(mem, 8), 0, cpu if qos == "LS" else 0,
                     round(mem, 8) if qos == "LS" else 0, 0, qos))
        end = SPAN if qos == "LS" else min(SPAN, max(created, 0) + int(rng.lognormal(math.log(3600), 0.6)))
        level = rng.uniform(0.2, 0.6)
        for t in range(max(created, 0), end, 900):
            u = level * _diurnal(np.array([t]))[0]
            usage.append((t, f"node{k % 10}", f"pod{k}", f"group{k % 7}", 0.1, round(float(u), 4), 0.4, 0.01,
                           0, 0, 0, 0, 0, 0, psi, 0, 0, 0))
    _csv(d / "pod_meta_info.csv", meta)
    text = "".join(",".join(str(v) for v in r) + "\n" for r in usage)
    (d / "pod_resource_usage_0.csv.gz").write_bytes(gzip.compress(text.encode(), mtime=0))


def google_2019(d: Path, rng: np.random.Generator) -> None:
    us = 1_000_000
    events, usage = [], []
    for c in range(60):
        prio = int(rng.choice([0, 25, 103, 115, 200, 360], p=[0.15, 0.15, 0.25, 0.15, 0.25, 0.05]))
        n = int(rng.integers(1, 5))
        sub = 0 if prio >= 120 else int(rng.uniform(0, SPAN - 600))
        cpus = float(rng.choice([0.0078125, 0.015625, 0.03125, 0.0625]))
        for i in range(n):
            events.append({"time": str(sub * us), "type": 0, "collection_id": str(1000 + c), "instance_index": i,
                           "priority": prio, "scheduling_class": int(prio >= 120) + 1, "collection_type": 0,
                           "resource_request": {"cpus": cpus, "memory": cpus / 2}})
            start = sub + int(rng.integers(0, 60))
            events.append({"time": str(start * us), "type": 3, "collection_id": str(1000 + c), "instance_index": i,
                           "machine_id": str(int(rng.integers(1, 13)))})
            if prio < 120:
                end = min(SPAN, start + int(rng.lognormal(math.log(1800), 0.8)) + 30)
                events.append({"time": str(end * us), "type": 6, "collection_id": str(1000 + c),
                               "instance_index": i})
            else:
                end = SPAN
            level = cpus * rng.uniform(0.3, 0.8)
            for t in range(start, end, 900):
                u = level * (_diurnal(np.array([t]))[0] if prio >= 120 else 1.0)
                usage.append({"start_time": str(t * us), "end_time": str(min(t + 900, end) * us),
                              "collection_id": str(1000 + c), "instance_index": i,
                              "average_usage": {"cpus": round(float(u), 6), "memory": round(cpus / 3, 6)}})
    events.sort(key=lambda e: int(e["time"]))
    machines = [{"time": "0", "machine_id": str(k), "type": 1,
                 "capacity": {"cpus": 1.0 if k <= 4 else 0.5, "memory": 1.0 if k <= 4 else 0.5},
                 "platform_id": "p"} for k in range(1, 13)]

    def jl(rows) -> bytes:
        return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()

    (d / "instance_events-000000000000.json.gz").write_bytes(gzip.compress(jl(events), mtime=0))
    (d / "instance_usage-000000000000.json.gz").write_bytes(gzip.compress(jl(usage), mtime=0))
    (d / "machine_events-000000000000.json").write_bytes(jl(machines))


def azure_packing_2020(d: Path, rng: np.random.Generator) -> None:
    p = d / "packing_trace_sample.sqlite"
    p.unlink(missing_ok=True)
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE vm (vmId INTEGER, tenantId INTEGER, vmTypeId INTEGER, priority INTEGER, "
                "starttime REAL, endtime REAL)")
    con.execute("CREATE TABLE vmType (id INTEGER, vmTypeId INTEGER, machineId INTEGER, core REAL, memory REAL, "
                "hdd REAL, ssd REAL, nic REAL)")
    rid = 0
    for t, core in enumerate([0.0625, 0.125, 0.25, 0.5]):
        for m, scale in ((1, 1.0), (2, 0.5)):
            rid += 1
            con.execute("INSERT INTO vmType VALUES (?,?,?,?,?,?,?,?)",
                        (rid, t, m, core * scale, core * scale * 0.75, 0.0, 0.01, 0.01))
    day = 86_400.0
    for v in range(300):
        start = -0.1 if v < 60 else float(rng.uniform(0, SPAN / day))
        life = float(rng.lognormal(math.log(2 * 3600), 1.2)) / day
        end = None if v % 17 == 0 else round(start + life, 6)
        con.execute("INSERT INTO vm VALUES (?,?,?,?,?,?)", (v, int(rng.integers(0, 30)),
                                                            int(rng.choice(4, p=[0.4, 0.3, 0.2, 0.1])),
                                                            int(rng.random() < 0.2), round(start, 6), end))
    con.commit()
    con.close()


MAKERS = {"alibaba-2018": alibaba_2018, "alibaba-gpu-2023": alibaba_gpu_2023, "alibaba-2023": alibaba_2023,
          "google-2019": google_2019, "azure-packing-2020": azure_packing_2020}


def raw_files(fmt: str) -> list[Path]:
    return sorted(p for p in (HERE / fmt).iterdir() if p.is_file())


def convert(fmt: str) -> list[str]:
    """The `trace import` arguments that turn the raw sample into the shipped files (relative paths)."""
    rel = lambda p: str(p.relative_to(HERE.parent.parent))  # noqa: E731
    return ["-f", fmt, "-o", rel(HERE / f"{fmt}.pods.csv"), "-m", rel(HERE / f"{fmt}.nodes.yaml"),
            *SAMPLES[fmt]["options"], *map(rel, raw_files(fmt))]


def main() -> None:
    import os

    from typer.testing import CliRunner

    from joulesched.pipelines.cli import app

    os.chdir(HERE.parent.parent)
    for k, (fmt, make) in enumerate(MAKERS.items()):
        folder = HERE / fmt
        folder.mkdir(exist_ok=True)
        make(folder, np.random.default_rng(1000 + k))
        r = CliRunner().invoke(app, ["trace", "import", *convert(fmt)])
        if r.exit_code != 0:
            sys.exit(f"{fmt}: {r.output}")
        print(f"{fmt}: {r.output.splitlines()[0] if r.output else 'ok'}")


if __name__ == "__main__":
    main()
