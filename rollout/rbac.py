"""RBAC grants: one verb on one resource, as a Role lists it. Step classes declare theirs
(rollout.steps.traits), change kinds those that depend on their change (rollout.changes.base),
and rollout.schedule.permissions unites them into a plan's Role."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource; namespace None is cluster scope or every namespace."""

    group: str
    resource: str
    verb: str
    namespace: str | None = None
    name: str | None = None  # a resourceNames restriction

    def describe(self) -> str:
        group = f" ({self.group})" if self.group else ""
        where = f" in {self.namespace}" if self.namespace else ""
        named = f" named {self.name}" if self.name else ""
        return f"{self.verb} {self.resource}{group}{named}{where}"


def grants_of(
    group: str, resource: str, verbs: str, namespace: str | None = None
) -> tuple[Grant, ...]:
    """One Grant per verb of `verbs` (space-separated) on the resource."""
    return tuple(Grant(group, resource, verb, namespace) for verb in verbs.split())
