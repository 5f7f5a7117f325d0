"""The run store: the only code that reads or writes a run's files.

A run lives in ``<state-dir>/runs/<run-id>/``:

- ``plan.json`` — the plan exactly as rendered when the run started; resume and rollback
  follow it, never a re-planned one, so a step's index and kind mean the same thing forever.
  Every reader checks it against the digest in the run-started record.
- ``invocation.json`` — the plan file's text and where the fleet is, for `rollout resume`.
- ``journal.jsonl`` — the append-only record of what the run did, each line fsynced before
  the executor acts on it (`journal`); folded into a `RunState` (`state`) for resume and
  status. A run is resumable once this file exists; it is written last at creation.
- ``lock`` — flock'ed by the one process allowed to append, with that process's pid inside
  (`lock`); a held lock is how status tells a running run from an interrupted one.
- ``nodes/<node>/<step>.json`` — what a step kept for later steps and its undo (`stepdata`).

Modules: `records` (the records and their JSON codec), `state` (the fold), `journal` (the
reader and the appender), `store` (where an open run's bytes live: `RunDirectory`, the files
above), `invocation`, `stepdata`, `lock`, `files` (paths and durable writes), `listing` (the
runs for `rollout status`).

A run of the scheduled CronJob's pod, whose files die with it, is kept in the cluster instead
(`cluster`: one Secret named after the plan, the same records, plan, invocation and step data,
every write resourceVersion-checked); the journal and the fold are the same.
"""

from rollout.run.errors import (
    InvalidRecord,
    InvocationUnreadable,
    JournalCorrupt,
    JournalError,
    JournalLocked,
    JournalMismatch,
    JournalWriteFailed,
    RunIncomplete,
    RunNotFound,
    StepDataUnreadable,
)
from rollout.run.files import (
    INVOCATION_FILE,
    JOURNAL_FILE,
    LOCK_FILE,
    PLAN_FILE,
    RUNS_DIR,
    STATE_DIR_ENV,
    current_user,
    default_state_dir,
    make_run_id,
)
from rollout.run.invocation import Invocation
from rollout.run.journal import (
    Journal,
    JournalContents,
    digest_plan,
    read_journal,
    read_plan_json,
    read_run,
    read_run_invocation,
)
from rollout.run.listing import RunSummary, latest_run, list_runs, lock_holder
from rollout.run.lock import LockHolder
from rollout.run.records import (
    JOURNAL_FORMAT,
    RECORD_TYPES,
    BackupWritten,
    Clock,
    CordonedByRollout,
    Entry,
    NodeFinished,
    NodeOutcome,
    NodeSkipped,
    Notified,
    Record,
    RecordKind,
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
    format_time,
    parse_time,
    utc_now,
)
from rollout.run.state import (
    Backup,
    CompletedStep,
    FailedStep,
    NodeState,
    RunPhase,
    RunState,
    StepInFlight,
    WaveSoak,
)

__all__ = [
    "INVOCATION_FILE",
    "JOURNAL_FILE",
    "JOURNAL_FORMAT",
    "LOCK_FILE",
    "PLAN_FILE",
    "RECORD_TYPES",
    "RUNS_DIR",
    "STATE_DIR_ENV",
    "Backup",
    "BackupWritten",
    "Clock",
    "CompletedStep",
    "CordonedByRollout",
    "Entry",
    "FailedStep",
    "InvalidRecord",
    "Invocation",
    "InvocationUnreadable",
    "Journal",
    "JournalContents",
    "JournalCorrupt",
    "JournalError",
    "JournalLocked",
    "JournalMismatch",
    "JournalWriteFailed",
    "LockHolder",
    "NodeFinished",
    "NodeOutcome",
    "NodeSkipped",
    "NodeState",
    "Notified",
    "Record",
    "RecordKind",
    "Retried",
    "RunFinished",
    "RunHalted",
    "RunId",
    "RunIncomplete",
    "RunNotFound",
    "RunOutcome",
    "RunPhase",
    "RunResumed",
    "RunStarted",
    "RunState",
    "RunSummary",
    "SoakFinished",
    "SoakStarted",
    "StepDataUnreadable",
    "StepFinished",
    "StepInFlight",
    "StepOutcome",
    "StepRef",
    "StepStarted",
    "StepUndone",
    "Uncordoned",
    "WaveSoak",
    "current_user",
    "default_state_dir",
    "digest_plan",
    "format_time",
    "latest_run",
    "list_runs",
    "lock_holder",
    "make_run_id",
    "parse_time",
    "read_journal",
    "read_plan_json",
    "read_run",
    "read_run_invocation",
    "utc_now",
]
