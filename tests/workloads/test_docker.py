"""Build the CPU blocker image from a locally imported base, run it, and load it (needs a startable dockerd).

Skips, saying why, when there is no dockerd (apt-get install docker.io), no docker client, not root, or no
base tarball and no debootstrap to make one. The base (bookworm minbase + python3 + pip) is cached in
~/.cache/joulesched/docker/; the test's own dockerd runs with no bridge and no NAT and is torn down after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.support.procs import cache_lock, free_port, private_dockerd

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "joulesched" / "docker"
BASE_TAR = Path(os.environ.get("JOULESCHED_DOCKER_BASE_TAR", CACHE / "bookworm-python3.tar"))

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _why_not() -> str | None:
    if shutil.which("dockerd") is None:
        return "dockerd not installed (apt-get install docker.io)"
    if shutil.which("docker") is None:
        return "docker client not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "dockerd needs root"
    if not BASE_TAR.is_file() and shutil.which("debootstrap") is None:
        return f"no base tarball at {BASE_TAR} and no debootstrap to make one (apt-get install debootstrap)"
    return None


@pytest.fixture
def dockerd():
    why = _why_not()
    if why:
        pytest.skip(why)
    with cache_lock(BASE_TAR):  # tests/live/test_image.py may ask for it at the same time, on another worker
        if not BASE_TAR.is_file():
            subprocess.run([str(ROOT / "workloads" / "docker" / "make-base.sh"), str(BASE_TAR)], check=True,
                           stdout=subprocess.DEVNULL, timeout=900)
    try:
        with private_dockerd(60, extra_env={"DOCKER_BUILDKIT": "0"}) as env:
            yield env
    except RuntimeError as exc:
        pytest.skip(f"dockerd did not start here: {str(exc)[-500:]}")


def test_cpu_blocker_image_builds_and_runs(dockerd):
    env = dockerd
    subprocess.run(["docker", "import", str(BASE_TAR), "joulesched-test-base:bookworm"], env=env, check=True,
                   capture_output=True, timeout=300)
    build = subprocess.run([str(ROOT / "workloads" / "build.sh"), "--base", "joulesched-test-base:bookworm",
                            "--prefix", "joulesched-test", "cpu"], env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    port = free_port()
    # Host network on loopback: the engine has no bridge, and nothing leaves the machine.
    run = subprocess.run(["docker", "run", "-d", "--name", "jt-cpu", "--network", "host", "--read-only", "--tmpfs", "/tmp",
                          "joulesched-test/cpu:latest", "cpu", "--listen", f"127.0.0.1:{port}"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                r = requests.get(url + "/healthz", timeout=2)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "container never answered /healthz"
                time.sleep(0.2)
        assert r.json() == {"kind": "cpu", "status": "ok"}
        uid = subprocess.run(["docker", "exec", "jt-cpu", "id", "-u"], env=env, capture_output=True, text=True).stdout.strip()
        assert uid == "10001"
        st = requests.post(url + "/start", json={"duration_s": 1, "cpu_m": 500}, timeout=5)
        assert st.status_code == 202
        assert requests.post(url + "/start", json={"duration_s": 1, "cpu_m": -5}, timeout=5).status_code == 400
    finally:
        subprocess.run(["docker", "rm", "-f", "jt-cpu"], env=env, capture_output=True, timeout=60)
