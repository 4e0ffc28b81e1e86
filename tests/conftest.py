"""Suite-wide test settings.

Under CI (CI=true) Hypothesis runs derandomized: the same examples on every run, so a landing is never decided
by which random cases came up. Locally it explores new examples each run (and keeps failures in its database).
"""

import os
import signal

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


def pytest_configure(config):
    """A suite started in the background of a non-interactive shell (``cmd &``) inherits SIGINT ignored, and so
    would every CLI process the tests start and interrupt with SIGINT (a Ctrl-C stand-in): they would run to the
    end instead of stopping. A handled SIGINT here becomes the default in each child at exec, as at a terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Modules marked ``heavy`` (minutes, mostly waiting on one core: a TCG guest, systemd containers) go first.

    `make test` runs the suite on two pytest-xdist workers, one module per worker at a time (``--dist loadfile
    --no-loadscope-reorder``), in this order: a heavy module started first runs beside the rest of the suite
    instead of after it. The sort is stable and the marker is module-wide, so each module's tests stay together
    (its module-scoped fixtures are set up once)."""
    if getattr(config.option, "numprocesses", None):  # in one process the order stays the collection's
        items.sort(key=lambda item: item.get_closest_marker("heavy") is None)
