"""The executor's decisions with fake steps and a fake cluster: order, halts, budget, rollback,
resume. The same executor runs in the lab tests with the real steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.cli.apply import exit_code
from rollout.errors import ExitCode
from rollout.executor import Executor
from rollout.facts import load_recorded_facts
from rollout.plan import NodePlan, Plan
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.run import Journal, NodeOutcome, RunOutcome
from rollout.spec import Spec, load_spec, parse_spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from tests.examples import FACTS, PLAN

# The steps examples/plan.yaml gives a node whose containerd files change, in plan order.
KINDS = (
    "preflight",
    "gates.baseline",
    "cordon",
    "drain",
    "containerd.write",
    "systemd.restart",
    "containerd.verify",
    "gpu.wait",
    "gpu.smoke",
    "gates",
    "uncordon",
)


@dataclass
class FakeNode:
    name: str
    unschedulable: bool = False
    ready: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    ready_changed_at: datetime | None = None


class FakeCluster:
    def __init__(self, names: Sequence[str]) -> None:
        self.nodes = {n: FakeNode(n) for n in names}
        self.events: list[tuple[str, str, str]] = []

    # the little of KubeClient the executor's own node marks use
    def get_node(self, name: str) -> FakeNode:
        return self.nodes[name]

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        for key, value in annotations.items():
            if value is None:
                self.nodes[name].annotations.pop(key, None)
            else:
                self.nodes[name].annotations[key] = value

    def create_event(self, namespace: str, node: str, reason: str, message: str, type: Any) -> None:
        self.events.append((node, reason, message))

    def list_nodes(self, label_selector: str | None = None) -> list[FakeNode]:
        if not label_selector:
            return list(self.nodes.values())
        key, value = label_selector.split("=", 1)
        return [n for n in self.nodes.values() if n.labels.get(key) == value]


class Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []


class FakeStep:
    kind: ClassVar[str] = ""

    def __init__(self, kind: str, log: Log, cluster: FakeCluster, fail_on: set[str]) -> None:
        self.kind_name = kind
        self.log = log
        self.cluster = cluster
        self.fail_on = fail_on

    def apply(self, ctx: StepContext) -> StepResult:
        self.log.calls.append(("apply", ctx.node, self.kind_name))
        if f"{ctx.node}/{self.kind_name}" in self.fail_on:
            raise StepFailed(ctx.node, self.kind_name, "injected failure")
        if self.kind_name == "cordon":
            self.cluster.nodes[ctx.node].unschedulable = True
        if self.kind_name == "uncordon":
            self.cluster.nodes[ctx.node].unschedulable = False
        return StepResult.done(f"{self.kind_name} ok")

    def undo(self, ctx: StepContext) -> None:
        self.log.calls.append(("undo", ctx.node, self.kind_name))
        if self.kind_name == "cordon":
            self.cluster.nodes[ctx.node].unschedulable = False


class Quiet:
    def node_started(self, wave: int, node: str) -> None: ...
    def step_started(self, node: str, step: str) -> None: ...
    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None: ...
    def node_finished(self, node: str, outcome: str, reason: str) -> None: ...
    def halted(self, reason: str) -> None: ...


def setup(
    tmp_path: Path, spec_text: str | None = None, fail_on: set[str] | None = None
) -> tuple[Plan, Spec, FakeCluster, Log, Journal, dict[str, Any]]:
    spec = parse_spec(spec_text, "plan.yaml") if spec_text else load_spec(PLAN)
    fleet = load_recorded_facts(FACTS)
    plan = build_plan(spec, "plan.yaml", fleet, load_playbooks())
    cluster = FakeCluster([n.name for n in fleet.nodes])
    log = Log()
    steps = {k: FakeStep(k, log, cluster, fail_on or set()) for k in KINDS}
    journal = Journal.create(tmp_path, "test", "{}")
    return plan, spec, cluster, log, journal, steps


def make_executor(
    plan: Plan, spec: Spec, cluster: FakeCluster, journal: Journal, steps: Mapping[str, Any]
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

    return Executor(plan, spec, steps, journal, cluster, context, Quiet())


def test_every_node_every_step_in_wave_order(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path)
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.SUCCEEDED
    nodes_in_order = list(dict.fromkeys(node for _, node, _ in log.calls))
    assert nodes_in_order == ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"]
    assert [k for _, n, k in log.calls if n == "gpu-a-1"] == list(KINDS)
    assert all(not n.unschedulable for n in cluster.nodes.values())


def test_upgrade_failed_label_halts_before_the_next_node(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path)
    cluster.nodes["gpu-b-1"].labels["nvidia.com/gpu-driver-upgrade-state"] = "upgrade-failed"
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.HALTED
    assert "gpu-b-1 (nvidia.com/gpu-driver-upgrade-state=upgrade-failed)" in report.halt_reason
    assert log.calls == []  # halted before the first step of the first node


def test_a_plan_retrying_failed_upgrades_is_not_halted_by_its_own_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry plan's driver.release relabels and watches its targets' upgrade-failed; a node
    outside the plan still halts the run. (The plan's steps stay the containerd ones: the
    driver change only decides which labels halt.)"""
    plan, spec, cluster, _, journal, steps = setup(tmp_path)
    again = setup(tmp_path / "again")  # planned before the change is patched in
    retry = DriverUpgradeChange(version="550.90.07", mode=DriverMode.OPERATOR, retry_failed=True)
    monkeypatch.setattr(type(spec), "changes", property(lambda _: (retry,)))
    node = cluster.nodes["gpu-b-1"]
    node.labels.update({"nvidia.com/gpu.present": "true"})  # the plan's selector
    node.labels["nvidia.com/gpu-driver-upgrade-state"] = "upgrade-failed"
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.SUCCEEDED
    cluster.nodes["gpu-z-9"] = FakeNode("gpu-z-9")
    cluster.nodes["gpu-z-9"].labels["nvidia.com/gpu-driver-upgrade-state"] = "upgrade-failed"
    plan, _, _, _, journal, steps = again
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.HALTED
    assert report.halt_reason == (
        "halt label on gpu-z-9 (nvidia.com/gpu-driver-upgrade-state=upgrade-failed)"
    )


