"""What pydantic's lax mode would coerce without a word, refused instead.

Lax mode (the one that reads ``cpu_m: 4000`` from YAML and ``[1, 2]`` as a tuple) also reads ``true`` as the
number 1 and the string ``"no"`` as the switch off: a scenario with ``count: true`` built one node, and
``--set dqn.hidden=true`` trained a one-unit network. :func:`lax_coercion` names such a value; each config
model calls it from a before-validator, so the rest of lax mode stays. No pydantic here: core stays a leaf.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

_NUMBERS = (int, float)


def _args(annotation: Any) -> tuple:
    return tuple(a for a in typing.get_args(annotation) if a is not type(None) and a is not Ellipsis)


def _mentions(annotation: Any, kinds: tuple[type, ...]) -> bool:
    if annotation in kinds:
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return False
    return any(_mentions(a, kinds) for a in _args(annotation))


def _is_switch(annotation: Any) -> bool:
    """``bool`` or ``bool | None``."""
    if annotation is bool:
        return True
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and bool(_args(annotation)) and all(
        a is bool for a in _args(annotation))


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_holds_bool(v) for v in value)


def _show(value: Any) -> str:
    """As the YAML or JSON was written: ``true``, ``"no"``, ``[true, 2.0]``."""
    return json.dumps(value, default=repr)


def lax_coercion(annotation: Any, value: Any) -> str | None:
    """Why ``value`` should not be coerced to ``annotation``'s type (a message), or None where it may be:
    a bool where only numbers are expected (at any depth of lists), or anything but a bool for a switch."""
    if _is_switch(annotation):
        if value is None or isinstance(value, bool):
            return None
        return f"expected true or false, got {_show(value)}"
    if not _mentions(annotation, (bool,)) and _mentions(annotation, _NUMBERS) and _holds_bool(value):
        if _mentions(annotation, (str,)):  # a policy option, a budget: quote a word meant as one
            return f"expected a number or a string, got {_show(value)} (quote it if it is a word: \"true\")"
        return f"expected a number, got {_show(value)}"
    return None
