"""A run's lock: the one process allowed to append to its journal, and whether one is alive.

The lock is an flock on ``<run>/lock`` with the holder's pid and host written inside. The
kernel drops an flock the moment its process dies, so a held lock means a live holder: that
is how `rollout status` tells a running run from an interrupted one.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from rollout.run.errors import JournalLocked
from rollout.run.files import FILE_MODE, LOCK_FILE
from rollout.run.records import format_time, utc_now

# `rollout status` takes the lock shared for an instant to see whether it is free; a run
# starting in that instant waits this long for it rather than reporting a false holder.
_ACQUIRE_TRIES = 20
_ACQUIRE_PAUSE_S = 0.01


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run's lock, as written in the lock file (unknown until they wrote it)."""

    pid: int | None
    host: str | None

    def __str__(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "a process"
        return who + (f" on {self.host}" if self.host else "")


def acquire_lock(run_dir: Path, run_id: str) -> int:
    """flock the run's lock file and write our pid in it; JournalLocked names the holder."""
    path = run_dir / LOCK_FILE
    # O_CLOEXEC: a child process (ssh, kubectl) must not inherit, and so outlive, the lock.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        for attempt in range(_ACQUIRE_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt + 1 == _ACQUIRE_TRIES or _held_exclusively(path):
                    holder = _read_holder(fd)
                    raise JournalLocked(run_id, path, holder.pid, holder.host) from None
                time.sleep(_ACQUIRE_PAUSE_S)
    except BaseException:
        os.close(fd)
        raise
    holder_doc = {"pid": os.getpid(), "host": socket.gethostname(), "since": format_time(utc_now())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder_doc) + "\n").encode(), 0)
    return fd


def find_lock_holder(run_dir: Path) -> LockHolder | None:
    """The live process holding the run's lock, or None when no process does."""
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            # Shared and non-blocking: refused only while someone holds it exclusively.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _held_exclusively(path: Path) -> bool:
    """Whether a shared probe is refused too: then an appender, not a status probe, holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _read_holder(fd: int) -> LockHolder:
    """Who holds the lock, from the file; unknown fields if the holder has not written yet."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return LockHolder(None, None)
    if not isinstance(doc, dict):
        return LockHolder(None, None)
    pid, host = doc.get("pid"), doc.get("host")
    return LockHolder(
        pid if isinstance(pid, int) else None,
        host if isinstance(host, str) else None,
    )