def test_budget_counts_nodes_already_unavailable(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path)
    cluster.nodes["gpu-b-1"].unschedulable = True  # cordoned by hand, max_unavailable 1
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.HALTED
    assert "over max_unavailable 1 (already unavailable: gpu-b-1)" in report.halt_reason
    assert log.calls == []


def test_failed_node_is_rolled_back_and_the_run_halts(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path, fail_on={"gpu-a-2/systemd.restart"})
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.HALTED
    assert report.nodes["gpu-a-1"][0] == "succeeded"
    assert report.nodes["gpu-a-2"] == ("rolled-back", "gpu-a-2: systemd.restart: injected failure")
    assert report.nodes["gpu-a-3"][0] == "pending"  # later nodes untouched
    undone = [k for verb, n, k in log.calls if verb == "undo"]
    # reverse order, done steps only
    assert undone == ["containerd.write", "drain", "cordon", "gates.baseline", "preflight"]
    assert not any(n in ("gpu-a-3", "gpu-b-1") for _, n, _ in log.calls)
    assert not cluster.nodes["gpu-a-2"].unschedulable


def test_failed_rollback_leaves_the_node_cordoned_with_the_reason(tmp_path: Path) -> None:
    plan, spec, cluster, _log, journal, steps = setup(tmp_path, fail_on={"gpu-a-1/gpu.wait"})

    def broken_undo(ctx: StepContext) -> None:
        raise StepFailed(ctx.node, "containerd.write", "backup missing")

    steps["containerd.write"].undo = broken_undo
    report = make_executor(plan, spec, cluster, journal, steps).run()
    outcome, reason = report.nodes["gpu-a-1"]
    assert outcome == NodeOutcome.LEFT_CORDONED.value
    assert "rollback failed at containerd.write" in reason and "backup missing" in reason
    assert cluster.nodes["gpu-a-1"].unschedulable
    # kubectl describe node says so, why, and which run
    left = cluster.nodes["gpu-a-1"].annotations["rollout.dev/left-cordoned"]
    assert "rollback failed at containerd.write" in left and "backup missing" in left
    assert cluster.nodes["gpu-a-1"].annotations["rollout.dev/run"] == journal.run_id
    (event,) = [e for e in cluster.events if e[1] == "RolloutLeftCordoned"]
    assert event[0] == "gpu-a-1" and journal.run_id in event[2] and "backup missing" in event[2]


def test_resume_skips_finished_work_and_reapplies_the_step_in_flight(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path)

    class Killed(BaseException):
        pass

    real_apply = steps["systemd.restart"].apply
    calls = {"n": 0}

    def dying(ctx: StepContext) -> StepResult:
        if ctx.node == "gpu-a-2" and calls["n"] == 0:
            calls["n"] += 1
            raise Killed  # the process dies mid-step: nothing journalled after step-started
        return real_apply(ctx)

    steps["systemd.restart"].apply = dying
    with pytest.raises(Killed):
        make_executor(plan, spec, cluster, journal, steps).run()
    before = len(log.calls)
    journal.close()
    resumed = Journal.open(tmp_path, journal.run_id)
    report = make_executor(plan, spec, cluster, resumed, steps).run()
    assert report.outcome is RunOutcome.SUCCEEDED
    again = log.calls[before:]
    assert ("apply", "gpu-a-1", "cordon") not in again  # finished node not redone
    assert again[0] == ("apply", "gpu-a-2", "systemd.restart")  # the step in flight, re-checked
    restart = KINDS.index("systemd.restart")
    assert [k for _, n, k in again if n == "gpu-a-2"] == list(KINDS[restart:])


