"""A run's state, folded from its journal's records.

Per node: the steps done, the step in flight (started, never finished: resume must re-check
it from fresh facts), the backups written (invariant 6), whether rollout cordoned the node
(invariant 4), and the node's outcome. The fold also checks that the records make sense
together (a step finishes only after it started, a node is uncordoned only if rollout
cordoned it), on replay and before every append, so a journal on disk is always one that
replays.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rollout.run.errors import JournalMismatch
from rollout.run.records import (
    JOURNAL_FORMAT,
    BackupWritten,
    CordonedByRollout,
    Entry,
    NodeFinished,
    NodeOutcome,
    NodeRecord,
    NodeSkipped,
    Notified,
    Retried,
    RunFinished,
    RunHalted,
    RunId,
    RunOutcome,
    RunResumed,
    RunStarted,
    SoakFinished,
    SoakStarted,
    StepFinished,
    StepOutcome,
    StepRef,
    StepStarted,
    StepUndone,
    Uncordoned,
    parse_time,
)


@dataclass(frozen=True)
class StepState(StepRef):
    """What every folded fact about one step starts with: the step it is about."""

    @property
    def ref(self) -> StepRef:
        """The bare reference (equal to the one the plan makes for the step)."""
        return StepRef(self.index, self.kind)


@dataclass(frozen=True)
class CompletedStep(StepState):
    outcome: StepOutcome
    attempt: int
    finished_at: datetime


@dataclass(frozen=True)
class StepInFlight(StepState):
    """Started and never finished: the process died, or is still in it. Re-check on resume."""

    attempt: int
    started_at: datetime


@dataclass(frozen=True)
class FailedStep(StepState):
    attempt: int
    detail: str


@dataclass(frozen=True)
class Backup:
    """A file replaced on a node, and where its original bytes were kept (invariant 6)."""

    path: str
    backup_path: str
    sha256: str
    written_at: datetime


@dataclass(frozen=True)
class NodeState:
    name: str
    completed: tuple[CompletedStep, ...] = ()
    in_flight: StepInFlight | None = None
    last_failure: FailedStep | None = None
    undone: tuple[StepRef, ...] = ()
    outcome: NodeOutcome | None = None
    outcome_reason: str = ""
    cordoned_by_rollout: bool = False
    backups: tuple[Backup, ...] = ()
    # The highest attempt seen per step index, so a retry or resume numbers the next one.
    attempts: tuple[tuple[int, int], ...] = ()
    # The kind recorded for each step index, to catch a plan.json changed under the journal.
    step_kinds: tuple[tuple[int, str], ...] = ()
    # Per step index, when its first attempt that did (or, killed, may have) change something
    # began: a no-op attempt changed nothing; the attempt in flight is `in_flight`.
    acted_at: tuple[tuple[int, datetime], ...] = ()

    def is_step_done(self, step: StepRef) -> bool:
        """Done or found to be a no-op, and not undone since."""
        return any(c.index == step.index for c in self.completed)


@dataclass(frozen=True)
class WaveSoak:
    """The soak after a wave (policy.soak_s), as journalled: when it ends, and whether it
    finished (waited its time and the gates passed again)."""

    wave: int
    ends_at: datetime
    finished: bool = False


class RunPhase(enum.Enum):
    """Where a run stands: what `rollout status` says of it."""

    FINISHED = "finished"  # a run-finished record: its outcome says how
    HALTED = "halted"  # stopped on purpose (a halt label, the failure budget, ...); resumable
    RUNNING = "running"  # a live process holds the run's lock
    INTERRUPTED = "interrupted"  # neither: its process died or was stopped; resumable


@dataclass(frozen=True)
class RunState:
    """Everything a journal says, folded; the executor's starting point on resume."""

    run_id: RunId
    plan_name: str
    plan_digest: str
    user: str
    host: str
    started_at: datetime
    nodes: tuple[NodeState, ...] = ()
    halted_reason: str | None = None
    outcome: RunOutcome | None = None
    last_seq: int = 0
    last_at: datetime | None = None
    notes: tuple[str, ...] = ()
    # retries per kind (`api 503`: 4), from the journal's retried records
    retries: tuple[tuple[str, int], ...] = ()
    soaks: tuple[WaveSoak, ...] = ()

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def phase(self, *, locked: bool) -> RunPhase:
        """Finished, halted, running or interrupted; `locked`: a live process holds the run.

        A halt is reported as such even while the halting process is still exiting: it
        will not act again. A resumed run has no halt reason until it halts again.
        """
        if self.outcome is not None:
            return RunPhase.FINISHED
        if self.halted_reason is not None:
            return RunPhase.HALTED
        return RunPhase.RUNNING if locked else RunPhase.INTERRUPTED

    def node(self, name: str) -> NodeState:
        """The node's state; a node the journal never mentions has an empty one."""
        for state in self.nodes:
            if state.name == name:
                return state
        return NodeState(name)

    def soak_after(self, wave: int) -> WaveSoak | None:
        """The soak after `wave` as journalled; None when it never started."""
        return next((soak for soak in self.soaks if soak.wave == wave), None)

    def is_step_done(self, node: str, step: StepRef) -> bool:
        self._check_step_kind(node, step)
        return self.node(node).is_step_done(step)

    def step_in_flight(self, node: str) -> StepInFlight | None:
        return self.node(node).in_flight

    def next_attempt(self, node: str, step: StepRef) -> int:
        """The attempt number for the next start of this step: 1, then one more each time."""
        self._check_step_kind(node, step)
        return dict(self.node(node).attempts).get(step.index, 0) + 1

    def next_step(self, node: str, step_kinds: Sequence[str]) -> StepRef | None:
        """The first step of the node's plan not done yet (the in-flight one included)."""
        state = self.node(node)
        for index, kind in state.step_kinds:
            if index >= len(step_kinds) or step_kinds[index] != kind:
                planned = step_kinds[index] if index < len(step_kinds) else "no such step"
                raise JournalMismatch(
                    f"run {self.run_id}: the journal records step {index + 1} of {node} as "
                    f"{kind}, the plan has {planned}: plan.json was changed after the run started"
                )
        for index, kind in enumerate(step_kinds):
            if not state.is_step_done(StepRef(index, kind)):
                return StepRef(index, kind)
        return None

    def pending_nodes(self, order: Iterable[str]) -> tuple[str, ...]:
        """The nodes of `order`, in that order, that have no outcome yet."""
        return tuple(name for name in order if self.node(name).outcome is None)

    def cordoned_nodes(self) -> tuple[str, ...]:
        """Nodes rollout cordoned and has not uncordoned: to uncordon, or report (invariant 4)."""
        return tuple(n.name for n in self.nodes if n.cordoned_by_rollout)

    def first_acted(self, kinds: Collection[str]) -> tuple[str, str, datetime] | None:
        """(node, step, when it began) of the earliest step of these kinds that changed, or
        may have changed, something in this run; None when none did."""
        acted: list[tuple[datetime, str, str]] = []
        for node in self.nodes:
            kind_of = dict(node.step_kinds)
            acted += [(at, node.name, kind_of[i]) for i, at in node.acted_at if kind_of[i] in kinds]
            if node.in_flight is not None and node.in_flight.kind in kinds:
                acted.append((node.in_flight.started_at, node.name, node.in_flight.kind))
        if not acted:
            return None
        at, node_name, kind = min(acted)
        return node_name, kind, at

    def _check_step_kind(self, node: str, step: StepRef) -> None:
        recorded = dict(self.node(node).step_kinds).get(step.index)
        if recorded is not None and recorded != step.kind:
            raise JournalMismatch(
                f"run {self.run_id}: the journal records step {step.index + 1} of {node} as "
                f"{recorded}, not {step.kind}: plan.json was changed after the run started"
            )


