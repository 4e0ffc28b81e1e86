"""The `joulesched` command line: one typer app, thin commands over library functions.

The commands live beside this file, one module per area (:mod:`.bench` for the twin, :mod:`.pipeline`,
:mod:`.train`, :mod:`.live`, :mod:`.power`, :mod:`.workload`, :mod:`.infra`), and share :mod:`.common`: its
consoles, its error-to-exit mapping (bad input exits 2 with one red line, a run-time failure 1, Ctrl-C 130).

The root :data:`app` is assembled on first use, so that importing one command module (a container image runs
``python -m joulesched.pipelines.cli.workload``) does not import every other one.
"""

from __future__ import annotations

from typing import Any

import typer


def build_app() -> typer.Typer:
    """The root app with every command and sub-app registered."""
    from joulesched.pipelines.cli import bench, infra, live, pipeline, power, train, workload

    app = typer.Typer(
        name="joulesched",
        help="Energy-aware Kubernetes scheduling: twin, baselines, DQN, power metering, workloads.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.registered_commands.extend(bench.app.registered_commands)
    app.command("pipeline")(pipeline.pipeline)
    app.command("train", epilog=train.knobs_epilog())(train.train_cmd)
    app.command("test")(train.test_cmd)
    app.command("serve")(live.serve)
    app.command("extender")(live.extender)
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


def main() -> None:
    __getattr__("app")()
