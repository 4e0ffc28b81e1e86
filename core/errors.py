"""The one root of joulesched's own exceptions, and the exit code each kind means.

Library code raises a subclass that says what went wrong and how to fix it; the CLI turns any of them into
one red line and ``exit_code`` (:func:`joulesched.pipelines.cli.common.errors`), in one place.

* :class:`UsageError` (exit 2): the input is wrong (an option, a scenario, a trace, a model file, a request).
  Raised before any work starts, so nothing is half-written.
* :class:`JouleschedError` itself (exit 1): the input was fine but something it depends on failed at run time
  (a cluster, Prometheus, an SSH host, a load driver, a meter).
"""

from __future__ import annotations

#: Exit code of a run stopped by Ctrl-C or SIGTERM (the shell's 128 + SIGINT).
EXIT_INTERRUPTED = 130


class JouleschedError(Exception):
    """Something joulesched itself detected and can explain in one line."""

    exit_code: int = 1


class UsageError(JouleschedError, ValueError):
    """Bad input: a malformed file, option, spec or request. The message names the problem."""

    exit_code = 2


def validation_summary(err: object, root: str = "") -> str:
    """A pydantic ``ValidationError`` as one line, ``loc: message; loc: message`` (pydantic's "Value error, "
    prefix dropped: our validators' messages say what is wrong themselves). ``root``: the location of an error
    about the whole document (none by default: such a message names what it is about itself). Typed loosely so
    that core needs no pydantic."""
    parts = []
    for e in err.errors():  # type: ignore[attr-defined]
        where, msg = ".".join(map(str, e["loc"])) or root, e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)
