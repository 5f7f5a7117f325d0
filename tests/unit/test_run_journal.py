"""The run store's journal: creating and opening runs, torn and corrupt lines, fsync, locking,
real kills."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.errors import ExitCode, RolloutError
from rollout.run import (
    JOURNAL_FILE,
    PLAN_FILE,
    CordonedByRollout,
    InvalidRecord,
    Journal,
    JournalCorrupt,
    JournalLocked,
    JournalMismatch,
    JournalWriteFailed,
    Record,
    RunHalted,
    RunNotFound,
    StepFinished,
    StepStarted,
    default_state_dir,
    make_run_id,
    read_journal,
    read_run,
)
from tests.lab.labapi import wait_for
from tests.unit.runfakes import (
    PLAN_JSON,
    REPO,
    kill_lock_holder,
    run_node,
    start_lock_holder,
)

# --- creating and opening -----------------------------------------------------------------


def test_create_lays_out_the_run_dir(journal: Journal, tmp_path: Path) -> None:
    assert journal.run_dir == tmp_path / "runs" / journal.run_id
    assert journal.read_plan_json() == PLAN_JSON
    assert sorted(p.name for p in journal.run_dir.iterdir()) == [
        "journal.jsonl",
        "lock",
        "plan.json",
    ]
    state = journal.replay()
    assert state.run_id == journal.run_id
    assert (state.plan_name, state.user, state.host) == ("registry-mirror", "ops", "laptop")
    assert state.plan_digest.startswith("sha256:") and len(state.plan_digest) == 7 + 64
    assert state.started_at == datetime(2026, 11, 29, 23, 15, tzinfo=UTC)
    assert state.last_seq == 1 and state.nodes == () and not state.finished


def test_run_id_shape() -> None:
    at = datetime(2026, 11, 29, 23, 15, tzinfo=UTC)
    run_id = make_run_id("Registry Mirror / EU!", at)
    assert run_id.startswith("20261129-231500-registry-mirror-eu-")
    assert len(run_id.rsplit("-", 1)[1]) == 4
    assert make_run_id("???", at).startswith("20261129-231500-run-")
    assert len(make_run_id("x" * 200, at)) < 70


def test_user_and_host_default_to_this_process(tmp_path: Path) -> None:
    with Journal.create(tmp_path, "p", PLAN_JSON) as journal:
        state = journal.replay()
    assert state.user and state.host


def test_state_dir_from_environment(tmp_path: Path) -> None:
    assert default_state_dir({"ROLLOUT_STATE_DIR": str(tmp_path)}) == tmp_path
    assert default_state_dir({"HOME": "/nonexistent"}).parts[-3:] == (".local", "state", "rollout")


@pytest.mark.parametrize("run_id", ["nope", "../runs", ".", "..", "a/b", ""])
def test_unknown_run(tmp_path: Path, run_id: str) -> None:
    (tmp_path / "runs").mkdir()
    with pytest.raises(RunNotFound) as caught:
        Journal.open(tmp_path, run_id)
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    with pytest.raises(RunNotFound):
        read_run(tmp_path, run_id)


def test_errors_are_rollout_errors() -> None:
    for error in (JournalCorrupt, JournalLocked, RunNotFound, InvalidRecord, JournalMismatch):
        assert issubclass(error, RolloutError)


def test_changed_plan_json_is_detected(journal: Journal) -> None:
    (journal.run_dir / PLAN_FILE).write_text(PLAN_JSON.replace("gpu-2", "gpu-3"))
    with pytest.raises(JournalMismatch, match="was changed"):
        journal.read_plan_json()


# --- torn and corrupt lines -----------------------------------------------------------------


def write_journal_bytes(journal: Journal) -> tuple[Path, str, bytes]:
    run_node(journal, "gpu-1")
    journal.close()
    return journal.run_dir.parent.parent, journal.run_id, journal.path.read_bytes()


@pytest.mark.parametrize(
    "tail",
    [
        b'{"seq": 99, "at": "2026-11-2',  # cut mid-record
        b'{"seq": 24, "at": "2026-11-29T23:15:00Z", "kind": "uncordoned", "node": "gpu-1"}',
        b"\x00\x00\x00\x00",  # a crash left zeroed blocks past the end
        b"\x00\x00\x00\n",
        b'{"seq": 24, "at": "2026-11-2\n',
    ],
    ids=["cut", "complete-json-without-newline", "zeros", "zeros-newline", "cut-newline"],
)
def test_torn_last_line_is_dropped_with_a_note(journal: Journal, tail: bytes) -> None:
    state_dir, run_id, good = write_journal_bytes(journal)
    expected = read_run(state_dir, run_id)
    path = journal.path
    path.write_bytes(good + tail)
    lines = good.count(b"\n") + 1

    state = read_run(state_dir, run_id)
    assert state.last_seq == expected.last_seq and state.nodes == expected.nodes
    (note,) = state.notes
    assert note.startswith(f"{path}:{lines}: dropped")

    # Opening to append cuts the torn tail, so the next record starts on a fresh line.
    with Journal.open(state_dir, run_id) as reopened:
        assert reopened.replay().notes == state.notes
        assert path.read_bytes() == good
        reopened.append(RunHalted("after the tear"))
    assert read_run(state_dir, run_id).halted_reason == "after the tear"
    assert read_run(state_dir, run_id).notes == ()


def test_corrupt_middle_line_names_file_and_line(journal: Journal) -> None:
    state_dir, run_id, good = write_journal_bytes(journal)
    lines = good.splitlines(keepends=True)
    lines[4] = b'{"seq": 5, "at": "2026-11-2\n'
    journal.path.write_bytes(b"".join(lines))
    for read in (lambda: read_run(state_dir, run_id), lambda: Journal.open(state_dir, run_id)):
        with pytest.raises(JournalCorrupt) as caught:
            read()
        assert str(caught.value).startswith(f"{journal.path}:5: not a JSON record")
        assert caught.value.location.line == 5


@pytest.mark.parametrize(
    ("mangle", "line", "problem"),
    [
        (lambda ls: ls[:3] + ls[4:], 4, "sequence number 5, expected 4"),
        (lambda ls: [ls[0], ls[0], *ls[1:]], 2, "sequence number 1, expected 2"),
        (lambda ls: [*ls[:-1], b'{"seq": 1}\n'], None, "'at'"),  # valid JSON, bad record
        (lambda ls: [*ls[:2], b"\n", *ls[2:]], 3, "not a JSON record"),
        (
            lambda ls: [
                b'{"seq": 1, "at": "2026-01-01T00:00:00Z", "kind": "uncordoned", "node": "a"}\n',
                *ls[1:],
            ],
            1,
            "before run-started",
        ),
    ],
    ids=["gap", "repeat", "bad-last-record", "blank-line", "no-run-started"],
)
def test_inconsistent_journal_is_an_error(
    journal: Journal, mangle: object, line: int | None, problem: str
) -> None:
    state_dir, run_id, good = write_journal_bytes(journal)
    lines = good.splitlines(keepends=True)
    mangled = mangle(lines)  # type: ignore[operator]
    journal.path.write_bytes(b"".join(mangled))
    with pytest.raises(JournalCorrupt, match=problem) as caught:
        read_run(state_dir, run_id)
    assert caught.value.location.line == (line or len(mangled))


def test_empty_journal_is_an_error(journal: Journal) -> None:
    journal.close()
    journal.path.write_bytes(b"")
    with pytest.raises(JournalCorrupt, match="no records"):
        read_journal(journal.path)


# --- durability -----------------------------------------------------------------------------


def count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"file": 0, "dir": 0}
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        counts["dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"] += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    return counts


def test_every_append_is_fsynced(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = count_fsyncs(monkeypatch)
    for n in range(1, 6):
        journal.append(CordonedByRollout(f"gpu-{n}"))
        assert counts == {"file": n, "dir": 0}


def test_create_fsyncs_files_and_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = count_fsyncs(monkeypatch)
    with Journal.create(tmp_path / "fresh" / "state", "p", PLAN_JSON):
        pass
    # plan.json and the run-started record; runs/ and its new parents, and the run dir
    assert counts["file"] == 2
    assert counts["dir"] >= 4


def test_failed_write_makes_the_journal_unusable_until_reopened(
    journal: Journal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", full_disk)
        with pytest.raises(JournalWriteFailed, match="No space left"):
            journal.append(CordonedByRollout("gpu-1"))
    with pytest.raises(JournalWriteFailed, match="reopen"):
        journal.append(CordonedByRollout("gpu-1"))
    journal.close()
    with Journal.open(tmp_path, journal.run_id) as reopened:
        assert reopened.append(CordonedByRollout("gpu-1")).seq == 2


def test_append_after_close_is_refused(journal: Journal) -> None:
    journal.close()
    journal.close()  # twice is fine
    with pytest.raises(JournalWriteFailed, match="closed"):
        journal.append(CordonedByRollout("gpu-1"))


# The writer of the kill test: records are a pure function of their sequence number, so the
# test knows exactly what a prefix must look like. Large details make torn writes likely.
RECORD_FOR_SEQ = """
from rollout.run import StepFinished, StepOutcome, StepStarted

