"""Start workload apps for real: `joulesched workload serve ...` in a subprocess on a free loopback port."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests

BIN = Path(sys.executable).parent / "joulesched"


@dataclass
class Served:
    url: str
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.url + path, timeout=10, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        return requests.post(self.url + path, timeout=10, **kw)


def start_app(*args: str, stderr_path: Path) -> Served:
    err = open(stderr_path, "wb")
    proc = subprocess.Popen([str(BIN), "workload", "serve", *args, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=err, text=True)
    err.close()
    line = proc.stdout.readline().strip()  # type: ignore[union-attr]
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"app did not start: {line!r}; stderr: {stderr_path.read_text()[-2000:]}")
    served = Served(line.removeprefix("listening on "), proc)
    deadline = time.monotonic() + 10
    while True:
        try:
            if served.get("/healthz").ok:
                return served
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("app never answered /healthz")
        time.sleep(0.05)


def stop_app(served: Served) -> list[int]:
    """SIGTERM the app; return pids of children that outlived it (must be none)."""
    try:
        kids = psutil.Process(served.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    served.proc.terminate()
    try:
        served.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        served.proc.wait()
    gone, alive = psutil.wait_procs(kids, timeout=3)
    for p in alive:
        p.kill()
    return [p.pid for p in alive]


@pytest.fixture
def serve(tmp_path):
    """serve("cpu") -> Served; every app started is stopped at teardown, and must leave no process behind."""
    started: list[Served] = []

    def _serve(*args: str) -> Served:
        s = start_app(*args, stderr_path=tmp_path / f"app{len(started)}.stderr")
        started.append(s)
        return s

    yield _serve
    leftovers = [pid for s in started for pid in stop_app(s)]
    assert leftovers == [], f"processes outlived their app: {leftovers}"


def cpu_seconds_of_tree(pid: int) -> float:
    """user+system seconds of a process and its live children (children that exited are not counted)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def wait_for(cond, timeout: float, poll: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(poll)
    return cond()


def proc_io(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss

