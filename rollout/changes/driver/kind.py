"""The driver-upgrade change kind: `mode: host` upgrades each node's packages itself (the
driver-upgrade playbook), `mode: operator` lets the GPU Operator upgrade nodes it releases
one by one (the driver-operator playbook, with the ClusterPolicy's change made first)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from rollout.changes.base import ChangeKindPlanner, ClusterWork, NodeWork, PlanningContext
from rollout.changes.driver.hostplan import host_driver_pending
from rollout.changes.driver.install import driver_change
from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.changes.driver.operatorplan import operator_driver_pending, plan_operator_upgrade
from rollout.facts import NodeFacts
from rollout.plan import DriverChange, NodePlan


@dataclass(frozen=True)
class DriverWork(NodeWork):
    """The driver change's work on one node, and the change as the plan shows it."""

    driver: DriverChange | None = None

    def add_to(self, plan: NodePlan) -> NodePlan:
        return dataclasses.replace(plan, driver=self.driver)


def is_operator(change: Any) -> bool:
    return isinstance(change, DriverUpgradeChange) and change.mode is DriverMode.OPERATOR


class DriverKind(ChangeKindPlanner):
    key: ClassVar[str] = "driver-upgrade"
    model: ClassVar[type] = DriverUpgradeChange

    def playbook(self, change: Any) -> str:
        return "driver-operator" if is_operator(change) else "driver-upgrade"

    def step_modules(self) -> tuple[ModuleType, ...]:
        from rollout.changes.driver import hoststeps, install, operands, operator

        return (install, operands, hoststeps, operator)

    def plan_cluster(self, ctx: PlanningContext, change: Any) -> ClusterWork:
        # mode: operator: pin, version and upgradePolicy (rollout.changes.driver.operatorplan)
        operator = plan_operator_upgrade(ctx.spec, ctx.fleet, ctx.targets, ctx.budget)
        if operator is None:
            return ClusterWork()
        return ClusterWork(tuple(operator.to_cluster_changes()), tuple(operator.warnings()))

    def plan_node(self, ctx: PlanningContext, change: Any, node: NodeFacts) -> NodeWork:
        host = host_driver_pending(ctx, node)
        return DriverWork(
            touches_node=host or operator_driver_pending(ctx.spec, node),
            disruptive=host,
            driver=driver_change(ctx.spec, node),
        )


KIND = DriverKind()
