"""What the progress bars say: each bar is labelled as what it counts."""

from __future__ import annotations


def test_the_work_bar_after_training_is_not_labelled_training():
    """The train stage's bar was reused for the benchmark's cells without its label changing."""
    from joulesched.pipelines.progress import StageDisplay

    with StageDisplay(enabled=False) as d:
        d.train(10, 1.0, 0.5)
        d.start(4)
        d.progress("s seed 0")
        task = d.prog.tasks[[t.id for t in d.prog.tasks].index(d.work)]
        assert task.description == "work" and task.total == 4 and task.completed == 1
