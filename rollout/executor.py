"""The executor: waves of nodes, each node's steps, halts, budgets and rollback.

Every decision is journalled before it is acted on, so a run killed at any instant resumes
from the journal: finished steps are skipped, a step in flight is applied again (steps are
idempotent and re-check fresh state first), and a node already finished is not touched.

Nodes of a wave run one after another; the wave boundary is where a run re-reads the cluster
before going on. Before each node the executor checks, in order: the lease is still ours,
no node carries a halt label (invariant 5), the maintenance window is open, and taking one
more node down stays within max_unavailable counting nodes already cordoned or NotReady
(invariant 4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from rollout.errors import RolloutError
from rollout.plan import NodePlan, Plan
from rollout.retry import DEFAULT_POLICY, RetryPolicy, call_with_policy
from rollout.run import (
    Journal,
    NodeFinished,
    NodeOutcome,
    RunFinished,
    RunHalted,
    RunOutcome,
    StepFinished,
    StepOutcome,
    StepRef,
    StepStarted,
    StepUndone,
)
from rollout.spec import OnFailure, Spec
from rollout.steps.base import Step, StepContext, StepResult, StepResultKind
from rollout.steps.nodemarks import mark_left_cordoned


class Halt(RolloutError):
    """The run must stop before the next node; the message says why."""


class ClusterView(Protocol):
    """What the executor reads of the cluster between nodes."""

    def list_nodes(self, label_selector: str | None = None) -> Sequence[ClusterNode]: ...


class ClusterNode(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def unschedulable(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


class LeaseCheck(Protocol):
    def check(self) -> None: ...


class Progress(Protocol):
    """Where the executor reports what it does (plain lines, a live table, JSON)."""

    def node_started(self, wave: int, node: str) -> None: ...

    def step_started(self, node: str, step: str) -> None: ...

    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None: ...

    def node_finished(self, node: str, outcome: str, reason: str) -> None: ...

    def halted(self, reason: str) -> None: ...


# The node outcomes that count against the failure budget.
FAILED_OUTCOMES = frozenset(
    {NodeOutcome.FAILED, NodeOutcome.ROLLED_BACK, NodeOutcome.LEFT_CORDONED}
)


@dataclass(frozen=True)
class RunReport:
    outcome: RunOutcome
    halt_reason: str
    nodes: Mapping[str, tuple[str, str]]  # node -> (outcome, reason)


ContextFactory = Callable[[NodePlan], StepContext]


@dataclass(eq=False)
class Executor:
    """Runs a Plan against the cluster, journalling every step."""

    plan: Plan
    spec: Spec
    steps: Mapping[str, Step]
    journal: Journal
    cluster: ClusterView
    make_context: ContextFactory
    progress: Progress
    lease: LeaseCheck | None = None
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    retry: RetryPolicy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        missing = sorted({s.kind for n in self.plan.nodes for s in n.steps} - self.steps.keys())
        if missing:
            raise RolloutError(f"no implementation for step(s): {', '.join(missing)}")
        self._targets = {n.name for n in self.plan.nodes}

    def run(self) -> RunReport:
        """Every pending node, wave by wave, until done or halted."""
        state = self.journal.replay()
        failures = sum(1 for n in self.plan.nodes if state.node(n.name).outcome in FAILED_OUTCOMES)
        for wave in self.plan.waves:
            for node in wave.nodes:
                if self.journal.replay().node(node.name).outcome is not None:
                    continue  # finished in this run, before an interruption
                try:
                    self._check_before_node(node)
                except Halt as halt:
                    return self._halt(str(halt))
                self.progress.node_started(wave.index, node.name)
                if self._run_node(node) in FAILED_OUTCOMES:
                    failures += 1
                    if failures > self.spec.policy.failure_budget:
                        return self._halt(
                            f"{node.name} failed; {failures} failed node(s) exceed the "
                            f"failure budget of {self.spec.policy.failure_budget}"
                        )
        outcome = RunOutcome.FAILED if failures else RunOutcome.SUCCEEDED
        self.journal.append(RunFinished(outcome))
        return self._report(outcome, "")

    def _check_before_node(self, node: NodePlan) -> None:
        if self.lease is not None:
            try:
                self.lease.check()
            except RolloutError as exc:
                raise Halt(str(exc)) from exc
        halting: list[str] = []
        for label in self.spec.policy.effective_halt_labels:
            for found in self.cluster.list_nodes(f"{label.key}={label.value}"):
                halting.append(f"{found.name} ({label.key}={label.value})")
        if halting:
            raise Halt("halt label on " + ", ".join(sorted(halting)))
        window = self.spec.policy.maintenance_window
        if window is not None and not window.contains(self.clock()):
            raise Halt(
                f"outside the maintenance window ({window.start:%H:%M}-{window.end:%H:%M} "
                f"{window.timezone}); resume the run inside it"
            )
        if not any(s.kind == "cordon" and s.changes for s in node.steps):
            return  # the node is not taken down: no budget needed
        down = sorted(
            n.name
            for n in self.cluster.list_nodes()
            if n.name in self._targets and n.name != node.name and (n.unschedulable or not n.ready)
        )
        budget = self.plan.max_unavailable
        if len(down) + 1 > budget:
            raise Halt(
                f"taking {node.name} down would make {len(down) + 1} node(s) unavailable, "
                f"over max_unavailable {budget} (already unavailable: {', '.join(down)})"
            )

    def _run_node(self, node: NodePlan) -> NodeOutcome:
        ctx = self.make_context(node)
        state = self.journal.replay()
        for index, planned in enumerate(node.steps):
            ref = StepRef(index, planned.kind)
            if state.is_step_done(node.name, ref):
                continue
            attempt = state.next_attempt(node.name, ref)
            self.journal.append(StepStarted(node.name, index, planned.kind, attempt))
            self.progress.step_started(node.name, planned.kind)
            try:
                if planned.action is None:
                    result = StepResult.noop(planned.noop_reason or "nothing to do")
                else:
                    # steps are idempotent, so a transient error (API or SSH hiccup) retries
                    # the whole step under the one retry policy
                    apply = functools.partial(self.steps[planned.kind].apply, ctx)
                    result = call_with_policy(apply, self.retry, sleep=ctx.sleep)
            except RolloutError as exc:
                self.journal.append(
                    StepFinished(
                        node.name, index, planned.kind, attempt, StepOutcome.FAILED, str(exc)
                    )
                )
                self.progress.step_finished(node.name, planned.kind, "failed", str(exc))
                return self._fail_node(node, ctx, str(exc))
            outcome = StepOutcome.DONE if result.kind is StepResultKind.DONE else StepOutcome.NOOP
            self.journal.append(
                StepFinished(node.name, index, planned.kind, attempt, outcome, result.detail)
            )
            self.progress.step_finished(node.name, planned.kind, outcome.value, result.detail)
            state = self.journal.replay()
        return self._finish(node.name, NodeOutcome.SUCCEEDED, "")

    def _fail_node(self, node: NodePlan, ctx: StepContext, reason: str) -> NodeOutcome:
        if self.spec.policy.on_failure is not OnFailure.ROLLBACK:
            return self._finish(
                node.name, NodeOutcome.FAILED, f"{reason} (policy: halt, no rollback)"
            )
        done = [c for c in self.journal.replay().node(node.name).completed]
        for completed in reversed(done):
            if completed.outcome is not StepOutcome.DONE:
                continue
            undo = functools.partial(self.steps[completed.kind].undo, ctx)
            try:
                call_with_policy(undo, self.retry, sleep=ctx.sleep)
            except RolloutError as exc:
                left = f"{reason}; rollback failed at {completed.kind}: {exc}"
                mark_left_cordoned(ctx, left)
                return self._finish(node.name, NodeOutcome.LEFT_CORDONED, left)
            self.journal.append(StepUndone(node.name, completed.index, completed.kind))
            self.progress.step_finished(node.name, completed.kind, "undone", "")
        return self._finish(node.name, NodeOutcome.ROLLED_BACK, reason)

    def _finish(self, node: str, outcome: NodeOutcome, reason: str) -> NodeOutcome:
        self.journal.append(NodeFinished(node, outcome, reason))
        self.progress.node_finished(node, outcome.value, reason)
        return outcome

    def _halt(self, reason: str) -> RunReport:
        self.journal.append(RunHalted(reason))
        self.progress.halted(reason)
        return self._report(RunOutcome.HALTED, reason)

    def _report(self, outcome: RunOutcome, reason: str) -> RunReport:
        state = self.journal.replay()
        nodes = {}
        for node in self.plan.nodes:
            ns = state.node(node.name)
            nodes[node.name] = (
                ns.outcome.value if ns.outcome else "pending",
                ns.outcome_reason,
            )
        return RunReport(outcome, reason, nodes)
