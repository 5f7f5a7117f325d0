"""The kinds of change, by the key that names each in `changes:`, and what every kind says of
the GPU resources a node advertises once it is made (rollout.capacity reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Protocol

from rollout.changes import KINDS
from rollout.plan import Advertised as Advertised  # with the forecast: changes.base reads it

# The key that names a change in `changes:`, one member per registered kind (REGISTRY,
# TIME_SLICING, ...); mypy cannot list members the table makes at run time.
ChangeKind: type[Enum] = Enum(  # type: ignore[misc]
    "ChangeKind", {key.upper().replace("-", "_"): key for key in KINDS}
)


class ChangeModel(Protocol):
    """What every kind's plan model is (a SpecModel) and says: `advertises`."""

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """GPU resource -> allocatable once the change is made, from what the node
        advertises `now` and its `physical` GPUs."""
        ...
