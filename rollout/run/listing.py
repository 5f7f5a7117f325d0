"""The runs under a state directory, newest first, each with where it stands."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rollout.run.errors import JournalError
from rollout.run.files import NAME_PATTERN, RUNS_DIR, find_run_dir, time_from_run_id
from rollout.run.journal import read_run
from rollout.run.lock import LockHolder, find_lock_holder
from rollout.run.records import RunId, RunOutcome
from rollout.run.state import RunPhase


@dataclass(frozen=True)
class RunSummary:
    """One run for `rollout status`; `problem` is set, and the rest partial, if it is unreadable.

    `holder` is the live process that holds the run's lock, if any.
    """

    run_id: RunId
    run_dir: Path
    started_at: datetime | None
    plan_name: str = ""
    outcome: RunOutcome | None = None
    halted_reason: str | None = None
    last_at: datetime | None = None
    phase: RunPhase | None = None
    holder: LockHolder | None = None
    problem: str | None = None

    @classmethod
    def from_run_dir(cls, run_dir: Path) -> RunSummary:
        run_id = RunId(run_dir.name)
        try:
            holder = find_lock_holder(run_dir)
            state = read_run(run_dir.parent.parent, run_id)
        except (JournalError, OSError) as e:
            return cls(run_id, run_dir, time_from_run_id(run_id), problem=str(e))
        return cls(
            run_id=run_id,
            run_dir=run_dir,
            started_at=state.started_at,
            plan_name=state.plan_name,
            outcome=state.outcome,
            halted_reason=state.halted_reason,
            last_at=state.last_at,
            phase=state.phase(locked=holder is not None),
            holder=holder,
        )


def lock_holder(state_dir: Path, run_id: str) -> LockHolder | None:
    """The live process working on the run (it holds the run's lock), or None."""
    return find_lock_holder(find_run_dir(state_dir, run_id))


def list_runs(state_dir: Path) -> list[RunSummary]:
    """Every run under the state directory, newest first."""
    runs_dir = state_dir / RUNS_DIR
    if not runs_dir.is_dir():
        return []
    summaries = [
        RunSummary.from_run_dir(child)
        for child in runs_dir.iterdir()
        if child.is_dir() and NAME_PATTERN.fullmatch(child.name)
    ]
    oldest = datetime.min.replace(tzinfo=UTC)
    summaries.sort(key=lambda s: (s.started_at or oldest, s.run_id), reverse=True)
    return summaries


def latest_run(state_dir: Path) -> RunSummary | None:
    runs = list_runs(state_dir)
    return runs[0] if runs else None
