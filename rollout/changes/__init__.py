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
from collections.abc import Mapping, Sequence
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
    planners = kind_planners(None, kinds)
    found: list[tuple[str, str]] = []
    for change in changes:
        kind = next(k for k in planners.values() if isinstance(change, k.model))
        found += [r for r in kind.cluster_reads(change, cluster_policy) if r not in found]
    return found
