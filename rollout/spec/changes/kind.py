"""The kinds of change, by the key that names each in `changes:`, and what every kind says of
the GPU resources a node advertises once it is made (rollout.capacity reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from rollout.changes import KINDS

# The key that names a change in `changes:`, one member per registered kind (REGISTRY,
# TIME_SLICING, ...); mypy cannot list members the table makes at run time.
ChangeKind: type[Enum] = Enum(  # type: ignore[misc]
    "ChangeKind", {key.upper().replace("-", "_"): key for key in KINDS}
)


@dataclass(frozen=True)
class Advertised:
    """What a node advertises once a change is made, each kind's `advertises(now, physical)`:
    GPU resource -> allocatable count, and what a reviewer must know of those counts (a new
    kind says its own here: a MIG layout, that it can advertise less than the card)."""

    counts: Mapping[str, int]
    caveats: tuple[str, ...] = ()


class ChangeModel(Protocol):
    """What every kind's plan model is (a SpecModel) and says: `advertises`."""

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """GPU resource -> allocatable once the change is made, from what the node
        advertises `now` and its `physical` GPUs."""
        ...
