"""Durable run state: what a run has done, written down before it is acted on, for resume.

A run lives in ``<state-dir>/runs/<run-id>/``:

- ``plan.json`` — the plan exactly as rendered when the run started; resume and rollback
  follow it, never a re-planned one, so a step's index and kind mean the same thing forever.
- ``journal.jsonl`` — an append-only log, one JSON record per line, each with a sequence
  number and a UTC timestamp. An append returns only after the line is fsynced (and, when the
  file is new, its directory), so whatever the executor was told is recorded survives a
  crash (safety invariant 7).
- ``lock`` — flock'ed by the one process allowed to append, with that process's pid inside.

Reading tolerates exactly one kind of damage: a torn last line, left by a process killed in
the middle of a write. That record was never acknowledged, so dropping it loses nothing the
executor relied on. Any other bad line is an error naming ``file:line``.

`Journal.replay` folds the records into a frozen `RunState`: per node the steps done, the
step in flight (started, never finished: resume must re-check it from fresh facts), the
backups written (invariant 6), whether rollout cordoned the node (invariant 4), and the
node's outcome. The fold also checks the records make sense together (a step finishes only
after it started, a node is uncordoned only if rollout cordoned it), on replay and before
every append, so a journal on disk is always one that replays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import getpass
import hashlib
import json
import os
import re
import secrets
import socket
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, NewType

from rollout.errors import ExitCode, RolloutError, SourceLocation

RunId = NewType("RunId", str)
Clock = Callable[[], datetime]

JOURNAL_FORMAT = 1
STATE_DIR_ENV = "ROLLOUT_STATE_DIR"
RUNS_DIR = "runs"
PLAN_FILE = "plan.json"
JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"

_RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_RUN_ID_TIME = re.compile(r"(\d{8}-\d{6})-")
_CORRUPT_HINT = (
    "only rollout writes this file; a bad line before the last means it was edited or the "
    "disk is damaged: restore it from a backup, or start a new run"
)


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$ROLLOUT_STATE_DIR, else ~/.local/state/rollout."""
    env = os.environ if environ is None else environ
    configured = env.get(STATE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path("~/.local/state/rollout").expanduser()


def utc_now() -> datetime:
    return datetime.now(UTC)


# --- errors -----------------------------------------------------------------------------------


class JournalError(RolloutError):
    """Something is wrong with a run's durable state."""


class JournalCorrupt(JournalError):
    """A journal line that cannot be read, located to file:line."""

    def __init__(self, location: SourceLocation, problem: str) -> None:
        self.location = location
        self.problem = problem
        super().__init__(f"{location}: {problem}\n  hint: {_CORRUPT_HINT}")


class JournalLocked(JournalError):
    """Another process appends to this run's journal."""

    def __init__(self, run_id: RunId, lock_path: Path, pid: int | None, host: str | None) -> None:
        self.run_id = run_id
        self.lock_path = lock_path
        self.pid = pid
        self.host = host
        holder = f"pid {pid}" if pid is not None else "another process (pid not yet recorded)"
        if host:
            holder += f" on {host}"
        super().__init__(
            f"run {run_id} is in use by {holder} (lock {lock_path}): wait for it to finish, "
            "or stop that process; the lock is released the moment it exits"
        )


class RunNotFound(JournalError):
    """No run with that id under the state directory."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, run_id: str, runs_dir: Path) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in {runs_dir}: `rollout status` lists the runs")


class InvalidRecord(JournalError):
    """A record that contradicts the journal so far; refused before it reaches the disk."""


class JournalMismatch(JournalError):
    """The journal and the plan it was written for disagree (plan.json was changed)."""


class JournalWriteFailed(JournalError):
    """An append did not reach the disk; the journal must be reopened before the next one."""


# --- records ----------------------------------------------------------------------------------


class RecordKind(enum.Enum):
    RUN_STARTED = "run-started"
    RUN_RESUMED = "run-resumed"
    STEP_STARTED = "step-started"
    STEP_FINISHED = "step-finished"
    STEP_UNDONE = "step-undone"
    NODE_FINISHED = "node-finished"
    CORDONED_BY_ROLLOUT = "cordoned-by-rollout"
    UNCORDONED = "uncordoned"
    BACKUP_WRITTEN = "backup-written"
    RUN_HALTED = "run-halted"
    RUN_FINISHED = "run-finished"


class StepOutcome(enum.Enum):
    DONE = "done"
    NOOP = "noop"
    FAILED = "failed"


class NodeOutcome(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled-back"
    LEFT_CORDONED = "left-cordoned"


class RunOutcome(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    HALTED = "halted"
    ABORTED = "aborted"


@dataclass(frozen=True)
class StepRef:
    """A step of a node's plan: its position, which identifies it, and its kind, which checks it."""

    index: int
    kind: str


@dataclass(frozen=True)
class RunStarted:
    kind: ClassVar[RecordKind] = RecordKind.RUN_STARTED
    run_id: str
    plan_name: str
    plan_digest: str
    user: str
    host: str
    journal_format: int = JOURNAL_FORMAT


@dataclass(frozen=True)
class RunResumed:
    """A later process took the run over (resume, rollback); who and where, for the audit."""

    kind: ClassVar[RecordKind] = RecordKind.RUN_RESUMED
    user: str
    host: str


@dataclass(frozen=True)
class StepStarted:
    kind: ClassVar[RecordKind] = RecordKind.STEP_STARTED
    node: str
    step_index: int
    step: str
    attempt: int

    @property
    def ref(self) -> StepRef:
        return StepRef(self.step_index, self.step)


@dataclass(frozen=True)
class StepFinished:
    kind: ClassVar[RecordKind] = RecordKind.STEP_FINISHED
    node: str
    step_index: int
    step: str
    attempt: int
    outcome: StepOutcome
    detail: str = ""

    @property
    def ref(self) -> StepRef:
        return StepRef(self.step_index, self.step)


@dataclass(frozen=True)
class StepUndone:
    kind: ClassVar[RecordKind] = RecordKind.STEP_UNDONE
    node: str
    step_index: int
    step: str
    detail: str = ""

    @property
    def ref(self) -> StepRef:
        return StepRef(self.step_index, self.step)


@dataclass(frozen=True)
class NodeFinished:
    kind: ClassVar[RecordKind] = RecordKind.NODE_FINISHED
    node: str
    outcome: NodeOutcome
    reason: str = ""


@dataclass(frozen=True)
class CordonedByRollout:
    kind: ClassVar[RecordKind] = RecordKind.CORDONED_BY_ROLLOUT
    node: str


@dataclass(frozen=True)
class Uncordoned:
    kind: ClassVar[RecordKind] = RecordKind.UNCORDONED
    node: str


@dataclass(frozen=True)
class BackupWritten:
    kind: ClassVar[RecordKind] = RecordKind.BACKUP_WRITTEN
    node: str
    path: str
    backup_path: str
    sha256: str


@dataclass(frozen=True)
class RunHalted:
    kind: ClassVar[RecordKind] = RecordKind.RUN_HALTED
    reason: str


@dataclass(frozen=True)
class RunFinished:
    kind: ClassVar[RecordKind] = RecordKind.RUN_FINISHED
    outcome: RunOutcome


Record = (
    RunStarted
    | RunResumed
    | StepStarted
    | StepFinished
    | StepUndone
    | NodeFinished
    | CordonedByRollout
    | Uncordoned
    | BackupWritten
    | RunHalted
    | RunFinished
)

RECORD_TYPES: Mapping[RecordKind, type[Record]] = {
    cls.kind: cls
    for cls in (
        RunStarted,
        RunResumed,
        StepStarted,
        StepFinished,
        StepUndone,
        NodeFinished,
        CordonedByRollout,
        Uncordoned,
        BackupWritten,
        RunHalted,
        RunFinished,
    )
}


@dataclass(frozen=True)
class Entry:
    """One line of the journal: a record with its sequence number (from 1) and UTC time."""

    seq: int
    at: datetime
    record: Record

    def to_json_line(self) -> bytes:
        """The line as written: JSON with seq, at and kind first, newline-terminated."""
        doc: dict[str, Any] = {"seq": self.seq, "at": format_time(self.at)}
        doc["kind"] = self.record.kind.value
        for f in dataclasses.fields(self.record):
            value = getattr(self.record, f.name)
            doc[f.name] = value.value if isinstance(value, enum.Enum) else value
        return (json.dumps(doc, ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_json_line(cls, line: bytes) -> Entry:
        """Parse one line; ValueError says what is wrong with it."""
        try:
            doc = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a JSON record ({e})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, found {type(doc).__name__}")
        seq = doc.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ValueError("missing or non-integer 'seq'")
        at = doc.get("at")
        if not isinstance(at, str):
            raise ValueError("missing 'at' timestamp")
        try:
            kind = RecordKind(doc.get("kind"))
        except ValueError:
            raise ValueError(f"unknown record kind {doc.get('kind')!r}") from None
        return cls(seq=seq, at=parse_time(at), record=_decode_record(RECORD_TYPES[kind], doc))


def _decode_record(cls: type[Record], doc: Mapping[str, Any]) -> Record:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in doc:
            if f.default is not dataclasses.MISSING:
                continue
            raise ValueError(f"{cls.kind.value}: missing field {f.name!r}")
        values[f.name] = _decode_value(cls.kind, f.name, hints[f.name], doc[f.name])
    # Unknown keys are ignored so a newer rollout may add optional fields.
    return cls(**values)


def _decode_value(kind: RecordKind, name: str, expected: Any, value: Any) -> Any:
    if isinstance(expected, type) and issubclass(expected, enum.Enum):
        try:
            return expected(value)
        except ValueError:
            choices = ", ".join(str(m.value) for m in expected)
            raise ValueError(
                f"{kind.value}: {name} is {value!r}, expected one of {choices}"
            ) from None
    if expected is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if expected is str and isinstance(value, str):
        return value
    raise ValueError(f"{kind.value}: {name} is {value!r}, expected {expected.__name__}")


def format_time(at: datetime) -> str:
    """UTC, microseconds, a trailing Z: sortable as text and unambiguous."""
    if at.tzinfo is None:
        raise ValueError("journal timestamps must be timezone-aware")
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"bad timestamp {text!r}") from None
    if at.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    return at.astimezone(UTC)


# --- derived state ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CompletedStep:
    index: int
    kind: str
    outcome: StepOutcome
    attempt: int
    finished_at: datetime

    @property
    def ref(self) -> StepRef:
        return StepRef(self.index, self.kind)


@dataclass(frozen=True)
class StepInFlight:
    """Started and never finished: the process died, or is still in it. Re-check on resume."""

    index: int
    kind: str
    attempt: int
    started_at: datetime

    @property
    def ref(self) -> StepRef:
        return StepRef(self.index, self.kind)


@dataclass(frozen=True)
class FailedStep:
    index: int
    kind: str
    attempt: int
    detail: str

    @property
    def ref(self) -> StepRef:
        return StepRef(self.index, self.kind)


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

    def is_step_done(self, step: StepRef) -> bool:
        """Done or found to be a no-op, and not undone since."""
        return any(c.index == step.index for c in self.completed)


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

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def node(self, name: str) -> NodeState:
        """The node's state; a node the journal never mentions has an empty one."""
        for state in self.nodes:
            if state.name == name:
                return state
        return NodeState(name)

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

    def _check_step_kind(self, node: str, step: StepRef) -> None:
        recorded = dict(self.node(node).step_kinds).get(step.index)
        if recorded is not None and recorded != step.kind:
            raise JournalMismatch(
                f"run {self.run_id}: the journal records step {step.index + 1} of {node} as "
                f"{recorded}, not {step.kind}: plan.json was changed after the run started"
            )


class _NodeFold:
    """The mutable per-node accumulator behind NodeState; private to the fold."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.completed: dict[int, CompletedStep] = {}
        self.in_flight: StepInFlight | None = None
        self.last_failure: FailedStep | None = None
        self.undone: list[StepRef] = []
        self.outcome: NodeOutcome | None = None
        self.outcome_reason = ""
        self.cordoned = False
        self.backups: list[Backup] = []
        self.attempts: dict[int, int] = {}
        self.kinds: dict[int, str] = {}

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
        )


class _Fold:
    """Folds entries into a RunState. Each apply checks everything before changing anything,
    so a refused entry leaves the fold as it was."""

    def __init__(self) -> None:
        self.started: Entry | None = None
        self.nodes: dict[str, _NodeFold] = {}
        self.halted_reason: str | None = None
        self.outcome: RunOutcome | None = None
        self.last_seq = 0
        self.last_at: datetime | None = None

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
            case RunFinished(outcome=outcome):
                busy = [n.name for n in self.nodes.values() if n.in_flight is not None]
                if busy:
                    raise ValueError(f"run-finished with steps in flight on {', '.join(busy)}")
                self.outcome = outcome
            case _:
                self._apply_to_node(entry)

    def _apply_to_node(self, entry: Entry) -> None:
        record = entry.record
        node_name = getattr(record, "node", None)
        if not isinstance(node_name, str) or not node_name:
            raise ValueError(f"{record.kind.value} without a node")
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


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JournalContents:
    """A journal as read: its entries, the byte length they span, and notes on what was dropped."""

    entries: tuple[Entry, ...]
    good_length: int
    notes: tuple[str, ...] = ()


def read_journal(path: Path) -> JournalContents:
    """Read and check a journal; a torn last line is dropped with a note, anything else raises."""
    return _read_journal(path)[0]


def _read_journal(path: Path) -> tuple[JournalContents, _Fold]:
    data = path.read_bytes()
    entries: list[Entry] = []
    notes: list[str] = []
    fold = _Fold()
    pos = 0
    line_no = 0
    while pos < len(data):
        line_no += 1
        end = data.find(b"\n", pos)
        is_last = end == -1 or end == len(data) - 1
        if end == -1:
            notes.append(f"{path}:{line_no}: dropped a torn last record (a write was cut short)")
            break
        try:
            entry = Entry.from_json_line(data[pos:end])
        except ValueError as e:
            if is_last and not _parses_as_json(data[pos:end]):
                notes.append(f"{path}:{line_no}: dropped an unreadable last record ({e})")
                break
            raise JournalCorrupt(SourceLocation(str(path), line_no), str(e)) from None
        try:
            fold.apply(entry)
        except ValueError as e:
            raise JournalCorrupt(SourceLocation(str(path), line_no), str(e)) from None
        entries.append(entry)
        pos = end + 1
    if not entries:
        raise JournalCorrupt(
            SourceLocation(str(path), 1),
            "the journal has no records: the run was interrupted while it was being created, "
            "before it touched anything",
        )
    return JournalContents(tuple(entries), pos, tuple(notes)), fold


def _parses_as_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def read_run(state_dir: Path, run_id: str) -> RunState:
    """A run's state without taking its lock: for `rollout status` while another process runs."""
    run_dir = _run_dir(state_dir, run_id)
    contents, fold = _read_journal(run_dir / JOURNAL_FILE)
    return fold.freeze(contents.notes)


# --- the journal ------------------------------------------------------------------------------


class Journal:
    """A run's journal, open for appending by this process alone (it holds the lock)."""

    def __init__(
        self,
        run_dir: Path,
        run_id: RunId,
        *,
        journal_fd: int,
        lock_fd: int,
        contents: tuple[JournalContents, _Fold] | None,
        clock: Clock,
    ) -> None:
        """Use `create` or `open`."""
        self.run_dir = run_dir
        self.run_id = run_id
        self._journal_fd: int | None = journal_fd
        self._lock_fd: int | None = lock_fd
        self._clock = clock
        read, fold = contents if contents else (JournalContents((), 0), _Fold())
        self._entries = list(read.entries)
        self._notes = read.notes
        self._fold = fold
        self._broken: str | None = None

    @property
    def path(self) -> Path:
        return self.run_dir / JOURNAL_FILE

    @property
    def plan_path(self) -> Path:
        return self.run_dir / PLAN_FILE

    @classmethod
    def create(
        cls,
        state_dir: Path,
        plan_name: str,
        plan_json: str,
        *,
        user: str | None = None,
        host: str | None = None,
        clock: Clock = utc_now,
    ) -> Journal:
        """Start a run: a new run directory with plan.json, a journal and its run-started record."""
        runs_dir = state_dir / RUNS_DIR
        _make_dirs_durable(runs_dir)
        started_at = clock()
        run_id, run_dir = _make_run_dir(runs_dir, plan_name, started_at)
        lock_fd = _acquire_lock(run_dir, run_id)
        journal_fd = -1
        try:
            _write_new_file(run_dir / PLAN_FILE, plan_json.encode())
            journal_fd = os.open(
                run_dir / JOURNAL_FILE,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                0o644,
            )
            # The new names (lock, plan.json, journal.jsonl) are durable only once the
            # directory itself is synced.
            _fsync_dir(run_dir)
            journal = cls(
                run_dir, run_id, journal_fd=journal_fd, lock_fd=lock_fd, contents=None, clock=clock
            )
            journal._append(
                RunStarted(
                    run_id=run_id,
                    plan_name=plan_name,
                    plan_digest=digest_plan(plan_json),
                    user=user if user is not None else _current_user(),
                    host=host if host is not None else socket.gethostname(),
                ),
                started_at,
            )
        except BaseException:
            if journal_fd >= 0:
                os.close(journal_fd)
            os.close(lock_fd)
            raise
        return journal

    @classmethod
    def open(cls, state_dir: Path, run_id: str, *, clock: Clock = utc_now) -> Journal:
        """Take over an existing run to append to it (resume, rollback); JournalLocked if busy."""
        run_dir = _run_dir(state_dir, run_id)
        lock_fd = _acquire_lock(run_dir, RunId(run_id))
        try:
            path = run_dir / JOURNAL_FILE
            contents, fold = _read_journal(path)
            journal_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                if contents.good_length < path.stat().st_size:
                    # Cut the torn tail, or the next record would be glued onto it and turn
                    # a tolerated torn last line into a corrupt middle one.
                    os.ftruncate(journal_fd, contents.good_length)
                    os.fsync(journal_fd)
            except BaseException:
                os.close(journal_fd)
                raise
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(
            run_dir,
            RunId(run_id),
            journal_fd=journal_fd,
            lock_fd=lock_fd,
            contents=(contents, fold),
            clock=clock,
        )

    def append(self, record: Record) -> Entry:
        """Write one record and fsync it; when this returns, the record survives a crash."""
        return self._append(record, self._clock())

    def _append(self, record: Record, at: datetime) -> Entry:
        if self._journal_fd is None:
            raise JournalWriteFailed(f"journal of run {self.run_id} is closed")
        if self._broken is not None:
            raise JournalWriteFailed(
                f"journal of run {self.run_id} is unusable after a failed write "
                f"({self._broken}): reopen it (rollout resume {self.run_id})"
            )
        entry = Entry(seq=self._fold.last_seq + 1, at=at, record=record)
        line = entry.to_json_line()
        try:
            self._fold.apply(entry)
        except ValueError as e:
            raise InvalidRecord(f"run {self.run_id}: refused to journal: {e}") from None
        self._entries.append(entry)
        try:
            _write_all(self._journal_fd, line)
            os.fsync(self._journal_fd)
        except OSError as e:
            # The file may now end in a partial line; only a reopen (which cuts it) is safe.
            self._broken = str(e)
            raise JournalWriteFailed(
                f"could not write the journal of run {self.run_id} ({self.path}): {e}"
            ) from e
        return entry

    def entries(self) -> tuple[Entry, ...]:
        return tuple(self._entries)

    def replay(self) -> RunState:
        """The run's state from every record so far."""
        if self._broken is not None:
            raise JournalWriteFailed(f"journal of run {self.run_id} is unusable: reopen it")
        return self._fold.freeze(self._notes)

    def read_plan_json(self) -> str:
        """plan.json as written at the start, checked against the digest in run-started."""
        text = self.plan_path.read_text()
        expected = self._fold.freeze().plan_digest
        if digest_plan(text) != expected:
            raise JournalMismatch(
                f"{self.plan_path} does not match the plan run {self.run_id} started with "
                f"({expected}): it was changed; restore it, or start a new run"
            )
        return text

    def close(self) -> None:
        """Release the lock; the journal stays on disk for resume and status."""
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def digest_plan(plan_json: str) -> str:
    return "sha256:" + hashlib.sha256(plan_json.encode()).hexdigest()


# --- listing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """One run for `rollout status`; `problem` is set, and the rest partial, if it is unreadable."""

    run_id: RunId
    run_dir: Path
    started_at: datetime | None
    plan_name: str = ""
    user: str = ""
    host: str = ""
    outcome: RunOutcome | None = None
    halted_reason: str | None = None
    last_at: datetime | None = None
    problem: str | None = None

    @classmethod
    def from_run_dir(cls, run_dir: Path) -> RunSummary:
        run_id = RunId(run_dir.name)
        try:
            state = read_run(run_dir.parent.parent, run_id)
        except (JournalError, OSError) as e:
            return cls(run_id, run_dir, _time_from_run_id(run_id), problem=str(e))
        return cls(
            run_id=run_id,
            run_dir=run_dir,
            started_at=state.started_at,
            plan_name=state.plan_name,
            user=state.user,
            host=state.host,
            outcome=state.outcome,
            halted_reason=state.halted_reason,
            last_at=state.last_at,
        )


def list_runs(state_dir: Path) -> list[RunSummary]:
    """Every run under the state directory, newest first."""
    runs_dir = state_dir / RUNS_DIR
    if not runs_dir.is_dir():
        return []
    summaries = [
        RunSummary.from_run_dir(child)
        for child in runs_dir.iterdir()
        if child.is_dir() and _RUN_ID_PATTERN.fullmatch(child.name)
    ]
    oldest = datetime.min.replace(tzinfo=UTC)
    summaries.sort(key=lambda s: (s.started_at or oldest, s.run_id), reverse=True)
    return summaries


def latest_run(state_dir: Path) -> RunSummary | None:
    runs = list_runs(state_dir)
    return runs[0] if runs else None


def make_run_id(plan_name: str, at: datetime) -> RunId:
    """<UTC yyyymmdd-hhmmss>-<plan name slug>-<4 hex>: sorts by time, reads at a glance."""
    slug = re.sub(r"[^a-z0-9]+", "-", plan_name.lower()).strip("-")[:40].strip("-") or "run"
    stamp = at.astimezone(UTC).strftime("%Y%m%d-%H%M%S")
    return RunId(f"{stamp}-{slug}-{secrets.token_hex(2)}")


def _time_from_run_id(run_id: str) -> datetime | None:
    match = _RUN_ID_TIME.match(run_id)
    if not match:
        return None
    try:
        return datetime.strptime(match.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None


# --- files ------------------------------------------------------------------------------------


def _run_dir(state_dir: Path, run_id: str) -> Path:
    runs_dir = state_dir / RUNS_DIR
    # The id becomes a path: refuse anything that could step outside runs/.
    if not _RUN_ID_PATTERN.fullmatch(run_id) or not (runs_dir / run_id).is_dir():
        raise RunNotFound(run_id, runs_dir)
    return runs_dir / run_id


def _make_run_dir(runs_dir: Path, plan_name: str, at: datetime) -> tuple[RunId, Path]:
    for _ in range(16):
        run_id = make_run_id(plan_name, at)
        run_dir = runs_dir / run_id
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        _fsync_dir(runs_dir)
        return run_id, run_dir
    raise JournalError(f"could not make a new run directory in {runs_dir}: every name was taken")


def _make_dirs_durable(path: Path) -> None:
    """mkdir -p, syncing each parent that gained an entry, so the path survives a crash."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
        _fsync_dir(directory.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _acquire_lock(run_dir: Path, run_id: RunId) -> int:
    """flock the run's lock file and write our pid in it; JournalLocked names the holder."""
    path = run_dir / LOCK_FILE
    # O_CLOEXEC: a child process (ssh, kubectl) must not inherit, and so outlive, the lock.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid, host = _read_lock_holder(fd)
        os.close(fd)
        raise JournalLocked(run_id, path, pid, host) from None
    except BaseException:
        os.close(fd)
        raise
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": format_time(utc_now())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    return fd


def _read_lock_holder(fd: int) -> tuple[int | None, str | None]:
    """Who holds the lock, from the file; (None, None) if the holder has not written yet."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    pid, host = doc.get("pid"), doc.get("host")
    return (
        pid if isinstance(pid, int) else None,
        host if isinstance(host, str) else None,
    )


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        # In a container without a passwd entry for our uid (the in-cluster CronJob).
        return f"uid {os.getuid()}"
