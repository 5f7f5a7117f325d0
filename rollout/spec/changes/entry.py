"""One item of `changes:`: exactly one change, named by its kind."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rollout.inputs.fieldproblems import FieldProblem
from rollout.spec.changes.containerd import ContainerdChange
from rollout.spec.changes.driver import DriverUpgradeChange
from rollout.spec.changes.kind import ChangeKind
from rollout.spec.changes.registry import RegistryChange
from rollout.spec.changes.timeslicing import TimeSlicingChange
from rollout.spec.fieldtypes import SpecModel

Change = RegistryChange | ContainerdChange | TimeSlicingChange | DriverUpgradeChange


class ChangeEntry(SpecModel):
    """One item of `changes:`: a mapping with exactly one key, the change's kind."""

    registry: RegistryChange | None = None
    containerd: ContainerdChange | None = None
    time_slicing: TimeSlicingChange | None = Field(default=None, alias="time-slicing")
    driver_upgrade: DriverUpgradeChange | None = Field(default=None, alias="driver-upgrade")

    @model_validator(mode="before")
    @classmethod
    def _check_one_key(cls, data: Any) -> Any:
        kinds = ", ".join(k.value for k in ChangeKind)
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
        for value in (self.registry, self.containerd, self.time_slicing, self.driver_upgrade):
            if value is not None:
                return value
        raise AssertionError("validated entries hold exactly one change")
