"""The unavailability budget (rollout.budget) and the executor deciding by it on resume.

The budget counts every target cordoned or NotReady, except that a node this run already
took down needs no new slot, and a node NotReady since this run's own cluster-wide change is
waited for (bounded) before it counts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rollout.budget import (
    SETTLE_WAIT_S,
    ClusterChange,
    NodeAvailability,
    UnavailabilityBudget,
    Verdict,
    clock_time,
)
from rollout.executor import Executor
from rollout.plan import NodePlan
from rollout.run import CordonedByRollout, Journal, RunOutcome, StepOutcome
from rollout.run.records import StepFinished, StepStarted
from rollout.steps.base import StepContext, StepResult
from tests.examples import REPO
from tests.unit.test_executor import FakeCluster, FakeStep, Log, Quiet, setup

T0 = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)
CHANGE = ClusterChange("configmap.update", "gpu-1", T0 + timedelta(seconds=0.4))
TARGETS = frozenset({"gpu-1", "gpu-2", "gpu-3"})


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def budget(change: ClusterChange | None = CHANGE) -> UnavailabilityBudget:
    return UnavailabilityBudget(1, TARGETS, change)


def ready(name: str) -> NodeAvailability:
    return NodeAvailability(name, cordoned=False, ready=True)


def not_ready(name: str, since: datetime, *, cordoned: bool = False) -> NodeAvailability:
    return NodeAvailability(name, cordoned=cordoned, ready=False, not_ready_since=since)


def test_within_the_budget_a_node_starts() -> None:
    nodes = [ready("gpu-1"), ready("gpu-2"), ready("gpu-3")]
    assert budget().decide("gpu-2", nodes, held=(), now=at(5)).verdict is Verdict.START


def test_a_node_this_run_holds_down_needs_no_new_slot() -> None:
    # resumed: gpu-1 cordoned by this run; gpu-2 NotReady for another reason, long before
    nodes = [
        NodeAvailability("gpu-1", cordoned=True, ready=True),
        not_ready("gpu-2", at(-600)),
        ready("gpu-3"),
    ]
    decision = budget().decide("gpu-1", nodes, held={"gpu-1"}, now=at(5))
    assert decision.verdict is Verdict.START
    assert decision.reason == "gpu-1 is already down by this run: no new slot"


def test_a_node_not_ready_since_this_runs_change_is_waited_for() -> None:
    nodes = [ready("gpu-1"), not_ready("gpu-2", at(3)), ready("gpu-3")]
    decision = budget().decide("gpu-3", nodes, held=(), now=at(10))
    assert decision.verdict is Verdict.WAIT
    assert decision.reason == (
        f"waiting for gpu-2, NotReady since {clock_time(at(3))}, after this run's ClusterPolicy "
        f"change (configmap.update on gpu-1 at {clock_time(at(0))}), at most "
        f"{round(SETTLE_WAIT_S)}s, "
        "before taking gpu-3 down"
    )


def test_the_condition_time_in_whole_seconds_counts_the_changes_second() -> None:
    # the change began at 10:00:00.4; the node went NotReady at .9, its condition says :00
    nodes = [ready("gpu-1"), not_ready("gpu-2", at(0)), ready("gpu-3")]
    assert budget().decide("gpu-3", nodes, held=(), now=at(2)).verdict is Verdict.WAIT


def test_a_node_still_not_ready_after_the_bound_counts_and_halts() -> None:
    nodes = [ready("gpu-1"), not_ready("gpu-2", at(3)), ready("gpu-3")]
    decision = budget().decide("gpu-3", nodes, held=(), now=at(3 + SETTLE_WAIT_S))
    assert decision.verdict is Verdict.HALT
    assert decision.reason == (
        "taking gpu-3 down would make 2 node(s) unavailable, over max_unavailable 1 "
        f"(already unavailable: gpu-2); gpu-2 still NotReady, waited for at most "
        f"{round(SETTLE_WAIT_S)}s after this run's ClusterPolicy change "
        f"(configmap.update on gpu-1 at {clock_time(at(0))})"
    )


def test_nodes_going_not_ready_in_turn_are_waited_for_no_longer_than_one() -> None:
    nodes = [ready("gpu-1"), not_ready("gpu-2", at(200)), ready("gpu-3")]
    decision = budget().decide("gpu-3", nodes, held=(), now=at(205), waited_s=SETTLE_WAIT_S)
    assert decision.verdict is Verdict.HALT


@pytest.mark.parametrize(
    ("node", "change"),
    [
        (not_ready("gpu-2", at(-1)), CHANGE),  # NotReady before the change
        (not_ready("gpu-2", at(3), cordoned=True), CHANGE),  # cordoned: not the operator's
        (NodeAvailability("gpu-2", cordoned=True, ready=True), CHANGE),  # cordoned by hand
        (not_ready("gpu-2", at(3)), None),  # no change of this run to explain it
        (NodeAvailability("gpu-2", cordoned=False, ready=False), CHANGE),  # no time given
    ],
)
def test_a_node_unavailable_for_another_reason_still_blocks(
    node: NodeAvailability, change: ClusterChange | None
) -> None:
    nodes = [ready("gpu-1"), node, ready("gpu-3")]
    decision = budget(change).decide("gpu-3", nodes, held=(), now=at(5))
    assert decision.verdict is Verdict.HALT
    assert decision.reason.startswith(
        "taking gpu-3 down would make 2 node(s) unavailable, over max_unavailable 1 "
        "(already unavailable: gpu-2)"
    )


def test_a_node_settling_does_not_hide_one_over_the_budget_for_another_reason() -> None:
    nodes = [
        NodeAvailability("gpu-1", cordoned=True, ready=True),
        not_ready("gpu-2", at(3)),
        ready("gpu-3"),
    ]
    assert budget().decide("gpu-3", nodes, held=(), now=at(5)).verdict is Verdict.HALT


def test_a_node_outside_the_targets_is_not_counted() -> None:
    nodes = [not_ready("cpu-1", at(-60)), ready("gpu-1")]
    assert budget().decide("gpu-1", nodes, held=(), now=at(5)).verdict is Verdict.START


# --- the journal: when this run changed a cluster-wide object ---------------------------


def test_first_acted_keeps_a_killed_attempt_and_skips_no_ops(tmp_path: Path) -> None:
    times = iter(at(s) for s in range(100))
    journal = Journal.create(tmp_path, "test", "{}", clock=lambda: next(times))
    journal.append(StepStarted("gpu-1", 5, "configmap.update", 1))  # killed in it
    assert journal.replay().first_acted({"configmap.update"}) == (
        "gpu-1",
        "configmap.update",
        at(1),
    )
    journal.append(StepStarted("gpu-1", 5, "configmap.update", 2))  # resumed: a no-op now
    journal.append(StepFinished("gpu-1", 5, "configmap.update", 2, StepOutcome.NOOP))
    journal.append(StepStarted("gpu-2", 5, "configmap.update", 1))
    journal.append(StepFinished("gpu-2", 5, "configmap.update", 1, StepOutcome.NOOP))
    state = journal.replay()
    assert state.first_acted({"configmap.update"}) == ("gpu-1", "configmap.update", at(1))
    assert state.first_acted({"driver.pin"}) is None


def test_first_acted_is_none_when_every_attempt_was_a_no_op(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, "test", "{}")
    journal.append(StepStarted("gpu-1", 5, "configmap.update", 1))
    journal.append(StepFinished("gpu-1", 5, "configmap.update", 1, StepOutcome.NOOP))
    assert journal.replay().first_acted({"configmap.update"}) is None


# --- the executor on resume, with fake steps and a fake cluster --------------------------


class Killed(BaseException):
    """The process dies in the middle of a step."""


class Clock:
    """One clock for the journal and the executor; sleeping moves it on."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)
        self.slept: list[float] = []
        self.on_sleep: list[Any] = []

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += timedelta(seconds=seconds)
        for hook in self.on_sleep:
            hook()


