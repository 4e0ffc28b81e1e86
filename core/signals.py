"""Hold Ctrl-C and SIGTERM over code that would lose them.

CPython raises a signal handler's exception (Ctrl-C's KeyboardInterrupt) in whatever Python code runs next. When
that is a ctypes callback or a ``__del__``, the exception is printed as "Exception ignored" and dropped: the
process goes on as if no Ctrl-C came. numba's compiler runs such callbacks (llvmlite's object-cache notifier)
throughout a compile, so about one Ctrl-C in six during the first decision's compile was lost.
:func:`held_signals` records a signal instead and delivers it again, to the handler that was there, on the way
out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def held_signals(*signums: int) -> Iterator[None]:
    """Defer ``signums`` (default SIGINT and SIGTERM) until the block ends, then raise the first that came.

    Only the main thread can set handlers; elsewhere (a live scheduler's worker thread, where no handler runs
    anyway) this does nothing. Only a Python handler is held: an ignored signal stays ignored, and one left to the
    system's default (a pool worker's SIGTERM) still ends the process at once, since no Python code runs for it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    saved: dict[int, object] = {}
    try:
        for s in signums or (signal.SIGINT, signal.SIGTERM):
            if callable(signal.getsignal(s)):
                saved[s] = signal.signal(s, lambda signum, frame: got.append(signum))
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        if got:
            signal.raise_signal(got[0])
