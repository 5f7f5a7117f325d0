"""The change kinds, one entry each: adding a kind is one line of KINDS.

An entry is the kind's key under `changes:` and where its parts live, below rollout/: the
kind's package, whose `kind` module holds what the kind is to the planner (its KIND, a
`rollout.changes.base.ChangeKindPlanner`, or the NAME after `package:`), and its plan model
(`module:Class`, in the kind's package: `changes.<kind>.model`, a
`rollout.changes.model.ChangeModel`). Nothing is imported here: reading a plan file loads the
models alone, and the planner loads the kinds (and their steps) when it plans.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.changes.model import ChangeModel


@dataclass(frozen=True)
class Kind:
    """Where a change kind's parts are, below rollout/: `package[:NAME]` (its planner is
    `package.kind`'s NAME, KIND by default) and `module:Class` (its plan model)."""

    planner: str
    model: str
    # a plan may hold several changes of the kind (registry: one per registry host)
    repeatable: bool = False


# key: Kind(package[:NAME], model, repeatable)
KINDS: Mapping[str, Kind] = {
    "registry": Kind(
        "changes.containerd:REGISTRY", "changes.containerd.registrymodel:RegistryChange", True
    ),
    "containerd": Kind("changes.containerd", "changes.containerd.model:ContainerdChange"),
    "time-slicing": Kind("changes.timeslicing", "changes.timeslicing.model:TimeSlicingChange"),
    "driver-upgrade": Kind("changes.driver", "changes.driver.model:DriverUpgradeChange"),
    "mig": Kind("changes.mig", "changes.mig.model:MigChange"),
}  # fmt: skip


def load_object(where: str, default_name: str) -> Any:
    """The object `module:NAME` names (`module` alone: its `default_name`)."""
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(f"rollout.{module}"), name or default_name)


def change_models(kinds: Mapping[str, Kind] = KINDS) -> dict[str, type[ChangeModel]]:
    """Each kind's plan model, by key, in the table's order."""
    return {key: load_object(kind.model, "") for key, kind in kinds.items()}


# A planner is a rollout.changes.base.ChangeKindPlanner; typed Any here, as importing that
# module even for typing would close a circle (base -> the plan model -> this table).
def _planner(where: str) -> Any:
    package, _, name = where.partition(":")
    found = load_object(f"{package}.kind:{name or 'KIND'}", "")
    return found() if isinstance(found, type) else found


def kind_planners(
    keys: list[str] | None = None, kinds: Mapping[str, Kind] = KINDS
) -> dict[str, Any]:
    """The planners of the kinds with these keys (all kinds: None), by key; an unknown key
    raises KeyError naming the known ones."""
    chosen = list(kinds) if keys is None else keys
    unknown = [key for key in chosen if key not in kinds]
    if unknown:
        raise KeyError(f"no change kind {', '.join(unknown)}; the kinds are {', '.join(kinds)}")
    return {key: _planner(kinds[key].planner) for key in chosen}


def cluster_reads(
    changes: Sequence[Any], cluster_policy: Mapping[str, Any], kinds: Mapping[str, Kind] = KINDS
) -> list[tuple[str, str]]:
    """The ConfigMaps (namespace, name) the changes' kinds read to plan, each once, in order."""
    found: list[tuple[str, str]] = []
    for kind, change in _each_kind(changes, kind_planners(None, kinds)):
        found += [r for r in kind.cluster_reads(change, cluster_policy) if r not in found]
    return found


# The hooks below ask each change's kind about what the layers beneath the kinds do for the
# plan (the facts read): those layers import no kind, and reach the kinds through this table.


def _each_kind(
    changes: Sequence[Any], planners: Mapping[str, Any] | None
) -> Iterator[tuple[Any, Any]]:
    """(its kind's planner, the change) of each change, in plan order; the registered kinds'
    planners unless given (a test's own)."""
    known = kind_planners() if planners is None else planners
    for change in changes:
        yield next(k for k in known.values() if isinstance(change, k.model)), change


def node_reads(changes: Sequence[Any], planners: Mapping[str, Any] | None = None) -> list[Any]:
    """The extra node facts (rollout.facts.extra.NodeRead) the changes' kinds need, in order."""
    return [
        read for kind, change in _each_kind(changes, planners) for read in kind.node_reads(change)
    ]


def node_files(
    changes: Sequence[Any], planners: Mapping[str, Any] | None = None
) -> tuple[str, ...]:
    """The files outside /etc/containerd the changes write, read in each node's one probe."""
    return tuple(
        sorted(
            {p for kind, change in _each_kind(changes, planners) for p in kind.node_files(change)}
        )
    )


def reads_nvidia_drivers(changes: Sequence[Any], planners: Mapping[str, Any] | None = None) -> bool:
    """True when a change's kind plans from the cluster's NVIDIADriver resources."""
    return any(kind.reads_nvidia_drivers(change) for kind, change in _each_kind(changes, planners))
