"""The kinds of change, by the key that names each in `changes:` (one member per kind of the
table, rollout.changes.KINDS)."""

from __future__ import annotations

from enum import Enum

from rollout.changes import KINDS

# The key that names a change in `changes:`, one member per registered kind (REGISTRY,
# TIME_SLICING, ...); mypy cannot list members the table makes at run time.
ChangeKind: type[Enum] = Enum(  # type: ignore[misc]
    "ChangeKind", {key.upper().replace("-", "_"): key for key in KINDS}
)
