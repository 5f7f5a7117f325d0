"""A pause asked of a run: who asked and why, kept beside the run's journal.

`rollout pause RUN` writes it while the run may be going (it takes no lock: the run holds
the journal's), and the run reads it before it starts each node: nodes in flight finish, no
node starts, and the run exits with ExitCode.PAUSED. It is a file of its own, written whole
or not at all, so it outlives a kill -9 of the run and the run's Lease; `rollout resume`
(or `rollout unpause`) removes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rollout.run.errors import JournalError
from rollout.run.files import fsync_dir, replace_file
from rollout.run.journal import Journal
from rollout.run.records import format_time, parse_time
from rollout.run.store import RunDirectory

PAUSE_FILE = "paused.json"


@dataclass(frozen=True)
class PauseMark:
    """Who paused a run (user@host), why, and when."""

    by: str
    reason: str
    at: datetime

    def describe(self) -> str:
        because = f": {self.reason}" if self.reason else ""
        return f"paused by {self.by} at {format_time(self.at)}{because}"

    def to_json(self) -> str:
        return json.dumps({"by": self.by, "reason": self.reason, "at": format_time(self.at)})

    @classmethod
    def from_json(cls, text: str, where: str) -> PauseMark:
        try:
            data = json.loads(text)
            return cls(str(data["by"]), str(data["reason"]), parse_time(str(data["at"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise JournalError(f"{where}: not a pause mark ({exc}); remove it") from None


def pause_run(run_dir: Path, mark: PauseMark) -> None:
    """Mark the run paused (durably; a later pause replaces the mark)."""
    replace_file(run_dir / PAUSE_FILE, mark.to_json().encode())


def read_pause(run_dir: Path) -> PauseMark | None:
    """The run's pause mark, or None when it is not paused."""
    path = run_dir / PAUSE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return PauseMark.from_json(text, str(path))


def clear_pause(run_dir: Path) -> PauseMark | None:
    """Remove the run's pause mark; the mark removed, or None when there was none."""
    mark = read_pause(run_dir)
    if mark is not None:
        (run_dir / PAUSE_FILE).unlink(missing_ok=True)
        fsync_dir(run_dir)
    return mark


def describe_pause_of(journal: Journal) -> str:
    """What the run's pause mark says, "" when it is not paused (or kept in the cluster)."""
    if not isinstance(journal.store, RunDirectory):
        return ""
    mark = read_pause(journal.store.run_dir)
    return "" if mark is None else mark.describe()
