"""What every change kind's plan model is: a SpecModel that says what a node advertises once
the change is made, with the hooks the plan asks of each change (the kind that has nothing to
say keeps the default).

It loads no plan (rollout.spec): rollout.spec loads every kind's model through the kinds'
table, and a model that imported it back would find itself half-loaded.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from rollout.errors import InputError
from rollout.inputs.fieldproblems import PathPart
from rollout.inputs.fieldtypes import SpecModel
from rollout.inputs.yamlsource import SourceDocument
from rollout.plan import Advertised

# the changes of one kind in a plan, each as its path in the document (`("changes", 2,
# "registry")`) and its raw body, in file order
RawChanges = Sequence[tuple[tuple[PathPart, ...], Any]]


class ChangeModel(SpecModel, abc.ABC):
    """Base of every kind's plan model (the classes rollout.changes.KINDS names)."""

    @abc.abstractmethod
    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """GPU resource -> allocatable once the change is made, from what the node
        advertises `now` and its `physical` GPUs."""

    @classmethod
    def check_across(cls, doc: SourceDocument, found: RawChanges) -> list[InputError]:
        """The kind's rules across its changes (`found`) in one plan, read from the raw
        document so they are reported with every other problem."""
        return []

    def watches_failed_upgrade(self) -> bool:
        """Whether the change relabels a target's driver `upgrade-failed` and watches it (that
        label is then its own step's to watch, not a reason to halt or hold a release)."""
        return False

    def shared_gpus(self) -> tuple[str, int] | None:
        """The resource a node's GPUs are advertised under once the change is made and the
        slices each GPU becomes, where the change shares GPUs (time-slicing); None where it
        leaves that as the node has it."""
        return None

    def driver_version(self) -> str | None:
        """The driver version the change moves a node to, or None when it moves none."""
        return None
