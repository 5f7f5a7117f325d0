"""One unavailability budget per run (rollout.budget.RunBudget): the executor builds it from
the plan, decides with it before taking a node down and hands the same object to every step;
a node a step hands to another controller's upgrade (driver.release) holds its slot in it for
the executor too, until the step settles it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rollout.budget import NodeAvailability, RunBudget, Verdict
from rollout.changes.driver.operator import DriverPinStep, DriverReleaseStep
from rollout.run import Journal, RunOutcome
from rollout.steps.base import StepContext, StepResult
from rollout.transports.kube import Node
from tests.unit.test_driver_operator_steps import STATE, FakeCluster, context
from tests.unit.test_executor import FakeStep, make_executor, setup

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class BudgetSeeingStep(FakeStep):
    """A fake step that keeps the budget each context hands it."""

    seen: list[RunBudget | None]

    def apply(self, ctx: StepContext) -> StepResult:
        self.seen.append(ctx.budget)
        return super().apply(ctx)


def test_every_step_is_handed_the_executors_one_budget(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path)
    seen: list[RunBudget | None] = []
    seeing: dict[str, Any] = {}
    for kind in steps:
        seeing[kind] = BudgetSeeingStep(kind, log, cluster, set())
        seeing[kind].seen = seen
    executor = make_executor(plan, spec, cluster, journal, seeing)
    assert executor.run().outcome is RunOutcome.SUCCEEDED
    assert seen and all(budget is executor.budget for budget in seen)
    assert executor.budget.limit == plan.max_unavailable == 1
    assert executor.budget.targets == {n.name for n in plan.nodes}


def test_a_node_handed_over_holds_its_slot_for_the_executor(tmp_path: Path) -> None:
    plan, spec, cluster, _, journal, steps = setup(tmp_path)
    executor = make_executor(plan, spec, cluster, journal, steps)
    # a step of this run handed gpu-b-1 to the operator: the budget's one slot is taken
    released = executor.budget.release("gpu-b-1", [], NOW, lambda: None)
    assert released.verdict is Verdict.START
    report = executor.run()
    assert report.outcome is RunOutcome.HALTED
    assert "over max_unavailable 1 (already unavailable: gpu-b-1)" in report.halt_reason
    # settled, the slot is free again: the resumed run takes its nodes down one at a time
    executor.budget.settled("gpu-b-1")
    assert executor.budget.released == frozenset()
    journal.close()
    resumed = make_executor(plan, spec, cluster, Journal.open(tmp_path, journal.run_id), steps)
    assert resumed.run().outcome is RunOutcome.SUCCEEDED


def test_a_hand_over_waits_for_the_slot_of_another(tmp_path: Path) -> None:
    budget = RunBudget(1, frozenset({"n1", "n2"}))
    handed: list[str] = []
    nodes = [NodeAvailability("n1", False, True), NodeAvailability("n2", False, True)]
    assert budget.release("n1", nodes, NOW, lambda: handed.append("n1")).verdict is Verdict.START
    refused = budget.release("n2", nodes, NOW, lambda: handed.append("n2"))
    assert refused.verdict is Verdict.HALT and "already unavailable: n1" in refused.reason
    assert handed == ["n1"] and budget.taken("n2", nodes) == ["n1"]
    budget.settled("n1")
    assert budget.release("n2", nodes, NOW, lambda: handed.append("n2")).verdict is Verdict.START
    assert handed == ["n1", "n2"] and budget.released == {"n2"}


def test_driver_release_holds_its_slot_in_the_budget_it_is_handed(tmp_path: Path) -> None:
    cluster = FakeCluster()
    journal = Journal.create(tmp_path, "unit", "{}")
    DriverPinStep().apply(context(cluster, journal, "n1"))
    ctx = context(cluster, journal, "n1")
    assert ctx.budget is not None
    budget = ctx.budget
    held_while_watched: list[frozenset[str]] = []
    read = cluster.get_node

    def get_node(name: str) -> Node:
        held_while_watched.append(budget.released)
        return read(name)

    cluster.get_node = get_node  # type: ignore[method-assign]
    cluster.on_read["n1"] = [{}, {STATE: "pod-restart-required"}, {STATE: "upgrade-done"}]
    DriverReleaseStep().apply(ctx)
    assert frozenset({"n1"}) in held_while_watched  # its slot while the operator upgrades it
    assert budget.released == frozenset()  # given back once upgrade-done was seen
