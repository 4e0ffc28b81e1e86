"""The one progress display of long runs (benchmarks, sweeps, training, pipeline stages), on stderr.

:func:`progress_bar` is the bar every command uses; :class:`StageDisplay` stacks two of them for a pipeline
(stages done, and the items of the running stage) and offers the callbacks the runs report through.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

#: Diagnostics and progress go to stderr, so stdout stays clean for --json and tables.
err = Console(stderr=True, highlight=False)


def progress_bar(enabled: bool = True, *, percent: bool = False) -> Progress:
    """A bar with a description, done/total (or a percentage and the time left, for budgets in seconds),
    the elapsed time and the current item (``item=`` field of each task)."""
    cols = [TextColumn("[bold]{task.description}"), BarColumn()]
    cols += [TextColumn("{task.percentage:>3.0f}%"), TimeRemainingColumn()] if percent else [MofNCompleteColumn()]
    cols += [TimeElapsedColumn(), TextColumn("{task.fields[item]}", markup=False)]  # items name the user's files
    return _Progress(*cols, console=err, disable=not enabled, transient=False)


class _Progress(Progress):
    """A Progress that leaves nothing behind when the block fails: the error line is all a bad input shows
    (not a ``0/? 0:00:00`` bar above it). On success the last state stays, as a log of what ran."""

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or self.disable:
            return super().__exit__(exc_type, exc, tb)
        for task in list(self.task_ids):
            self.remove_task(task)
        self.live.transient = True  # a terminal erases the bar; a file or pipe gets nothing, not even a newline
        self.live.stop()


class StageDisplay:
    """Progress across stages (one bar counts stages) and within the running one (a second bar counts items)."""

    def __init__(self, enabled: bool = True) -> None:
        self.prog = progress_bar(enabled)
        self.work = None

    def __enter__(self) -> "StageDisplay":
        self.prog.__enter__()
        self.stages = self.prog.add_task("stages", total=None, item="")
        return self

    def __exit__(self, *exc) -> None:
        self.prog.__exit__(*exc)

    def plan(self, names: list[str]) -> None:
        self.prog.update(self.stages, total=len(names), completed=0, item=", ".join(names))

    def event(self, name: str, what: str) -> None:
        err.print(f"[bold]{escape(name)}[/bold]: {escape(what)}", soft_wrap=True)
        if what == "running":
            self.prog.update(self.stages, item=name)
        elif what == "done" or what.startswith("skipped"):
            self.prog.update(self.stages, advance=1)

    def start(self, total: int) -> None:
        if self.work is None:
            self.work = self.prog.add_task("work", total=total, item="")
        else:
            self.prog.reset(self.work, total=total, description="work", item="")  # it was "training"

    def progress(self, item: str) -> None:
        if self.work is not None:
            self.prog.update(self.work, advance=1, item=item)

    def train(self, step: int, reward: float, epsilon: float) -> None:
        if self.work is None:
            self.work = self.prog.add_task("training", total=None, item="")
        stat = f"reward(20 ep) {reward:,.1f}, " if not math.isnan(reward) else ""
        self.prog.update(self.work, completed=step, item=f"step {step:,}: {stat}ε {epsilon:.2f}")

    def callbacks(self) -> dict:
        return {"on_event": self.event, "on_plan": self.plan, "on_start": self.start, "on_progress": self.progress,
                "on_train": self.train}
