"""Step `driver.install`: move the node's GPU driver to the plan's version.

One step kind, two modes, each in its own module so they evolve apart:

- `mode: host` (ClusterPolicy driver.enabled=false): apt installs and holds the pinned
  packages (rollout.changes.driver.hoststeps); the steps around it pause the operands,
  unload or reboot, verify and resume (docs/drivers.md).
- `mode: operator`: the GPU Operator's upgrade controller upgrades the driver container;
  its own playbook (driver-operator.yaml) and steps (rollout.changes.driver.operator) do it;
  `driver.install` is not among them, and has nothing to do in that mode.
"""

from __future__ import annotations

from typing import ClassVar

from rollout.changes.base import PlanningContext
from rollout.changes.driver.hostplan import plan_host_driver
from rollout.changes.driver.hoststeps import install_packages, plan_install, undo_install
from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.facts import NodeFacts
from rollout.plan import DriverChange, StepPlan
from rollout.rbac import grants_of
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepResult
from rollout.steps.traits import StepTraits, fixed_s

# Said where a playbook of one's own puts driver.install in an operator-mode plan; the
# built-in driver-operator playbook does not name it.
OPERATOR_MODE = "mode: operator: the GPU Operator installs the driver (driver.release)"


class DriverInstall:
    """Upgrade the node's GPU driver to the plan's version (host or operator mode)."""

    kind: ClassVar[str] = "driver.install"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=grants_of("", "nodes", "get"),
        expected_s=120.0,
        worst_s=fixed_s(1800.0),
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        change = ctx.spec.change_of(DriverUpgradeChange)
        if change is None:
            return StepPlan.skipping(self.kind, "no driver change")
        if change.mode is not DriverMode.HOST:
            return StepPlan.skipping(self.kind, OPERATOR_MODE)
        return plan_install(ctx, facts)

    def apply(self, ctx: StepContext) -> StepResult:
        change = ctx.spec.change_of(DriverUpgradeChange)
        if change is None:
            return StepResult.noop("no driver change")
        if change.mode is not DriverMode.HOST:
            return StepResult.noop(OPERATOR_MODE)
        return install_packages(ctx)

    def undo(self, ctx: StepContext) -> None:
        change = ctx.spec.change_of(DriverUpgradeChange)
        if change is not None and change.mode is DriverMode.HOST:
            undo_install(ctx)


def driver_change(spec: Spec, facts: NodeFacts) -> DriverChange | None:
    """The node's driver change for the plan output (None: no driver change there)."""
    change = spec.change_of(DriverUpgradeChange)
    if change is None:
        return None
    if change.mode is DriverMode.HOST:
        planned = plan_host_driver(spec, facts)
        if planned is None or not planned.pending:
            return None
        return DriverChange("host", planned.current, planned.target, planned.kernel, planned.reboot)
    current = facts.gpus.driver_version
    if current == change.version:
        return None
    kernel = facts.driver_kernel.kernel if facts.driver_kernel else ""
    return DriverChange("operator", current or "(unknown)", change.version, kernel, "no")
