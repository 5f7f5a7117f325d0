"""render.json_text writes what `json.dumps(value, indent=2, default=str)` writes, at any depth.

write_plan_json builds a plan's JSON from pieces encoded at their depth (so that copies of a
node share their text); every piece must be the json module's own text, byte for byte.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.cli.render import json_text


class Colour(enum.Enum):  # no JSON of its own: default=str
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.sampled_from([Colour.RED, Level.HIGH, math.nan, -0.0, 1e300, "\x1b[8m", "é\u2028"]),
)
keys = st.one_of(st.text(max_size=5), st.integers(), st.booleans(), st.none(), st.floats())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
    ),
    max_leaves=25,
)


def wrapped_in_lists(text: str, level: int) -> str:
    """`text`, a value's JSON at `level`, inside `level` one-item lists as json.dumps nests it."""
    for depth in range(level - 1, -1, -1):
        text = "[\n" + "  " * (depth + 1) + text + "\n" + "  " * depth + "]"
    return text


@settings(max_examples=300, deadline=None)
@given(value=values, level=st.integers(0, 5))
def test_json_text_is_the_json_modules_text(value: Any, level: int) -> None:
    wrapped: Any = value
    for _ in range(level):
        wrapped = [wrapped]
    expected = json.dumps(wrapped, indent=2, default=str)
    assert wrapped_in_lists(json_text(value, level), level) == expected


def test_a_key_json_refuses_is_refused() -> None:
    with pytest.raises(TypeError):
        json.dumps({(1, 2): 3}, indent=2)
    with pytest.raises(TypeError):
        json_text({(1, 2): 3}, 0)
