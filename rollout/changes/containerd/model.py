"""`containerd:` settings of containerd's config by dotted key, and runtime handlers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from rollout.changes.model import ChangeModel
from rollout.inputs.fieldproblems import FieldProblem, describe_value
from rollout.inputs.fieldtypes import Str
from rollout.plan import Advertised

# containerd's own table names: letters, digits, '_' and '-' (runtime names like nvidia-cdi)
_SETTING_SEGMENT = re.compile(r"^[A-Za-z0-9_-]+$")
DEFAULT_RUNTIME_KEY = "containerd.default_runtime_name"
# TOML integers are 64-bit; containerd refuses a file holding a bigger one
_INT64 = range(-(2**63), 2**63)
SettingValue = str | int | float | bool | list[Any] | dict[str, Any]


def check_setting_key(key: str) -> str:
    """A dotted key relative to the CRI plugin table, e.g. `containerd.runtimes.nvidia`."""
    if key.startswith("plugins.") or key.startswith("plugins"):
        raise FieldProblem(
            f"setting {key!r} names a plugin table",
            hint="keys are relative to the CRI plugin table: write e.g. 'enable_cdi' or"
            " 'containerd.runtimes.nvidia.options.SystemdCgroup'",
        )
    segments = key.split(".")
    if not all(_SETTING_SEGMENT.match(s) for s in segments):
        raise FieldProblem(
            f"expected a dotted key of letters, digits, '_' and '-', found {describe_value(key)}"
        )
    if segments[0] == "registry":
        raise FieldProblem(
            f"setting {key!r} configures registries",
            hint="use a `registry:` change; it writes hosts.toml and sets config_path",
        )
    return key


def check_setting_value(value: Any) -> Any:
    """A value TOML can hold: strings, numbers, booleans, lists and tables of those."""
    if isinstance(value, int) and not isinstance(value, bool) and not _INT64.count(value):
        raise FieldProblem(
            f"expected an integer TOML can hold (64-bit, {_INT64.start} to {_INT64.stop - 1}),"
            f" found {value}",
        )
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        for item in value:
            check_setting_value(item)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FieldProblem(f"table keys must be strings, found {describe_value(key)}")
            check_setting_value(item)
        return value
    raise FieldProblem(
        f"expected a TOML value (string, number, boolean, list or table),"
        f" found {describe_value(value)}",
        hint="TOML has no null; to leave a setting as it is, leave it out"
        if value is None
        else None,
    )


SettingKey = Annotated[Str, AfterValidator(check_setting_key)]


class ContainerdChange(ChangeModel):
    """Settings of containerd's CRI plugin, keys relative to its table (config version 2)."""

    settings: Mapping[SettingKey, Annotated[Any, AfterValidator(check_setting_value)]] = Field(
        default_factory=dict
    )
    default_runtime: (
        Annotated[
            Str,
            AfterValidator(lambda v: _check_runtime_name(v)),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _check_consistent(self) -> ContainerdChange:
        if not self.settings and self.default_runtime is None:
            raise FieldProblem(
                "a containerd change needs `settings` or `default_runtime`",
                hint="remove the change if there is nothing to set",
            )
        if self.default_runtime is not None and DEFAULT_RUNTIME_KEY in self.settings:
            raise FieldProblem(
                f"`default_runtime` and the setting {DEFAULT_RUNTIME_KEY!r} both set the"
                " default runtime",
                hint="keep one of them",
            )
        for longer in sorted(self.settings):
            segments = longer.split(".")
            prefixes = (".".join(segments[:n]) for n in range(1, len(segments)))
            shorter = next((p for p in prefixes if p in self.settings), None)
            if shorter is not None:
                raise FieldProblem(
                    f"settings {shorter!r} and {longer!r} overlap",
                    hint=f"put the value of {longer!r} inside the table {shorter!r}, or split"
                    " the table into dotted keys",
                )
        return self

    def all_settings(self) -> Mapping[str, Any]:
        """All settings as dotted keys, `default_runtime` folded in."""
        merged = dict(self.settings)
        if self.default_runtime is not None:
            merged[DEFAULT_RUNTIME_KEY] = self.default_runtime
        return merged

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """Runtime settings change no GPU resource: the node advertises what it does `now`."""
        return Advertised(now)

    @staticmethod
    def split_key(key: str) -> tuple[str, ...]:
        """A dotted settings key as its table path."""
        return tuple(key.split("."))


def _check_runtime_name(value: str) -> str:
    if not _SETTING_SEGMENT.match(value):
        raise FieldProblem(
            f"expected a runtime name like 'nvidia' or 'runc', found {describe_value(value)}"
        )
    return value
