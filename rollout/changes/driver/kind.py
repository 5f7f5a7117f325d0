"""The driver-upgrade change kind: `mode: host` upgrades each node's packages itself (the
driver-upgrade playbook), `mode: operator` lets the GPU Operator upgrade nodes it releases
one by one (the driver-operator playbook, with the ClusterPolicy's change made first)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from rollout.changes.base import ChangeKindPlanner, ClusterWork, NodeWork, PlanningContext
from rollout.changes.driver.hostplan import host_driver_pending
from rollout.changes.driver.install import driver_change
from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.changes.driver.operatorplan import (
    operator_driver_pending,
    operator_run_notes,
    plan_operator_upgrade,
)
from rollout.driver.host import read_driver_host
from rollout.driver.status import DriverKernelFact
from rollout.fact import read_fact
from rollout.facts import NodeFacts
from rollout.facts.extra import NodeRead
from rollout.plan import DriverChange, NodePlan, Plan
from rollout.rbac import Grant, grants_of
from rollout.run.state import RunState


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

    def node_reads(self, change: Any) -> tuple[NodeRead, ...]:
        # mode: host, the apt and module facts of the packages (rollout.driver.host); mode:
        # operator, the running kernel the operator's driver container builds its module for
        if change.mode is DriverMode.OPERATOR:
            kernel = DriverKernelFact()
            return (
                NodeRead("driver_kernel", lambda r: read_fact(r, kernel), "the nodes' kernels"),
            )
        packages, version = change.apt_packages, change.version
        return (
            NodeRead(
                "driver_host",
                lambda runner: read_driver_host(runner, packages, version),
                "the host driver facts",
            ),
        )

    def reads_nvidia_drivers(self, change: Any) -> bool:
        return change.nvidiadriver is not None

    def grants(self, change: Any, step_kinds: Collection[str]) -> tuple[Grant, ...]:
        # where driver.pin writes the version: the ClusterPolicy, or the NVIDIADriver the
        # change names (also listed for facts, rollout.driver.operatorlive)
        from rollout.changes.driver.operator import DriverPinStep

        if DriverPinStep.kind not in step_kinds:
            return ()
        if change.nvidiadriver is None:
            return grants_of("nvidia.com", "clusterpolicies", "patch")
        return grants_of("nvidia.com", "nvidiadrivers", "get list patch")

    def run_notes(
        self, change: Any, plan: Plan, spec: Any, outcome: str, state: RunState
    ) -> list[str]:
        # mode: operator: the nodes left pinned and, once driver.pin moved the version, the
        # way back
        from rollout.changes.driver.operator import DriverPinStep

        pinned = state.first_acted({DriverPinStep.kind}) is not None
        return operator_run_notes(plan, spec, outcome, pinned=pinned)

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
