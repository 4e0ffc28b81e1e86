"""Pure pieces: pacing, the CPU split, listen parsing, parameter limits, manifests and Dockerfiles."""

from __future__ import annotations

import re
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from joulesched.core.net import parse_listen
from joulesched.workloads.cpu import split_millicores
from joulesched.workloads.egress import EgressError, NetAllow
from joulesched.workloads.manifests import APPS, IMAGES, container_args, render, render_yaml
from joulesched.workloads.pacing import TokenBucket, chunk_size
from joulesched.workloads.params import KIND_FIELDS, LoadParams, cpu_capacity_m

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_paces_to_rate():
    clock = FakeClock()
    b = TokenBucket(rate=1000, burst=100, clock=clock)
    assert b.reserve(500) == pytest.approx(0.5)  # starts empty: no initial burst
    clock.t += 0.5
    assert b.reserve(500) == pytest.approx(0.5)
    clock.t += 10  # idle for long: credit is capped at burst, so no catch-up burst
    assert b.reserve(600) == pytest.approx(0.5)


def test_token_bucket_take_honours_stop():
    b = TokenBucket(rate=1)
    stop = threading.Event()
    stop.set()
    assert b.take(10, stop) is False


def test_token_bucket_rejects_zero_rate():
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_chunk_size_is_page_aligned_and_bounded():
    assert chunk_size(20e6) == 999424
    assert chunk_size(1.0) == 4096
    assert chunk_size(1e12) == 1 << 20


@pytest.mark.parametrize("m,expected", [(500, [0.5]), (1000, [1.0]), (1500, [0.75, 0.75]), (2000, [1.0, 1.0]), (0, [])])
def test_split_millicores_spreads_evenly(m, expected):
    assert split_millicores(m) == pytest.approx(expected)
    assert sum(split_millicores(m)) * 1000 == pytest.approx(m)


@pytest.mark.parametrize("value,expected", [("127.0.0.1:8080", ("127.0.0.1", 8080)), ("[::1]:0", ("::1", 0)), ("0.0.0.0:1", ("0.0.0.0", 1))])
def test_parse_listen(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["127.0.0.1", ":80", "h:-1", "h:70000", "h:x"])
def test_parse_listen_rejects(value):
    with pytest.raises(ValueError, match="--listen"):
        parse_listen(value)


def test_params_limits():
    ok = LoadParams.model_validate({"duration_s": 1, "cpu_m": cpu_capacity_m()})
    assert ok.cpu_m == cpu_capacity_m()
    for bad in ({"duration_s": 1, "cpu_m": cpu_capacity_m() + 1}, {"duration_s": 3601, "cpu_m": 1}, {"duration_s": 1},
                {"duration_s": 1, "net_mbps": 1}, {"duration_s": 1, "disk_read_mbps": -1}):
        with pytest.raises(ValidationError):
            LoadParams.model_validate(bad)
    assert KIND_FIELDS["combined"] == set(LoadParams.model_fields)


@pytest.mark.parametrize("app", APPS)
def test_manifest_shape(app):
    dep, svc = render(app, scheduler_name="joulesched", image="img:1")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["schedulerName"] == "joulesched"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    # Selector, pod labels and Service selector agree because they come from one place.
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["selector"] == sel
    # Every writable path the app uses is a mounted emptyDir.
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    for arg in c["args"]:
        if arg.startswith("/"):
            assert any(arg.startswith(m) for m in mounts), arg


def test_an_invalid_image_reference_is_refused_naming_the_option():
    for image in ("UPPER CASE:bad", "joulesched/CPU:1", "cpu:", "cpu:-x", "a//b", "cpu@sha256:abc", " cpu",
                  "cpu:" + "1" * 129, "img:1\n", "img:tägé"):
        with pytest.raises(ValueError, match=f"--image {re.escape(repr(image))} is not a valid image reference"):
            render("cpu", image=image)
    for image in ("joulesched/cpu:latest", "img:1", "nginx", "registry.example:5000/team/cpu:1.0",
                  "localhost:5000/a/b_c.d-e", "ghcr.io/org/app@sha256:" + "ab" * 32, "[::1]:5000/x"):
        assert render("cpu", image=image)[0]["spec"]["template"]["spec"]["containers"][0]["image"] == image


