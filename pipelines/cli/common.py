"""What every `joulesched` command shares: the consoles, the error-to-exit mapping, the command line.

Library code raises :class:`~joulesched.core.errors.JouleschedError` subclasses; :func:`errors` turns any of
them into one red line on stderr and the exit code the error carries (2 for bad input, 1 for a failure at run
time). Ctrl-C and SIGTERM exit 130.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from joulesched.core.errors import EXIT_INTERRUPTED, JouleschedError
from joulesched.pipelines.progress import err

# Piped output (logs, CI) gets a wide console so that tables are not truncated to 80 columns.
out = Console(highlight=False) if sys.stdout.isatty() else Console(width=160, highlight=False)

__all__ = ["EXIT_INTERRUPTED", "command_line", "err", "errors", "fail", "float_option", "interrupted", "json_text",
           "out"]


def _finite(value: float | None) -> float | None:
    # After click's own conversion and range check, which nan passes (every comparison with it is false).
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def json_text(doc: object, **kw) -> str:
    """``doc`` as strict JSON: a NaN or an infinity (a ratio of nothing to nothing) becomes null, since
    ``json.dumps`` would write ``NaN``, which no strict parser reads."""

    def clean(v: object) -> object:
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(doc), allow_nan=False, **kw)


def float_option(*names: str, **kw) -> typer.models.OptionInfo:
    """``typer.Option`` for a float: its ``min`` and ``max`` checked as typer checks them, and ``nan`` and ``inf``
    refused (exit 2): a time limit, a step or a unit that is not a number is bad input."""
    if "callback" in kw:
        raise TypeError("float_option checks finiteness in its own callback; validate in the command instead")
    return typer.Option(*names, callback=_finite, **kw)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` in red on stderr and exit with ``code``."""
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """Map joulesched's own errors to one line and their exit code; nothing else is caught."""
    try:
        yield
    except JouleschedError as e:
        fail(str(e), e.exit_code)


def command_line() -> str:
    """The command as typed (``joulesched`` and the arguments, shell-quoted): it reproduces the run."""
    return "joulesched " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _forget_caught_interrupt() -> None:
    """Clear CPython's "unhandled KeyboardInterrupt" flag after we have handled one.

    A KeyboardInterrupt that ends a *string* ``exec``/``eval`` (``PyRun_String``: dataclasses, namedtuples and
    string annotations are built that way, e.g. when torch imports a module lazily mid-training) sets that flag
    even if a caller catches it; under ``python -m`` the interpreter then kills itself with SIGINT at exit, so a
    clean exit 130 reads as a signal death (-2). Every string eval clears the flag when it starts, so one that
    ends normally resets it. Harmless where the flag does not exist."""
    exec("pass", {})  # noqa: S102 - a constant string, run for its side effect on the flag


@contextlib.contextmanager
def interrupted(out_dir: Path, message: str | Callable[[], str] | None = None) -> Iterator[None]:
    """Ctrl-C: say what was kept and how to resume (``message``: the command's own words), exit 130 (stages
    record themselves only when complete)."""
    try:
        yield
    except KeyboardInterrupt:
        # We are on the way out: a second Ctrl-C (or a SIGTERM) must not cut the exit short or print a traceback.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        _forget_caught_interrupt()
        if message is None:
            message = (f"{out_dir} is consistent: nothing half-written is left (results are written only when "
                       "complete; a pipeline keeps its finished stages, and a cluster run deleted its pods). "
                       "Re-run the same command to resume.")
        text = message() if callable(message) else message  # (a callable says what is true when it happens)
        err.print(f"[yellow]interrupted:[/yellow] {escape(text)}", soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
