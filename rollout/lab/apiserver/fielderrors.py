"""Field errors as the real server words them in a 422's causes: apimachinery's `field`
package (Invalid, Required, Forbidden, NotSupported) and the messages of its validation helpers
(RegexError, MaxLenError)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout.lab.apiserver.errors import StatusCause


def invalid(field: str, value: Any, why: str) -> StatusCause:
    """field.Invalid: `Invalid value: "text": why` (numbers without quotes)."""
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return StatusCause("FieldValueInvalid", f"Invalid value: {shown}: {why}", field)


def required(field: str, detail: str = "") -> StatusCause:
    """field.Required: `Required value`, with the detail after a colon where there is one."""
    return StatusCause(
        "FieldValueRequired", f"Required value: {detail}" if detail else "Required value", field
    )


def forbidden(field: str, why: str) -> StatusCause:
    """field.Forbidden: `Forbidden: why`."""
    return StatusCause("FieldValueForbidden", f"Forbidden: {why}", field)


def not_supported(field: str, value: object, supported: Sequence[str]) -> StatusCause:
    """field.NotSupported: the value and every supported one, quoted."""
    listed = ", ".join(f'"{s}"' for s in supported)
    return StatusCause(
        "FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {listed}', field
    )


def regex_error(message: str, pattern: str, *examples: str) -> str:
    """validation.RegexError: the message, then its examples and the pattern in parentheses."""
    used = f"regex used for validation is '{pattern}'"
    if not examples:
        return f"{message} ({used})"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}{used})"


def max_len_error(length: int) -> str:
    """validation.MaxLenError."""
    return f"must be no more than {length} characters"
