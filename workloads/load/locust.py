"""Run Locust headless against a URL and summarise every request it made (same `LoadResult` as JMeter).

Locust runs as a subprocess: it monkey-patches the process with gevent, which must not leak into ours.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from joulesched.workloads.load.results import DriverError, LoadResult, check_target
from joulesched.workloads.load.results import read_csv_samples, remove_stale, summarise

LOCUSTFILE = Path(__file__).resolve().parent.parent / "locust" / "locustfile.py"
STARTUP_GRACE_S = 60.0
REQUEST_TIMEOUT_S = 5.0
"""A request unanswered this long fails (the JMeter plan's timeout); Locust's own HttpSession waits forever."""


def run(
    target: str,
    *,
    users: int = 10,
    spawn_rate: float = 10.0,
    duration_s: int = 10,
    locustfile: Path = LOCUSTFILE,
    workdir: Path | None = None,
) -> LoadResult:
    u = urlsplit(check_target(target))
    if users < 1 or spawn_rate <= 0 or duration_s < 1:
        raise DriverError("need users >= 1, spawn-rate > 0 and duration >= 1")
    # find_spec, not import: importing locust monkey-patches this process with gevent.
    if importlib.util.find_spec("locust") is None:
        raise DriverError("locust is not installed; pip install 'joulesched[load]'") from None
    host = f"{u.scheme}://{u.netloc}"
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    own_dir = workdir is None
    # Absolute: Locust runs in the work folder, where a path relative to ours names nothing (or the wrong file).
    wd = Path(tempfile.mkdtemp(prefix="joulesched-locust-")) if workdir is None else Path(workdir).absolute()
    locustfile = Path(locustfile).absolute()
    try:  # a folder of our own is removed however the run ends; a --workdir is the caller's to keep
        wd.mkdir(parents=True, exist_ok=True)
        return _run(wd, target, host, path, users, spawn_rate, duration_s, locustfile)
    finally:
        if own_dir:
            shutil.rmtree(wd, ignore_errors=True)


def _run(wd: Path, target: str, host: str, path: str, users: int, spawn_rate: float, duration_s: int,
         locustfile: Path) -> LoadResult:
    samples = wd / "samples.csv"
    remove_stale(samples)  # a Locust that fails before the locustfile opens it would leave the last run's to read
    argv = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--host", host,
        "-u", str(users), "-r", str(spawn_rate), "-t", f"{duration_s}s",
        # Longer than a request may take: a user stopped mid-request would leave no row for it.
        "--stop-timeout", str(int(REQUEST_TIMEOUT_S) + 2), "--only-summary", "--loglevel", "WARNING",
    ]
    # The user's LOCUST_* settings would change the run behind the driver's back (processes, tags, exit codes);
    # ~/.locust.conf is still read, but the options above override it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")} | {
        "JOULESCHED_LOCUST_PATH": path, "JOULESCHED_LOCUST_SAMPLES": str(samples),
        "JOULESCHED_LOCUST_TIMEOUT": str(REQUEST_TIMEOUT_S)}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=duration_s + STARTUP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise DriverError(f"Locust did not finish within {duration_s + STARTUP_GRACE_S:.0f} s") from None
    except BaseException:  # Ctrl-C: locust must not outlive us either
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    wall = time.monotonic() - t0
    # Locust exits 1 when any request failed; that is a result to report, not a driver failure.
    if proc.returncode not in (0, 1) or not samples.is_file():
        tail = "\n".join(out.strip().splitlines()[-5:])
        raise DriverError(f"Locust exited {proc.returncode} without results; last output:\n{tail}")
    return summarise(read_csv_samples(samples, "start_ms", "elapsed_ms", "ok"), "locust", target, wall)
