"""Limits on YAML documents: control characters, depth, and size after alias expansion.

YAML aliases are expanded at every use, so a few lines can stand for 10^9 values ("billion
laughs"). The composed node graph shares each anchored node, so it is small; `measure_expansion`
walks it once per distinct node (memoised by identity) and refuses it, located, above the
value or depth limit, or when an alias contains itself, before anything is built.
"""

from __future__ import annotations

import re

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from rollout.errors import InputError, InputErrors, SourceLocation

# How deep a document may nest (mappings and lists, aliases expanded); far above any real plan
# or inventory, far below Python's recursion limit.
MAX_DEPTH = 100
# How many values (scalars, mappings, lists, keys included) a document may hold once every
# alias is expanded at every use; bounds "billion laughs" documents in width as MAX_DEPTH
# bounds them in depth.
MAX_VALUES = 100_000
# Characters YAML itself refuses (PyYAML's reader would stop at the first one, unlocated).
_NON_PRINTABLE = re.compile(
    r"[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)
_MAX_CHARACTER_ERRORS = 10


def location_of_mark(path: str, mark: yaml.Mark | None) -> SourceLocation:
    """A PyYAML mark (0-based) as a 1-based SourceLocation in `path`."""
    if mark is None:
        return SourceLocation(path, 1, 1)
    return SourceLocation(path, mark.line + 1, mark.column + 1)


def measure_expansion(node: Node, path: str, max_values: int) -> None:
    """InputError when node's expansion holds more than max_values values or MAX_DEPTH levels,
    or an alias contains itself."""
    _Expansion(path, max_values).measure(node, 1)


VALUES_HINT = (
    "YAML aliases (*name) copy the anchored value at every use; see docs/input-contract.md"
)


def too_many_values(limit: int) -> str:
    return (
        f"more than {limit} values (the limit is {limit} values, counted with every alias"
        " expanded at every use)"
    )


class _Expansion:
    """Measures a composed node graph as it will be built: every alias expanded at every use.

    Each distinct node is measured once (memoised by identity), so a "billion laughs" bomb
    is measured in time linear in its file and refused before anything is built.
    """

    def __init__(self, path: str, max_values: int) -> None:
        self.path = path
        self.max_values = max_values
        self.sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height)
        self.active: set[int] = set()

    def measure(self, node: Node, depth: int) -> tuple[int, int]:
        """(values, height) of node's expansion; InputError over max_values or MAX_DEPTH."""
        known = self.sizes.get(id(node))
        if known is None:
            known = self._measure_new(node, depth)
        height = known[1]
        if depth - 1 + height > MAX_DEPTH:
            raise self._error(
                node,
                f"nested more than {MAX_DEPTH} levels deep once aliases are expanded"
                f" (the depth limit is {MAX_DEPTH})",
            )
        return known

    def _measure_new(self, node: Node, depth: int) -> tuple[int, int]:
        if id(node) in self.active:
            raise self._error(
                node, "a recursive alias: the anchored value contains the alias (a cycle)"
            )
        if depth > MAX_DEPTH:
            raise self._error(
                node,
                f"nested more than {MAX_DEPTH} levels deep once aliases are expanded"
                f" (the depth limit is {MAX_DEPTH})",
            )
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        self.active.add(id(node))
        values, height = 1, 0
        for child in children:
            child_values, child_height = self.measure(child, depth + 1)
            values += child_values
            height = max(height, child_height)
            if values > self.max_values:
                raise self._error(node, too_many_values(self.max_values), hint=VALUES_HINT)
        self.active.discard(id(node))
        known = (values, height + 1)
        self.sizes[id(node)] = known
        return known

    def _error(self, node: Node, message: str, hint: str | None = None) -> InputError:
        return InputError(location_of_mark(self.path, node.start_mark), message, hint=hint)


def check_characters(text: str, path: str) -> None:
    """InputErrors for characters YAML refuses (NUL, escapes, other controls), located."""
    if _NON_PRINTABLE.search(text) is None:
        return
    errors: list[InputError] = []
    for number, line in enumerate(text.splitlines(), start=1):
        found = _NON_PRINTABLE.search(line)
        if found is None:
            continue
        char = found.group()
        name = "a NUL byte" if char == "\0" else f"control character U+{ord(char):04X}"
        errors.append(
            InputError(
                SourceLocation(path, number, found.start() + 1),
                f"found {name}; allowed are printable text, tabs and newlines",
                hint="is this a text file? control characters have no place in a plan or inventory",
            )
        )
        if len(errors) == _MAX_CHARACTER_ERRORS:
            break
    if not errors:  # e.g. a lone surrogate splitlines() did not separate
        errors.append(InputError(SourceLocation(path), "found a control character"))
    raise InputErrors(errors)