@pytest.mark.parametrize("namespace", ["Bad_NS", "-ns", "ns-", "a.b", "", "n" * 64, "ns\n", "nş"])
def test_a_namespace_that_is_no_rfc1123_label_is_refused(namespace):
    with pytest.raises(ValueError, match=f"--namespace {re.escape(repr(namespace))} is not a valid namespace"):
        render("cpu", namespace=namespace)
    assert render("cpu", namespace="team-a1")[1]["metadata"]["namespace"] == "team-a1"


@pytest.mark.parametrize("app", APPS)
def test_committed_manifests_match_renderer(app):
    assert (ROOT / "workloads" / "k8s" / f"{app}.yaml").read_text() == render_yaml(app)


@pytest.mark.parametrize("app", IMAGES)
def test_dockerfile(app):
    text = (ROOT / "workloads" / "docker" / f"Dockerfile.{app}").read_text()
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert lines[0] == "ARG BASE=python:3.11-slim" and lines[1] == "FROM ${BASE}"
    user = re.search(r"^USER (\S+)", text, re.M)
    assert user and not user.group(1).startswith(("0", "root"))
    assert "--no-index" in text  # offline install: no registry needed at build time
    cmd = yaml.safe_load(re.search(r"^CMD (.*)$", text, re.M).group(1))
    assert cmd == container_args(app)
    entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))
    assert entry == ["python3", "-m", "joulesched.pipelines.cli.workload", "serve"]


