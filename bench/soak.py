"""Soak: `joulesched serve` (the real CLI, its own process) against the API emulator under continuous pod churn,
with its resident memory, threads and open file descriptors sampled every second.

Churn: pods are created at ``--rate`` per second with ``schedulerName: joulesched``; once ``--live`` pods exist,
each new pod is matched by deleting the oldest one (bound or not), so the cluster stays at a steady size while
every pod is new. The emulator keeps Events for ``--event-ttl`` seconds, as kube-apiserver's ``--event-ttl``.
After ``--warmup`` seconds, the verdict: RSS grows less than 5 % from the warm-up's end to the run's end (each
the median of 10 s of samples), and threads and descriptors stay within a small band (their max minus min).

    .venv/bin/python bench/soak.py --duration 600              # the 10-minute soak (docs/PERFORMANCE.md)
    .venv/bin/python bench/soak.py --duration 60 --warmup 20   # what tests/live/test_soak.py runs
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.procs import emulator_process, free_port  # noqa: E402

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {},
       "spec": {"schedulerName": "joulesched",
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10.1",
                                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}


def proc_sample(pid: int) -> dict:
    """RSS (bytes), threads and open descriptors of ``pid``, from /proc."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss": rss, "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class Churn:
    """Creates pods at ``rate``/s and, past ``live`` pods, deletes the oldest for each one created."""

    def __init__(self, port: int, rate: float, live: int, namespace: str = "soak") -> None:
        self.port, self.rate, self.live, self.ns = port, rate, live, namespace
        self.created = self.deleted = self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def start(self) -> "Churn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _req(self, conn: http.client.HTTPConnection, method: str, path: str, body: dict | None = None) -> int:
        conn.request(method, path, json.dumps(body).encode() if body is not None else None,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return r.status

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        t0 = time.monotonic()
        i = 0
        while not self._stop.is_set():
            delay = t0 + i / self.rate - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            pod = dict(POD, metadata={"name": f"p{i}", "namespace": self.ns})
            if self._req(conn, "POST", f"/api/v1/namespaces/{self.ns}/pods", pod) == 201:
                self.created += 1
            else:
                self.errors += 1
            if i >= self.live:
                code = self._req(conn, "DELETE", f"/api/v1/namespaces/{self.ns}/pods/p{i - self.live}")
                self.deleted += code == 200
            i += 1


def soak(duration: float, warmup: float, rate: float = 300, live: int = 2000, nodes: int = 200,
         policy: str = "default-k8s", event_ttl: float = 30.0, interval: float = 1.0, progress: bool = True,
         serve_cmd: list[str] | None = None) -> dict:
    """Run the soak; returns the samples and the verdict (see the module docstring). ``serve_cmd``: the
    command that runs ``joulesched`` (default: the venv's entry point), followed by ``serve`` and its options."""
    port, status_port = free_port(), free_port()
    tmp = tempfile.mkdtemp(prefix="joulesched-soak-")
    kubeconfig = os.path.join(tmp, "kubeconfig")
    serve = churn = None
    try:
        with emulator_process("--nodes", str(nodes), "--node-cpu", "16", "--node-memory", "64Gi", "--quiet",
                              "--event-ttl", str(event_ttl), "--kubeconfig", kubeconfig, port=port):
            try:
                exe = Path(sys.executable).with_name("joulesched")
                cmd = serve_cmd or ([str(exe)] if exe.exists() else [sys.executable, "-m", "joulesched.pipelines.cli"])
                serve = subprocess.Popen(cmd + ["serve", "--kubeconfig", kubeconfig, "--policy", policy,
                                                "--lease-namespace", "default", "--listen", f"127.0.0.1:{status_port}",
                                                "--log-level", "warning"],
                                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{status_port}/readyz", timeout=2) as r:
                            if r.status == 200:
                                break
                    except OSError:
                        pass
                    if serve.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"serve did not become ready: {serve.stderr.read() if serve.poll() else ''}")
                    time.sleep(0.2)
                churn = Churn(port, rate, live).start()
                t0 = time.monotonic()
                samples = []
                while (t := time.monotonic() - t0) < duration:
                    s = proc_sample(serve.pid)
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/emulator/bindings?since=999999999",
                                                timeout=10) as r:
                        s["bindings"] = json.loads(r.read())["count"]
                    s["t"] = t
                    samples.append(s)
                    if progress and len(samples) % 30 == 0:
                        print(f"  {t:5.0f} s  rss {s['rss'] / 2**20:6.1f} MiB  threads {s['threads']}  fds {s['fds']}  "
                              f"bound {s['bindings']}", flush=True)
                    time.sleep(max(0.0, interval - (time.monotonic() - t0 - t)))
                if serve.poll() is not None:
                    raise RuntimeError(f"serve exited during the soak: {serve.stderr.read()}")
                return verdict(samples, warmup)
            finally:
                if churn is not None:
                    churn.stop()
                if serve is not None:
                    serve.terminate()
                    try:
                        serve.wait(20)
                    except subprocess.TimeoutExpired:
                        serve.kill()
                        serve.wait()
    finally:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)


def verdict(samples: list[dict], warmup: float, window: float = 10.0) -> dict:
    after = [s for s in samples if s["t"] >= warmup]
    if len(after) < 2:
        raise RuntimeError("no samples after the warm-up: run longer than --warmup")
    first = [s["rss"] for s in after if s["t"] < warmup + window]
    last = [s["rss"] for s in after if s["t"] >= after[-1]["t"] - window]
    rss0, rss1 = statistics.median(first), statistics.median(last)
    span = after[-1]["t"] - after[0]["t"]
    bound = after[-1]["bindings"] - after[0]["bindings"]
    return {"samples": samples, "warmup_s": warmup, "rss_after_warmup": rss0, "rss_end": rss1,
            "rss_growth": rss1 / rss0 - 1, "threads": (min(s["threads"] for s in after),
                                                      max(s["threads"] for s in after)),
            "fds": (min(s["fds"] for s in after), max(s["fds"] for s in after)),
            "pods_bound_after_warmup": bound, "pods_per_s": bound / span if span > 0 else 0.0,
            "bytes_per_pod": (rss1 - rss0) / bound if bound else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--duration", type=float, default=600, help="seconds of churn")
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the baseline sample")
    ap.add_argument("--rate", type=float, default=300, help="pods created (and deleted) per second")
    ap.add_argument("--live", type=int, default=2000, help="pods kept in the cluster")
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--policy", default="default-k8s")
    ap.add_argument("--event-ttl", type=float, default=30.0, help="the emulator's --event-ttl, seconds")
    ap.add_argument("--json", type=Path, help="also write the samples and verdict here")
    a = ap.parse_args()
    r = soak(a.duration, a.warmup, a.rate, a.live, a.nodes, a.policy, a.event_ttl)
    print(f"after warm-up ({a.warmup:.0f} s): RSS {r['rss_after_warmup'] / 2**20:.1f} MiB -> "
          f"{r['rss_end'] / 2**20:.1f} MiB ({r['rss_growth'] * 100:+.2f} %), "
          f"threads {r['threads'][0]}..{r['threads'][1]}, "
          f"fds {r['fds'][0]}..{r['fds'][1]}, {r['pods_bound_after_warmup']} pods bound ({r['pods_per_s']:.0f}/s), "
          f"{r['bytes_per_pod']:+.1f} bytes per pod")
    if a.json:
        from joulesched.core.fsio import atomic_write_text

        atomic_write_text(a.json, json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
