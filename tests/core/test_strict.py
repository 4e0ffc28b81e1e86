"""core.strict: what lax mode would coerce without a word is named; what it reads rightly is left alone."""

from __future__ import annotations

from typing import Literal, Optional, Union

import pytest

from joulesched.core.strict import lax_coercion


@pytest.mark.parametrize("annotation, value, message", [
    (int, True, "expected a number, got true"),
    (float, False, "expected a number, got false"),
    (Optional[float], True, "expected a number"),
    (Union[int, str], True, "expected a number"),  # a disruption budget's nodes: 3 or "10%"
    (tuple[float, ...], [1.0, True], "expected a number, got [1.0, true]"),
    (list[float] | str, [True], "expected a number"),
    (bool, "no", 'expected true or false, got "no"'),
    (bool, 1, "expected true or false, got 1"),
    (Optional[bool], 0, "expected true or false"),
])
def test_what_lax_mode_would_coerce_is_named(annotation, value, message):
    assert message in (lax_coercion(annotation, value) or "")


@pytest.mark.parametrize("annotation, value", [
    (int, 3), (float, 2), (float, 2.5), (tuple[float, ...], [1, 2.5]), (bool, True), (Optional[bool], None),
    (Union[bool, int], True),  # a field that takes either: true is what was meant
    (str, True),  # not a number: pydantic refuses it itself
    (Literal["a", "b"], True), (Optional[int], None), (int, "3"),  # a string: pydantic's own check says what is wrong
])
def test_what_lax_mode_reads_rightly_is_left_alone(annotation, value):
    assert lax_coercion(annotation, value) is None