class CordoningStep(FakeStep):
    """The fake cordon that journals its cordon, as the real one does."""

    def apply(self, ctx: StepContext) -> StepResult:
        result = super().apply(ctx)
        ctx.journal.append(CordonedByRollout(ctx.node))
        return result


def killed_in_cluster_change(tmp_path: Path) -> tuple[Any, ...]:
    """The demo plan (lab-plan.yaml) over the example facts, its first run killed in gpu-a-1's
    configmap.update (gpu-a-1 cordoned by the run); the journal reopened for a resume."""
    plan, spec, cluster, _, _, _ = setup(tmp_path, (REPO / "examples/lab-plan.yaml").read_text())
    log = Log()
    kinds = {s.kind for n in plan.nodes for s in n.steps}
    steps: dict[str, Any] = {k: FakeStep(k, log, cluster, set()) for k in kinds}
    steps["cordon"] = CordoningStep("cordon", log, cluster, set())
    real = steps["configmap.update"].apply

    def dying(ctx: StepContext) -> StepResult:
        raise Killed

    steps["configmap.update"].apply = dying
    clock = Clock()
    state = tmp_path / "state"
    journal = Journal.create(state, "test", "{}", clock=clock)
    with pytest.raises(Killed):
        executor(plan, spec, cluster, journal, steps, clock, []).run()
    journal.close()
    steps["configmap.update"].apply = real
    assert cluster.nodes["gpu-a-1"].unschedulable
    return plan, spec, cluster, log, Journal.open(state, journal.run_id, clock=clock), steps, clock


