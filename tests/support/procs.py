"""Process helpers for integration tests: stop a server for sure, run a private dockerd, run a real Prometheus."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PROMETHEUS = "/usr/bin/prometheus"


_GIVEN: set[int] = set()
_RNG = random.Random()  # its own: a test's random.seed() neither steers nor is disturbed by it


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a server that must be told its port (Prometheus, sshd, sushy).

    Between this check and the server's bind another socket could take the port. So it is drawn below the
    kernel's ephemeral range (where no outgoing connection's port comes from), from a slice of its own for each
    xdist worker (no two workers draw the same port), and never twice in one process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker) % count if worker.isdigit() else 0
    low, high = 10000, _ephemeral_low()
    if high - low < 64 * count:  # an unusual range: fall back to the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    size = (high - low) // count
    first = low + index * size
    start = _RNG.randrange(size)
    for k in range(size):
        port = first + (start + k) % size
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {first}-{first + size - 1}")


def wait_for(cond, timeout: float, what: str, interval: float = 0.2):
    """Poll ``cond`` until it returns something truthy (returned), or fail the test naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL: a test's server never outlives the test."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def emulator_process(*args: str, port: int | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """The API emulator (tests/support/kube_emulator.py) in a process of its own, for benchmarks (its CPU is
    not the measured process's), with the command-line options ``args`` on ``port`` (default: a free one).
    Yields ``(url, process)`` once it listens; stopped on exit."""
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.kube_emulator", "--port", str(port), *args],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        if "emulator on" not in line:
            raise RuntimeError(f"emulator did not start: {line}")
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_process(proc, timeout=15)


@contextlib.contextmanager
def cache_lock(entry: Path) -> Iterator[None]:
    """An exclusive lock on a cache entry across processes (flock on ``entry``.lock, made with its folder): test
    workers running side by side (`make test PYTEST_JOBS=2`) that both find the entry missing build it once, the second
    waiting for the first and then finding it there. Released when the holder exits, however it exits."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(entry.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def umount_under(path: Path) -> None:
    """Lazily unmount everything below ``path``: dockerd leaves netns bind mounts (and, if killed, overlay
    mounts) behind, which rmtree cannot remove."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(path))), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], check=False)


@contextlib.contextmanager
def private_dockerd(start_timeout_s: float = 90, extra_env: dict[str, str] | None = None,
                    prefix: str = "jsd-") -> Iterator[dict[str, str]]:
    """Start a dockerd of our own with no bridge, no iptables and no masquerade (no traffic leaves the
    machine); yield an environment whose DOCKER_HOST points at it. Raises RuntimeError if it does not start.
    """
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: the socket path must fit in 108 bytes
    sock = d / "docker.sock"
    log = open(d / "dockerd.log", "wb")
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(d / "data"), "--exec-root", str(d / "exec"), "-H", f"unix://{sock}",
         "--pidfile", str(d / "dockerd.pid"), "--bridge=none", "--iptables=false", "--ip-masq=false"],
        stdout=log, stderr=log)
    env = os.environ | {"DOCKER_HOST": f"unix://{sock}"} | (extra_env or {})
    try:
        deadline = time.monotonic() + start_timeout_s
        while subprocess.run(["docker", "version"], env=env, capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {(d / 'dockerd.log').read_text()[-1500:]}")
            time.sleep(0.5)
        yield env
    finally:
        stop_process(proc, timeout=60)
        log.close()
        umount_under(d)
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def prometheus_server(workdir: Path, port: int, targets: list[str], scrape_interval: str = "1s") -> Iterator[str]:
    """A real Prometheus (Debian's package) on 127.0.0.1:``port`` scraping ``targets``; yields its URL."""
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {scrape_interval}\n  scrape_timeout: {scrape_interval}\n"
        f"  evaluation_interval: {scrape_interval}\n"
        "scrape_configs:\n  - job_name: joulesched\n    static_configs:\n"
        f"      - targets: {targets!r}\n")
    log_path = workdir / "prometheus.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {log_path.read_text()[-2000:]}")
            try:
                if urllib.request.urlopen(f"{url}/-/ready", timeout=1).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after 30 s: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        stop_process(proc, timeout=10)
        log.close()
