"""The README's no-cluster quickstart, run as written: the emulator, then `joulesched serve` with the shipped DQN,
until the emulator reports the pods bound. (Only the port and the kubeconfig's path change, so runs do not
collide.)"""

from __future__ import annotations

import queue
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parent.parent


def _quickstart() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- quickstart: emulator", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_quickstart_binds_pods_on_the_emulator(tmp_path):
    emulator, serve = _quickstart()
    assert emulator[0] == ".venv/bin/python" and serve[:2] == [".venv/bin/joulesched", "serve"]
    kc = str(tmp_path / "kubeconfig")
    emulator = [kc if a == "/tmp/joulesched-kubeconfig" else a for a in emulator] + ["--port", str(free_port())]
    serve = [kc if a == "/tmp/joulesched-kubeconfig" else a for a in serve] + ["--listen", "127.0.0.1:0"]
    pods = int(emulator[emulator.index("--pods") + 1])
    emu = subprocess.Popen(emulator, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sched = None
    try:
        assert "emulator on" in emu.stdout.readline()
        sched = subprocess.Popen(serve, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in emu.stdout], daemon=True).start()
        bound = []
        deadline = time.monotonic() + 60
        while len(bound) < pods and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if re.match(r"bound default/pod-\d+ to node-\d+", line):
                bound.append(line.split()[-1])
        assert len(bound) == pods, (bound, sched.poll())
    finally:
        for p in (sched, emu):
            if p is not None:
                p.terminate()
                p.wait(timeout=20)
