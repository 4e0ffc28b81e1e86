"""Worker processes for benchmark cells that stop at once: one Ctrl-C (or SIGTERM) ends them all.

Workers are spawned (never forked: a parent that imported torch must not fork its thread pools) and ignore
SIGINT from their first instruction on (:func:`_quiet_start`), so a terminal's Ctrl-C reaches only the parent.
There the KeyboardInterrupt terminates the pool and is raised again; while the pool is being torn down further
Ctrl-Cs and SIGTERMs are ignored, so a second one cannot interrupt the cleanup and leave orphans behind (the hang a
plain ProcessPoolExecutor shows)."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import get_context, resource_tracker
from multiprocessing.pool import AsyncResult, Pool
from typing import Any

from joulesched.core.errors import JouleschedError

#: Seconds between checks that every worker is still the one the pool started with.
CHECK_EVERY_S = 1.0


class WorkerDied(JouleschedError):
    """A worker process ended (killed for memory, a crash): ``multiprocessing.Pool`` would wait for its task for
    ever, starting a new worker in its place."""


#: In a worker: the exception its initializer raised, raised again by every task (a pool whose initializer fails
#: would otherwise start new workers for ever, each printing its traceback).
_init_error: BaseException | None = None


def _worker_init(initializer: Callable[..., object] | None = None, args_file: str = "") -> None:
    # The worker was spawned with SIGINT blocked (_quiet_start): ignoring it discards a Ctrl-C that came during
    # start-up, and unblocking it leaves the worker's own children a normal signal mask.
    global _init_error
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if initializer is not None:
        try:
            with open(args_file, "rb") as f:
                initializer(*pickle.load(f))
        except Exception as e:  # kept, raised by the first task: it reaches the parent as that task's error
            _init_error = e


def _guarded(fn: Callable[[Any], Any], task: Any) -> Any:
    if _init_error is not None:
        raise _init_error
    return fn(task)


def _workers(pool: Pool) -> frozenset[int]:
    return frozenset(p.pid for p in pool._pool)  # type: ignore[attr-defined]


def _check_workers(pool: Pool, started: frozenset[int]) -> None:
    """Workers never exit on their own here (no maxtasksperchild): one that is not among those the pool started
    with replaced a worker that died, whose task will never be answered."""
    if _workers(pool) != started:
        raise WorkerDied("a worker process died (killed for lack of memory?); its task cannot finish")


def imap(pool: Pool, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
    """``pool.imap(fn, tasks)`` (results in task order) that raises :class:`WorkerDied` instead of waiting for
    ever, and raises an initializer's error instead of restarting workers for ever."""
    started = _workers(pool)
    it = pool.imap(functools.partial(_guarded, fn), tasks)
    while True:
        try:
            yield it.next(timeout=CHECK_EVERY_S)
        except StopIteration:
            return
        except multiprocessing.TimeoutError:
            _check_workers(pool, started)


class Checked:
    """An ``AsyncResult`` whose :meth:`get` raises :class:`WorkerDied` instead of waiting for ever."""

    def __init__(self, pool: Pool, result: AsyncResult, started: frozenset[int]) -> None:
        self.pool, self.result, self.started = pool, result, started

    def ready(self) -> bool:
        return self.result.ready()

    def get(self) -> Any:
        while True:
            try:
                return self.result.get(timeout=CHECK_EVERY_S)
            except multiprocessing.TimeoutError:
                _check_workers(self.pool, self.started)


def map_async(pool: Pool, fn: Callable[[Any], Any], tasks: list) -> Checked:
    """``pool.map_async(fn, tasks, chunksize=1)`` as a :class:`Checked` result."""
    started = _workers(pool)
    return Checked(pool, pool.map_async(functools.partial(_guarded, fn), tasks, chunksize=1), started)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _quiet_start() -> Iterator[list[int]]:
    """While the workers are being spawned, SIGINT is blocked in this thread, and SIGINT and SIGTERM are held:
    the list yielded receives what came, and the caller tears the pool down once it exists.

    A signal mask survives fork and exec, so each worker's Python starts with Ctrl-C blocked, and a terminal's
    Ctrl-C to the process group cannot kill it half-way through its imports (its ``_worker_init`` then ignores
    and unblocks it). The parent's own Ctrl-C is *held*, not ignored: an ignored signal is discarded, and under
    load spawning takes long enough (over 50 ms) for both of a double Ctrl-C to be lost, leaving the run going.
    """
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    # CPython starts its resource tracker on the first spawn and unblocks SIGINT on the way out of that: started
    # first, it leaves the mask below alone.
    resource_tracker.ensure_running()
    got: list[int] = []
    # A signal the process ignores (started with `cmd &` from a script, or by a supervisor) stays ignored.
    saved = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)
             if signal.getsignal(s) is not signal.SIG_IGN}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield got
    finally:
        # Unblocked while the recording handler is still in place: a pending Ctrl-C lands in ``got`` (CPython runs
        # the handlers before pthread_sigmask returns).
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for s, handler in saved.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def process_pool(jobs: int, initializer: Callable[..., object] | None = None, initargs: tuple = ()) -> Iterator[Pool]:
    """A pool of ``jobs`` spawned workers; on any exception (Ctrl-C included) every worker is terminated.
    ``initializer(*initargs)`` runs once in each worker (what every task shares: sent once, not per task)."""
    # What the workers share goes through a file, not the spawn pipe: a large payload in the pipe would keep the
    # parent writing (Ctrl-C held, see _quiet_start) until each child had started Python and read it.
    with tempfile.TemporaryDirectory(prefix="joulesched-pool-") as tmp:
        args_file = ""
        if initializer is not None:
            args_file = os.path.join(tmp, "initargs.pickle")
            with open(args_file, "wb") as f:
                pickle.dump(initargs, f, protocol=pickle.HIGHEST_PROTOCOL)
        with _pool(jobs, initializer, args_file) as pool:
            yield pool


@contextlib.contextmanager
def _pool(jobs: int, initializer: Callable[..., object] | None, args_file: str) -> Iterator[Pool]:
    with _quiet_start() as held:
        pool = get_context("spawn").Pool(jobs, initializer=_worker_init, initargs=(initializer, args_file))
    try:
        if held:
            raise KeyboardInterrupt
        yield pool
    except BaseException:
        with _signals_ignored():
            pool.terminate()
            pool.join()
        raise
    else:
        pool.close()
        pool.join()
