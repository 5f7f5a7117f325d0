"""The type containerd loads each CRI setting as, read from the version's recorded defaults.

containerd decodes its TOML into Go structs: `enable_cdi = "yes"` or an integer beyond int64
makes `config dump` (and containerd itself) refuse the file, and a scalar where a table
belongs (`cni = "x"`) as well. The recorded `config dump` of a config with no settings
(defaults.py) holds a value of the right type at every field, so a setting is checked
against the default at its effective path: the same answer whether or not this machine has
the real binary cached, and before a node is cordoned rather than at its write. A runtime
handler's keys are checked against the zero handler, its `options` against runc's; a key no
default holds (a new runtime's own options, a free-form table) is checked only for int64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollout.containerd.defaults import Defaults, nearest_recorded_series, recorded_defaults
from rollout.containerd.errors import SettingTypeError
from rollout.containerd.version import ContainerdVersion
from rollout.inputs.fieldproblems import shorten

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_UNKNOWN = object()
# The runtime whose recorded options stand for every runc-shim handler's (nvidia's too).
_RUNC = "runc"


def check_setting_type(
    key: str, path: Sequence[str], value: Any, version: ContainerdVersion
) -> None:
    """SettingTypeError unless `value` loads into the field at effective `path` on `version`."""
    defaults = recorded_defaults(nearest_recorded_series(version))
    expected = _expected_at(defaults, tuple(path))
    _compare(key, value, expected, version)


def _expected_at(defaults: Defaults, path: tuple[str, ...]) -> Any:
    """The default value at an effective path, or _UNKNOWN where no default says."""
    if len(path) >= 5 and path[2:4] == ("containerd", "runtimes"):
        handler = path[5:]
        runtimes = _walk(defaults.tree, path[:4])
        if handler[:1] == ("options",):
            runc = runtimes.get(_RUNC) if isinstance(runtimes, Mapping) else None
            options = runc.get("options") if isinstance(runc, Mapping) else None
            return _walk(options, handler[1:]) if isinstance(options, Mapping) else _UNKNOWN
        return _walk(defaults.runtime_entry, handler)
    return _walk(defaults.tree, path)


def _walk(tree: Any, path: Sequence[str]) -> Any:
    node = tree
    for part in path:
        if not isinstance(node, Mapping):
            return node  # a scalar where the path goes on: the comparison refuses a table
        if part not in node:
            return _UNKNOWN
        node = node[part]
    return node


def _compare(key: str, value: Any, expected: Any, version: ContainerdVersion) -> None:
    if isinstance(value, bool):
        found_ok = expected is _UNKNOWN or isinstance(expected, bool)
    elif isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise SettingTypeError(
                f"{key}: {value} is beyond a 64-bit integer; containerd {version} cannot "
                f"load it (allowed: {INT64_MIN} to {INT64_MAX})"
            )
        found_ok = expected is _UNKNOWN or (
            isinstance(expected, int | float) and not isinstance(expected, bool)
        )
    elif isinstance(value, float):
        found_ok = expected is _UNKNOWN or (
            isinstance(expected, float) and not isinstance(expected, bool)
        )
    elif isinstance(value, str):
        found_ok = expected is _UNKNOWN or isinstance(expected, str)
    elif isinstance(value, list):
        found_ok = expected is _UNKNOWN or isinstance(expected, list)
        if found_ok:
            item_type = expected[0] if isinstance(expected, list) and expected else _UNKNOWN
            for index, item in enumerate(value):
                _compare(f"{key}[{index}]", item, item_type, version)
    elif isinstance(value, Mapping):
        found_ok = expected is _UNKNOWN or isinstance(expected, Mapping)
        if found_ok:
            for name, item in value.items():
                inner = expected.get(name, _UNKNOWN) if isinstance(expected, Mapping) else _UNKNOWN
                _compare(f"{key}.{name}", item, inner, version)
    else:
        found_ok = False
    if not found_ok:
        hint = ""
        if isinstance(value, str) and isinstance(expected, bool | int | float):
            hint = " (write it without quotes)"
        raise SettingTypeError(
            f"{key}: containerd {version} loads it as {_kind(expected)}, found "
            f"{_kind(value)} {_show(value)}{hint}"
        )


# How a value's type reads in a message, in TOML's words; the first match names it (a bool
# is an int too).
_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
    (Mapping, "a table"),
)


def _kind(value: Any) -> str:
    return next((name for kind, name in _KINDS if isinstance(value, kind)), type(value).__name__)


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{...}"
    if isinstance(value, list):
        return "[...]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return shorten(repr(value))
