"""--limit: Ansible's host patterns, over the nodes of a fleet.

`--limit PATTERN[,PATTERN...]` (`:` separates too) narrows what a command touches to the nodes
the patterns select, intersected with what it would touch anyway (a plan's targets). A pattern
is a node name, a glob (`gpu-a-*`, `gpu-[ab]-1`), `@FILE` (the patterns of FILE, one a line,
`#` comments), or a label selector term (`key=value`, `key!=value`). As in Ansible, the plain
patterns are a union, `&PATTERN` intersects it and `!PATTERN` takes nodes out; a limit of
exclusions only starts from every node.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from rollout.errors import BadInput
from rollout.inputs.fieldproblems import FieldProblem
from rollout.spec.selector import LabelSelector, parse_label_selector

_SEPARATORS = re.compile(r"[,:]")
_GLOB = re.compile(r"[*?\[]")
# Far above any hand-written limit file; keeps a wrong @FILE (a log, an image) from being read.
MAX_LIMIT_FILE_BYTES = 1 << 20


class LimitError(BadInput):
    """A --limit that does not parse, names an unknown node, or selects nothing."""


class PatternRole(Enum):
    """What a pattern does to the selection (Ansible's prefixes)."""

    ADD = ""
    REQUIRE = "&"
    EXCLUDE = "!"


@dataclass(frozen=True)
class NodePattern:
    """One pattern of a --limit: a name, a glob or a label selector term, and its role."""

    text: str
    role: PatternRole
    selector: LabelSelector | None = None

    @property
    def is_name(self) -> bool:
        return self.selector is None and not _GLOB.search(self.text)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.selector is not None:
            return self.selector.matches(labels)
        return fnmatch.fnmatchcase(name, self.text)


@dataclass(frozen=True)
class NodeLimit:
    """A parsed --limit: `text` as given, and its patterns in order."""

    text: str
    patterns: tuple[NodePattern, ...]

    @classmethod
    def from_text(cls, text: str) -> NodeLimit:
        """Parse `text`, reading the patterns of each `@FILE` it names."""
        patterns: list[NodePattern] = []
        for word in _words(text):
            role, body = _role_of(word)
            if body.startswith("@"):
                path = Path(body[1:])
                lines = _read_limit_file(path).splitlines()
                listed = [line.split("#", 1)[0].strip() for line in lines]
                for line in filter(None, listed):
                    for inner in _words(line):
                        if inner.startswith(("@", "&", "!")):
                            raise LimitError(
                                f"--limit {body}: {inner!r}: a file lists node names, globs "
                                "and selectors, without @, & or !"
                            )
                        patterns.append(_pattern(inner, role))
            else:
                patterns.append(_pattern(body, role))
        if not patterns:
            raise LimitError(f"--limit {text!r}: no pattern; name nodes, globs or key=value")
        return cls(text, tuple(patterns))

    def admits(self, name: str, labels: Mapping[str, str]) -> bool:
        """True when the node `name` with `labels` is within the limit."""
        adds = [p for p in self.patterns if p.role is PatternRole.ADD]
        if adds and not any(p.matches(name, labels) for p in adds):
            return False
        for pattern in self.patterns:
            if pattern.role is PatternRole.REQUIRE and not pattern.matches(name, labels):
                return False
            if pattern.role is PatternRole.EXCLUDE and pattern.matches(name, labels):
                return False
        return True

    @property
    def needs_labels(self) -> bool:
        """Whether a pattern reads labels: without one, names alone decide (before probing)."""
        return any(p.selector is not None for p in self.patterns)

    def select(self, nodes: Iterable[tuple[str, Mapping[str, str]]], where: str) -> list[str]:
        """The names of `nodes` (name, labels) within the limit; LimitError when a plain name
        is not among them or when none is within it."""
        listed = list(nodes)
        self.check_names((name for name, _ in listed), where)
        chosen = [name for name, labels in listed if self.admits(name, labels)]
        if not chosen:
            raise LimitError(
                f"--limit {self.text} leaves none of the {len(listed)} node(s) of {where}"
            )
        return chosen

    def check_names(self, known: Iterable[str], where: str) -> None:
        """LimitError when a pattern that is a plain name names no node `where` knows."""
        names = set(known)
        unknown = [p.text for p in self.patterns if p.is_name and p.text not in names]
        if unknown:
            raise LimitError(
                f"--limit {self.text}: {', '.join(unknown)} not a node of {where}; "
                f"its nodes: {', '.join(sorted(names)[:20])}"
                + (f" and {len(names) - 20} more" if len(names) > 20 else "")
            )


def _words(text: str) -> list[str]:
    return [word.strip() for word in _SEPARATORS.split(text) if word.strip()]


def _role_of(word: str) -> tuple[PatternRole, str]:
    for role in (PatternRole.REQUIRE, PatternRole.EXCLUDE):
        if word.startswith(role.value):
            return role, word[1:].strip()
    return PatternRole.ADD, word


def _pattern(text: str, role: PatternRole) -> NodePattern:
    if not text:
        raise LimitError(f"--limit: {role.value!r} with no pattern after it")
    if "=" not in text:
        return NodePattern(text, role)
    try:
        selector = parse_label_selector(text)
    except FieldProblem as exc:
        raise LimitError(f"--limit {text}: {exc}") from None
    return NodePattern(text, role, selector)


def _read_limit_file(path: Path) -> str:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_LIMIT_FILE_BYTES + 1)
    except OSError as exc:
        raise LimitError(f"--limit @{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_LIMIT_FILE_BYTES:
        raise LimitError(f"--limit @{path}: larger than {MAX_LIMIT_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise LimitError(f"--limit @{path}: not UTF-8 text") from None
