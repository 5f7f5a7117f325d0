"""A run's journal: read and checked without a lock, appended to under one.

``journal.jsonl`` is append-only, one JSON record per line. An append returns only after
the line is fsynced, so whatever the executor was told is recorded survives a crash (safety
invariant 7). Reading tolerates exactly one kind of damage: a torn last line, left by a
process killed in the middle of a write. That record was never acknowledged, so dropping it
loses nothing the executor relied on. Any other bad line is an error naming ``file:line``.

The journal is the mark of a run that can be resumed: it appears, with its run-started
record already in it, only after plan.json and invocation.json are on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rollout.closeable import Closeable
from rollout.errors import SourceLocation
from rollout.run.errors import (
    InvalidRecord,
    JournalCorrupt,
    JournalError,
    JournalMismatch,
    JournalWriteFailed,
    RunIncomplete,
)
from rollout.run.files import (
    DIR_MODE,
    FILE_MODE,
    INVOCATION_FILE,
    JOURNAL_FILE,
    NAME_PATTERN,
    PLAN_FILE,
    RUNS_DIR,
    current_user,
    find_run_dir,
    fsync_dir,
    make_dirs_durable,
    make_run_id,
    write_new_file,
)
from rollout.run.invocation import Invocation, read_invocation
from rollout.run.lock import acquire_lock
from rollout.run.records import Clock, Entry, Record, RunId, RunStarted, utc_now
from rollout.run.state import Fold, RunState
from rollout.run.store import RunDirectory, RunStore, read_plan_file

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


def _read_journal(path: Path) -> tuple[JournalContents, Fold]:
    return parse_journal(path.read_bytes(), str(path))


def parse_journal(data: bytes, where: str) -> tuple[JournalContents, Fold]:
    """A journal's bytes checked and folded; `where` (a path, a cluster object) locates lines."""
    entries: list[Entry] = []
    notes: list[str] = []
    fold = Fold()
    pos = 0
    line_no = 0
    while pos < len(data):
        line_no += 1
        end = data.find(b"\n", pos)
        is_last = end == -1 or end == len(data) - 1
        if end == -1:
            notes.append(f"{where}:{line_no}: dropped a torn last record (a write was cut short)")
            break
        try:
            entry = Entry.from_json_line(data[pos:end])
        except ValueError as e:
            if is_last and not _parses_as_json(data[pos:end]):
                notes.append(f"{where}:{line_no}: dropped an unreadable last record ({e})")
                break
            raise JournalCorrupt(SourceLocation(where, line_no), str(e)) from None
        try:
            fold.apply(entry)
        except ValueError as e:
            raise JournalCorrupt(SourceLocation(where, line_no), str(e)) from None
        entries.append(entry)
        pos = end + 1
    if not entries:
        raise JournalCorrupt(
            SourceLocation(where, 1),
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


def _read_run_journal(run_dir: Path, run_id: str) -> tuple[JournalContents, Fold]:
    try:
        return _read_journal(run_dir / JOURNAL_FILE)
    except FileNotFoundError:
        raise RunIncomplete(run_id, run_dir / JOURNAL_FILE) from None


def read_run(state_dir: Path, run_id: str) -> RunState:
    """A run's state without taking its lock: for `rollout status` while another process runs."""
    contents, fold = _read_run_journal(find_run_dir(state_dir, run_id), run_id)
    return fold.freeze(contents.notes)


def read_plan_json(state_dir: Path, run_id: str) -> str:
    """A run's plan.json without taking its lock, checked against its run-started digest."""
    run_dir = find_run_dir(state_dir, run_id)
    _, fold = _read_run_journal(run_dir, run_id)
    return _checked_plan(run_dir, run_id, fold.freeze().plan_digest)


def read_run_invocation(state_dir: Path, run_id: str) -> Invocation:
    """How a run was started, without taking its lock (for `rollout status`)."""
    return read_invocation(find_run_dir(state_dir, run_id), run_id)


def digest_plan(plan_json: str) -> str:
    return "sha256:" + hashlib.sha256(plan_json.encode()).hexdigest()


def _checked_plan(run_dir: Path, run_id: str, expected: str) -> str:
    return check_plan(read_plan_file(run_dir, run_id), str(run_dir / PLAN_FILE), run_id, expected)


def check_plan(text: str, where: str, run_id: str, expected: str) -> str:
    """plan.json's text when it is the one the run started with (its run-started digest)."""
    if digest_plan(text) != expected:
        raise JournalMismatch(
            f"{where} does not match the plan run {run_id} started with "
            f"({expected}): it was changed; restore it, or start a new run"
        )
    return text


# --- appending --------------------------------------------------------------------------------


class Journal(Closeable):
    """A run open for writing by this process alone: its journal, and what is kept beside it
    (plan, invocation, per-step data) in its store: a run directory whose lock this process
    holds (`create`, `open`), or the cluster (`rollout.run.cluster`)."""

    def __init__(
        self,
        store: RunStore,
        run_id: RunId,
        *,
        contents: tuple[JournalContents, Fold] | None,
        clock: Clock,
    ) -> None:
        """Use `create` or `open` (or rollout.run.cluster's `start_run`, `open_run`)."""
        self.store = store
        self.run_id = run_id
        self._clock = clock
        read, fold = contents if contents else (JournalContents((), 0), Fold())
        self._entries = list(read.entries)
        self._notes = read.notes
        self._fold = fold
        self._broken: str | None = None
        self._closed = False
        # The nodes of a wave append from their own threads: one record at a time, so
        # sequence numbers, the fold and the stored lines stay in one order.
        self._lock = threading.RLock()

    @property
    def run_dir(self) -> Path:
        """The run's directory (a run kept in the cluster has none)."""
        if not isinstance(self.store, RunDirectory):
            raise JournalError(f"run {self.run_id} is kept in the cluster, not in a directory")
        return self.store.run_dir

    @property
    def path(self) -> Path:
        return self.run_dir / JOURNAL_FILE

    @classmethod
    def create(
        cls,
        state_dir: Path,
        plan_name: str,
        plan_json: str,
        *,
        invocation: Invocation | None = None,
        run_id: RunId | None = None,
        user: str | None = None,
        host: str | None = None,
        clock: Clock = utc_now,
    ) -> Journal:
        """Start a run: a run directory with plan.json (and invocation.json), then its journal.

        The journal, with its run-started record, is written aside and renamed into place
        last, so a crash at any point leaves either a complete run or one with no journal
        (which nothing will try to resume). `run_id`: an id chosen beforehand (the Lease
        names it); by default a fresh one.
        """
        runs_dir = state_dir / RUNS_DIR
        make_dirs_durable(runs_dir)
        started_at = clock()
        run_id, run_dir = _make_run_dir(runs_dir, plan_name, started_at, run_id)
        lock_fd = -1
        journal_fd = -1
        try:
            lock_fd = acquire_lock(run_dir, run_id)
            write_new_file(run_dir / PLAN_FILE, plan_json.encode())
            if invocation is not None:
                write_new_file(run_dir / INVOCATION_FILE, invocation.to_json())
            staged = run_dir / f".{JOURNAL_FILE}.new"
            journal_fd = os.open(
                staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, FILE_MODE
            )
            store = RunDirectory(run_dir, run_id, journal_fd=journal_fd, lock_fd=lock_fd)
            journal = cls(store, run_id, contents=None, clock=clock)
            journal.start(plan_name, plan_json, user=user, host=host, at=started_at)
            staged.rename(run_dir / JOURNAL_FILE)
            # Every new name (lock, plan.json, invocation.json, journal.jsonl) is durable
            # only once the directory itself is synced.
            fsync_dir(run_dir)
        except BaseException:
            for fd in (journal_fd, lock_fd):
                if fd >= 0:
                    os.close(fd)
            # Nothing acted on this run yet: leave no half-made run behind.
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return journal

    def start(
        self,
        plan_name: str,
        plan_json: str,
        *,
        user: str | None,
        host: str | None,
        at: datetime | None = None,
    ) -> Entry:
        """Journal the run-started record, the first of a new run (its store already holds
        plan.json, or writes it with this record)."""
        with self._lock:
            return self._append(
                RunStarted(
                    run_id=self.run_id,
                    plan_name=plan_name,
                    plan_digest=digest_plan(plan_json),
                    user=user if user is not None else current_user(),
                    host=host if host is not None else socket.gethostname(),
                ),
                at or self._clock(),
            )

    @classmethod
    def open(cls, state_dir: Path, run_id: str, *, clock: Clock = utc_now) -> Journal:
        """Take over an existing run to append to it (resume, rollback); JournalLocked if busy."""
        run_dir = find_run_dir(state_dir, run_id)
        lock_fd = acquire_lock(run_dir, run_id)
        try:
            contents, fold = _read_run_journal(run_dir, run_id)
            path = run_dir / JOURNAL_FILE
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
        store = RunDirectory(run_dir, run_id, journal_fd=journal_fd, lock_fd=lock_fd)
        return cls(store, RunId(run_id), contents=(contents, fold), clock=clock)

    def append(self, record: Record) -> Entry:
        """Write one record durably; when this returns, the record survives a crash.

        Safe from several threads: appends are serialised, each gets the next sequence number.
        """
        with self._lock:
            return self._append(record, self._clock())

    def _append(self, record: Record, at: datetime) -> Entry:
        if self._closed:
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
            self.store.append_journal(line)
        except JournalWriteFailed as e:
            # The stored journal may now end in a partial line (a file), or another writer
            # holds the run (the cluster): only a reopen is safe.
            self._broken = str(e)
            raise
        return entry

    def entries(self) -> tuple[Entry, ...]:
        with self._lock:
            return tuple(self._entries)

    def replay(self) -> RunState:
        """The run's state from every record so far."""
        with self._lock:
            if self._broken is not None:
                raise JournalWriteFailed(f"journal of run {self.run_id} is unusable: reopen it")
            return self._fold.freeze(self._notes)

    def read_plan_json(self) -> str:
        """plan.json as written at the start, checked against the digest in run-started."""
        with self._lock:
            text = self.store.read_plan_text()
        digest = self._fold.freeze().plan_digest
        return check_plan(text, self.store.plan_location, self.run_id, digest)

    def read_invocation(self) -> Invocation:
        """How the run was started; InvocationUnreadable when missing or damaged."""
        with self._lock:
            return self.store.read_invocation()

    def save_step_data(self, node: str, step: str, data: Mapping[str, Any]) -> None:
        """Keep what later steps (or a resumed run) need from this node's step, durably."""
        with self._lock:
            self.store.save_step_data(node, step, data)

    def load_step_data(self, node: str, step: str) -> dict[str, Any]:
        """What this node's step saved; {} when it saved nothing."""
        with self._lock:
            return self.store.load_step_data(node, step)

    def close(self) -> None:
        """Let the run go (its lock, in a directory); what is stored stays for resume and status."""
        self._closed = True
        self.store.close()


def _make_run_dir(
    runs_dir: Path, plan_name: str, at: datetime, chosen: RunId | None
) -> tuple[RunId, Path]:
    if chosen is not None and not NAME_PATTERN.fullmatch(chosen):
        raise JournalError(f"{chosen!r} cannot be a run id: letters, digits, '.', '_', '-'")
    for _ in range(1 if chosen else 16):
        run_id = chosen or make_run_id(plan_name, at)
        run_dir = runs_dir / run_id
        try:
            run_dir.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        fsync_dir(runs_dir)
        return run_id, run_dir
    raise JournalError(
        f"could not make a new run directory in {runs_dir}: "
        + (f"run {chosen} already exists" if chosen else "every name was taken")
    )
