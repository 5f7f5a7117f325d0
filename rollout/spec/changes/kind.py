"""The kinds of change, by the key that names each in `changes:`, and what every kind says of
the GPU resources a node advertises once it is made (rollout.capacity reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class ChangeKind(Enum):
    """The key that names a change in `changes:`."""

    REGISTRY = "registry"
    CONTAINERD = "containerd"
    TIME_SLICING = "time-slicing"
    DRIVER_UPGRADE = "driver-upgrade"


@dataclass(frozen=True)
class Advertised:
    """What a node advertises once a change is made, each kind's `advertises(now, physical)`:
    GPU resource -> allocatable count, and what a reviewer must know of those counts (a new
    kind says its own here: a MIG layout, that it can advertise less than the card)."""

    counts: Mapping[str, int]
    caveats: tuple[str, ...] = ()
