"""held_signals: a Ctrl-C that arrives where CPython would drop it is delivered when the block ends."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from joulesched.core.signals import held_signals


class _KillsOnDelete:
    """Sends SIGINT from ``__del__``: the handler runs there, where CPython prints and drops its exception
    (as it does in the ctypes callbacks numba's compiler runs)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def _delete_one() -> None:
    _KillsOnDelete()  # deleted at once, so its __del__ runs here
    for _ in range(1000):  # bytecodes in which a still-pending handler would run
        pass


@pytest.fixture
def dropped(monkeypatch) -> list[type]:
    """The exceptions CPython drops ("Exception ignored in ..."), by type."""
    seen: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    return seen


def test_without_holding_a_ctrl_c_in_a_del_is_lost(dropped):
    """What held_signals is for: here the KeyboardInterrupt is dropped and the code goes on."""
    _delete_one()
    assert dropped == [KeyboardInterrupt]


def test_a_held_ctrl_c_is_raised_once_the_block_ends(dropped):
    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with held_signals():
            _delete_one()
            reached_end = True
    assert reached_end and dropped == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_held_sigterm_goes_to_the_handler_that_was_there():
    got: list[int] = []
    saved = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with held_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
            assert got == []
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, saved)


@pytest.mark.parametrize("disposition", [signal.SIG_IGN, signal.SIG_DFL])
def test_a_signal_without_a_python_handler_is_left_alone(disposition):
    """Ignored stays ignored; the system's default (no Python code runs for it, nothing to lose) stays too."""
    saved = signal.signal(signal.SIGTERM, disposition)
    try:
        with held_signals(signal.SIGTERM):
            assert signal.getsignal(signal.SIGTERM) is disposition
        assert signal.getsignal(signal.SIGTERM) is disposition
    finally:
        signal.signal(signal.SIGTERM, saved)


def test_an_ignored_ctrl_c_is_not_delivered_afterwards():
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with held_signals(signal.SIGINT):
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, saved)


def test_outside_the_main_thread_it_changes_nothing():
    seen: list[object] = []

    def run() -> None:
        with held_signals():
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]
