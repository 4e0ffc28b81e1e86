"""The site playbook against a real systemd host (a container under our own dockerd) in the power_hosts,
monitoring and loadgen groups: converge, a second run with changed=0, then the testinfra host checks (power host
and load generator) through the same inventory (--hosts=ansible://all).

Air-gapped, as the targets are: the container has no network but loopback; joulesched comes from a wheelhouse
built on the controller and installed with `pip --no-index`; Debian packages are preinstalled in the image.
Skips (saying why) without root, docker.io or debootstrap; JOULESCHED_INFRA_E2E=0 turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.infra import targets

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(1500)]
HERE = Path(__file__).resolve().parent
PLUGINS = HERE / "ansible_plugins" / "connection"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    why = targets.why_not_docker()
    if why:
        pytest.skip(f"systemd container target unavailable: {why}")
    pytest.importorskip("ansible_runner", reason="ansible-runner not installed (pip install -e '.[infra]')")
    from joulesched.infra.wheelhouse import build_wheelhouse

    wheelhouse = targets.CACHE / "wheelhouse"
    build_wheelhouse(wheelhouse)
    name = f"js-target-{os.getpid()}"
    inv = tmp_path_factory.mktemp("inv") / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "docker", "ansible_python_interpreter": "/usr/bin/python3",
                 "ansible_become": False},
        "children": {
            "power_hosts": {"hosts": {name: None}, "vars": {
                "power_exporter_install_mode": "wheelhouse", "power_exporter_wheelhouse_src": str(wheelhouse),
                "power_exporter_apt_update_cache": False, "node_exporter_apt_update_cache": False,
                "power_exporter_interval": 0.5}},
            "monitoring": {"hosts": {name: None}, "vars": {"prometheus_apt_update_cache": False,
                                                          "prometheus_scrape_interval": "2s"}},
            # JMeter and its JRE are preinstalled in the image (air-gapped); the role converges the rest.
            "loadgen": {"hosts": {name: None}, "vars": {"jmeter_apt_update_cache": False}},
        }}}))
    t0 = time.monotonic()
    with targets.dockerd() as env:
        with targets.systemd_container(env, name):
            yield {"env": env, "inventory": inv, "name": name, "boot_s": time.monotonic() - t0}


def _provision(target):
    from joulesched.infra.provision import provision

    env = {"DOCKER_HOST": target["env"]["DOCKER_HOST"], "ANSIBLE_CONNECTION_PLUGINS": str(PLUGINS)}
    t0 = time.monotonic()
    r = provision(target["inventory"], envvars=env, timeout_s=900)
    return r, time.monotonic() - t0


@pytest.fixture(scope="module")
def converged(target):
    first, t1 = _provision(target)
    assert first.succeeded, first.stdout[-6000:]
    second, t2 = _provision(target)
    print(f"\nboot {target['boot_s']:.1f}s, converge {t1:.1f}s, second run {t2:.1f}s")
    return first, second


def test_converge_passes(converged):
    first, _ = converged
    assert first.changed > 0 and first.failed == 0


def test_second_run_changes_nothing(converged):
    _, second = converged
    assert second.succeeded, second.stdout[-6000:]
    assert second.changed == 0, [h for h in second.hosts] and second.stdout[-6000:]


def test_testinfra_passes_through_the_inventory(target, converged):
    env = target["env"] | {"ANSIBLE_CONNECTION_PLUGINS": str(PLUGINS),
                           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                        str(HERE / "test_power_host.py"), str(HERE / "test_loadgen_host.py"), "--hosts=ansible://all",
                        f"--ansible-inventory={target['inventory']}"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=str(targets.REPO))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout and "skipped" not in r.stdout.split("\n")[-2], \
        r.stdout[-3000:]


# ------------------------------------------------------------------------------------------------- upgrades
MARKER_FILE = "power/exporter.py"
MARKER_FROM = '"Energy per zone since the exporter started."'


def _metrics(target) -> str:
    r = targets.docker(target["env"], "exec", target["name"], "python3", "-c",
                       "import urllib.request; print(urllib.request.urlopen("
                       "'http://127.0.0.1:9102/metrics', timeout=5).read().decode())", check=False, timeout=60)
    return r.stdout if r.returncode == 0 else ""


def _main_pid(target) -> str:
    return targets.docker(target["env"], "exec", target["name"], "systemctl", "show", "-p", "MainPID", "--value",
                          "joulesched-power-exporter", timeout=60).stdout.strip()


def test_new_code_under_the_same_version_is_installed_and_runs(target, converged, tmp_path):
    """Converge, change the code (the version number stays 0.1.0), converge again: the role reinstalls because
    the wheelhouse's lock hash changed, restarts the service, and the running exporter serves the new code.
    Before the lock, the second converge found `joulesched==0.1.0` "already satisfied" and changed nothing."""
    import shutil as sh

    from joulesched.infra.wheelhouse import LOCK_NAME, build_wheelhouse, package_folders
    from tests.infra.test_qemu_guest import _changed_tasks

    marker = f"upgrade-marker-{os.getpid()}-{int(time.time())}"
    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        sh.copy2(targets.REPO / f, src / f)
    for pkg in package_folders():
        if (targets.REPO / pkg).is_dir():
            sh.copytree(targets.REPO / pkg, src / pkg, ignore=sh.ignore_patterns("__pycache__"))
    code = (src / MARKER_FILE).read_text()
    assert MARKER_FROM in code
    (src / MARKER_FILE).write_text(code.replace(MARKER_FROM, f'"Energy per zone since the exporter started '
                                                             f'({marker})."'))
    wheelhouse = tmp_path / "wheelhouse"
    sh.copytree(targets.CACHE / "wheelhouse", wheelhouse)  # the same requirement wheels: no download
    build_wheelhouse(wheelhouse, source=src)
    assert (wheelhouse / LOCK_NAME).read_text() != (targets.CACHE / "wheelhouse" / LOCK_NAME).read_text()

    assert marker not in _metrics(target)
    pid_before = _main_pid(target)
    inv = yaml.safe_load(target["inventory"].read_text())
    inv["all"]["children"]["power_hosts"]["vars"]["power_exporter_wheelhouse_src"] = str(wheelhouse)
    upgraded = dict(target, inventory=tmp_path / "hosts.yml")
    upgraded["inventory"].write_text(yaml.safe_dump(inv))
    r, t = _provision(upgraded)
    assert r.succeeded, r.stdout[-6000:]
    changed = _changed_tasks(r.stdout)
    assert "power_exporter : Install joulesched and its requirements from the hashed lock file" in changed, changed
    assert "power_exporter : Restart power exporter" in changed, changed
    deadline = time.monotonic() + 60
    while marker not in (body := _metrics(target)) and time.monotonic() < deadline:
        time.sleep(1)
    assert marker in body, "the running exporter does not serve the new code"
    assert _main_pid(target) != pid_before
    print(f"\nupgrade converge {t:.1f}s")
    # (That an unchanged lock installs nothing is test_second_run_changes_nothing.)