def executor(
    plan: Any,
    spec: Any,
    cluster: FakeCluster,
    journal: Journal,
    steps: Any,
    clock: Clock,
    said: list[str],
) -> Executor:
    def context(node: NodePlan) -> StepContext:
        return StepContext(
            node=node.name,
            node_plan=node,
            facts=None,  # type: ignore[arg-type]
            spec=spec,
            runner=None,  # type: ignore[arg-type]
            kube=cluster,  # type: ignore[arg-type]
            journal=journal,
        )

    return Executor(
        plan,
        spec,
        steps,
        journal,
        cluster,
        context,
        Quiet(),
        clock=clock,
        sleep=clock.sleep,
        say=said.append,
    )


def test_resume_continues_the_node_it_took_down_while_another_is_not_ready(
    tmp_path: Path,
) -> None:
    """Issue 22 part 6: gpu-a-1 cordoned by the killed run, another target NotReady since the
    ClusterPolicy change: the resume continues gpu-a-1 at once (it needs no new slot), waits
    for the other node before taking the next one down, and converges."""
    plan, spec, cluster, log, journal, steps, clock = killed_in_cluster_change(tmp_path)
    flapping = cluster.nodes["gpu-b-1"]
    flapping.ready, flapping.ready_changed_at = False, clock.now + timedelta(seconds=1)
    clock.now += timedelta(seconds=3)
    before = len(log.calls)

    def settle_after_a_few_polls() -> None:
        if len(clock.slept) == 3:
            flapping.ready = True

    clock.on_sleep.append(settle_after_a_few_polls)
    said: list[str] = []
    report = executor(plan, spec, cluster, journal, steps, clock, said).run()
    assert report.outcome is RunOutcome.SUCCEEDED, report.halt_reason
    assert log.calls[before] == ("apply", "gpu-a-1", "configmap.update")
    first_wait = said[0]
    assert first_wait.startswith(
        f"waiting for gpu-b-1, NotReady since {clock_time(flapping.ready_changed_at)}, after "
        "this run's ClusterPolicy change (configmap.update on gpu-a-1 at "
    )
    assert first_wait.endswith("before taking gpu-a-2 down")
    assert len(said) == 1  # said once, not at every poll
    assert clock.slept == [2.0, 2.0, 2.0]
    assert all(not n.unschedulable for n in cluster.nodes.values())


def test_resume_halts_when_the_node_stays_not_ready_past_the_bound(tmp_path: Path) -> None:
    plan, spec, cluster, _, journal, steps, clock = killed_in_cluster_change(tmp_path)
    stuck = cluster.nodes["gpu-b-1"]
    stuck.ready, stuck.ready_changed_at = False, clock.now + timedelta(seconds=1)
    said: list[str] = []
    report = executor(plan, spec, cluster, journal, steps, clock, said).run()
    assert report.outcome is RunOutcome.HALTED
    assert report.nodes["gpu-a-1"][0] == "succeeded"  # continued without a new slot
    assert report.nodes["gpu-a-2"][0] == "pending"
    assert "over max_unavailable 1 (already unavailable: gpu-b-1)" in report.halt_reason
    assert "gpu-b-1 still NotReady, waited for at most 120s after" in report.halt_reason
    assert sum(clock.slept) >= SETTLE_WAIT_S - 1


def test_resume_still_counts_a_node_cordoned_by_someone_else(tmp_path: Path) -> None:
    plan, spec, cluster, _log, journal, steps, clock = killed_in_cluster_change(tmp_path)
    cluster.nodes["gpu-b-1"].unschedulable = True  # cordoned by hand after the change
    said: list[str] = []
    report = executor(plan, spec, cluster, journal, steps, clock, said).run()
    assert report.outcome is RunOutcome.HALTED
    assert report.nodes["gpu-a-1"][0] == "succeeded"
    assert report.halt_reason == (
        "taking gpu-a-2 down would make 2 node(s) unavailable, over max_unavailable 1 "
        "(already unavailable: gpu-b-1)"
    )
    assert said == [] and clock.slept == []  # counted at once, not waited for
