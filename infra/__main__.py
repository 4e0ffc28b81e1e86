"""Pulumi entry point: read the stack config once, build the target, export. Resources live in modules.

Pulumi runs it in the project's .venv (Pulumi.yaml), where ``make`` installed joulesched, so the program imports
the same ``joulesched.infra`` package as the CLI and the tests.
"""

import pulumi

from joulesched.infra.config import load
from joulesched.infra.program import build

outputs = build(load(pulumi.Config()))

for key, value in outputs.items():
    pulumi.export(key, value)
