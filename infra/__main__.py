"""Pulumi entry point: read the stack config once, build the target, export. Resources live in modules.

Pulumi runs it in the project's .venv (Pulumi.yaml), where ``make`` installed joulesched, so the program imports
the same ``joulesched.infra`` package as the CLI and the tests.
"""

import pulumi

from joulesched.infra.config import InfraConfigError, load
from joulesched.infra.program import build


class StackConfigError(InfraConfigError, pulumi.RunError):
    """A bad stack config, raised as Pulumi's RunError: Pulumi prints the list of problems alone, not the
    "unhandled exception" report with this program's traceback around it."""


try:
    outputs = build(load(pulumi.Config()))
except InfraConfigError as e:
    raise StackConfigError(e.problems) from None

for key, value in outputs.items():
    pulumi.export(key, value)
