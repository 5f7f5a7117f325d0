"""What the MIG kind plans for one node (its NodeWork), read by the kind and its steps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rollout.changes.base import NodeWork
from rollout.facts.migmode import CONFIG_LABEL


@dataclass(frozen=True)
class MigWork(NodeWork):
    """The layout a node gets: its label before and after, and what it will advertise."""

    layout: str = ""
    previous: str | None = None
    # the MIG manager's state now; the reason nothing is done where the node is on the layout
    state: str | None = None
    already: str = ""
    # GPU resource -> count the node advertises once the layout is applied, and caveats
    advertised: Mapping[str, int] | None = None
    caveats: tuple[str, ...] = ()

    def describe_label(self) -> str:
        """`nvidia.com/mig.config all-disabled -> all-1g.5gb`."""
        return f"{CONFIG_LABEL} {self.previous or '(none)'} -> {self.layout}"
