"""`trace import -f alibaba-gpu-2023` keeps GPUs (issue 25 item 3): counts, shares, gpu_spec and names into
the pods CSV, GPU count and model per machines group; bad GPU input exits 2 and writes nothing."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.workload import build_workload, load_trace

OPENB = Path("/work/shared/data/alibaba-gpu-2023")
HEAD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,96000,786432,8,V100M32\nn2,104000,524288,2,T4\n"


def _import(tmp_path: Path, pods: str, nodes: str = NODES):
    (tmp_path / "openb_pod_list_x.csv").write_text(HEAD + pods)
    (tmp_path / "openb_node_list_x.csv").write_text(nodes)
    out, mach = tmp_path / "pods.csv", tmp_path / "nodes.yaml"
    res = CliRunner().invoke(app, ["trace", "import", "-f", "alibaba-gpu-2023", "-o", str(out), "-m", str(mach),
                                   str(tmp_path / "openb_node_list_x.csv"), str(tmp_path / "openb_pod_list_x.csv")])
    return res, out, mach


def test_gpus_shares_specs_and_names_are_kept(tmp_path):
    res, out, mach = _import(tmp_path, "a,4000,8192,1,250,T4|A10,LS,Running,0,500,0\n"
                                       "b,8000,8192,4,1000,,BE,Succeeded,10,90,12\n"
                                       "c,1000,1024,0,0,,BE,Succeeded,20,40,20\n")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(out.open()))
    assert [(r["name"], r["gpu_count"], r["gpu_milli"], r["gpu_spec"]) for r in rows] == [
        ("a", "1", "250", "A10|T4"), ("b", "4", "1000", ""), ("c", "", "", "")]  # kept as the trace has it
    text = mach.read_text()
    assert "gpu_count: 8, gpu_model: V100M32" in text and "gpu_count: 2, gpu_model: T4" in text
    sc = tmp_path / "s.yaml"
    sc.write_text("name: x\nseed: 0\nduration_s: 1000\nnodes: [{include: nodes.yaml}]\nworkload: {trace: pods.csv}\n")
    wl = build_workload(load_scenario(sc))
    assert wl.gpu.tolist() == [1, 4, 0] and wl.gpu_milli.tolist()[:2] == [250, 1000]


@pytest.mark.parametrize("pods,nodes,words", [
    ("a,4000,8192,1,250,A100,LS,Running,0,500,0\n", NODES, ["line 2, column gpu_spec", "A100", "no node"]),
    ("a,4000,8192,1,1500,,LS,Running,0,500,0\n", NODES, ["line 2, column gpu_milli", "1500", "more than one GPU"]),
    ("a,4000,8192,1,500,,LS,Running,0,500,0\n", NODES + "n3,32000,262144,0,T4\n",
     ["line 5, column gpu", "n3", "model 'T4' but no GPU count"]),
])
def test_bad_gpu_input_exits_2_and_writes_nothing(tmp_path, pods, nodes, words):
    res, out, mach = _import(tmp_path, pods, nodes)
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    for w in words:
        assert w in flat, flat
    assert not out.exists() and not mach.exists()


@pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").is_file(),
                    reason="the real OpenB files are in /work/shared/data/alibaba-gpu-2023 on the project's machines")
def test_the_real_openb_files_import_with_every_gpu_by_model(tmp_path):
    out, mach = tmp_path / "pods.csv", tmp_path / "nodes.yaml"
    res = CliRunner().invoke(app, ["trace", "import", "-f", "alibaba-gpu-2023", "-o", str(out), "-m", str(mach),
                                   str(OPENB / "openb_node_list_all_node.csv"),
                                   str(OPENB / "openb_pod_list_default.csv")])
    assert res.exit_code == 0, res.output
    want: Counter = Counter()
    for r in csv.DictReader((OPENB / "openb_node_list_all_node.csv").open()):
        want[r["model"]] += int(r["gpu"])
    del want[""]
    import yaml
    got: Counter = Counter()
    for g in yaml.safe_load(mach.read_text())["nodes"]:
        got[g.get("gpu_model", "")] += g["count"] * g.get("gpu_count", 0)
    del got[""]
    assert got == want and sum(got.values()) == 6212
    pods = {r["name"]: r for r in csv.DictReader((OPENB / "openb_pod_list_default.csv").open())
            if r["pod_phase"] != "Pending"}
    wl = load_trace(out)
    assert len(wl) == len(pods) == 7255
    for i in range(len(wl)):
        r = pods[wl.name_of(i)]
        assert int(wl.gpu[i]) == int(r["num_gpu"])
        if int(r["num_gpu"]):
            assert int(wl.gpu_milli[i]) == int(r["gpu_milli"])