def test_the_image_entry_point_imports_no_scheduler_dependencies():
    """The images install joulesched without its dependencies: the workload command must not need them."""
    import subprocess
    import sys

    code = ("import sys, joulesched.pipelines.cli.workload; "
            "print(sorted(m for m in ('torch', 'kubernetes', 'gymnasium', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_build_script_refuses_unknown_apps():
    import subprocess

    cp = subprocess.run(["bash", str(ROOT / "workloads" / "build.sh"), "gpu"], capture_output=True, text=True)
    assert cp.returncode == 2 and "unknown argument" in cp.stderr


# ----------------------------------------------------------------------------------------------- review fixes
def test_token_bucket_take_gives_up_at_until_instead_of_waiting_past_it():
    clock = FakeClock()
    b = TokenBucket(rate=1e-300, clock=clock)  # the wait it would ask for overflows any platform's timer
    assert b.take(4096, threading.Event(), until=clock.t) is False  # no OverflowError, no wait past the end
    b = TokenBucket(rate=1000, clock=clock)
    assert b.take(500, threading.Event(), until=clock.t + 0.1) is False  # tokens come at +0.5 s: past the end
    b = TokenBucket(rate=1000, clock=clock)
    assert b.take(50, threading.Event(), until=clock.t + 10) is True


def test_paced_stream_ends_at_its_seconds_even_before_the_first_chunk():
    from joulesched.workloads.network import paced_stream

    t0 = time.monotonic()
    got = list(paced_stream(0.004, 0.2, threading.Event(), [0]))  # 500 B/s: the first 1 KiB chunk is due at 2 s
    assert got == [] and time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("body,words", [
    ({"duration_s": 1, "net_mbps": 1e-300, "net_target": "http://127.0.0.1:1/"}, "net_mbps=1e-300 Mbit/s is too slow"),
    ({"duration_s": 60, "disk_write_mbps": 1e-300}, "disk_write_mbps=1e-300 MB/s is too slow"),
    ({"duration_s": 1, "disk_read_mbps": 0.004}, "at least 0.0041 MB/s"),
    ({"duration_s": 0.001, "net_mbps": 100, "net_target": "http://127.0.0.1:1/"}, "more than the 0.001 s"),
])
def test_a_rate_too_slow_for_one_transfer_within_the_duration_is_refused(body, words):
    with pytest.raises(ValidationError, match=re.escape(words)):
        LoadParams.model_validate(body)


@pytest.mark.parametrize("field,value,unit,extra", [("disk_read_mbps", 0.004, "MB/s", {}),
                                                ("net_mbps", 0.001, "Mbit/s", {"net_target": "http://127.0.0.1:1/"})])
def test_the_least_rate_quoted_passes(field, value, unit, extra):
    with pytest.raises(ValidationError) as err:
        LoadParams.model_validate({"duration_s": 1, field: value} | extra)
    least = float(re.search(rf"at least ([0-9.e-]+) {unit}", str(err.value)).group(1))
    assert getattr(LoadParams.model_validate({"duration_s": 1, field: least} | extra), field) == least
    assert getattr(LoadParams.model_validate({"duration_s": 3600, field: value} | extra), field) == value


@pytest.mark.parametrize("target", ["http://127.0.0.1:99999/sink", "http://127.0.0.1:abc/sink",
                                    "http://127.0.0.1:0/sink"])
def test_a_net_target_port_outside_1_65535_is_refused(target):
    with pytest.raises(ValidationError, match="port must be a number in 1..65535"):
        LoadParams.model_validate({"duration_s": 1, "net_mbps": 1, "net_target": target})
    with pytest.raises(EgressError, match="port must be a number in 1..65535"):
        NetAllow().check_url(target)


@pytest.mark.parametrize("url,host,expected", [
    ("http://127.0.0.1:8080/sink", "127.0.0.1", True),
    ("http://localhost:8080/start", "127.0.0.1", True),
    ("http://[::ffff:127.0.0.1]:8080/sink", "127.0.0.1", True),
    ("http://LOCALHOST.:8080/sink", "127.0.0.1", True),
    ("http://127.0.0.2:8080/sink", "127.0.0.1", False),  # nothing listens there: a 127.0.0.1 bind takes only itself
    ("http://127.0.0.2:8080/sink", "0.0.0.0", True),  # a wildcard bind takes every loopback address
    ("http://[::1]:8080/sink", "::", True),
    ("http://10.1.2.3:8080/sink", "0.0.0.0", True),  # one of this host's interface addresses (faked below)
    ("http://10.1.2.4:8080/sink", "0.0.0.0", False),
    ("http://127.0.0.1:8081/sink", "127.0.0.1", False),
    ("http://sink.ns.svc:8080/sink", "0.0.0.0", False),
    ("http://gone.ns.svc:8080/sink", "0.0.0.0", False),  # does not resolve: reaches nothing
])
def test_is_self_knows_the_apps_own_address_in_any_spelling(monkeypatch, url, host, expected):
    import ipaddress

    from joulesched.workloads import egress

    def resolver(name: str, port: int) -> list[str]:
        known = {"localhost": ["127.0.0.1", "::1"], "sink.ns.svc": ["10.96.0.7"]}
        if name not in known:
            raise OSError(f"cannot resolve {name}")
        return known[name]

    monkeypatch.setattr(egress, "local_addresses", lambda: {ipaddress.ip_address("10.1.2.3")})
    assert NetAllow(resolver=resolver).is_self(url, host, 8080) is expected


def _cgroup_v2(root: Path, limits: dict[str, dict[str, str]]) -> Path:
    """A synthetic cgroup v2 tree: ``limits`` maps a cgroup path to its files; returns a /proc/self/cgroup."""
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for rel, files in limits.items():
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (d / name).write_text(text)
    proc = root.parent / "self-cgroup"
    proc.write_text(f"0::/{max(limits, key=len)}\n")
    return proc


def test_cgroup_v2_limits_are_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path):
    from joulesched.workloads import cgroup

    root = tmp_path / "fs"
    proc = _cgroup_v2(root, {
        "kubepods/pod1": {"cpu.max": "150000 100000\n", "memory.max": str(512 << 20), "memory.current": str(100 << 20),
                          "memory.stat": f"anon 1\ninactive_file {20 << 20}\n"},
        "kubepods/pod1/ctr": {"cpu.max": "max 100000\n", "memory.max": "max\n", "memory.current": str(90 << 20)},
    })
    assert cgroup.cpu_quota_m(root, proc) == 1500
    assert cgroup.memory_available(root, proc) == (512 - 80) << 20  # limit less usage less inactive page cache
    (root / "kubepods/pod1/ctr/cpu.max").write_text("50000 100000\n")
    assert cgroup.cpu_quota_m(root, proc) == 500
    (root / "kubepods/pod1/cpu.max").write_text("max 100000\n")
    (root / "kubepods/pod1/memory.max").write_text("max\n")
    assert cgroup.memory_available(root, proc) is None