def record_for_seq(seq):
    node = f"gpu-{seq // 2}"
    if seq % 2 == 0:
        return StepStarted(node, 0, "containerd.write", 1)
    return StepFinished(node, 0, "containerd.write", 1, StepOutcome.DONE, f"{seq}:" + "x" * 200_000)
"""

WRITER = (
    RECORD_FOR_SEQ
    + """
import sys
from pathlib import Path
from rollout.run import Journal

journal = Journal.open(Path(sys.argv[1]), sys.argv[2])
acked = open(sys.argv[3], "a", buffering=1)
acked.write("ready\\n")
seq = journal.replay().last_seq
while True:
    seq += 1
    journal.append(record_for_seq(seq))
    acked.write(f"{seq}\\n")  # only after append returned: the record is acknowledged
"""
)


_WRITER_NAMESPACE: dict[str, object] = {}
exec(RECORD_FOR_SEQ, _WRITER_NAMESPACE)


def record_for_seq(seq: int) -> Record:
    """The record the writer appends as number `seq`, from the very code the writer runs."""
    record = _WRITER_NAMESPACE["record_for_seq"](seq)  # type: ignore[operator]
    assert isinstance(record, StepStarted | StepFinished)
    return record


def wait_for_line(path: Path, text: str, timeout_s: float = 20.0) -> None:
    def written() -> bool:
        return path.exists() and text in path.read_text().splitlines()

    wait_for(written, timeout_s, what=f"the writer to write {text!r}", interval_s=0.005)


def test_sigkill_at_random_moments_leaves_a_replayable_prefix(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    with Journal.create(tmp_path, "kill-test", PLAN_JSON) as journal:
        run_id = journal.run_id
    acked_seq = 1
    torn = 0
    for round_no in range(8):
        acked = tmp_path / f"acked-{round_no}"
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), run_id, str(acked)], cwd=REPO
        )
        try:
            wait_for_line(acked, "ready")
            time.sleep(rng.uniform(0.0, 0.15))
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
        acks = [int(x) for x in acked.read_text().split() if x != "ready"]
        acked_seq = max([acked_seq, *acks])

        contents = read_journal(journal.path)
        torn += bool(contents.notes)
        entries = contents.entries
        last_seq = entries[-1].seq
        context = f"seed {seed}, round {round_no}"
        assert [e.seq for e in entries] == list(range(1, len(entries) + 1)), context
        assert [e.record for e in entries[1:]] == [
            record_for_seq(s) for s in range(2, len(entries) + 1)
        ], context
        # Everything the writer was told is durable is there (and maybe one record more).
        assert acked_seq <= last_seq <= acked_seq + 1, context
        acked_seq = last_seq
    print(f"kill test: seed {seed}, {torn} of 8 kills left a torn last line, {acked_seq} records")
    with Journal.open(tmp_path, run_id) as journal:
        assert journal.replay().last_seq == acked_seq


# --- locking ------------------------------------------------------------------------------


def test_second_process_gets_journal_locked_with_the_pid(journal: Journal, tmp_path: Path) -> None:
    journal.close()
    holder = start_lock_holder(tmp_path, journal.run_id)
    try:
        with pytest.raises(JournalLocked) as caught:
            Journal.open(tmp_path, journal.run_id)
        assert caught.value.pid == holder.pid
        assert f"in use by pid {holder.pid}" in str(caught.value)
        # Reading never needs the lock: `rollout status` works while a run is going.
        assert read_run(tmp_path, journal.run_id).last_seq == 1
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=20) == 0
    with Journal.open(tmp_path, journal.run_id):
        pass


def test_lock_is_per_open_not_per_process(journal: Journal, tmp_path: Path) -> None:
    with pytest.raises(JournalLocked) as caught:
        Journal.open(tmp_path, journal.run_id)
    assert caught.value.pid == os.getpid()
    journal.close()
    with Journal.open(tmp_path, journal.run_id):
        pass


def test_lock_is_released_when_the_holder_is_killed(journal: Journal, tmp_path: Path) -> None:
    journal.close()
    holder = start_lock_holder(tmp_path, journal.run_id)
    kill_lock_holder(holder)
    with Journal.open(tmp_path, journal.run_id):
        pass


def test_journal_file_name_is_stable() -> None:
    # Other tools (status, the CronJob's log scraper) read this path; renaming it breaks them.
    assert JOURNAL_FILE == "journal.jsonl"
