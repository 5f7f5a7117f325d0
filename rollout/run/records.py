"""The journal's records and their one-line JSON codec.

Each record is a frozen dataclass with a `kind`; an `Entry` is a record with its sequence
number and UTC time, written as one JSON object per line with seq, at and kind first.
Decoding checks every field's type and ignores unknown keys, so a newer rollout may add
optional fields without breaking an older reader.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, NewType

RunId = NewType("RunId", str)
Clock = Callable[[], datetime]

JOURNAL_FORMAT = 1


def utc_now() -> datetime:
    return datetime.now(UTC)


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
    RETRIED = "retried"
    NODE_SKIPPED = "node-skipped"
    NOTIFIED = "notified"
    SOAK_STARTED = "soak-started"
    SOAK_FINISHED = "soak-finished"


class StepOutcome(enum.Enum):
    DONE = "done"
    NOOP = "noop"
    FAILED = "failed"


class NodeOutcome(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled-back"
    LEFT_CORDONED = "left-cordoned"
    # left out of the run on purpose (`rollout resume --skip-node`): its state is unknown
    SKIPPED = "skipped"


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
class NodeRecord:
    """What every record about one node starts with (a base, not a record itself)."""

    node: str


@dataclass(frozen=True)
class StepRecord(NodeRecord):
    """What every record about one step of a node starts with (a base, not a record itself)."""

    step_index: int
    step: str

    @property
    def ref(self) -> StepRef:
        return StepRef(self.step_index, self.step)


@dataclass(frozen=True)
class StepStarted(StepRecord):
    kind: ClassVar[RecordKind] = RecordKind.STEP_STARTED
    attempt: int


@dataclass(frozen=True)
class StepFinished(StepRecord):
    kind: ClassVar[RecordKind] = RecordKind.STEP_FINISHED
    attempt: int
    outcome: StepOutcome
    detail: str = ""


@dataclass(frozen=True)
class StepUndone(StepRecord):
    kind: ClassVar[RecordKind] = RecordKind.STEP_UNDONE
    detail: str = ""


@dataclass(frozen=True)
class NodeFinished(NodeRecord):
    kind: ClassVar[RecordKind] = RecordKind.NODE_FINISHED
    outcome: NodeOutcome
    reason: str = ""


@dataclass(frozen=True)
class CordonedByRollout(NodeRecord):
    kind: ClassVar[RecordKind] = RecordKind.CORDONED_BY_ROLLOUT


@dataclass(frozen=True)
class Uncordoned(NodeRecord):
    kind: ClassVar[RecordKind] = RecordKind.UNCORDONED


@dataclass(frozen=True)
class BackupWritten(NodeRecord):
    kind: ClassVar[RecordKind] = RecordKind.BACKUP_WRITTEN
    path: str
    backup_path: str
    sha256: str


@dataclass(frozen=True)
class NodeSkipped(NodeRecord):
    """`rollout resume --skip-node`: the node (one that never came back) is left as it is."""

    kind: ClassVar[RecordKind] = RecordKind.NODE_SKIPPED
    reason: str = ""


@dataclass(frozen=True)
class Retried:
    """An operation retried after a transient error: what, which retry, the error's kind."""

    kind: ClassVar[RecordKind] = RecordKind.RETRIED
    operation: str
    retry: int
    cause: str  # the summary's kind: `api 503`, `api timeout`, `ssh`, ...
    error: str = ""


@dataclass(frozen=True)
class Notified:
    """A webhook delivery's end: sent, or failed after `tries` (policy.notify). Never the
    URL: a receiver is named by its webhook's name; the error is redacted of the URL."""

    kind: ClassVar[RecordKind] = RecordKind.NOTIFIED
    webhook: str
    event: str
    outcome: str  # sent | failed
    tries: int
    error: str = ""


@dataclass(frozen=True)
class SoakStarted:
    """policy.soak_s began after `wave` (1-based); it ends at `ends_at` (format_time, UTC),
    the wall time of the process running rollout: a resumed run soaks only what is left."""

    kind: ClassVar[RecordKind] = RecordKind.SOAK_STARTED
    wave: int
    ends_at: str


@dataclass(frozen=True)
class SoakFinished:
    """The soak after `wave` waited its time and every node done so far passed its gates
    again: the next wave may start, and a resumed run does not soak that wave again."""

    kind: ClassVar[RecordKind] = RecordKind.SOAK_FINISHED
    wave: int


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
    | Retried
    | NodeSkipped
    | Notified
    | SoakStarted
    | SoakFinished
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
        Retried,
        NodeSkipped,
        Notified,
        SoakStarted,
        SoakFinished,
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
            doc = parse_json_object(line)
        except ValueError as e:
            raise ValueError(f"not a JSON record: {e}") from None
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


def parse_json_object(data: bytes) -> dict[str, Any]:
    """One JSON object from a file of rollout's; ValueError says what the bytes are instead."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"a {type(doc).__name__}, not a JSON object")
    return doc


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
