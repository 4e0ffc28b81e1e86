"""Malformed input as a user writes it (review of the input side): each is one line naming the file, line and
column, exit 2, and nothing written; what is left out is counted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.cluster.scenario import ScenarioError, load_scenario
from joulesched.cluster.workload import build_workload, load_trace
from joulesched.pipelines.cli import app

runner = CliRunner()
HEAD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
TRACE_HEAD = "submit_s,duration_s,cpu_request_m,memory_request_mib,cpu_usage_m\n"
FIT = Path(__file__).resolve().parents[2] / "scenarios" / "fits" / "openb-train.yaml"


def _openb(tmp_path: Path, pods: str, nodes: str | None = None, head: str = HEAD):
    files = [tmp_path / "openb_pod_list_x.csv"]
    files[0].write_text(head + pods, encoding="utf-8")
    args = ["trace", "import", "-f", "alibaba-gpu-2023", "-o", str(tmp_path / "pods.csv")]
    if nodes is not None:
        files.append(tmp_path / "openb_node_list_x.csv")
        files[1].write_text("sn,cpu_milli,memory_mib,gpu,model\n" + nodes)
        args += ["-m", str(tmp_path / "nodes.yaml")]
    return runner.invoke(app, [*args, "--json", *map(str, files)])


def _refused(res, tmp_path: Path, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    for n in needles:
        assert n in res.output, res.output
    assert not (tmp_path / "pods.csv").exists() and not (tmp_path / "nodes.yaml").exists()


@pytest.mark.parametrize("row,needles", [
    ("p,1e30,1024,1,500,,LS,Running,0,100,0\n", ("line 2, column cpu_milli", "too large")),  # was OverflowError
    ("p,1000.7,1024,0,,,LS,Running,0,100,0\n", ("line 2, column cpu_milli", "not a whole number")),  # was 1000
    ("p,1000,1024,1.5,1000,,LS,Running,0,100,0\n", ("line 2, column num_gpu", "not a whole number")),  # was 1 GPU
    ("p,1000,1024,65,1000,,LS,Running,0,100,0\n", ("line 2, column num_gpu", "0..64")),  # load_trace refuses it
    ("p,1000,1024,1,500,,LS,Running,0,100,0\np,1000,1024,1,500,,LS,Running,0,100,0\n",
     ("line 3, column name", "pod p is listed again", "line 2")),  # was imported twice, doubling its load
])
def test_openb_bad_pod_cells_are_refused(tmp_path, row, needles):
    _refused(_openb(tmp_path, row), tmp_path, *needles)


def test_openb_node_listed_twice_is_refused(tmp_path):
    res = _openb(tmp_path, "p,1000,1024,0,,,LS,Running,0,100,0\n",
                 "n1,32000,1024,0,\nn1,64000,1024,0,\n")  # the second row silently replaced the first
    _refused(res, tmp_path, "line 3, column sn", "node n1 is listed again")


def test_machines_without_cpu_are_counted(tmp_path):
    res = _openb(tmp_path, "p,1000,1024,0,,,LS,Running,0,100,0\n", "n0,0,1024,0,\nn1,32000,1024,0,\n")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["machines"] == 2 and sum(g["count"] for g in summary["node_groups"]) == 1
    assert summary["machines without CPU or memory (left out of the node groups)"] == 1


def test_a_utf8_bom_is_no_column_name(tmp_path):
    res = _openb(tmp_path, "p,1000,1024,0,,,LS,Running,0,100,0\n", head="\ufeff" + HEAD)
    assert res.exit_code == 0, res.output
    t = tmp_path / "t.csv"
    t.write_text("\ufeff" + TRACE_HEAD + "0,10,100,100,5\n", encoding="utf-8")
    assert len(load_trace(t)) == 1


def test_a_directory_is_named_as_one(tmp_path):
    (tmp_path / "openb_pod_list_d.csv").mkdir()
    res = runner.invoke(app, ["trace", "import", "-f", "alibaba-gpu-2023", "-o", str(tmp_path / "pods.csv"),
                              str(tmp_path / "openb_pod_list_d.csv")])
    _refused(res, tmp_path, "a directory")
    (tmp_path / "s.yaml").write_text(_scenario("openb_pod_list_d.csv"))
    with pytest.raises(ScenarioError, match="a directory"):
        load_scenario(tmp_path / "s.yaml")


def test_window_in_the_error_is_the_one_given(tmp_path):
    res = runner.invoke(app, ["trace", "import", "-f", "alibaba-gpu-2023", "-o", str(tmp_path / "pods.csv"),
                              "--window", "12902960:13000000", str(_write(tmp_path, "openb_pod_list_w.csv", HEAD
                                                                    + "p,1,1,0,,,LS,Running,0,100,0\n"))])
    _refused(res, tmp_path, "window 12902960..13000000 s")  # was 1.2903e+07..1.3e+07


def _write(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def _scenario(trace: str = "t.csv", workload: str | None = None) -> str:
    return ("name: t\nseed: 1\nduration_s: 100\nnodes:\n  - {name_prefix: n, count: 1, cpu_m: 4000, memory_mib: "
            "8192, power_watts: ibm-x3550-m3-x5675}\nworkload:\n  " + (workload or f"trace: {trace}") + "\n")


@pytest.mark.parametrize("cell,col", [("99999999999999999999", "cpu_request_m"), ("", None)])
def test_trace_csv_huge_request_is_refused(tmp_path, cell, col):
    head = TRACE_HEAD.strip() + ",kind,cpu_limit_m\n"
    row = f"0,10,{cell or 100},100,5,job,{'' if cell else '99999999999999999999'}\n"
    with pytest.raises(ScenarioError, match=rf"line 2, column {col or 'cpu_limit_m'}: .*too large"):
        load_trace(_write(tmp_path, "t.csv", head + row))  # was OverflowError


def test_trace_csv_not_utf8_names_its_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes((TRACE_HEAD + "0,10,100,100,5\n").encode() + b"1,10,\xff100,100,5\n")
    with pytest.raises(ScenarioError, match=r"t\.csv: line 3: not UTF-8"):  # was "line 1"
        load_trace(p)


def test_a_job_that_ends_long_after_the_scenario_is_refused(tmp_path):
    """The run lasts until its last job ends: a trace row living 1e8 s behind duration_s 100 ran for minutes and
    gigabytes (1e15 s: for ever), and validate passed it."""
    from joulesched.cluster.workload import MAX_JOB_END_FACTOR

    _write(tmp_path, "t.csv", TRACE_HEAD + f"0,10,100,100,5\n5,{MAX_JOB_END_FACTOR * 100 - 5},100,100,5\n")
    sc = load_scenario(_write(tmp_path, "s.yaml", _scenario()))
    assert len(build_workload(sc)) == 2  # ends at exactly the bound
    _write(tmp_path, "t.csv", TRACE_HEAD + "0,10,100,100,5\n5,1e8,100,100,5\n7,1e15,100,100,5\n")
    with pytest.raises(ScenarioError, match=r"s\.yaml: a job submitted at 5 s runs at least 1e\+08 s \(1e\+08 s of "
                                            r"work at its CPU demand\), ending more than 100 x duration_s \(100 s\) "
                                            r"after the start \(2 such job"):
        build_workload(sc)


@pytest.mark.parametrize("row, words", [
    # 1e18 millicores stretched a 100 s job to 1e16 s: validate passed it and the benchmark never ended.
    ("0,100,100,100,1e18", "column cpu_usage_m: 1e18 millicores is more than any node has"),
    ("0,100,100,100,9e8", "runs at least 2.25e+07 s (100 s of work"),  # within the bound, stretched past the run
])
def test_a_demand_no_node_can_carry_for_long_is_refused(tmp_path, row, words):
    _write(tmp_path, "t.csv", TRACE_HEAD + row + "\n")
    with pytest.raises(ScenarioError, match=re.escape(words)):
        build_workload(load_scenario(_write(tmp_path, "s.yaml", _scenario())))
    _write(tmp_path, "t.csv", TRACE_HEAD + "0,100,99999,100,9e8\n")  # fits no node: never runs, stretches nothing
    assert len(build_workload(load_scenario(_write(tmp_path, "s.yaml", _scenario())))) == 1
    profiled = TRACE_HEAD.strip() + ",usage_profile\n0,100,100,100,5,0:5 10:9e8\n"
    _write(tmp_path, "t.csv", profiled)
    with pytest.raises(ScenarioError, match="runs at least"):  # a profile's steps stretch it as much
        build_workload(load_scenario(_write(tmp_path, "s.yaml", _scenario())))


def test_include_of_no_node_group_says_so(tmp_path):
    _write(tmp_path, "t.csv", TRACE_HEAD + "0,10,100,100,5\n")
    _write(tmp_path, "none.yaml", "nodes: []\n")
    text = _scenario().replace("nodes:\n", "nodes:\n  - {include: none.yaml}\n", 1)
    with pytest.raises(ScenarioError, match="none.yaml holds no node group"):
        load_scenario(_write(tmp_path, "s.yaml", text))


def _fitted(tmp_path: Path, fit_text: str | bytes):
    p = tmp_path / "fit.yaml"
    p.write_bytes(fit_text if isinstance(fit_text, bytes) else fit_text.encode())
    sc = load_scenario(_write(tmp_path, "s.yaml", _scenario(workload="fitted: {fit: fit.yaml, cpu_only: true}")
                              .replace("duration_s: 100", "duration_s: 86400")))
    return build_workload(sc, 1)


@pytest.mark.parametrize("change,needle", [
    (lambda s: s.replace("usage_fraction: 0.5", "usage_fraction: .nan"), "usage_fraction must be"),  # NaN usage
    (lambda s: s.replace("usage_fraction: 0.5", "usage_fraction: abc"), "usage_fraction must be"),  # ValueError
    (lambda s: re.sub(r"rate_per_s: .*", "rate_per_s: 1.0e9", s), "would draw about"),  # ran out of memory
    (lambda s: b"\xff\xfe" + s.encode(), "not UTF-8"),  # UnicodeDecodeError
    (lambda s: re.sub(r"cpu_m: \d+", "cpu_m: 100000000000000000000000", s), "cpu_m 1000"),  # OverflowError
    (lambda s: s.replace("  - 11.213279\n", "  - 1000.0\n", 1), "a life of more than 1e9 s"),  # exp() gave inf
    (lambda s: s.replace("  own_lifetimes:", "  usage_fractoin: 0.9\n  own_lifetimes:", 1),
     r"apps\[0\]: unknown field\(s\) usage_fractoin"),  # a typo silently left the field at its default
    (lambda s: s.replace("rate_per_s:", "rate_per_sec: 1\nrate_per_s:", 1), r"unknown field\(s\) rate_per_sec"),
])
def test_malformed_fit_is_refused(tmp_path, change, needle):
    with pytest.raises(ScenarioError, match=needle):
        _fitted(tmp_path, change(FIT.read_text()))


def test_trace_fit_counts_what_it_leaves_out(tmp_path):
    csv_ = _write(tmp_path, "t.csv", TRACE_HEAD + "0,10,100,100,5\n5,10,100,100,5\n50,10,100,100,5\n")
    r = runner.invoke(app, ["trace", "fit", str(csv_), "-o", str(tmp_path / "f.yaml"), "--until", "20", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["pods"] == 1 and s["pods_in_csv"] == 3
    assert s["pods_left_out"] == {"submitted at time 0": 1, "submitted at or after --until": 1}


def test_a_request_that_converts_beyond_the_columns_is_refused():
    from joulesched.cluster.traces.common import ImportOptions, PodSink, TraceFormatError

    sink = PodSink(ImportOptions())  # Google's and Azure's normalised cells times a unit: no cell check catches it
    with pytest.raises(TraceFormatError, match="pod big: its cpu request converts to 1e\\+25"):
        sink.add(submit=0.0, end=10.0, kind=0, cpu_req=10**25, mem_req=100, name="big")  # was OverflowError


@pytest.mark.parametrize("unit", [["--cpu-unit-m", "1e+300"], ["--memory-unit-mib", "1e+17"]])
def test_a_unit_that_overflows_every_cell_is_refused(tmp_path, unit):
    from tests.cluster.test_traces import google_2019

    files = google_2019(tmp_path / "in")
    res = runner.invoke(app, ["trace", "import", "-f", "google-2019", "-o", str(tmp_path / "pods.csv"), *unit,
                              *map(str, files)])
    _refused(res, tmp_path, f"{unit[0]} {unit[1]}: a unit must be a finite number above 0 and at most 2^53")


@pytest.mark.parametrize("unit", [float("nan"), float("inf"), 0.0])
def test_an_importer_called_with_a_unit_that_is_no_number_is_refused(tmp_path, unit):
    # The CLI refuses nan and inf as options (test_first_hour.py); a caller of the library meets check_units.
    # nan reached int(math.ceil(nan)) before: a ValueError from deep in the conversion.
    from joulesched.cluster.traces import ImportOptions, import_trace
    from joulesched.cluster.traces.common import TraceFormatError
    from tests.cluster.test_traces import google_2019

    with pytest.raises(TraceFormatError, match=f"--cpu-unit-m {unit:g}: a unit must be a finite number"):
        import_trace("google-2019", google_2019(tmp_path / "in"), ImportOptions(cpu_unit_m=unit))


def test_a_cell_that_overflows_once_converted_is_refused_with_its_place(tmp_path):
    """Google's cells are fractions of the largest machine, converted only once an instance is assembled: the
    check is made where the row is read, so the error names its file, line and column, not only the pod."""
    import gzip

    from tests.cluster.test_traces import google_2019

    files = google_2019(tmp_path / "in")
    rows = gzip.decompress(files[0].read_bytes()).decode().splitlines(keepends=True)
    ev = json.loads(rows[2])
    ev["resource_request"]["memory"] = 1e12  # times 393,216 MiB: 3.9e17 MiB
    rows[2] = json.dumps(ev) + "\n"
    files[0].write_bytes(gzip.compress("".join(rows).encode()))
    res = runner.invoke(app, ["trace", "import", "-f", "google-2019", "-o", str(tmp_path / "pods.csv"),
                              *map(str, files)])
    _refused(res, tmp_path, f"{files[0]}: line 3, column resource_request.memory: ", "more than 2^53")


@pytest.mark.parametrize("n", ["1e12", "2.5"])
def test_alibaba2018_absurd_instance_num_is_refused(tmp_path, n):
    # Without batch_instance each instance is a pod: 1e12 ran for ever, 2.5 became 2.
    task = _write(tmp_path, "batch_task.csv", f"M1,{n},j_0,1,Terminated,10,20,100,0.5\n")
    res = runner.invoke(app, ["trace", "import", "-f", "alibaba-2018", "-o", str(tmp_path / "pods.csv"), str(task)])
    _refused(res, tmp_path, "line 1, column instance_num", "not a whole number of instances")
    # With batch_instance the instances are its rows: the count is never read, so it is no reason to refuse.
    inst = _write(tmp_path, "batch_instance.csv", "ins_a,M1,j_0,1,Terminated,10,20,m_1,1,1,120,180,0.3,0.4\n")
    res = runner.invoke(app, ["trace", "import", "-f", "alibaba-2018", "-o", str(tmp_path / "pods.csv"), str(task),
                              str(inst)])
    assert res.exit_code == 0, res.output


def test_alibaba2023_pod_listed_twice_is_counted(tmp_path):
    head = "create_timestamp,pod,cpu,memory,disk,cpu_limit,memory_limit,disk_limit,qos\n"
    meta = _write(tmp_path, "pod_meta_info.csv", head + "0,pod0,0.03125,0.0078125,0,0,0,0,LS\n"
                                                        "0,pod0,0.0625,0.0078125,0,0,0,0,LS\n")
    res = runner.invoke(app, ["trace", "import", "-f", "alibaba-2023", "-o", str(tmp_path / "pods.csv"), "--json",
                              str(meta)])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["pods"] == 1 and s["pod_meta_info rows of a pod listed before (the later row kept)"] == 1


@pytest.mark.parametrize("nodes,workload,needle", [
    ("cpu_m: 100000000000000000000000, memory_mib: 8192", "trace: t.csv", "nodes.0.cpu_m"),  # was OverflowError
    ("cpu_m: 4000, memory_mib: 8192", "services: [{count: 1, cpu_m: 100000000000000000000000, memory_mib: 100}]",
     "workload.services.0.cpu_m"),  # was OverflowError
    ("cpu_m: 4000, memory_mib: 8192", "services: [{count: 1, cpu_m: 100, memory_mib: 100, usage: {step_s: 1}}]",
     "demand steps"),  # with duration_s 1e9: an 8 GB MemoryError
])
def test_absurd_scenario_sizes_are_refused(tmp_path, nodes, workload, needle):
    _write(tmp_path, "t.csv", TRACE_HEAD + "0,10,100,100,5\n")
    text = _scenario(workload=workload).replace("cpu_m: 4000, memory_mib: 8192", nodes)
    if "step_s" in workload:
        text = text.replace("duration_s: 100", "duration_s: 1.0e9")
    r = runner.invoke(app, ["validate", str(_write(tmp_path, "s.yaml", text))])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("knob", ["usage_noise_sigma: 1.0e18", "cpu_scale: 1.0e18", "memory_per_core_mib: 1.0e18",
                                  "duration_sigma: 1.0e18"])
def test_synthetic_knobs_that_overflow_are_refused(tmp_path, knob):
    """exp(sigma x N) overflowed to infinite usage (a ZeroDivisionError mid-run), and a request beyond int64
    cast to a negative one."""
    text = _scenario(workload="{synthetic: {pods: 50, mean_interarrival_s: 1, " + knob + "}}")
    r = runner.invoke(app, ["validate", str(_write(tmp_path, "s.yaml", text))])
    assert r.exit_code == 2 and "workload.synthetic." + knob.split(":")[0] in r.output, r.output


def test_a_burst_larger_than_the_workload_is_the_workload(tmp_path):
    """burst_mean 1e15 (bursts 10 s apart): a burst of about 10^15 pods was allocated before being cut to
    ``pods`` (ValueError: array is too big)."""
    text = _scenario(workload="{synthetic: {pods: 50, mean_interarrival_s: 1.0e-14, burst_mean: 1.0e15}}")
    wl = build_workload(load_scenario(_write(tmp_path, "s.yaml", text)))
    assert len(wl.submit_s) == 50 and (wl.submit_s == wl.submit_s[0]).all()  # one burst, at one instant


def test_a_file_given_twice_is_refused(tmp_path):
    task = _write(tmp_path, "batch_task.csv", "M1,2,j_0,1,Terminated,10,20,100,0.5\n")
    res = runner.invoke(app, ["trace", "import", "-f", "alibaba-2018", "-o", str(tmp_path / "pods.csv"), str(task),
                              str(tmp_path / "." / "batch_task.csv")])  # imported 4 pods, not 2
    _refused(res, tmp_path, "given twice")


@pytest.mark.parametrize("node,needle", [("n1,20000,1024,100,T4", "gpu_count"), ("n1,2000000000,1024,0,", "cpu_m")])
def test_a_machine_no_node_group_can_hold_is_named(tmp_path, node, needle):
    res = _openb(tmp_path, "p,1000,1024,0,,,LS,Running,0,100,0\n", node + "\n")  # was a pydantic traceback
    _refused(res, tmp_path, "machine n1", "makes no valid node group", needle)


def test_google_request_beyond_any_machine_is_refused(tmp_path):
    ev = _write(tmp_path, "instance_events-0.json", json.dumps(
        {"collection_id": "1", "collection_type": 0, "instance_index": 0, "priority": 200, "time": "0", "type": 3,
         "resource_request": {"cpus": 1e306, "memory": 0.03125}}) + "\n")
    res = runner.invoke(app, ["trace", "import", "-f", "google-2019", "-o", str(tmp_path / "pods.csv"), str(ev)])
    _refused(res, tmp_path, "line 1, column resource_request.cpus", "too large")  # was OverflowError in ceil


@pytest.mark.parametrize("extra,needle", [("duration_s: 50\n", "key 'duration_s' is given twice (lines 3 and 8)"),
                                          ("", "key 'count' is given twice")])
def test_a_key_given_twice_in_a_scenario_is_refused(tmp_path, extra, needle):
    _write(tmp_path, "t.csv", TRACE_HEAD + "0,10,100,100,5\n")
    text = _scenario() + extra
    if not extra:
        text = text.replace("count: 1,", "count: 1, count: 3,")  # was 3 nodes, the first count ignored
    with pytest.raises(ScenarioError, match=re.escape(needle)):  # PyYAML kept the last one silently
        load_scenario(_write(tmp_path, "s.yaml", text))


def test_azure_units_that_make_no_node_group_are_refused(tmp_path):
    db = FIT.parents[1] / "traces" / "azure-packing-2020" / "packing_trace_sample.sqlite"
    out, mach = tmp_path / "pods.csv", tmp_path / "nodes.yaml"
    res = runner.invoke(app, ["trace", "import", "-f", "azure-packing-2020", "--cpu-unit-m", "2e9", "-o", str(out),
                              "-m", str(mach), str(db)])  # wrote a nodes file every scenario refused
    _refused(res, tmp_path, "machine type", "makes no valid node group", "cpu_m")


def test_an_error_in_an_included_group_names_the_file_it_is_in(tmp_path):
    """nodes.N counts the groups after the includes: the error named nodes.2 of a scenario that lists two."""
    _write(tmp_path, "t.csv", TRACE_HEAD + "0,10,100,100,5\n")
    _write(tmp_path, "machines.yaml", "nodes:\n  - {name_prefix: x, count: 1, cpu_m: 4000, memory_mib: 8192, "
                                      "power_watts: ibm-x3550-m3-x5675}\n  - {name_prefix: y, count: 1, cpu_m: -5, "
                                      "memory_mib: 8192, power_watts: ibm-x3550-m3-x5675}\n")
    text = _scenario().replace("nodes:\n", "nodes:\n  - {include: machines.yaml}\n", 1)
    with pytest.raises(ScenarioError, match=r"nodes\.1\.cpu_m: .*\n  \(nodes\.1 is group 1 of .*machines\.yaml "
                                            r"\(nodes\.0\.include\)\)"):
        load_scenario(_write(tmp_path, "s.yaml", text))
    with pytest.raises(ScenarioError, match=r"nodes\.0\.include: expected one file name, got \['a', 'b'\]"):
        load_scenario(_write(tmp_path, "s.yaml", _scenario().replace("nodes:\n", "nodes:\n  - {include: [a, b]}\n")))
