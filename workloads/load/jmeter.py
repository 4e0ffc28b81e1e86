"""Run a JMeter plan headless against a URL and read its results file back.

The plan takes host, port, protocol, path, threads, rampup and duration as `-J` properties; results are
written as CSV (forced with -J properties, whatever jmeter.properties says) and summarised into a
`LoadResult`. Debian's JMeter 2.13 cannot load any plan with bookworm's xstream, so for a 2.x install the
driver starts JMeter through `xstream-allow.bsh` (see there); 5.x runs as plain `jmeter`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from joulesched.core.net import url_port
from joulesched.workloads.load.results import (
    DriverError,
    LoadResult,
    check_target,
    read_csv_samples,
    remove_stale,
    summarise,
)

HERE = Path(__file__).resolve().parent.parent / "jmeter"
DEFAULT_PLAN = HERE / "test-app.jmx"
ALLOW_SCRIPT = HERE / "xstream-allow.bsh"
BSH_JARS = (Path("/usr/share/java/bsh.jar"),)
STARTUP_GRACE_S = 60.0
"""Allowed on top of rampup + duration before the run counts as hung (JVM start is ~1 s here)."""

# CSV results with exactly the columns we parse; ms timestamps so start + elapsed is arithmetic.
RESULT_PROPS = {
    "jmeter.save.saveservice.output_format": "csv",
    "jmeter.save.saveservice.print_field_names": "true",
    "jmeter.save.saveservice.timestamp_format": "ms",
    "jmeter.save.saveservice.time": "true",
    "jmeter.save.saveservice.successful": "true",
    "jmeter.save.saveservice.response_code": "true",
    "jmeter.save.saveservice.label": "true",
    "jmeter.save.saveservice.response_message": "false",
    "jmeter.save.saveservice.thread_name": "false",
    "jmeter.save.saveservice.assertion_results_failure_message": "false",
    "jmeter.save.saveservice.default_delimiter": ",",
    # JMeter 5 writes a redirect's hops as rows of their own (label-0, label-1): one request must be one row.
    "jmeter.save.saveservice.subresults": "false",
    # timeStamp is the request's start (5.x and Debian's 2.13 ship it so; JMeter's code default is its end).
    "sampleresult.timestamp.start": "true",
}

Launcher = Literal["auto", "jmeter", "debian-2.13"]


def split_target(url: str) -> dict[str, str]:
    """URL -> the plan's protocol/host/port/path properties (checked as every --target is: core/net.py)."""
    check_target(url)
    u = urlsplit(url)
    port = url_port(u) or (443 if u.scheme == "https" else 80)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return {"protocol": u.scheme, "host": u.hostname, "port": str(port), "path": path}


def jmeter_home(jmeter_bin: str) -> Path | None:
    """The install that `jmeter_bin` runs, found by its bin/ApacheJMeter.jar. ``JMETER_HOME`` and Debian's
    /usr/share/jmeter stand in only for the default ``jmeter`` (Debian's /usr/bin/jmeter is a wrapper script): a
    binary the user names is run as given, never swapped for another install."""
    found = shutil.which(jmeter_bin)
    default = jmeter_bin == "jmeter" or (found is not None and Path(found).name == "jmeter"
                                         and Path(found).resolve().parent == Path("/usr/bin").resolve())
    candidates = [os.environ.get("JMETER_HOME")] if default else []
    if found:
        candidates.append(str(Path(found).resolve().parent.parent))
    if default:
        candidates.append("/usr/share/jmeter")
    for c in candidates:
        if c and (Path(c) / "bin" / "ApacheJMeter.jar").is_file():
            return Path(c)
    return None


