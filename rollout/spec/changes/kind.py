"""The kinds of change, by the key that names each in `changes:`."""

from __future__ import annotations

from enum import Enum


class ChangeKind(Enum):
    """The key that names a change in `changes:`."""

    REGISTRY = "registry"
    CONTAINERD = "containerd"
    TIME_SLICING = "time-slicing"
    DRIVER_UPGRADE = "driver-upgrade"
