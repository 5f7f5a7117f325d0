"""What can be wrong with a run's files; every one says what, which run or file, and what to do."""

from __future__ import annotations

from pathlib import Path

from rollout.errors import ExitCode, RolloutError, SourceLocation

_CORRUPT_HINT = (
    "only rollout writes this file; a bad line before the last means it was edited or the "
    "disk is damaged: restore it from a backup, or start a new run"
)


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

    def __init__(self, run_id: str, lock_path: Path, pid: int | None, host: str | None) -> None:
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


class RunIncomplete(JournalError):
    """A run directory without a journal: its creation was cut short before it acted."""

    def __init__(self, run_id: str, journal_path: Path) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id} has no journal ({journal_path}): it was interrupted while it was being "
            "created, before it touched any node; there is nothing to resume: start a new run "
            "with `rollout apply PLAN`"
        )


class InvocationUnreadable(JournalError):
    """A run's invocation.json is missing or damaged, so resume cannot reconnect to the fleet."""

    def __init__(self, run_id: str, path: Path | str, problem: str) -> None:
        self.run_id = run_id
        self.path = path
        super().__init__(
            f"cannot resume run {run_id}: {path} {problem}; it records the plan file and the "
            "inventory and cluster to reconnect to. Run `rollout apply PLAN` again with the "
            "same plan and inventory: steps already done are found to have nothing to do"
        )


class InvalidRecord(JournalError):
    """A record that contradicts the journal so far; refused before it reaches the disk."""


class JournalMismatch(JournalError):
    """The journal and the plan it was written for disagree (plan.json was changed)."""


class JournalWriteFailed(JournalError):
    """An append did not reach the disk; the journal must be reopened before the next one."""


class StepDataUnreadable(JournalError):
    """Per-step data saved by a step that cannot be read back."""
