"""Label and field selectors: the query-string syntax and metav1.LabelSelector objects."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.validation import label_value_problem, qualified_name_problem

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\((.*)\)\s*$")
_NOT_EXISTS_RE = re.compile(rf"^\s*!\s*({_KEY})\s*$")
_COMPARE_RE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=|>|<)\s*(\S*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*({_KEY})\s*$")


class Operator(StrEnum):
    """Selector operators, named as in metav1.LabelSelectorRequirement where they exist there."""

    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GREATER_THAN = "Gt"
    LESS_THAN = "Lt"


@dataclass(frozen=True)
class Requirement:
    """One clause of a label selector."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case Operator.EQUALS | Operator.IN:
                return present and value in self.values
            # Like the real server, negative operators match objects without the key.
            case Operator.NOT_EQUALS | Operator.NOT_IN:
                return not present or value not in self.values
            case Operator.EXISTS:
                return present
            case Operator.DOES_NOT_EXIST:
                return not present
            case Operator.GREATER_THAN | Operator.LESS_THAN:
                if value is None or not re.fullmatch(r"-?\d+", value):
                    return False
                bound = int(self.values[0])
                return (
                    int(value) > bound
                    if self.operator is Operator.GREATER_THAN
                    else (int(value) < bound)
                )


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements; `matches_none` for a null metav1.LabelSelector."""

    requirements: tuple[Requirement, ...] = ()
    matches_none: bool = False

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.matches_none:
            return False
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)

    @classmethod
    def from_text(cls, text: str | None) -> LabelSelector:
        """Parse the `labelSelector` query syntax: `a=b,c!=d,e in (x,y),f notin (z),g,!h`."""
        if text is None or not text.strip():
            return cls()
        return cls(tuple(_parse_requirement(part) for part in _split_top_level(text)))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> LabelSelector:
        """From a metav1.LabelSelector object (matchLabels, matchExpressions)."""
        if spec is None:
            return cls(matches_none=True)
        requirements = [
            Requirement(k, Operator.EQUALS, (str(v),))
            for k, v in sorted((spec.get("matchLabels") or {}).items())
        ]
        for expression in spec.get("matchExpressions") or []:
            operator = Operator(expression.get("operator", ""))
            values = tuple(str(v) for v in expression.get("values") or [])
            requirements.append(Requirement(str(expression.get("key", "")), operator, values))
        return cls(tuple(requirements))


@dataclass(frozen=True)
class FieldRequirement:
    """One clause of a field selector: `field=value` or `field!=value`."""

    field: str
    value: str
    negated: bool = False

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (read_field(obj, self.field) == self.value) != self.negated


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of field requirements."""

    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    def fields(self) -> set[str]:
        return {r.field for r in self.requirements}

    def value_of(self, field_name: str) -> str | None:
        """The value an equality clause pins a field to, for cheap pre-filtering."""
        for r in self.requirements:
            if r.field == field_name and not r.negated:
                return r.value
        return None

    @classmethod
    def from_text(cls, text: str | None) -> FieldSelector:
        if text is None or not text.strip():
            return cls()
        requirements = []
        for part in _split_unescaped_commas(text):
            match = re.fullmatch(r"\s*([^!=\s]+)\s*(==|=|!=)(.*)", part)
            if match is None:
                raise ApiError.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
            name, operator, value = match.groups()
            requirements.append(
                FieldRequirement(name, value.replace("\\,", ","), negated=operator == "!=")
            )
        return cls(tuple(requirements))


def read_field(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field, as field selectors compare it ("" when absent)."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _split_unescaped_commas(text: str) -> list[str]:
    return re.split(r"(?<!\\),", text)


def _parse_requirement(text: str) -> Requirement:
    requirement = _match_requirement(text)
    problem = qualified_name_problem(requirement.key)
    if problem is not None:
        raise _unparsable(f'invalid label key "{requirement.key}": {problem}')
    for value in requirement.values:
        value_problem = label_value_problem(value)
        if value_problem is not None:
            raise _unparsable(f'invalid label value: "{value}": {value_problem}')
    return requirement


def _match_requirement(text: str) -> Requirement:
    if match := _SET_RE.match(text):
        key, word, inner = match.groups()
        values = tuple(v.strip() for v in inner.split(",")) if inner.strip() else ()
        if not values:
            raise _unparsable("for 'in', 'notin' operators, values set can't be empty")
        return Requirement(key, Operator.IN if word == "in" else Operator.NOT_IN, values)
    if match := _NOT_EXISTS_RE.match(text):
        return Requirement(match.group(1), Operator.DOES_NOT_EXIST)
    if match := _COMPARE_RE.match(text):
        key, symbol, value = match.groups()
        if symbol in {">", "<"}:
            if not re.fullmatch(r"-?\d+", value):
                raise _unparsable("for 'Gt', 'Lt' operators, the value must be an integer")
            operator = Operator.GREATER_THAN if symbol == ">" else Operator.LESS_THAN
            return Requirement(key, operator, (value,))
        operator = Operator.NOT_EQUALS if symbol == "!=" else Operator.EQUALS
        return Requirement(key, operator, (value,))
    if match := _EXISTS_RE.match(text):
        return Requirement(match.group(1), Operator.EXISTS)
    raise _unparsable(f"found '{text.strip()}', expected: identifier")


def _unparsable(why: str) -> ApiError:
    return ApiError.bad_request(f"unable to parse requirement: {why}")
