"""The `joulesched` command line: one typer app, thin commands over library functions.

The commands live beside this file, one module per area (:mod:`.bench` for the twin, :mod:`.pipeline`,
:mod:`.train`, :mod:`.live`, :mod:`.power`, :mod:`.workload`, :mod:`.infra`), and share :mod:`.common`: its
consoles, its error-to-exit mapping (bad input exits 2 with one red line, a run-time failure 1, Ctrl-C 130).

The root :data:`app` is assembled on first use, so that importing one command module (a container image runs
``python -m joulesched.pipelines.cli.workload``) does not import every other one.
"""

from __future__ import annotations

import errno
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperGroup
from typer.models import TyperPath


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"joulesched {version('joulesched')}")
        raise typer.Exit()


def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the installed version and exit.")] = False,
) -> None:
    """Energy-aware Kubernetes scheduling: twin, baselines, DQN, power metering, workloads."""


class _NonEmptyPath(TyperPath):
    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path (give '.' for the current folder)", param, ctx)
        return super().convert(value, param, ctx)


def _refuse_empty_paths(command: Any) -> None:
    """Make every path option and argument of ``command``'s tree refuse ``''``.

    Typer turns ``''`` into ``Path('.')``: ``-o "$OUT"`` with ``OUT`` unset wrote a run's files into the current
    folder. One place for the CLI's 61 path parameters, so that a new command cannot forget it."""
    for sub in getattr(command, "commands", {}).values():
        _refuse_empty_paths(sub)
    for param in getattr(command, "params", []):
        if type(param.type) is TyperPath:
            param.type.__class__ = _NonEmptyPath  # same state, one more check


#: What a full disk, a quota, a read-only or immutable file system or a dying device does to a read or write:
#: the machine's state, not a bug, so one line and exit 1 rather than a traceback (a review).
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                             errno.EFBIG})


class _RootGroup(TyperGroup):
    def main(self, *args: Any, **kwargs: Any) -> Any:
        # Typer builds the click tree afresh for each invocation (CliRunner's too), then calls the root's main.
        _refuse_empty_paths(self)
        try:
            return super().main(*args, **kwargs)
        except OSError as e:
            # EACCES and EPERM come from sockets and signals too: only a file's is the machine's state here.
            if e.errno not in _STORAGE_ERRNOS or (e.errno in (errno.EACCES, errno.EPERM) and not e.filename):
                raise
            from joulesched.pipelines.cli.common import err

            where = f"{e.filename}: " if e.filename else ""
            err.print(f"[red]error:[/red] {escape(where + (e.strerror or str(e)))} (nothing half-written is left: "
                      "outputs are renamed into place only when whole)", soft_wrap=True)
            raise SystemExit(1) from None


def build_app() -> typer.Typer:
    """The root app with every command and sub-app registered."""
    from joulesched.pipelines.cli import autoscaler, bench, infra, live, pipeline, power, train, workload

    app = typer.Typer(
        name="joulesched",
        cls=_RootGroup,
        help="Energy-aware Kubernetes scheduling: twin, baselines, DQN, power metering, workloads.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        # click's plain help (every Typer of the CLI says so): it wraps the text and never cuts an option's name,
        # where rich's option table truncates long names (--max-evictions-…) at 80 columns.
        rich_markup_mode=None,
    )
    app.callback()(_root)
    app.registered_commands.extend(bench.app.registered_commands)
    app.registered_groups.extend(bench.app.registered_groups)  # `trace` (export, and `trace import`)
    app.command("pipeline")(pipeline.pipeline)
    app.command("train", epilog=train.knobs_epilog())(train.train_cmd)
    app.command("test")(train.test_cmd)
    app.command("serve")(live.serve)
    app.command("extender")(live.extender)
    app.command("node-power")(live.node_power)
    app.command("autoscaler-provider")(autoscaler.autoscaler_provider)
    app.add_typer(power.app, name="power", help="RAPL meters, attribution, the Prometheus exporter, calibration.")
    app.add_typer(workload.workload_app, name="workload", help="Resource-blocker apps and the test app.")
    app.add_typer(workload.load_app, name="load", help="Drive load with JMeter or Locust and read results back.")
    app.add_typer(infra.app, name="infra", help="Provision environments: Pulumi stacks, KVM guests, Ansible.")
    return app


_app: typer.Typer | None = None


def __getattr__(name: str) -> Any:
    # PEP 562: `from joulesched.pipelines.cli import app` builds the app the first time it is asked for.
    global _app
    if name == "app":
        if _app is None:
            _app = build_app()
        return _app
    raise AttributeError(name)


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run the way Ctrl-C does: workers torn down, exit 130


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    __getattr__("app")()
