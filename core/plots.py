"""How joulesched draws every figure: matplotlib headless, and every label plain text.

Scenario, policy and node names are the user's text: a ``$`` in one must not start matplotlib's mathtext (an
unbalanced ``$\\frac{`` raises mid-render). ``text.parse_math`` is read when each Text is created, so the
setting has to hold while a figure is built, not only while it is saved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def plain_text_figures() -> Iterator[None]:
    """Build figures inside this: the Agg backend (reports are written on servers and in CI; switched for the
    whole process, as matplotlib's backend is), no mathtext while inside."""
    import matplotlib

    matplotlib.use("Agg")
    with matplotlib.rc_context({"text.parse_math": False}):
        yield