def test_cgroup_v1_limits_and_a_namespaced_path_that_is_the_mount(tmp_path):
    from joulesched.workloads import cgroup

    root = tmp_path / "fs"
    for ctrl, files in (("memory", {"memory.limit_in_bytes": str(256 << 20), "memory.usage_in_bytes": str(56 << 20),
                                    "memory.stat": "total_inactive_file 0\n"}),
                        ("cpu,cpuacct", {"cpu.cfs_quota_us": "200000\n", "cpu.cfs_period_us": "100000\n"})):
        (root / ctrl).mkdir(parents=True)
        for name, text in files.items():
            (root / ctrl / name).write_text(text)
    proc = tmp_path / "self-cgroup"
    # Seen from a private cgroup namespace: a path that is not under the mount, whose root is the own cgroup.
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/../../x\n0::/\n")
    assert cgroup.cpu_quota_m(root, proc) == 2000
    assert cgroup.memory_available(root, proc) == 200 << 20
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup.cpu_quota_m(root, proc) is None and cgroup.memory_available(root, proc) is None


def test_params_cap_cpu_and_memory_at_the_cgroup_limits(tmp_path, monkeypatch):
    import psutil

    from joulesched.workloads import cgroup, params

    root = tmp_path / "fs"
    proc = _cgroup_v2(root, {"pod": {"cpu.max": "50000 100000", "memory.max": str(300 << 20),
                                     "memory.current": str(100 << 20)}})
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", root)
    monkeypatch.setattr(cgroup, "SELF_CGROUP", proc)
    assert psutil.virtual_memory().available > 1 << 30  # the host alone would allow far more
    assert params.cpu_capacity_m() == 500
    assert params.memory_capacity_mib() == int((200 << 20) * params.MEMORY_HEADROOM) // 2**20
    with pytest.raises(ValidationError, match="cpu_m=600 exceeds the 500m"):
        LoadParams.model_validate({"duration_s": 1, "cpu_m": 600})
    with pytest.raises(ValidationError, match="memory_mib=190 exceeds 180 MiB"):
        LoadParams.model_validate({"duration_s": 1, "memory_mib": 190})
    assert LoadParams.model_validate({"duration_s": 1, "cpu_m": 500, "memory_mib": 180}).memory_mib == 180


