"""A multi-process, duty-cycled CPU burner for calibration (one process per core: threads would share the GIL).

Each worker spins for ``duty * period`` and sleeps for the rest of each period; the duty is a shared value
the parent changes between calibration steps. Only the standard library is imported (no numpy), so spawned workers
start fast and the module runs on hosts with a bare Python (bench/power_rapl_check.py).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from joulesched.power.meter import Clock, PowerMeter
from joulesched.power.procfs import read_cpu_times, usage_ratio

#: Period range. The period is random because /proc/stat accounts CPU time by sampling at the scheduler tick
#: (100-1000 Hz): a fixed period that is a multiple of the tick aliases with it and reads 10 % duty as 50 %.
PERIOD_S = (0.02, 0.08)


def _burn(duty, stop) -> None:  # runs in the worker process
    rng = random.Random()
    while not stop.is_set():
        period = rng.uniform(*PERIOD_S)
        start = time.perf_counter()
        busy_until = start + duty.value * period
        while time.perf_counter() < busy_until:
            pass
        rest = start + period - time.perf_counter()
        if rest > 0:
            time.sleep(rest)


class Burner:
    """``with Burner(workers) as b: b.set_duty(0.3)`` loads ``workers`` cores at 30 % each."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        ctx = mp.get_context("spawn")  # fork from a threaded parent (the exporter, pytest) is unsafe
        self._duty = ctx.Value("d", 0.0, lock=False)
        self._stop = ctx.Event()
        self._procs = [ctx.Process(target=_burn, args=(self._duty, self._stop), daemon=True)
                       for _ in range(self.workers)]

    def set_duty(self, duty: float) -> None:
        if not 0.0 <= duty <= 1.0:
            raise ValueError(f"duty must be in [0, 1], got {duty}")
        self._duty.value = duty

    def __enter__(self) -> "Burner":
        for p in self._procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for p in self._procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()


@dataclass(frozen=True)
class Sample:
    utilization: float  # fraction of all CPUs, 0..1
    watts: float


KNOTS = tuple(k / 10 for k in range(11))


def measure(meter: PowerMeter, *, step_s: float = 10.0, settle_s: float = 2.0, sample_s: float = 1.0,
            workers: int | None = None, proc_root: str = "/proc", clock: Clock = time.monotonic,
            sleep: Callable[[float], None] = time.sleep, levels: Sequence[float] = KNOTS,
            progress: Callable[[str], None] = lambda _: None,
            burner: Callable[[int | None], Burner] = Burner) -> list[Sample]:
    """Step the burner through ``levels`` and sample (utilisation, watts of the primary zones) every
    ``sample_s`` for ``step_s`` after ``settle_s`` at each level. ``clock`` paces the steps; watts are the
    meter's own joules over its own marked instants (give the meter the same clock). Utilisation is what /proc/stat measured,
    not the target, so background load does not bias the fit."""
    if step_s <= 0 or sample_s <= 0 or settle_s < 0:
        raise ValueError("step, sample and settle seconds must be positive")
    samples: list[Sample] = []
    with burner(workers) as load:
        for level in levels:
            load.set_duty(float(level))
            sleep(settle_s)
            t_end = clock() + step_s
            t0, c0 = meter.mark(), read_cpu_times(proc_root)
            while clock() < t_end - 1e-9:
                sleep(min(sample_s, max(t_end - clock(), 0.0)))
                t1, c1 = meter.mark(), read_cpu_times(proc_root)
                if t1 > t0:
                    samples.append(Sample(usage_ratio(c0, c1), meter.joules(t0, t1) / (t1 - t0)))
                t0, c0 = t1, c1
            progress(f"load {level * 100:3.0f}%: {samples[-1].utilization * 100:5.1f}% measured, "
                     f"{samples[-1].watts:7.2f} W" if samples else f"load {level * 100:3.0f}%: no sample")
    return samples
