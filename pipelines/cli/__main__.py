"""``python -m joulesched.pipelines.cli``: the same as the ``joulesched`` command."""

from joulesched.pipelines.cli import main

main()
