"""Where a run's files are, and how they reach the disk so that they survive a crash.

A new name is durable only once the directory holding it is synced, and a replaced file is
whole only if it was written aside, synced, and renamed over the old one: every write of
the run store goes through the few functions here.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from rollout.run.errors import RunNotFound
from rollout.run.records import RunId

STATE_DIR_ENV = "ROLLOUT_STATE_DIR"
RUNS_DIR = "runs"
PLAN_FILE = "plan.json"
JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"
INVOCATION_FILE = "invocation.json"
NODES_DIR = "nodes"
# Invariant 9: a run's files hold the plan's text and what steps saw on nodes; only the
# user who ran it may read them.
FILE_MODE = 0o600
# ... and the directories holding them are closed to others as well
DIR_MODE = 0o700

# Run ids, node names and step kinds become path components: nothing that could step out.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_RUN_ID_TIME = re.compile(r"(\d{8}-\d{6})-")


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$ROLLOUT_STATE_DIR, else ~/.local/state/rollout."""
    env = os.environ if environ is None else environ
    configured = env.get(STATE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path("~/.local/state/rollout").expanduser()


def make_run_id(plan_name: str, at: datetime) -> RunId:
    """<UTC yyyymmdd-hhmmss>-<plan name slug>-<4 hex>: sorts by time, reads at a glance."""
    slug = re.sub(r"[^a-z0-9]+", "-", plan_name.lower()).strip("-")[:40].strip("-") or "run"
    stamp = at.astimezone(UTC).strftime("%Y%m%d-%H%M%S")
    return RunId(f"{stamp}-{slug}-{secrets.token_hex(2)}")


def time_from_run_id(run_id: str) -> datetime | None:
    match = _RUN_ID_TIME.match(run_id)
    if not match:
        return None
    try:
        return datetime.strptime(match.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None


def find_run_dir(state_dir: Path, run_id: str) -> Path:
    """The directory of an existing run; RunNotFound for an unknown or unsafe id."""
    runs_dir = state_dir / RUNS_DIR
    if not NAME_PATTERN.fullmatch(run_id) or not (runs_dir / run_id).is_dir():
        raise RunNotFound(run_id, runs_dir)
    return runs_dir / run_id


def make_dirs_durable(path: Path) -> None:
    """mkdir -p, syncing each parent that gained an entry, so the path survives a crash."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=DIR_MODE)
        fsync_dir(directory.parent)


def _write_synced(path: Path, data: bytes, create_flag: int) -> None:
    """Create `path` (O_EXCL: it must not exist; O_TRUNC: emptied if it does), write, fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | create_flag | os.O_CLOEXEC, FILE_MODE)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist) with `data`, synced; the caller syncs the directory."""
    _write_synced(path, data, os.O_EXCL)


def replace_file(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a synced temporary file renamed over it, then the
    directory synced. A crash leaves the old content or the new, never a torn mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    _write_synced(tmp, data, os.O_TRUNC)
    tmp.replace(path)
    fsync_dir(path.parent)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        # In a container without a passwd entry for our uid (the in-cluster CronJob).
        return f"uid {os.getuid()}"