@dataclass
class _NodeFold:
    """The mutable per-node accumulator behind NodeState; private to the fold."""

    name: str
    completed: dict[int, CompletedStep] = field(default_factory=dict)
    in_flight: StepInFlight | None = None
    last_failure: FailedStep | None = None
    undone: list[StepRef] = field(default_factory=list)
    outcome: NodeOutcome | None = None
    outcome_reason: str = ""
    cordoned: bool = False
    backups: list[Backup] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)
    acted: dict[int, datetime] = field(default_factory=dict)

    def freeze(self) -> NodeState:
        return NodeState(
            name=self.name,
            completed=tuple(self.completed.values()),
            in_flight=self.in_flight,
            last_failure=self.last_failure,
            undone=tuple(self.undone),
            outcome=self.outcome,
            outcome_reason=self.outcome_reason,
            cordoned_by_rollout=self.cordoned,
            backups=tuple(self.backups),
            attempts=tuple(sorted(self.attempts.items())),
            step_kinds=tuple(sorted(self.kinds.items())),
            acted_at=tuple(sorted(self.acted.items())),
        )


@dataclass
class Fold:
    """Folds entries into a RunState. Each apply checks everything before changing anything,
    so a refused entry leaves the fold as it was."""

    started: Entry | None = None
    nodes: dict[str, _NodeFold] = field(default_factory=dict)
    halted_reason: str | None = None
    outcome: RunOutcome | None = None
    last_seq: int = 0
    last_at: datetime | None = None
    retries: dict[str, int] = field(default_factory=dict)
    soaks: dict[int, WaveSoak] = field(default_factory=dict)

    def apply(self, entry: Entry) -> None:
        """Add one entry; ValueError (nothing changed) if it contradicts the journal so far."""
        if entry.seq != self.last_seq + 1:
            raise ValueError(f"sequence number {entry.seq}, expected {self.last_seq + 1}")
        record = entry.record
        if isinstance(record, RunStarted):
            if self.started is not None:
                raise ValueError("a second run-started record")
            if record.journal_format > JOURNAL_FORMAT:
                raise ValueError(
                    f"journal format {record.journal_format} is newer than this rollout "
                    f"understands ({JOURNAL_FORMAT}): use a newer rollout"
                )
        elif self.started is None:
            raise ValueError(f"{record.kind.value} before run-started")
        else:
            self._apply_to_run(entry)
        if isinstance(record, RunStarted):
            self.started = entry
        self.last_seq = entry.seq
        self.last_at = entry.at

    def _apply_to_run(self, entry: Entry) -> None:
        record = entry.record
        match record:
            case RunResumed():
                self.halted_reason = None
                self.outcome = None
            case RunHalted(reason=reason):
                self.halted_reason = reason
            case Retried(cause=cause):
                self.retries[cause] = self.retries.get(cause, 0) + 1
            case Notified():  # an audit line: it changes no state
                pass
            case SoakStarted(wave=wave, ends_at=ends_at):
                if wave in self.soaks:
                    raise ValueError(f"a second soak-started record for wave {wave}")
                self.soaks[wave] = WaveSoak(wave, parse_time(ends_at))
            case SoakFinished(wave=wave):
                started = self.soaks.get(wave)
                if started is None:
                    raise ValueError(f"soak-finished for wave {wave}, whose soak never started")
                self.soaks[wave] = WaveSoak(wave, started.ends_at, finished=True)
            case RunFinished(outcome=outcome):
                busy = [n.name for n in self.nodes.values() if n.in_flight is not None]
                if busy:
                    raise ValueError(f"run-finished with steps in flight on {', '.join(busy)}")
                self.outcome = outcome
            case _:
                self._apply_to_node(entry)

    def _apply_to_node(self, entry: Entry) -> None:
        record = entry.record
        if not isinstance(record, NodeRecord) or not record.node:
            raise ValueError(f"{record.kind.value} without a node")
        node_name = record.node
        node = self.nodes.get(node_name) or _NodeFold(node_name)
        where = f"{record.kind.value} of {node_name}"
        match record:
            case StepStarted() | StepFinished() | StepUndone():
                _check_step(node, record.ref, where)
        match record:
            case StepStarted(step_index=index, step=kind, attempt=attempt):
                if node.in_flight is not None and node.in_flight.index != index:
                    raise ValueError(
                        f"{where} step {index + 1} ({kind}) while step "
                        f"{node.in_flight.index + 1} ({node.in_flight.kind}) is in flight: "
                        "finish or undo that one first"
                    )
                if attempt <= node.attempts.get(index, 0):
                    raise ValueError(
                        f"{where} step {index + 1} ({kind}) attempt {attempt}, "
                        f"after attempt {node.attempts[index]}"
                    )
                if node.in_flight is not None:  # its process died in it: it may have acted
                    node.acted.setdefault(index, node.in_flight.started_at)
                node.in_flight = StepInFlight(index, kind, attempt, entry.at)
                node.attempts[index] = attempt
                node.kinds[index] = kind
                node.completed.pop(index, None)
            case StepFinished(step_index=index, step=kind, attempt=attempt, outcome=outcome):
                flying = node.in_flight
                if flying is None or (flying.index, flying.attempt) != (index, attempt):
                    raise ValueError(
                        f"{where} step {index + 1} ({kind}) attempt {attempt}, "
                        "which is not the step in flight"
                    )
                node.in_flight = None
                if outcome is not StepOutcome.NOOP:
                    node.acted.setdefault(index, flying.started_at)
                if outcome is StepOutcome.FAILED:
                    node.last_failure = FailedStep(index, kind, attempt, record.detail)
                else:
                    node.completed[index] = CompletedStep(index, kind, outcome, attempt, entry.at)
            case StepUndone(step_index=index, step=kind):
                if index not in node.attempts:
                    raise ValueError(f"{where} step {index + 1} ({kind}), which never started")
                if node.in_flight is not None and node.in_flight.index == index:
                    node.in_flight = None
                node.completed.pop(index, None)
                node.undone.append(StepRef(index, kind))
            case NodeFinished(outcome=outcome, reason=reason):
                if node.in_flight is not None:
                    raise ValueError(
                        f"{where} while step {node.in_flight.index + 1} "
                        f"({node.in_flight.kind}) is in flight"
                    )
                node.outcome = outcome
                node.outcome_reason = reason
            case CordonedByRollout():
                node.cordoned = True
            case Uncordoned():
                # Invariant 4: a node someone else cordoned is never uncordoned by rollout.
                if not node.cordoned:
                    raise ValueError(f"{where}, which rollout did not cordon")
                node.cordoned = False
            case BackupWritten(path=path, backup_path=backup_path, sha256=digest):
                node.backups.append(Backup(path, backup_path, digest, entry.at))
            case NodeSkipped(reason=reason):
                # the step in flight when the node died stays unknown: nothing resumes it
                node.in_flight = None
                node.outcome = NodeOutcome.SKIPPED
                node.outcome_reason = reason
            case _:
                raise ValueError(f"unexpected {record.kind.value} record")
        self.nodes[node_name] = node

    def freeze(self, notes: Sequence[str] = ()) -> RunState:
        if self.started is None or not isinstance(self.started.record, RunStarted):
            raise ValueError("no run-started record")
        started = self.started.record
        return RunState(
            run_id=RunId(started.run_id),
            plan_name=started.plan_name,
            plan_digest=started.plan_digest,
            user=started.user,
            host=started.host,
            started_at=self.started.at,
            nodes=tuple(n.freeze() for n in self.nodes.values()),
            halted_reason=self.halted_reason,
            outcome=self.outcome,
            retries=tuple(sorted(self.retries.items())),
            soaks=tuple(self.soaks[wave] for wave in sorted(self.soaks)),
            last_seq=self.last_seq,
            last_at=self.last_at,
            notes=tuple(notes),
        )


def _check_step(node: _NodeFold, step: StepRef, where: str) -> None:
    if step.index < 0:
        raise ValueError(f"{where}: negative step index {step.index}")
    recorded = node.kinds.get(step.index)
    if recorded is not None and recorded != step.kind:
        raise ValueError(f"{where} step {step.index + 1} is {step.kind}, recorded as {recorded}")
