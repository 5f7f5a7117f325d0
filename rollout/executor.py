# long module: one job, running a plan: waves, node threads, halts, budgets, rollback
"""The executor: waves of nodes, each node's steps, halts, budgets and rollback.

Every decision is journalled before it is acted on, so a run killed at any instant resumes
from the journal: finished steps are skipped, a step in flight is applied again (steps are
idempotent and re-check fresh state first), and a node already finished is not touched.

The nodes of one wave run concurrently, one thread each; the wave boundary is where a run
waits for every node of the wave and re-reads the cluster before going on. Only the
scheduling thread starts nodes. Before it starts any, it checks, in order: the lease is
still ours, no node carries a halt label (invariant 5), the maintenance window is open, and
each node it starts that is taken down fits within max_unavailable (invariant 4), counting
the targets the API shows cordoned or NotReady *and* every node of this run still in flight
(one that is not cordoned yet, or already uncordoned but not finished, holds its slot too).
`rollout.budget` decides it: a node this run already took down needs no new slot, and a
node NotReady since this run's own cluster-wide change is waited for, bounded, before it
counts. Nodes no step takes down need no slot; at most `max_parallel` nodes run at once.

When a node fails, it is rolled back in its own thread (policy.on_failure: rollback) or
left as it is (halt). Once the failure budget is exceeded, or a halt label or a closed
window is found, no further node starts; nodes already in flight then finish, rolling
themselves back if they fail (rollback), or stop before their next step (halt) and are left
for `rollout resume`. A lost lease stops every node before its next step whatever the
policy: another run may own the cluster; so does a node that stays unreachable past every
retry (its state is unknown: its step stays in flight for `rollout resume` to re-check).
The halt record is journalled once every node thread has returned.

Journal records of concurrent nodes interleave; each record names its node and the fold
keeps per-node state, so any interleaving folds to the same per-node state (the journal
serialises appends). Steps that change a cluster-wide object (their class's traits say so,
rollout.steps.traits) run one node at a time, so the first node makes the change and the
others find it made.
Mandatory waits (containerd's RestartSec, device-plugin registration, the smoke pod)
overlap across a wave's nodes because each node waits in its own thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from rollout.budget import ClusterChange, NodeAvailability, RunBudget, Verdict
from rollout.errors import RolloutError
from rollout.plan import NodePlan, Plan, StepPlan
from rollout.retry import DEFAULT_POLICY, RetryPolicy, call_with_policy
from rollout.run import (
    Journal,
    NodeFinished,
    NodeOutcome,
    RunFinished,
    RunHalted,
    RunOutcome,
    SoakFinished,
    SoakStarted,
    StepFinished,
    StepOutcome,
    StepRef,
    StepStarted,
    StepUndone,
    format_time,
)
from rollout.schedule.window import span_at
from rollout.spec import UPGRADE_FAILED_LABEL, OnFailure, Spec, parse_label
from rollout.steps import step_traits
from rollout.steps.base import Step, StepContext, StepResult, StepResultKind
from rollout.steps.deadline import HaltLabelSeen, HaltWatch
from rollout.steps.traits import cluster_wide_kinds, takes_down
from rollout.topology import group_limits
from rollout.transports.errors import SshConnectError


class Halt(RolloutError):
    """The run must stop before the next node; the message says why."""


class WindowClosed(Halt):
    """The maintenance window has closed, or would before the next node could finish."""


class Paused(Halt):
    """`rollout pause` asked the run to stop: no node starts; the nodes in flight finish."""


class NodeRefused(Halt):
    """A node the run must not touch (a saved plan's node whose facts moved): raised by the
    context factory, it halts the run before the node's first step; the node stays pending."""


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

    @property
    def ready_changed_at(self) -> datetime | None: ...


class LeaseCheck(Protocol):
    def check(self) -> None: ...


class Progress(Protocol):
    """Where the executor reports what it does (plain lines, a live table, JSON).

    Called from every node's thread; the executor serialises the calls, so an
    implementation needs no lock of its own.
    """

    def node_started(self, wave: int, node: str) -> None: ...

    def step_started(self, node: str, step: str) -> None: ...

    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None: ...

    def node_finished(self, node: str, outcome: str, reason: str) -> None: ...

    def halted(self, reason: str) -> None: ...


# The node outcomes that count against the failure budget.
FAILED_OUTCOMES = frozenset(
    {NodeOutcome.FAILED, NodeOutcome.ROLLED_BACK, NodeOutcome.LEFT_CORDONED}
)

# Threads for the nodes of one wave: nodes taken down are bounded by max_unavailable first.
MAX_PARALLEL = 32

# How often a node waiting for the budget reads the nodes again.
BUDGET_POLL_S = 2.0


@dataclass(frozen=True)
class RunReport:
    outcome: RunOutcome
    halt_reason: str
    nodes: Mapping[str, tuple[str, str]]  # node -> (outcome, reason)
    window_closed: bool = False  # halted at the maintenance window's end
    paused: bool = False  # halted by `rollout pause`


ContextFactory = Callable[[NodePlan], StepContext]


class _SerialProgress:
    """A Progress that lets one thread at a time into the one it wraps."""

    def __init__(self, inner: Progress) -> None:
        self._inner = inner
        self._lock = threading.Lock()

    def node_started(self, wave: int, node: str) -> None:
        with self._lock:
            self._inner.node_started(wave, node)

    def step_started(self, node: str, step: str) -> None:
        with self._lock:
            self._inner.step_started(node, step)

    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None:
        with self._lock:
            self._inner.step_finished(node, step, outcome, detail)

    def node_finished(self, node: str, outcome: str, reason: str) -> None:
        with self._lock:
            self._inner.node_finished(node, outcome, reason)

    def halted(self, reason: str) -> None:
        with self._lock:
            self._inner.halted(reason)


@dataclass(frozen=True)
class _Done:
    """What a node's thread hands back: its outcome (None: stopped before a step) or an error."""

    node: NodePlan
    outcome: NodeOutcome | None
    error: BaseException | None = None


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
    max_parallel: int = MAX_PARALLEL
    sleep: Callable[[float], None] = time.sleep
    # lines that are no step's: what the run waits for before starting a node
    say: Callable[[str], None] = print
    # who paused the run and why ("" when it is not paused), read before each node starts
    paused: Callable[[], str] = lambda: ""
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _stop_reason: str = field(default="", init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _cluster_wide: threading.Lock = field(default_factory=threading.Lock, init=False)
    # how long each node that succeeded in this process took: the next one's expected time
    _durations: list[timedelta] = field(default_factory=list, init=False)
    _window_closed: bool = field(default=False, init=False)
    _paused: bool = field(default=False, init=False)
    # each node's context as its steps ran in this process: the soak reads its gates with it
    _contexts: dict[str, StepContext] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        missing = sorted({s.kind for n in self.plan.nodes for s in n.steps} - self.steps.keys())
        if missing:
            raise RolloutError(f"no implementation for step(s): {', '.join(missing)}")
        if self.max_parallel < 1:
            raise ValueError(f"max_parallel must be at least 1, got {self.max_parallel}")
        self._targets = {n.name for n in self.plan.nodes}
        # what each step kind is, from its class (the steps given may be stand-ins)
        self._traits = step_traits()
        # one node at a time in these, so concurrent nodes do not race on the shared object
        self._cluster_wide_kinds = cluster_wide_kinds(self._traits)
        # the run's one unavailability budget: here before each node taken down, and in every
        # step that hands its node to another controller's upgrade (StepContext.budget)
        self.budget = RunBudget(
            self.plan.max_unavailable,
            frozenset(self._targets),
            group_limits(self.plan),
            self._first_change,
        )
        self._serial = _SerialProgress(self.progress)

    def run(self) -> RunReport:
        """Every pending node, wave by wave, until done or halted."""
        state = self.journal.replay()
        failures = sum(1 for n in self.plan.nodes if state.node(n.name).outcome in FAILED_OUTCOMES)
        for wave in self.plan.waves:
            state = self.journal.replay()
            # nodes finished in this run before an interruption are not touched again
            pending = [n for n in wave.nodes if state.node(n.name).outcome is None]
            failures, halt = self._run_wave(wave.index, pending, failures)
            if not halt and wave is not self.plan.waves[-1]:
                halt = self._soak(wave.index)
            if halt:
                return self._halt(halt)
        outcome = RunOutcome.FAILED if failures else RunOutcome.SUCCEEDED
        self.journal.append(RunFinished(outcome))
        return self._report(outcome, "")

    # --- scheduling (the calling thread only) --------------------------------------------

    def _run_wave(self, wave: int, pending: list[NodePlan], failures: int) -> tuple[int, str]:
        """Run a wave's nodes concurrently; (failures so far, halt reason or "")."""
        results: queue.Queue[_Done] = queue.Queue()
        running: dict[str, NodePlan] = {}
        waiting = list(pending)
        halt = ""
        error: BaseException | None = None
        try:
            while waiting or running:
                if not halt and error is None and waiting:
                    try:
                        for node in self._startable(waiting, running):
                            waiting.remove(node)
                            running[node.name] = node
                            self._serial.node_started(wave, node.name)
                            threading.Thread(
                                target=self._node_thread,
                                args=(node, results),
                                name=f"rollout-node-{node.name}",
                                daemon=True,
                            ).start()
                    except Halt as exc:
                        halt = str(exc)
                        self._window_closed = isinstance(exc, WindowClosed)
                        self._paused = isinstance(exc, Paused)
                        if not self._paused:  # a pause lets the nodes in flight finish
                            self._halting(halt)
                if not running:
                    break
                done = results.get()
                del running[done.node.name]
                if done.error is not None:
                    error = error or done.error
                    self._stopping("an error stopped the run")
                    continue
                if done.outcome in FAILED_OUTCOMES:
                    failures += 1
                    budget = self.spec.policy.failure_budget
                    if failures > budget and not halt:
                        halt = (
                            f"{done.node.name} failed; {failures} failed node(s) exceed the "
                            f"failure budget of {budget}"
                        )
                        self._halting(halt)
                if done.outcome is None and not halt:
                    halt = self._stop_reason or "stopped"
        except BaseException:
            # Ctrl-C or a bug here: every node stops before its next step; wait for them so
            # that what each one did is journalled, then let the exception go on.
            self._stopping("interrupted")
            while running:
                del running[results.get().node.name]
            raise
        if error is not None:
            raise error
        if not halt and self._stop.is_set():
            halt = self._stop_reason  # e.g. the lease was lost during the wave's last step
        return failures, halt

    def _halting(self, reason: str) -> None:
        """No node starts any more; under the halt policy the running ones stop too."""
        if self.spec.policy.on_failure is OnFailure.HALT:
            self._stopping(reason)

    def _stopping(self, reason: str) -> None:
        with self._lock:
            if not self._stop.is_set():
                self._stop_reason = reason
                self._stop.set()

    def _startable(
        self, waiting: Sequence[NodePlan], running: Mapping[str, NodePlan]
    ) -> list[NodePlan]:
        """The next nodes, in plan order, that may start now; Halt when none may ever. With
        nothing running, nodes settling after this run's own cluster-wide change are waited
        for here, bounded by the budget, and said."""
        said = ""
        waited_since = self.clock()
        while True:
            self._check_run()
            slots = self.max_parallel - len(running)
            if slots <= 0:
                return []
            if not any(takes_down(n, self._traits) for n in waiting[:slots]):
                return list(waiting[:slots])
            waited_s = (self.clock() - waited_since).total_seconds()
            chosen, wait = self._fit(waiting[:slots], running, waited_s)
            if chosen or running or not wait:
                return chosen
            if wait != said:
                self.say(wait)
                said = wait
            self.sleep(BUDGET_POLL_S)

    def _fit(
        self, candidates: Sequence[NodePlan], running: Mapping[str, NodePlan], waited_s: float
    ) -> tuple[list[NodePlan], str]:
        """The candidates, in order, that the budget lets start, up to the first it does not;
        and what that one waits for ("" when none waits). Halt when none may ever start."""
        state = self.journal.replay()
        # this run's nodes down: running here, or cordoned by it and not finished (resumed)
        held = (
            {name for name, n in running.items() if takes_down(n, self._traits)}
            | {
                n.name
                for n in self.plan.nodes
                if state.node(n.name).cordoned_by_rollout and state.node(n.name).outcome is None
            }
            | self.budget.released
        )
        budget = self.budget.current()
        nodes = [
            NodeAvailability(n.name, n.unschedulable, n.ready, n.ready_changed_at)
            for n in self.cluster.list_nodes()
        ]
        chosen: list[NodePlan] = []
        for node in candidates:
            if takes_down(node, self._traits):
                decision = budget.decide(node.name, nodes, held, self.clock(), waited_s)
                if decision.verdict is not Verdict.START:
                    if running or chosen:
                        return chosen, ""  # a node of this run holds a slot: start when it frees
                    if decision.verdict is Verdict.HALT:
                        raise Halt(decision.reason)
                    return chosen, decision.reason
                held.add(node.name)
            chosen.append(node)
        return chosen, ""

    def _first_change(self) -> ClusterChange | None:
        """This run's first change of a cluster-wide object, if any (nodes settling after it
        are waited for)."""
        first = self.journal.replay().first_acted(self._cluster_wide_kinds)
        return None if first is None else ClusterChange(first[1], first[0], first[2])

    def _check_run(self) -> None:
        if self._stop.is_set():
            raise Halt(self._stop_reason)
        self._check_lease()
        paused = self.paused()
        if paused:
            raise Paused(paused)
        halting = self._find_halt_labels()
        if halting:
            raise Halt(halting)
        window = self.spec.policy.maintenance_window
        if window is None:
            return
        now = self.clock()
        hours = f"{window.start:%H:%M}-{window.end:%H:%M} {window.timezone}"
        span = span_at(window, now)
        if span is None:
            raise WindowClosed(
                f"window closed ({hours}): {self._nodes_left()} node(s) left; resume the run "
                "inside the window"
            )
        expected = max(self._durations, default=None)
        closes = span.closes.astimezone(window.zone)
        if expected is not None and now + expected > closes:
            raise WindowClosed(
                f"window closes at {closes:%H:%M} ({hours}): the next node would need about "
                f"{round(expected.total_seconds())}s (the longest node of this run), so it is "
                f"not started; {self._nodes_left()} node(s) left; resume the run inside the "
                "next window"
            )

    def _find_halt_labels(self, except_node: str = "") -> str:
        """What halts the run: the halt labels on nodes (`except_node`'s upgrade-failed aside,
        its own step watching it), or "" when none is on."""
        halting: list[str] = []
        upgrade_failed = parse_label(UPGRADE_FAILED_LABEL)
        for label in self.spec.policy.effective_halt_labels:
            for found in self.cluster.list_nodes(f"{label.key}={label.value}"):
                if label == upgrade_failed and (
                    found.name == except_node
                    or self.spec.retries_failed_upgrade_of(found.name, found.labels)
                ):
                    continue  # its driver.release watches it
                halting.append(f"{found.name} ({label.key}={label.value})")
        return "halt label on " + ", ".join(sorted(halting)) if halting else ""

    def _nodes_left(self) -> int:
        state = self.journal.replay()
        return sum(1 for n in self.plan.nodes if state.node(n.name).outcome is None)

    def _check_lease(self) -> None:
        if self.lease is None:
            return
        try:
            self.lease.check()
        except RolloutError as exc:
            # another run may own the cluster now: every node stops before its next step
            self._stopping(str(exc))
            raise Halt(str(exc)) from exc

    def _soak(self, wave: int) -> str:
        """policy.soak_s after a wave: wait, then read the health gates of every node done so
        far again (rollout/gates/soak.py); the halt reason, or "" to go on. Journalled: a
        resumed run skips a finished soak and waits only what is left of a cut one."""
        state = self.journal.replay()
        done = [n for n in self.plan.nodes if state.node(n.name).outcome is NodeOutcome.SUCCEEDED]
        later = [n for w in self.plan.waves if w.index > wave for n in w.nodes]
        if not self.spec.policy.soak_s or not done or not later:
            return ""
        journalled = state.soak_after(wave)
        if journalled is not None and journalled.finished:
            return ""  # soaked before an interruption: not again
        from rollout.gates.soak import Soak  # the kubernetes client: see _fail_node

        soak = Soak(self.spec.policy.soak_s, self.clock, self.sleep, self._check_run, self.say)
        if journalled is None:
            ends = soak.ends_from_now()
            self.journal.append(SoakStarted(wave, format_time(ends)))
        else:  # cut by a window, a pause, a kill: only what is left of it
            ends = journalled.ends_at
        try:
            soak.wait(wave, len(done), ends)
            degraded = soak.recheck(
                done, lambda node: self._contexts.get(node.name) or self.make_context(node)
            )
        except Halt as exc:
            self._window_closed = isinstance(exc, WindowClosed)
            self._paused = isinstance(exc, Paused)
            left = soak.left_s(ends)
            return f"{exc}; {left}s of the soak after wave {wave} left" if left else str(exc)
        for bad in degraded:
            self._leave_cordoned(bad.node, bad.ctx, bad.evidence)
        if not degraded:
            self.journal.append(SoakFinished(wave))
            return ""
        names = ", ".join(bad.node.name for bad in degraded)
        return f"soak after wave {wave}: {names}: {degraded[0].evidence}"

    # --- one node (its own thread) -------------------------------------------------------

    def _node_thread(self, node: NodePlan, results: queue.Queue[_Done]) -> None:
        started = self.clock()
        try:
            outcome = self._run_node(node)
        except BaseException as exc:  # handed to the scheduling thread, which raises it
            results.put(_Done(node, None, exc))
            return
        if outcome is NodeOutcome.SUCCEEDED:
            with self._lock:
                self._durations.append(self.clock() - started)
        results.put(_Done(node, outcome))

    def _run_node(self, node: NodePlan) -> NodeOutcome | None:
        """The node's pending steps; its outcome, or None when stopped before a step."""
        try:
            ctx = self.make_context(node)
        except NodeRefused as exc:
            self._stopping(str(exc))
            return None
        self._contexts[node.name] = ctx
        ctx = dataclasses.replace(
            ctx, halt_watch=HaltWatch(self._find_halt_labels), budget=self.budget
        )
        for index, planned in enumerate(node.steps):
            ref = StepRef(index, planned.kind)
            state = self.journal.replay()
            if state.is_step_done(node.name, ref):
                continue
            if self._stop.is_set():
                return None  # left as it is, for `rollout resume`
            try:
                self._check_lease()
            except Halt:
                return None
            attempt = state.next_attempt(node.name, ref)
            self.journal.append(StepStarted(node.name, index, planned.kind, attempt))
            self._serial.step_started(node.name, planned.kind)
            try:
                with self._cluster_wide if planned.kind in self._cluster_wide_kinds else _NO_LOCK:
                    result = self._apply(planned, ctx)
            except SshConnectError as exc:  # node gone past all retries: halt, step in flight
                self._stopping(f"{node.name}: {planned.kind}: node unreachable: {exc}")
                return None
            except HaltLabelSeen as exc:  # invariant 5: the run halts; the node is not to blame
                self._stopping(f"{exc} (seen while {node.name} waited in {planned.kind})")
                return None
            except RolloutError as exc:
                self.journal.append(
                    StepFinished(
                        node.name, index, planned.kind, attempt, StepOutcome.FAILED, str(exc)
                    )
                )
                self._serial.step_finished(node.name, planned.kind, "failed", str(exc))
                if getattr(exc, "leaves_node_cordoned", False):  # a failed health gate
                    return self._leave_cordoned(node, ctx, str(exc))
                return self._fail_node(node, ctx, str(exc))
            outcome = StepOutcome.DONE if result.kind is StepResultKind.DONE else StepOutcome.NOOP
            self.journal.append(
                StepFinished(node.name, index, planned.kind, attempt, outcome, result.detail)
            )
            self._serial.step_finished(node.name, planned.kind, outcome.value, result.detail)
        return self._finish(node.name, NodeOutcome.SUCCEEDED, "")

    def _apply(self, planned: StepPlan, ctx: StepContext) -> StepResult:
        if planned.action is None:
            return StepResult.noop(planned.noop_reason or "nothing to do")
        # steps are idempotent, so a transient error (API or SSH hiccup) retries the whole
        # step under the one retry policy
        apply = functools.partial(self.steps[planned.kind].apply, ctx)
        return call_with_policy(apply, self.retry, sleep=ctx.sleep)

    def _fail_node(self, node: NodePlan, ctx: StepContext, reason: str) -> NodeOutcome:
        if self.spec.policy.on_failure is not OnFailure.ROLLBACK:
            return self._finish(
                node.name, NodeOutcome.FAILED, f"{reason} (policy: halt, no rollback)"
            )
        ctx = dataclasses.replace(ctx, halt_watch=None)  # a rollback runs to its end
        done = list(self.journal.replay().node(node.name).completed)
        for completed in reversed(done):
            if completed.outcome is not StepOutcome.DONE:
                continue
            undo = functools.partial(self.steps[completed.kind].undo, ctx)
            try:
                with self._cluster_wide if completed.kind in self._cluster_wide_kinds else _NO_LOCK:
                    call_with_policy(undo, self.retry, sleep=ctx.sleep)
            except RolloutError as exc:
                # imported here: it brings the kubernetes client, which `rollout plan`
                # (importing this module through the renderer) must not pay for
                from rollout.steps.nodemarks import mark_left_cordoned

                if getattr(exc, "leaves_node_cordoned", False):  # its gates after the undo
                    left = f"{reason}; {exc}"
                else:
                    left = f"{reason}; rollback failed at {completed.kind}: {exc}"
                mark_left_cordoned(ctx, left)
                return self._finish(node.name, NodeOutcome.LEFT_CORDONED, left)
            self.journal.append(StepUndone(node.name, completed.index, completed.kind))
            self._serial.step_finished(node.name, completed.kind, "undone", "")
        return self._finish(node.name, NodeOutcome.ROLLED_BACK, reason)

    def _leave_cordoned(self, node: NodePlan, ctx: StepContext, reason: str) -> NodeOutcome:
        """No rollback: the evidence is about the node's GPUs, which a rollback cannot heal."""
        from rollout.steps.nodemarks import mark_left_cordoned

        mark_left_cordoned(ctx, reason)
        return self._finish(node.name, NodeOutcome.LEFT_CORDONED, reason)

    def _finish(self, node: str, outcome: NodeOutcome, reason: str) -> NodeOutcome:
        self.journal.append(NodeFinished(node, outcome, reason))
        self._serial.node_finished(node, outcome.value, reason)
        return outcome

    # --- the end -------------------------------------------------------------------------

    def _halt(self, reason: str) -> RunReport:
        self.journal.append(RunHalted(reason))
        self._serial.halted(reason)
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
        return RunReport(outcome, reason, nodes, self._window_closed, self._paused)


_NO_LOCK = contextlib.nullcontext()
