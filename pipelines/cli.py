"""The `joulesched` command line: one typer app, thin commands over library functions."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="joulesched",
    help="Energy-aware Kubernetes scheduling: twin, baselines, DQN, power metering, workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_subapps() -> None:
    # Sub-apps live with the code they drive; importing them here keeps one entry point.
    from power.cli import app as power_app
    from workloads.cli import load_app, workload_app

    app.add_typer(power_app, name="power", help="RAPL meters, attribution, the Prometheus exporter, calibration.")
    app.add_typer(workload_app, name="workload", help="Resource-blocker apps and the test app.")
    app.add_typer(load_app, name="load", help="Drive load with JMeter or Locust and read results back.")


_register_subapps()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
