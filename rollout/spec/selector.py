"""Kubernetes label selectors: parse the string form, match a node's or a pod's labels.

The grammar is the one `kubectl -l` and the API's `labelSelector` parameter accept:
`key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (a, b)`, `key notin (a, b)`,
joined by commas (a logical AND). The numeric `<`/`>` operators only work for node
selectors in scheduling terms, never in list calls, so they are rejected here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from rollout.inputs.fieldproblems import FieldProblem
from rollout.inputs.fieldtypes import check_label_key, check_label_value

_SPECIAL = "!=,() \t\n"
_PUNCTUATION = frozenset({"!", "=", "==", "!=", ",", "(", ")"})


class SelectorOperator(Enum):
    """How one requirement of a selector tests a label."""

    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"


# Far above any real selector (a few requirements of at most 317 + 63 characters each); keeps
# a hostile one from being parsed at length and echoed in every message that names it.
MAX_SELECTOR_CHARS = 4096


class LabelSelectorError(FieldProblem):
    """A selector string that does not parse; `offset` is the 0-based character position."""

    def __init__(self, message: str, offset: int, hint: str | None = None) -> None:
        super().__init__(f"{message} (at character {offset + 1} of the selector)", hint)
        self.offset = offset


@dataclass(frozen=True)
class Requirement:
    """One comma-separated term of a selector."""

    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes semantics: `!=` and `notin` also match when the label is absent."""
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case SelectorOperator.EXISTS:
                return present
            case SelectorOperator.DOES_NOT_EXIST:
                return not present
            case SelectorOperator.EQUALS | SelectorOperator.IN:
                return present and value in self.values
            case SelectorOperator.NOT_EQUALS | SelectorOperator.NOT_IN:
                return not present or value not in self.values

    def to_string(self) -> str:
        """This term in the canonical string form."""
        match self.operator:
            case SelectorOperator.EXISTS:
                return self.key
            case SelectorOperator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case SelectorOperator.EQUALS | SelectorOperator.NOT_EQUALS:
                return f"{self.key}{self.operator.value}{self.values[0]}"
            case SelectorOperator.IN | SelectorOperator.NOT_IN:
                return f"{self.key} {self.operator.value} ({','.join(self.values)})"


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; no requirements matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every requirement holds for `labels`."""
        return all(r.matches(labels) for r in self.requirements)

    @property
    def is_empty(self) -> bool:
        return not self.requirements

    def to_string(self) -> str:
        """The canonical string form, fit for the API's `labelSelector` parameter."""
        return ",".join(r.to_string() for r in self.requirements)

    def __str__(self) -> str:
        return self.to_string()


@dataclass(frozen=True)
class _Token:
    text: str
    offset: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith(("!=", "=="), i):
            tokens.append(_Token(text[i : i + 2], i))
            i += 2
        elif ch in "!=,()":
            tokens.append(_Token(ch, i))
            i += 1
        elif ch in "<>":
            raise LabelSelectorError(
                f"operator {ch!r} is not supported",
                i,
                hint="use =, !=, in (...), notin (...), key or !key",
            )
        else:
            start = i
            while i < len(text) and text[i] not in _SPECIAL and text[i] not in "<>":
                i += 1
            tokens.append(_Token(text[start:i], start))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> _Token | None:
        token = self.peek()
        if token is not None:
            self.pos += 1
        return token

    def end_offset(self) -> int:
        return len(self.text)

    def key(self) -> _Token:
        token = self.take()
        if token is None or token.text in _PUNCTUATION:
            offset = token.offset if token else self.end_offset()
            found = f"{token.text!r}" if token else "the end"
            raise LabelSelectorError(f"expected a label key, found {found}", offset)
        problem = check_label_key(token.text)
        if problem:
            raise LabelSelectorError(problem, token.offset)
        return token

    def value(self) -> str:
        token = self.peek()
        if token is None or token.text in (",", ")"):
            return ""  # `key=` selects the empty value, as in Kubernetes
        if token.text in ("!", "=", "(", "!=", "=="):
            raise LabelSelectorError(f"expected a label value, found {token.text!r}", token.offset)
        self.take()
        problem = check_label_value(token.text)
        if problem:
            raise LabelSelectorError(problem, token.offset)
        return token.text

    def value_set(self, operator: str, offset: int) -> tuple[str, ...]:
        opening = self.take()
        if opening is None or opening.text != "(":
            where = opening.offset if opening else self.end_offset()
            raise LabelSelectorError(f"expected '(' after '{operator}'", where)
        values: list[str] = []
        while True:
            values.append(self.value())
            token = self.take()
            if token is None:
                raise LabelSelectorError("expected ')' to close the value list", self.end_offset())
            if token.text == ")":
                break
            if token.text != ",":
                raise LabelSelectorError(f"expected ',' or ')', found {token.text!r}", token.offset)
        if values == [""]:
            raise LabelSelectorError(f"'{operator}' needs at least one value", offset)
        return tuple(dict.fromkeys(values))

    def requirement(self) -> Requirement:
        token = self.peek()
        if token is not None and token.text == "!":
            self.take()
            return Requirement(self.key().text, SelectorOperator.DOES_NOT_EXIST)
        key = self.key().text
        token = self.peek()
        if token is None or token.text == ",":
            return Requirement(key, SelectorOperator.EXISTS)
        self.take()
        if token.text in ("=", "=="):
            return Requirement(key, SelectorOperator.EQUALS, (self.value(),))
        if token.text == "!=":
            return Requirement(key, SelectorOperator.NOT_EQUALS, (self.value(),))
        if token.text in ("in", "notin"):
            operator = SelectorOperator.IN if token.text == "in" else SelectorOperator.NOT_IN
            return Requirement(key, operator, self.value_set(token.text, token.offset))
        raise LabelSelectorError(
            f"expected an operator after {key!r}, found {token.text!r}",
            token.offset,
            hint="use =, !=, in (...), notin (...); separate requirements with ','",
        )

    def selector(self) -> LabelSelector:
        if self.peek() is None:
            return LabelSelector()
        requirements = [self.requirement()]
        while (token := self.take()) is not None:
            if token.text != ",":
                raise LabelSelectorError(f"expected ',', found {token.text!r}", token.offset)
            requirements.append(self.requirement())
        return LabelSelector(tuple(requirements))


def parse_label_selector(text: str | LabelSelector) -> LabelSelector:
    """Parse a Kubernetes label selector string; LabelSelectorError when it is malformed.

    An already parsed LabelSelector is returned as it is.
    """
    if isinstance(text, LabelSelector):
        return text
    if len(text) > MAX_SELECTOR_CHARS:
        raise LabelSelectorError(
            f"the selector is {len(text)} characters long; the limit is {MAX_SELECTOR_CHARS}",
            MAX_SELECTOR_CHARS,
            hint="select the GPU nodes by one or two labels",
        )
    return _Parser(text).selector()