@pytest.mark.parametrize("app", APPS)
def test_manifests_set_limits_and_size_limits(app):
    pod = render(app)[0]["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    # The blockers that write to /scratch reserve the node's disk for it (its emptyDir's size limit).
    want = {"cpu", "memory"} | ({"ephemeral-storage"} if app in ("disk", "combined") else set())
    assert set(res["limits"]) == want and set(res["requests"]) == want
    assert all(v["emptyDir"].get("sizeLimit") for v in pod["volumes"])
    if app in ("disk", "combined"):
        scratch = next(v for v in pod["volumes"] if v["name"] == "scratch")["emptyDir"]["sizeLimit"]
        assert res["requests"]["ephemeral-storage"] == res["limits"]["ephemeral-storage"] == scratch


@pytest.mark.parametrize("app", [a for a in APPS if a.startswith("shop")])
def test_a_shop_is_one_replica_at_most(app):
    # Each replica would have its own SQLite database behind one Service: a cart made on one pod is a 404 on the next.
    assert render(app, replicas=1)[0]["spec"]["replicas"] == 1
    with pytest.raises(ValueError, match="--replicas 2: .* SQLite file of its own pod"):
        render(app, replicas=2)


def test_the_scratch_size_limit_holds_two_files_of_the_largest_size():
    from joulesched.workloads.manifests import SIZE_LIMITS, quantity
    from joulesched.workloads.params import MAX_DISK_FILE_MIB

    assert quantity(SIZE_LIMITS["scratch"], "scratch") > 2 * MAX_DISK_FILE_MIB * 2**20


def test_limits_are_overridable_and_a_request_above_its_limit_is_refused():
    res = render("cpu", cpu_request="2", cpu_limit="3", memory_limit="1Gi")[0]["spec"]["template"]["spec"][
        "containers"][0]["resources"]
    assert res == {"requests": {"cpu": "2", "memory": "64Mi"}, "limits": {"cpu": "3", "memory": "1Gi"}}
    with pytest.raises(ValueError, match=r"--cpu-request 5 is more than the default cpu limit 4 \(see --cpu-limit\)"):
        render("cpu", cpu_request="5")
    with pytest.raises(ValueError, match="--memory-request 2Gi is more than --memory-limit 1Gi"):
        render("cpu", memory_request="2Gi", memory_limit="1Gi")


@pytest.mark.parametrize("option,value", [("cpu_request", "0"), ("cpu_request", "0m"), ("memory_request", "0"),
                                          ("memory_request", "0.0Gi"), ("cpu_limit", "0e3"), ("memory_limit", "0Mi")])
def test_a_zero_quantity_is_refused_naming_the_option(option, value):
    with pytest.raises(ValueError, match=f"--{option.replace('_', '-')} '{value}' asks for nothing"):
        render("cpu", **{option: value})


@pytest.mark.parametrize("name", ["Bad_Name", "-x", "x-", "a..b", "UPPER", "sched uler", "", "s" * 254, "x\n"])
def test_a_scheduler_name_that_is_no_dns_1123_subdomain_is_refused(name):
    with pytest.raises(ValueError, match=f"--scheduler-name {re.escape(repr(name))} is not a valid scheduler name"):
        render("cpu", scheduler_name=name)
    for ok in ("default-scheduler", "joulesched", "my.scheduler-1"):
        assert render("cpu", scheduler_name=ok)[0]["spec"]["template"]["spec"]["schedulerName"] == ok


@pytest.mark.parametrize("value, number", [("1E", 10**18), ("1Ei", 2**60), ("2e3", 2000), ("1.5E", 15 * 10**17),
                                           ("3Pi", 3 * 2**50), ("1e-3", Decimal("0.001"))])
def test_exa_and_exbi_are_suffixes_not_exponents(value, number):
    from joulesched.workloads.manifests import quantity

    assert quantity(value, "--memory-limit") == number


def test_a_url_takes_an_idn_host_but_no_spaces_or_non_ascii_elsewhere():
    from joulesched.core.net import check_http_url

    assert check_http_url("http://bücher.example:8080/sink", "--t") == "http://bücher.example:8080/sink"
    for bad, why in (("http://h/a b", "percent-encode spaces"), ("http://h/é", "path or query"),
                     ("http://h/a\r\nX: y", "control characters"), ("http://[::1/", "Invalid IPv6 URL")):
        with pytest.raises(ValueError, match=f"--t .*{why}"):
            check_http_url(bad, "--t")
