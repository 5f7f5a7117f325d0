"""The registry and containerd change kinds: one engine run over both writes the node's
containerd files (writes), applied by the containerd playbook's steps (steps)."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar

from rollout.changes.base import ChangeKindPlanner, NodeWork, PlanningContext
from rollout.changes.containerd.engineruns import ContainerdPlans
from rollout.changes.containerd.model import ContainerdChange
from rollout.changes.containerd.registrymodel import RegistryChange, is_under
from rollout.changes.containerd.writes import ContainerdWork
from rollout.commands import CommandRunner
from rollout.containerd import hosts_toml_path
from rollout.containerd.files import CONTAINERD_DIR
from rollout.facts import NodeFacts
from rollout.plan import Plan

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

    def clean_up_run(
        self, change: Any, plan: Plan, runners: Mapping[str, CommandRunner], run_id: str
    ) -> dict[str, str]:
        # staging dirs a killed attempt of this run left on a node go with the run
        from rollout.changes.containerd.steps import remove_run_stages

        staged = {n.name: runners[n.name] for n in plan.nodes if n.files}
        problems = remove_run_stages(staged, run_id)
        return {node: f"staging not removed: {why}" for node, why in problems.items()}


class RegistryKind(ContainerdKind):
    """`registry:` a mirror's hosts.toml and the CRI registry config_path."""

    key: ClassVar[str] = "registry"
    model: ClassVar[type] = RegistryChange

    def node_files(self, change: Any) -> tuple[str, ...]:
        # a hosts.toml under a config_path outside /etc/containerd, which the files fact
        # reads only when named
        path = hosts_toml_path(change.config_path, change.host)
        return () if is_under(path, CONTAINERD_DIR) else (path,)


KIND = ContainerdKind()
REGISTRY = RegistryKind()
