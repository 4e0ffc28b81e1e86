"""`joulesched workload ...` and `joulesched load ...` commands."""

import typer

workload_app = typer.Typer(no_args_is_help=True)
load_app = typer.Typer(no_args_is_help=True)
