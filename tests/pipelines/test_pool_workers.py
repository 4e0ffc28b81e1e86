"""The worker pool when a worker dies or its initializer fails: multiprocessing.Pool waits for a dead worker's
task for ever (starting another worker in its place), and restarts workers whose initializer raises for ever,
each printing its traceback. Both are now one error. The task functions live here, importable by the spawned
workers."""

from __future__ import annotations

import os
import time

import pytest

from joulesched.pipelines.pool import WorkerDied, imap, map_async, process_pool


def _dies_on_one(x: int) -> int:
    if x == 1:
        os._exit(9)  # what the kernel's OOM killer leaves: no exception, no answer
    time.sleep(0.05)
    return x


def _double(x: int) -> int:
    return 2 * x


def _bad_init() -> None:
    raise ValueError("the shared workload could not be read")


def test_a_worker_that_dies_is_an_error_not_a_wait_for_ever():
    t0 = time.monotonic()
    with pytest.raises(WorkerDied, match="worker process died"):
        with process_pool(2) as pool:
            list(imap(pool, _dies_on_one, range(4)))
    assert time.monotonic() - t0 < 60
    with pytest.raises(WorkerDied):
        with process_pool(2) as pool:
            map_async(pool, _dies_on_one, [0, 1, 2]).get()


def test_an_initializer_that_fails_is_raised_by_the_tasks_not_restarted_for_ever():
    with pytest.raises(ValueError, match="shared workload could not be read"):
        with process_pool(2, _bad_init) as pool:
            list(imap(pool, _double, range(3)))


def test_results_keep_the_tasks_order():
    with process_pool(2) as pool:
        assert list(imap(pool, _double, range(6))) == [0, 2, 4, 6, 8, 10]
        assert map_async(pool, _double, [3, 1]).get() == [6, 2]