def jmeter_version(home: Path) -> str:
    with zipfile.ZipFile(home / "bin" / "ApacheJMeter.jar") as z:
        for line in z.read("META-INF/MANIFEST.MF").decode().splitlines():
            if line.startswith("Implementation-Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def command(jmeter_bin: str = "jmeter", launcher: Launcher = "auto") -> list[str]:
    """The argv prefix that starts JMeter non-GUI on this machine (arguments follow)."""
    home = jmeter_home(jmeter_bin)
    bsh = next((j for j in BSH_JARS if j.is_file()), None)
    if launcher == "auto":
        launcher = "debian-2.13" if home and bsh and jmeter_version(home).startswith("2.") else "jmeter"
    if launcher == "jmeter":
        if shutil.which(jmeter_bin) is None:
            raise DriverError(f"{jmeter_bin!r} not found; install JMeter (Debian: apt-get install jmeter jmeter-http)")
        # Absolute: JMeter runs in its work folder, where a relative path names nothing (or another file).
        return [str(Path(shutil.which(jmeter_bin) or jmeter_bin).absolute())]
    if home is None or bsh is None:
        raise DriverError("the debian-2.13 launcher needs /usr/share/jmeter and /usr/share/java/bsh.jar (apt-get install jmeter)")
    java = shutil.which("java")
    if java is None:
        raise DriverError("java not found; JMeter needs a Java runtime (apt-get install default-jre-headless)")
    jars = [home / "bin" / "ApacheJMeter.jar", *sorted((home / "lib").glob("*.jar")), *sorted((home / "lib" / "ext").glob("*.jar")), bsh]
    if not (home / "lib" / "ext" / "ApacheJMeter_http.jar").is_file():
        raise DriverError(f"JMeter at {home} has no HTTP sampler; install it (Debian: apt-get install jmeter-http)")
    cp = os.pathsep.join(str(j) for j in jars)
    return [java, f"-Djmeter.home={home}", "-cp", cp, "bsh.Interpreter", str(ALLOW_SCRIPT)]


def run(
    target: str,
    *,
    plan: Path = DEFAULT_PLAN,
    threads: int = 10,
    rampup_s: int = 1,
    duration_s: int = 10,
    jmeter_bin: str = "jmeter",
    launcher: Launcher = "auto",
    workdir: Path | None = None,
) -> LoadResult:
    """Run `plan` against `target` for `duration_s` seconds and summarise what JMeter recorded."""
    # Absolute: JMeter runs in the work folder, where a path relative to ours names nothing (or the wrong file).
    plan = Path(plan).absolute()
    if not plan.is_file():
        raise DriverError(f"plan {plan} not found")
    if threads < 1 or rampup_s < 0 or duration_s < 1:
        raise DriverError("need threads >= 1, rampup >= 0 and duration >= 1")
    if rampup_s > duration_s:  # JMeter's end time is start + duration: threads due after it never start
        raise DriverError(f"rampup ({rampup_s} s) is longer than duration ({duration_s} s): the ramp-up is part of "
                          "the duration")
    props = split_target(target) | {"threads": str(threads), "rampup": str(rampup_s), "duration": str(duration_s)}
    argv = command(jmeter_bin, launcher)
    own_dir = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="joulesched-jmeter-")) if workdir is None else Path(workdir).absolute()
    try:  # a folder of our own is removed however the run ends; a --workdir is the caller's to keep
        wd.mkdir(parents=True, exist_ok=True)
        return _run(argv, plan, props, wd, target, rampup_s + duration_s + STARTUP_GRACE_S, own_dir)
    finally:
        if own_dir:
            shutil.rmtree(wd, ignore_errors=True)


def _log_tail(log: Path, lines: int = 5) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no jmeter.log)"


def _run(argv: list[str], plan: Path, props: dict[str, str], wd: Path, target: str, limit_s: float,
         own_dir: bool) -> LoadResult:
    jtl, log = wd / "results.jtl", wd / "jmeter.log"
    remove_stale(jtl, log)  # JMeter appends to an existing results.jtl: a reused --workdir would mix two runs
    argv = argv + ["-n", "-t", str(plan), "-l", str(jtl), "-j", str(log)]
    argv += [f"-J{k}={v}" for k, v in (props | RESULT_PROPS).items()]
    # The log of a folder about to be removed goes into the message; a kept folder is named instead.
    where = (lambda: f"jmeter.log ends:\n{_log_tail(log)}") if own_dir else (lambda: f"log: {log}")
    t0 = time.monotonic()
    # Own session so a timeout kills JMeter's whole process group, wrapper script and JVM alike.
    proc = subprocess.Popen(argv, cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise DriverError(f"JMeter did not finish within {limit_s:.0f} s; {where()}") from None
    except BaseException:  # Ctrl-C: the JVM must not outlive us either
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    wall = time.monotonic() - t0
    if proc.returncode != 0 or not jtl.is_file():
        tail = "\n".join(out.strip().splitlines()[-5:])
        raise DriverError(f"JMeter exited {proc.returncode} without results; last output:\n{tail}\n{where()}")
    return summarise(read_csv_samples(jtl, "timeStamp", "elapsed", "success"), "jmeter", target, wall)
