"""Block YAML read line by line: the plain documents rollout writes, at a fraction of the cost.

A recorded fleet is ten thousand node.yaml files of a few dozen lines each, as
`yaml.safe_dump` writes them: block mappings, block lists of scalars, plain and quoted
one-line scalars, comments. Its lines repeat from node to node (the same labels, versions and
GPU models), so each distinct line is read once (its indent, key and value, the scalar
resolved and constructed) and a document is built from the lines' readings.

Only what this reads exactly as PyYAML does is read here: anything else (a flow collection
but `{}` and `[]`, a block scalar, a multi-line or escaped scalar, an anchor, alias, tag or
directive, a tab, a repeated or non-string key, a line this cannot place) reads as None, and
the caller reads the document with libyaml or PyYAML, which word any refusal. The scalar's
value comes from the caller (`plain_value`), so it is resolved as the caller's loader resolves.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable
from typing import Any

from rollout.inputs.yamllimits import MAX_DEPTH

# Distinct lines kept: a fleet's shared lines, and a document's own lines while it is read.
LINES_KEPT = 4096

# A plain scalar rollout writes: no indicator first, no ` #`, no `: `, one line, ASCII.
_PLAIN = r"[A-Za-z0-9_./~+(](?:[A-Za-z0-9_./~+()=,@-]|:(?=[A-Za-z0-9_./~+()=,@-])| +(?=[^ ]))*"
_SCALAR = (
    rf"(?P<plain>{_PLAIN})"
    r"|'(?P<single>(?:[^'\r\x85\u2028\u2029]|'')*)'"
    r'|"(?P<double>[^"\\\r\x85\u2028\u2029]*)"'
    r"|(?P<empty>\{\}|\[\])"
)
_ENTRY = re.compile(rf"(?P<indent> *)(?P<key>[A-Za-z0-9_/][A-Za-z0-9_./-]*):(?: +(?:{_SCALAR}))? *")
_ITEM = re.compile(rf"(?P<indent> *)- +(?:{_SCALAR}) *")
_BLANK = re.compile(r" *(?:#[^\r\x85\u2028\u2029]*)?")


class _Kind(enum.Enum):
    ENTRY = "key: value"
    ITEM = "- value"
    OTHER = "not read here"


class _Nested(enum.Enum):
    """What an entry's value is when it is not a scalar on its own line."""

    BELOW = "the lines below"  # `key:` and the value, if any, under it
    MAPPING = "{}"
    LIST = "[]"


class NotPlain(Exception):
    """The document is not one this module reads; the caller reads it its own way."""


_Line = tuple[_Kind, int, str, Any]  # kind, indent, key, value
_NOT_READ: _Line = (_Kind.OTHER, 0, "", None)


class BlockReader:
    """Reads block documents line by line; `plain_value` gives a plain scalar's value."""

    def __init__(self, plain_value: Callable[[str], Any]) -> None:
        self._plain_value = plain_value
        self.read_line = functools.lru_cache(maxsize=LINES_KEPT)(self._read_line)

    def read(self, text: str, max_values: int) -> dict[str, Any] | None:
        """The document's data (a mapping at its root), or None: not a document read here."""
        # blank lines and comments read as None and leave, in C
        lines: list[_Line] = [*filter(None, map(self.read_line, text.split("\n")))]
        # every line a key and a value at most: well within the limits, or not read here
        if not lines or 2 * len(lines) + 1 >= max_values:
            return None
        if _NOT_READ in lines:  # compared in C: only _NOT_READ equals it (its kind)
            return None
        try:
            data, end = _mapping(lines, 0, 0, 1)
        except NotPlain:
            return None
        return data if end == len(lines) else None

    def _read_line(self, line: str) -> _Line | None:
        try:
            return self._reading(line)
        except NotPlain:
            return _NOT_READ

    def _reading(self, line: str) -> _Line | None:
        entry = _ENTRY.fullmatch(line)
        if entry is not None:
            key = entry["key"]
            if not isinstance(self._plain_value(key), str):  # `true:`, `1:`, `null:`
                raise NotPlain
            value = _Nested.BELOW if entry.lastgroup == "key" else self._scalar(entry)
            return (_Kind.ENTRY, len(entry["indent"]), key, value)
        item = _ITEM.fullmatch(line)
        if item is not None:
            return (_Kind.ITEM, len(item["indent"]), "", self._scalar(item))
        if _BLANK.fullmatch(line) is not None:
            return None  # blank or a comment
        raise NotPlain

    def _scalar(self, found: re.Match[str]) -> Any:
        which = found.lastgroup
        text = found[which] if which is not None else None
        if text is None:
            raise NotPlain
        if which == "plain":
            return self._plain_value(text)
        if which == "single":
            return text.replace("''", "'")
        if which == "double":
            return text
        return _Nested.MAPPING if text == "{}" else _Nested.LIST


def _mapping(lines: list[_Line], at: int, indent: int, depth: int) -> tuple[dict[str, Any], int]:
    """The mapping whose keys start at lines[at], at `indent`; and the line after it."""
    if depth + 2 >= MAX_DEPTH:  # its keys' values and their items within the limit
        raise NotPlain
    result: dict[str, Any] = {}
    end = len(lines)
    while at < end:
        kind, at_indent, key, value = lines[at]
        if at_indent != indent:
            if at_indent < indent:
                break
            raise NotPlain  # YAML's own error (or a multi-line scalar)
        if kind is not _Kind.ENTRY or key in result:
            raise NotPlain
        at += 1
        if value.__class__ is _Nested:
            value, at = _nested(lines, at, value, indent, depth)
        result[key] = value
    return result, at


def _nested(
    lines: list[_Line], at: int, value: _Nested, indent: int, depth: int
) -> tuple[Any, int]:
    """The value of `key:` at `indent` whose value is not a scalar on its line."""
    if value is _Nested.MAPPING:
        return {}, at
    if value is _Nested.LIST:
        return [], at
    if at == len(lines):
        return None, at
    kind, below, _, _ = lines[at]
    if kind is _Kind.ENTRY and below > indent:
        return _mapping(lines, at, below, depth + 1)
    if kind is _Kind.ITEM and below >= indent:  # a list may sit at its key's indent
        return _items(lines, at, below)
    return None, at


def _items(lines: list[_Line], at: int, indent: int) -> tuple[list[Any], int]:
    """The list of scalars whose items start at lines[at], at `indent`."""
    result: list[Any] = []
    end = len(lines)
    while at < end:
        kind, at_indent, _, value = lines[at]
        if at_indent != indent or kind is not _Kind.ITEM:
            break
        at += 1
        if value.__class__ is _Nested:
            value = {} if value is _Nested.MAPPING else []
        result.append(value)
    return result, at
