"""The run store's listing: every run newest first, broken runs reported, and where each run
stands: finished, halted, running or interrupted."""

from __future__ import annotations

import fcntl
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rollout.run import (
    LOCK_FILE,
    Journal,
    JournalLocked,
    RunFinished,
    RunHalted,
    RunOutcome,
    RunPhase,
    latest_run,
    list_runs,
    lock_holder,
)
from tests.unit.runfakes import PLAN_JSON, FakeClock


def test_list_runs_newest_first(tmp_path: Path) -> None:
    assert list_runs(tmp_path) == [] and latest_run(tmp_path) is None
    base = datetime(2026, 11, 29, 23, 15, tzinfo=UTC)
    # Out of order, and two within one second: ordering must not depend on creation order.
    offsets_s = [60.0, 0.0, 3600.0, 60.25]
    ids: dict[float, str] = {}
    for offset_s in offsets_s:
        clock = FakeClock(base + timedelta(seconds=offset_s))
        with Journal.create(tmp_path, f"plan-{offset_s}", PLAN_JSON, clock=clock) as j:
            ids[offset_s] = j.run_id
    runs = list_runs(tmp_path)
    assert [r.run_id for r in runs] == [ids[o] for o in sorted(offsets_s, reverse=True)]
    assert runs[0].plan_name == "plan-3600.0" and runs[0].problem is None
    latest = latest_run(tmp_path)
    assert latest is not None and latest.run_id == ids[3600.0]


def test_list_runs_reports_broken_runs_and_ignores_strays(tmp_path: Path) -> None:
    at = datetime(2026, 11, 29, 23, 15, tzinfo=UTC)
    with Journal.create(tmp_path, "good", PLAN_JSON, clock=lambda: at) as journal:
        journal.append(RunFinished(RunOutcome.SUCCEEDED))
    runs_dir = tmp_path / "runs"
    (runs_dir / "20261201-000000-broken-0000").mkdir()
    (runs_dir / ".tmp").mkdir()
    (runs_dir / "README").write_text("not a run")
    runs = list_runs(tmp_path)
    assert [r.run_id for r in runs] == ["20261201-000000-broken-0000", journal.run_id]
    broken, good = runs
    assert broken.problem is not None and "journal.jsonl" in broken.problem
    assert broken.started_at == datetime(2026, 12, 1, tzinfo=UTC)
    assert good.outcome is RunOutcome.SUCCEEDED and good.last_at == at


def test_each_run_says_where_it_stands(tmp_path: Path) -> None:
    with Journal.create(tmp_path, "halted", PLAN_JSON) as journal:
        journal.append(RunHalted("gpu-2 labelled upgrade-failed"))
    with Journal.create(tmp_path, "finished", PLAN_JSON) as journal:
        journal.append(RunFinished(RunOutcome.SUCCEEDED))
    with Journal.create(tmp_path, "interrupted", PLAN_JSON):
        pass
    running = Journal.create(tmp_path, "running", PLAN_JSON)
    try:
        phases = {r.plan_name: (r.phase, r.holder) for r in list_runs(tmp_path)}
        holder = lock_holder(tmp_path, running.run_id)
    finally:
        running.close()
    assert holder is not None and holder.pid == os.getpid() and holder.host
    assert phases == {
        "halted": (RunPhase.HALTED, None),
        "finished": (RunPhase.FINISHED, None),
        "interrupted": (RunPhase.INTERRUPTED, None),
        "running": (RunPhase.RUNNING, holder),
    }
    assert lock_holder(tmp_path, running.run_id) is None, "closed: nobody holds it"


def test_looking_at_a_run_does_not_make_it_look_busy(tmp_path: Path) -> None:
    """`rollout status` takes the lock shared for an instant; a resume in that instant waits."""
    with Journal.create(tmp_path, "p", PLAN_JSON) as journal:
        run_id, lock = journal.run_id, journal.run_dir / LOCK_FILE
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a status probe, caught in the act
    threading.Timer(0.05, os.close, (fd,)).start()
    with Journal.open(tmp_path, run_id):
        pass


def test_a_lock_held_shared_for_too_long_is_reported(tmp_path: Path) -> None:
    with Journal.create(tmp_path, "p", PLAN_JSON) as journal:
        run_id, lock = journal.run_id, journal.run_dir / LOCK_FILE
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        with pytest.raises(JournalLocked, match=f"run {run_id} is in use"):
            Journal.open(tmp_path, run_id)
    finally:
        os.close(fd)
