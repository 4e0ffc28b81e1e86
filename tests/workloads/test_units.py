"""Pure pieces: pacing, the CPU split, listen parsing, parameter limits, manifests and Dockerfiles."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from joulesched.core.net import parse_listen
from joulesched.workloads.cpu import split_millicores
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
