"""Step `driver.install`: planned today, not yet applied.

The plan shows which nodes a driver upgrade would touch and from which version; apply
refuses a plan that holds an acting `driver.install` before anything changes, because the
executor only runs step kinds that implement `apply` (see rollout.steps.builtin_steps).
"""

from __future__ import annotations

from typing import ClassVar

from rollout.facts import ClusterFacts, NodeFacts
from rollout.plan import StepPlan
from rollout.spec import DriverUpgradeChange, Spec


class DriverInstall:
    """Upgrade the node's GPU driver to the plan's version (host or operator mode)."""

    kind: ClassVar[str] = "driver.install"

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        change = next(iter(spec.changes_of(DriverUpgradeChange)), None)
        if change is None:
            return StepPlan.skipping(self.kind, "no driver change")
        current = facts.gpus.driver_version
        if current == change.version:
            return StepPlan.skipping(self.kind, f"driver {current} already installed")
        return StepPlan.acting(
            self.kind,
            f"upgrade the driver {current or '(unknown)'} -> {change.version} "
            f"({change.mode.value} mode)",
        )
