"""One item of `changes:`: exactly one change, named by its kind, and the enum of the kinds'
keys (ChangeKind).

The entry's keys are the registered change kinds' (rollout.changes.KINDS), each read into its
kind's plan model (rollout/changes/<kind>/model.py, on rollout.changes.model.ChangeModel): a
new kind is accepted under its key with no edit here, and nothing here names a kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, Union

from pydantic import Field, create_model, model_validator

from rollout.changes import KINDS, change_models
from rollout.changes.model import ChangeModel
from rollout.inputs.fieldproblems import FieldProblem
from rollout.inputs.fieldtypes import SpecModel

MODELS = change_models()

# The key that names a change in `changes:`, one member per registered kind (REGISTRY,
# TIME_SLICING, ...); mypy cannot list members the table makes at run time.
ChangeKind: type[Enum] = Enum(  # type: ignore[misc]
    "ChangeKind", {key.upper().replace("-", "_"): key for key in KINDS}
)

if TYPE_CHECKING:
    # one of the kinds' plan models; which one, the code asks with isinstance
    Change = ChangeModel
else:
    Change = Union[tuple(MODELS.values())]  # noqa: UP007 (a union of the registered models)


class ChangeEntryBase(SpecModel):
    """One item of `changes:`: a mapping with exactly one key, the change's kind."""

    @model_validator(mode="before")
    @classmethod
    def _check_one_key(cls, data: Any) -> Any:
        kinds = ", ".join(str(f.alias) for f in cls.model_fields.values())
        if isinstance(data, dict) and len(data) != 1:
            found = ", ".join(str(k) for k in data) or "no key"
            raise FieldProblem(
                f"each change has exactly one key ({kinds}), found {found}",
                hint="start each change with its own '- '" if len(data) > 1 else None,
            )
        if isinstance(data, dict):
            (value,) = data.values()
            if value is None:
                raise FieldProblem(f"change {next(iter(data))!r} is empty; expected a mapping")
        return data

    @property
    def change(self) -> Change:
        """The one change this entry holds."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                return value  # type: ignore[no-any-return]
        raise AssertionError("validated entries hold exactly one change")


def build_change_entry(models: Mapping[str, type]) -> type[ChangeEntryBase]:
    """The entry model of a table of kinds: one optional field per key, in the table's order."""
    fields: dict[str, Any] = {
        key.replace("-", "_"): (model | None, Field(default=None, alias=key))
        for key, model in models.items()
    }
    return create_model("ChangeEntry", __base__=ChangeEntryBase, **fields)


if TYPE_CHECKING:
    ChangeEntry = ChangeEntryBase
else:
    ChangeEntry = build_change_entry(MODELS)
