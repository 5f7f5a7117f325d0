"""The registry and containerd change kinds: one engine run over both writes the node's
containerd files (writes), applied by the containerd playbook's steps (steps)."""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

from rollout.changes.base import ChangeKindPlanner, NodeWork, PlanningContext
from rollout.changes.containerd.engineruns import ContainerdPlans
from rollout.changes.containerd.model import ContainerdChange
from rollout.changes.containerd.registrymodel import RegistryChange
from rollout.changes.containerd.writes import ContainerdWork
from rollout.facts import NodeFacts

# Distinct node configurations planned at once (each mostly waits for `containerd config dump`).
ENGINE_RUNS_AT_ONCE = 4


class ContainerdKind(ChangeKindPlanner):
    """`containerd:` settings; with `deduplicate` off every node runs the engine afresh (the
    reference the per-plan memo is tested against)."""

    key: ClassVar[str] = "containerd"
    model: ClassVar[type] = ContainerdChange
    work_key: ClassVar[str] = "containerd"
    describes_every_node: ClassVar[bool] = True

    def __init__(
        self, *, deduplicate: bool = True, plans_made: list[ContainerdPlans] | None = None
    ) -> None:
        self.deduplicate = deduplicate
        # where each plan's engine runs are listed as they are made (a benchmark's, a test's)
        self.plans_made = plans_made

    def playbook(self, change: Any) -> str:
        return "containerd"

    def step_modules(self) -> tuple[ModuleType, ...]:
        from rollout.changes.containerd import steps

        return (steps,)

    def engine_plans(self, ctx: PlanningContext) -> ContainerdPlans:
        """The plan's engine results by distinct node configuration."""
        return ctx.memo(("containerd plans",), self._new_plans)

    def _new_plans(self) -> ContainerdPlans:
        plans = ContainerdPlans(deduplicate=self.deduplicate)
        if self.plans_made is not None:
            self.plans_made.append(plans)
        return plans

    def prepare(self, ctx: PlanningContext, change: Any) -> None:
        ctx.memo(
            ("containerd prepared",),
            lambda: self.engine_plans(ctx).plan_distinct(
                ctx.spec, ctx.targets, ENGINE_RUNS_AT_ONCE
            ),
        )

    def plan_node(self, ctx: PlanningContext, change: Any, node: NodeFacts) -> NodeWork:
        return ContainerdWork.from_changes(self.engine_plans(ctx).plan(ctx.spec, node))


class RegistryKind(ContainerdKind):
    """`registry:` a mirror's hosts.toml and the CRI registry config_path."""

    key: ClassVar[str] = "registry"
    model: ClassVar[type] = RegistryChange


KIND = ContainerdKind()
REGISTRY = RegistryKind()
