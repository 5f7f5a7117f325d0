"""The time-slicing change kind: a device-plugin profile published in the GPU Operator's
ConfigMap, then each node labelled to it in its wave (rollout.changes.timeslicing.profiles)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import ModuleType
from typing import Any, ClassVar

from rollout.changes.base import ChangeKindPlanner, ClusterWork, NodeWork, PlanningContext
from rollout.changes.timeslicing.model import TimeSlicingChange
from rollout.changes.timeslicing.profiles import (
    SHARED_MEMORY_WARNING,
    ProfileWork,
    plan_cluster_changes,
)
from rollout.facts import NodeFacts
from rollout.rbac import Grant, grants_of


class TimeSlicingKind(ChangeKindPlanner):
    key: ClassVar[str] = "time-slicing"
    model: ClassVar[type] = TimeSlicingChange

    def playbook(self, change: Any) -> str:
        return "time-slicing"

    def step_modules(self) -> tuple[ModuleType, ...]:
        from rollout.changes.timeslicing import steps

        return (steps,)

    def cluster_reads(
        self, change: Any, cluster_policy: Mapping[str, Any]
    ) -> tuple[tuple[str, str], ...]:
        return ((change.configmap.namespace, change.configmap.name),)

    def grants(self, change: Any, step_kinds: Collection[str]) -> tuple[Grant, ...]:
        # the ConfigMap: read for facts, created or replaced by configmap.update, which then
        # waits for the operator's DaemonSets in its namespace to roll out
        namespace = change.configmap.namespace
        return (
            *grants_of("", "configmaps", "get create update", namespace),
            *grants_of("apps", "daemonsets", "list", namespace),
        )

    def plan_cluster(self, ctx: PlanningContext, change: Any) -> ClusterWork:
        sharing = isinstance(change, TimeSlicingChange) and bool(change.config.sharing)
        return ClusterWork(
            changes=tuple(plan_cluster_changes(ctx)),
            warnings=(SHARED_MEMORY_WARNING,) if sharing else (),
        )

    def plan_node(self, ctx: PlanningContext, change: Any, node: NodeFacts) -> NodeWork:
        return ProfileWork.from_node(ctx, node)


KIND = TimeSlicingKind()