def test_halt_only_policy_does_not_roll_back(tmp_path: Path) -> None:
    text = PLAN.read_text().replace("on_failure: rollback", "on_failure: halt")
    plan, spec, cluster, log, journal, steps = setup(
        tmp_path, spec_text=text, fail_on={"gpu-a-1/containerd.verify"}
    )
    report = make_executor(plan, spec, cluster, journal, steps).run()
    assert report.nodes["gpu-a-1"][0] == "failed"
    assert not [c for c in log.calls if c[0] == "undo"]
    assert cluster.nodes["gpu-a-1"].unschedulable  # left cordoned, as the policy says


def test_a_transient_error_retries_the_idempotent_step(tmp_path: Path) -> None:
    from rollout.errors import TransientError

    plan, spec, cluster, log, journal, steps = setup(tmp_path)
    real_apply = steps["gpu.wait"].apply
    failures = {"left": 2}

    def flaky(ctx: StepContext) -> StepResult:
        if ctx.node == "gpu-a-1" and failures["left"]:
            failures["left"] -= 1
            log.calls.append(("apply", ctx.node, "gpu.wait"))
            raise TransientError("API server unreachable for a moment")
        return real_apply(ctx)

    steps["gpu.wait"].apply = flaky
    executor = make_executor(plan, spec, cluster, journal, steps)
    assert executor.run().outcome is RunOutcome.SUCCEEDED
    assert [c for c in log.calls if c[1:] == ("gpu-a-1", "gpu.wait")] == [
        ("apply", "gpu-a-1", "gpu.wait")
    ] * 3


def test_live_progress_table_shows_each_node_state() -> None:
    import io

    from rollout.cli.render import LiveProgress, make_console

    out = io.StringIO()
    console = make_console(out, color=False)
    progress = LiveProgress(console, {"gpu-a-1": 1, "gpu-a-2": 2})
    with progress:
        progress.node_started(1, "gpu-a-1")
        progress.step_started("gpu-a-1", "containerd.write")
        progress.node_finished("gpu-a-1", "succeeded", "")
        progress.node_started(2, "gpu-a-2")
        progress.step_started("gpu-a-2", "drain")
        progress.halted("drain of gpu-a-2 timed out")
    text = out.getvalue()
    assert "gpu-a-1" in text and "succeeded" in text
    assert "gpu-a-2" in text and "drain" in text and "running" in text
    assert "halted: drain of gpu-a-2 timed out" in text


WINDOWED = PLAN.read_text().replace(
    "policy:\n",
    'policy:\n  maintenance_window: {start: "22:00", end: "23:00", timezone: UTC}\n',
)


def test_no_node_starts_that_would_not_finish_before_the_window_closes(tmp_path: Path) -> None:
    """Each node takes 25 minutes (its uncordon moves the clock): the third would start at
    22:50 and end after 23:00, so the run stops there with window_closed, two nodes left."""
    plan, spec, cluster, _, journal, steps = setup(tmp_path, WINDOWED)
    now = [datetime(2026, 11, 30, 22, 0, tzinfo=UTC)]
    uncordon = steps["uncordon"].apply

    def slow_uncordon(ctx: StepContext) -> StepResult:
        now[0] += timedelta(minutes=25)
        return uncordon(ctx)

    steps["uncordon"].apply = slow_uncordon
    executor = make_executor(plan, spec, cluster, journal, steps)
    executor.clock = lambda: now[0]
    report = executor.run()
    assert report.outcome is RunOutcome.HALTED and report.window_closed
    outcomes = [outcome for outcome, _ in report.nodes.values()]
    assert outcomes == ["succeeded", "succeeded", "pending", "pending"]
    assert report.halt_reason == (
        "window closes at 23:00 (22:00-23:00 UTC): the next node would need about 1500s (the "
        "longest node of this run), so it is not started; 2 node(s) left; resume the run "
        "inside the next window"
    )
    assert exit_code(report) == ExitCode.WINDOW_CLOSED


def test_outside_the_window_nothing_starts(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path, WINDOWED)
    executor = make_executor(plan, spec, cluster, journal, steps)
    executor.clock = lambda: datetime(2026, 11, 30, 23, 0, tzinfo=UTC)  # the end is not in it
    report = executor.run()
    assert report.window_closed and log.calls == []
    assert report.halt_reason == (
        f"window closed (22:00-23:00 UTC): {len(plan.nodes)} node(s) left; resume the run "
        "inside the window"
    )
