"""How problems with input fields read to a user: pydantic's errors as "expected X, found Y",
with a hint where one helps, "did you mean" for a misspelt key, field paths as users write
them, and errors in file order.

Validators raise `FieldProblem`; the wording here is shared by the plan and the inventories.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from rollout.errors import InputError

PathPart = str | int


class FieldProblem(ValueError):
    """Raised by model validators: a message and an optional hint for the user.

    pydantic keeps the raised exception in the error's context, so the hint survives into
    the InputError.
    """

    def __init__(
        self, message: str, hint: str | None = None, at: tuple[str | int, ...] = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # where below the validated value the problem is, e.g. (3,) for a list's 4th item
        self.at = at


def format_path(path: Sequence[PathPart]) -> str:
    """A field path as users write it: `changes[1].registry.endpoints[0].url`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def shorten(text: str, limit: int = 60) -> str:
    """A long text cut to `limit` characters, ending in "..." when cut (for quoting input)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_value(value: object) -> str:
    """A short rendering of what was found, in YAML terms."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(shorten(value))
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "mapping_type": "a mapping",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "frozen_set_type": "a list",
    "float_type": "a number",
}


def describe_problem(err: Mapping[str, Any]) -> tuple[str, str | None]:
    """The message ("expected ..., found ...") and hint for one pydantic error."""
    kind = str(err["type"])
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    found = describe_value(err.get("input"))
    if kind == "value_error":
        problem = ctx.get("error")
        if isinstance(problem, FieldProblem):
            return problem.message, problem.hint
        return str(problem), None
    expected: str | None = _EXPECTED.get(kind)
    if kind in {"literal_error", "enum"}:
        expected = f"one of {ctx.get('expected')}"
    elif kind in {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}:
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<="}
        limit = ctx.get("ge", ctx.get("gt", ctx.get("le", ctx.get("lt"))))
        expected = f"a number {sign.get(kind, '<')} {limit}"
    elif kind == "too_short":
        expected = f"at least {ctx.get('min_length')} item(s)"
        found = f"{ctx.get('actual_length')}"
    elif kind == "too_long":
        expected = f"at most {ctx.get('max_length')} item(s)"
        found = f"{ctx.get('actual_length')}"
    if expected is None:
        return f"{err.get('msg')}, found {found}", None
    hint = None
    if kind in {"bool_type", "bool_parsing"} and isinstance(err.get("input"), str):
        hint = "write true or false without quotes"
    elif kind in {"int_type", "int_parsing"} and isinstance(err.get("input"), str):
        hint = "write the number without quotes"
    return f"expected {expected}, found {found}", hint


_MAX_SUGGESTED_WORD = 100


def did_you_mean(word: str, candidates: Sequence[str] | frozenset[str]) -> str | None:
    """'did you mean X?' for the closest candidate, or None when nothing is close."""
    if len(word) > _MAX_SUGGESTED_WORD:
        return None  # difflib is quadratic in the length; a hostile 1 MiB key is no typo
    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


def allowed_keys(model: type[pydantic.BaseModel], path: Sequence[PathPart]) -> frozenset[str]:
    """The keys the model at `path` inside `model` accepts (by alias); empty if unknown."""
    target = _type_at(model, path)
    if isinstance(target, type) and issubclass(target, pydantic.BaseModel):
        return frozenset(f.alias or name for name, f in target.model_fields.items())
    return frozenset()


def _type_at(root: Any, path: Sequence[PathPart]) -> Any:
    current: Any = root
    for part in path:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, pydantic.BaseModel):
            fields = {f.alias or n: f for n, f in current.model_fields.items()}
            field = fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
            continue
        origin = typing.get_origin(current)
        args = typing.get_args(current)
        if origin in (tuple, list, frozenset, set, Sequence) and args:
            current = args[0]
        elif origin in (dict, Mapping) and len(args) == 2:
            current = args[1]
        else:
            return None
    return _unwrap(current)


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the one interesting type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def sort_errors(errors: Sequence[InputError]) -> list[InputError]:
    """Errors in file order: by path, then line, then column."""

    def order(e: InputError) -> tuple[str, int, int]:
        return (e.location.path, e.location.line or 0, e.location.column or 0)

    return sorted(errors, key=order)
