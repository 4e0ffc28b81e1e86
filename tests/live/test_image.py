"""The scheduler image: built offline from a local base by deploy/docker/build.sh, non-root, read-only root, and
it schedules: `joulesched serve --policy dqn=...` from inside the container binds a pod on the API emulator.

Needs a startable dockerd (the fixture starts a private one with no bridge and no NAT; it skips, saying why,
without dockerd, root or a base image). The emulator stands in for a kube-apiserver, which cannot run here.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.kube_emulator import KubeEmulator
from tests.workloads.test_docker import BASE_TAR, dockerd  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "joulesched-test/scheduler:test"

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy]


def _docker(env, *args, timeout=120, check=True):
    r = subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(autouse=True)
def no_thread_leaks():  # the emulator here is stopped by the test itself
    yield


def test_the_scheduler_image_builds_runs_non_root_and_binds_a_pod(dockerd, tmp_path):  # noqa: F811
    env = dockerd
    _docker(env, "import", str(BASE_TAR), "joulesched-test-base:bookworm", timeout=300)
    build = subprocess.run([str(ROOT / "deploy" / "docker" / "build.sh"), "--base", "joulesched-test-base:bookworm",
                            "--tag", IMAGE], env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-3000:]
    # Read-only root, no network: what the Deployment allows it.
    ro = ("run", "--rm", "--read-only", "--network", "none", "--tmpfs", "/tmp")
    help_ = _docker(env, *ro, IMAGE, "serve", "--help")
    assert "--scheduler-name" in help_.stdout
    assert _docker(env, *ro, IMAGE, "--version").stdout.startswith("joulesched ")
    assert _docker(env, *ro, "--entrypoint", "id", IMAGE, "-u").stdout.strip() == "65532"
    # The image carries the live path only: no Ray, Pulumi, Ansible or matplotlib.
    probe = _docker(env, *ro, "--entrypoint", "python3", IMAGE, "-c",
                    "import importlib.util as u; print([m for m in ('ray', 'pulumi', 'ansible', 'matplotlib') "
                    "if u.find_spec(m)])")
    assert probe.stdout.strip() == "[]"

    # It schedules: the DQN in the container binds a pod on the emulator (host network, loopback only).
    emu = KubeEmulator().start()
    try:
        for k in range(3):
            emu.add_node(f"n{k}", cpu="4", memory="8Gi")
        kc = emu.kubeconfig(str(tmp_path / "kubeconfig"))
        Path(kc).chmod(0o644)
        run = _docker(env, "run", "-d", "--name", "js-sched", "--read-only", "--tmpfs", "/tmp", "--network", "host",
                      "-v", f"{kc}:/etc/joulesched/kubeconfig:ro", IMAGE, "serve", "--kubeconfig",
                      "/etc/joulesched/kubeconfig", "--policy", "dqn=/opt/joulesched/models/v2.pt",
                      "--no-leader-elect", "--listen", "127.0.0.1:0")
        try:
            emu.add_pod("p1", scheduler_name="joulesched", cpu="500m", memory="256Mi")
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                pod = next(p for p in emu.list("pods") if p["metadata"]["name"] == "p1")
                if (pod.get("spec") or {}).get("nodeName"):
                    break
                time.sleep(0.2)
            logs = _docker(env, "logs", "js-sched", check=False)
            assert pod["spec"].get("nodeName") in {"n0", "n1", "n2"}, logs.stdout + logs.stderr
            assert len(emu.bindings) == 1
        finally:
            _docker(env, "rm", "-f", "js-sched", check=False)
            assert run.returncode == 0
    finally:
        emu.stop()


def test_the_manifests_name_the_image_build_sh_makes():
    """deploy/docker/build.sh tags joulesched:<version>; the Deployments run that image and the DQN it carries."""
    import tomllib

    import yaml

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for f in ("deployment.yaml", "extender-deployment.yaml"):
        for doc in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / f).read_text()):
            if not doc or doc.get("kind") != "Deployment":
                continue
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            assert c["image"].split("@")[0] == f"joulesched:{version}", (f, c["image"])
            for arg in c.get("args", []):
                if arg.startswith("--policy=dqn="):
                    model = arg.split("=", 2)[2]
                    assert model.startswith("/opt/joulesched/models/")
                    assert (ROOT / "models" / Path(model).name).is_file()
