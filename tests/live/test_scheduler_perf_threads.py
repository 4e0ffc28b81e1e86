"""bench/scheduler_perf.py's per-thread CPU accounting (``thread_cpu_us_per_pod``): threads are named without
their number and a busy thread's CPU is counted under its name."""

from __future__ import annotations

import os
import threading
import time

from bench.scheduler_perf import thread_cpu_s


def test_a_busy_threads_cpu_is_counted_under_its_name():
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    workers = [threading.Thread(target=spin, name=f"spinner-{k}") for k in range(2)]
    idle = threading.Thread(target=stop.wait, name="idler-0")
    before = thread_cpu_s()
    for t in (*workers, idle):
        t.start()
    t_end = time.thread_time() + 0.3  # this thread's CPU: the spinners share the GIL with it
    while time.thread_time() < t_end:
        pass
    during = thread_cpu_s()
    stop.set()
    for t in (*workers, idle):
        t.join()
    assert "spinner" in during and "spinner-0" not in during  # the two summed under one name
    assert during["spinner"] - before.get("spinner", 0.0) > 0.05
    assert during.get("idler", 0.0) < 0.05  # waiting costs nothing
    # /proc counts CPU in clock ticks (10 ms at USER_HZ=100), sampled: each reading may be a few ticks short
    assert during["MainThread"] - before["MainThread"] >= 0.3 - 5 / os.sysconf("SC_CLK_TCK")
