"""YAML input that refuses a key given twice in one mapping.

PyYAML's ``safe_load`` keeps the last of two equal keys without a word: a second ``duration_s:`` in a scenario,
``lr:`` in a training config or a node's name in the power address map would silently replace the first. Every
file a user writes for joulesched is read through :func:`load`, which makes that an error naming both lines.
It also reads ``1e9`` and ``1.0e9`` as numbers, as YAML 1.2 does (PyYAML's YAML 1.1 rules need ``1.0e+9``: a
rate of ``1e9`` was the string "1e9", refused as no number).
"""

from __future__ import annotations

import re
from typing import IO, Any

import yaml


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping gives one key twice (a :class:`yaml.YAMLError`, so readers' YAML handlers report it)."""

    def __init__(self, key: object, lines: tuple[int, int], mark) -> None:
        self.key, self.lines = key, lines
        where = f"line {lines[1]}" if lines[0] == lines[1] else f"lines {lines[0]} and {lines[1]}"
        super().__init__(None, None, f"key {key!r} is given twice ({where})", mark)

    def __str__(self) -> str:  # the lines are in the message: no echo of the file's text after it
        return str(self.problem)


class UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *anchor``: its keys may be overridden here, which is what merging is for
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen.setdefault(key, line)
            except TypeError:  # an unhashable key: the base loader reports it
                continue
            if first is not None:
                raise DuplicateKeyError(key, (first, line), key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats: PyYAML (YAML 1.1) wants a dot and a signed exponent. The table is copied first:
# add_implicit_resolver would otherwise append to the lists SafeLoader shares with every yaml.safe_load.
UniqueKeyLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load(stream: str | bytes | IO[str] | IO[bytes]) -> Any:
    """``yaml.safe_load``, but a key given twice in one mapping raises :class:`DuplicateKeyError`."""
    return yaml.load(stream, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
