"""A halt label that appears while a step waits on the cluster ends the wait at once, names the
node and the label, and halts the run without blaming (rolling back) the node in flight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout.run import RunOutcome
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import HALT_CHECK_INTERVAL_S, Deadline, HaltLabelSeen, HaltWatch
from tests.unit.test_executor import FakeStep, make_executor
from tests.unit.test_executor import setup as setup_executor

STATE = "nvidia.com/gpu-driver-upgrade-state"


def setup(tmp_path: Path) -> tuple[Any, ...]:
    """test_executor's run, with a fake step for every kind the playbooks plan."""
    plan, spec, cluster, log, journal, steps = setup_executor(tmp_path)
    for kind in {s.kind for n in plan.nodes for s in n.steps} - steps.keys():
        steps[kind] = FakeStep(kind, log, cluster, set())
    return plan, spec, cluster, log, journal, steps


def test_a_watch_lists_at_most_once_per_interval_and_names_what_halts() -> None:
    asked: list[str] = []

    def probe(except_node: str) -> str:
        asked.append(except_node)
        return "halt label on n3 (x=y)" if len(asked) > 1 else ""

    watch = HaltWatch(probe, interval_s=3600.0)
    deadline = Deadline(300.0, lambda _s: None, watch, except_node="n1")
    for _ in range(5):
        deadline.sleep(1.0)
    assert asked == ["n1"]  # one list for five polls inside the interval
    watch.interval_s = 0.0
    try:
        deadline.sleep(1.0)
    except HaltLabelSeen as exc:
        assert str(exc) == "halt label on n3 (x=y)"
    else:
        raise AssertionError("the halt label did not end the wait")


def test_a_halt_label_ends_a_wait_and_halts_the_run_without_rolling_back(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path)
    polls: list[str] = []

    def waiting(ctx: StepContext) -> StepResult:
        log.calls.append(("apply", ctx.node, "gpu.wait"))
        deadline = ctx.deadline(300.0)
        while not deadline.expired:
            polls.append(ctx.node)
            if len(polls) == 2:  # the operator marks another node while this one waits
                cluster.nodes["gpu-b-1"].labels[STATE] = "upgrade-failed"
            deadline.sleep(1.0)
        raise StepFailed(ctx.node, "gpu.wait", "waited its full time")

    steps["gpu.wait"].apply = waiting
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.HALTED
    assert report.halt_reason == (
        f"halt label on gpu-b-1 ({STATE}=upgrade-failed) (seen while gpu-a-1 waited in gpu.wait)"
    )
    # ended at the first check after the label (one poll a second), not after 300 polls
    assert len(polls) <= 2 + HALT_CHECK_INTERVAL_S + 1
    assert not any(verb == "undo" for verb, _, _ in log.calls)  # gpu-a-1 is not to blame
    assert report.nodes["gpu-a-1"][0] == "pending"  # left in flight, for `rollout resume`
    assert not any(n != "gpu-a-1" for _, n, _ in log.calls)  # no other node started


def test_a_step_judging_its_own_node_is_not_halted_by_its_own_label(tmp_path: Path) -> None:
    """driver.release watches its own node's upgrade-failed and fails the node on it."""
    plan, spec, cluster, log, journal, steps = setup(tmp_path)

    def releasing(ctx: StepContext) -> StepResult:
        log.calls.append(("apply", ctx.node, "gpu.wait"))
        cluster.nodes[ctx.node].labels[STATE] = "upgrade-failed"
        deadline = ctx.deadline(3.0, judges_own_node=True)
        while not deadline.expired:
            deadline.sleep(1.0)
        raise StepFailed(ctx.node, "gpu.wait", "the operator labelled the node upgrade-failed")

    steps["gpu.wait"].apply = releasing
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.HALTED
    assert report.nodes["gpu-a-1"][0] == "rolled-back"
    assert "the operator labelled the node upgrade-failed" in report.nodes["gpu-a-1"][1]
