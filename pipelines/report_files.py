"""What a report writes into its folder (report.html, plots/), known without drawing: the benchmark checks and
clears them before its grid, and :mod:`joulesched.pipelines.report` renders into them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from joulesched.pipelines.results import ResultsError

#: The files the report's ``figures`` draws: the only ones in plots/ that a render replaces or, when it no longer
#: draws them, removes (``training_curve.png`` is the training's).
_FIGURE_FILE = re.compile(r"(energy_ratio|energy_vs_service|energy_vs_slo"
                          r"|(power|util|gpu_energy|node_power|awake|placement)_\d+)\.png")


def report_plots(out: Path) -> list[Path]:
    """The plots of ``out/plots`` that :func:`joulesched.pipelines.report.write_report` draws, sorted: after a render, exactly the ones it
    wrote (it removes those it no longer draws); ``training_curve.png``, the training's, is not among them."""
    plots = Path(out) / "plots"
    return sorted(p for p in plots.iterdir() if _FIGURE_FILE.fullmatch(p.name)) if plots.is_dir() else []


def check_report_outputs(out: Path, error: Callable[[str], Exception] = ResultsError) -> None:
    """Refuse, before anything is drawn, what would stop a render halfway: a ``plots`` in ``out`` that is not a
    folder, a folder where one of its figures goes (:data:`_FIGURE_FILE`: each is replaced or removed) or where
    report.html goes. Found only at the rename, each was a traceback after the work (a review), with a new page
    that showed plots which were not there."""
    out = Path(out)
    plots = out / "plots"
    if (plots.exists() or plots.is_symlink()) and not plots.is_dir():  # a dangling link too: mkdir fails on it
        raise error(f"{plots} is not a directory, and the report draws its plots there; remove it or choose "
                    "another folder")
    # The page is written through a link (core/fsio.py), so a link to a folder is one; a figure is renamed over
    # whatever is there, which fails for a folder only.
    taken = [out / "report.html"] if (out / "report.html").is_dir() else []
    taken += [p for p in report_plots(out) if p.is_dir() and not p.is_symlink()]
    if taken:
        raise error(f"{taken[0]} is a directory, where the report writes a file; remove it or choose another folder")
