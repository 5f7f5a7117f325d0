"""Where a run open for writing keeps what must outlive its process: the seam between the
journal (records, their order, the fold) and the place their bytes live.

`RunDirectory` is a run's directory under the state directory (the default, for a laptop);
`rollout.run.cluster.SecretStore` is a Secret in the cluster, for the scheduled CronJob's pod,
whose files die with it. Either makes every write durable before it returns (an fsync, or
the API server's answer once etcd holds it) and raises JournalWriteFailed when it cannot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rollout.run.errors import JournalMismatch, JournalWriteFailed
from rollout.run.files import JOURNAL_FILE, PLAN_FILE, write_all
from rollout.run.invocation import Invocation, read_invocation
from rollout.run.stepdata import load_step_data, save_step_data


class RunStore(Protocol):
    """The durable half of a run open for writing (its journal, plan, invocation, step data)."""

    @property
    def plan_location(self) -> str:
        """Where plan.json is, for messages: a path, or the cluster object and its key."""
        ...

    def append_journal(self, line: bytes) -> None:
        """Add one journal line; durable when this returns, JournalWriteFailed if not."""
        ...

    def read_plan_text(self) -> str:
        """plan.json as stored (the caller checks its digest); JournalMismatch if unreadable."""
        ...

    def read_invocation(self) -> Invocation: ...

    def save_step_data(self, node: str, step: str, data: Mapping[str, Any]) -> None: ...

    def load_step_data(self, node: str, step: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


class RunDirectory:
    """A run's directory, its journal open for appending and its lock held by this process."""

    def __init__(self, run_dir: Path, run_id: str, *, journal_fd: int, lock_fd: int) -> None:
        self.run_dir = run_dir
        self._run_id = run_id
        self._journal_fd: int | None = journal_fd
        self._lock_fd: int | None = lock_fd

    @property
    def plan_location(self) -> str:
        return str(self.run_dir / PLAN_FILE)

    def append_journal(self, line: bytes) -> None:
        if self._journal_fd is None:
            raise JournalWriteFailed(f"journal of run {self._run_id} is closed")
        try:
            write_all(self._journal_fd, line)
            os.fsync(self._journal_fd)
        except OSError as e:
            raise JournalWriteFailed(
                f"could not write the journal of run {self._run_id} "
                f"({self.run_dir / JOURNAL_FILE}): {e}"
            ) from e

    def read_plan_text(self) -> str:
        return read_plan_file(self.run_dir, self._run_id)

    def read_invocation(self) -> Invocation:
        return read_invocation(self.run_dir, self._run_id)

    def save_step_data(self, node: str, step: str, data: Mapping[str, Any]) -> None:
        save_step_data(self.run_dir, node, step, data)

    def load_step_data(self, node: str, step: str) -> dict[str, Any]:
        return load_step_data(self.run_dir, node, step)

    def close(self) -> None:
        """Release the lock; the journal stays on disk for resume and status."""
        for fd in (self._journal_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._journal_fd = self._lock_fd = None


def read_plan_file(run_dir: Path, run_id: str) -> str:
    """A run directory's plan.json as stored; JournalMismatch when it cannot be read."""
    path = run_dir / PLAN_FILE
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise JournalMismatch(
            f"{path}: cannot read the plan run {run_id} started with ({e}); restore it, or "
            "start a new run"
        ) from None
