"""The run journal: records, replay, torn and corrupt lines, fsync, locking, real kills."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from rollout.errors import ExitCode, RolloutError
from rollout.journal import (
    JOURNAL_FILE,
    Backup,
    BackupWritten,
    CordonedByRollout,
    Entry,
    InvalidRecord,
    Journal,
    JournalCorrupt,
    JournalLocked,
    JournalMismatch,
    JournalWriteFailed,
    NodeFinished,
    NodeOutcome,
    Record,
    RecordKind,
    RunFinished,
    RunHalted,
    RunNotFound,
    RunOutcome,
    RunResumed,
    RunStarted,
    StepFinished,
    StepOutcome,
    StepRef,
    StepStarted,
    StepUndone,
    Uncordoned,
    default_state_dir,
    latest_run,
    list_runs,
    make_run_id,
    read_journal,
    read_run,
)

REPO = Path(__file__).resolve().parents[2]
PLAN_JSON = json.dumps({"name": "registry-mirror", "waves": [["gpu-1", "gpu-2"]]})
STEPS = ("cordon", "drain", "containerd.write", "systemd.restart", "uncordon")


class FakeClock:
    """A clock that ticks one second per call, so timestamps are exact in tests."""

    def __init__(self, start: datetime = datetime(2026, 11, 29, 23, 15, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        current = self.now
        self.now += timedelta(seconds=1)
        return current


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal.create(
        tmp_path, "registry-mirror", PLAN_JSON, user="ops", host="laptop", clock=FakeClock()
    ) as j:
        yield j


def run_node(journal: Journal, node: str, steps: tuple[str, ...] = STEPS) -> None:
    """Journal a node going through all its steps successfully."""
    for index, kind in enumerate(steps):
        journal.append(StepStarted(node, index, kind, 1))
        if kind == "cordon":
            journal.append(CordonedByRollout(node))
        if kind == "containerd.write":
            journal.append(BackupWritten(node, "/etc/a.toml", "/var/backup/a.toml", "ab" * 32))
        if kind == "uncordon":
            journal.append(Uncordoned(node))
        journal.append(StepFinished(node, index, kind, 1, StepOutcome.DONE, "ok"))
    journal.append(NodeFinished(node, NodeOutcome.SUCCEEDED))


# --- records ------------------------------------------------------------------------------


EVERY_RECORD: list[Record] = [
    RunStarted("20261129-231500-x-ab12", "x", "sha256:00", "ops", "laptop"),
    RunResumed("ops", "cron-pod"),
    StepStarted("gpu-1", 2, "containerd.write", 1),
    StepFinished("gpu-1", 2, "containerd.write", 1, StepOutcome.DONE, "wrote 1 file"),
    StepFinished("gpu-1", 3, "gpu.wait", 2, StepOutcome.NOOP),
    StepFinished("gpu-1", 3, "gpu.wait", 2, StepOutcome.FAILED, "0 of 4 GPUs after 300 s"),
    StepUndone("gpu-1", 2, "containerd.write", "restored 1 file"),
    NodeFinished("gpu-1", NodeOutcome.LEFT_CORDONED, "halted: upgrade-failed on gpu-2"),
    NodeFinished("gpu-1", NodeOutcome.ROLLED_BACK),
    CordonedByRollout("gpu-1"),
    Uncordoned("gpu-1"),
    BackupWritten("gpu-1", "/etc/containerd/config.toml", "/var/lib/rollout/b/config.toml", "0f"),
    RunHalted("gpu-2 labelled upgrade-failed"),
    RunFinished(RunOutcome.HALTED),
]


def test_every_record_kind_is_covered() -> None:
    assert {r.kind for r in EVERY_RECORD} == set(RecordKind)


@pytest.mark.parametrize("record", EVERY_RECORD, ids=lambda r: r.kind.value)
def test_record_round_trip(record: Record) -> None:
    entry = Entry(7, datetime(2026, 11, 29, 23, 15, 0, 123456, tzinfo=UTC), record)
    line = entry.to_json_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert (doc["seq"], doc["at"], doc["kind"]) == (
        7,
        "2026-11-29T23:15:00.123456Z",
        record.kind.value,
    )
    assert Entry.from_json_line(line.rstrip(b"\n")) == entry


def test_non_ascii_detail_round_trips() -> None:
    entry = Entry(2, datetime(2026, 1, 1, tzinfo=UTC), RunHalted("Knoten grün → rot\nzweite"))
    assert Entry.from_json_line(entry.to_json_line()) == entry


def test_round_trip_through_the_disk(tmp_path: Path) -> None:
    with Journal.create(tmp_path, "plan", PLAN_JSON, clock=FakeClock()) as journal:
        run_node(journal, "gpu-1")
        journal.append(RunHalted("operator said so"))
        journal.append(RunResumed("ops", "laptop"))
        journal.append(StepStarted("gpu-2", 0, "cordon", 1))
        journal.append(StepFinished("gpu-2", 0, "cordon", 1, StepOutcome.FAILED, "409"))
        journal.append(StepUndone("gpu-2", 0, "cordon"))
        journal.append(NodeFinished("gpu-2", NodeOutcome.ROLLED_BACK, "cordon failed"))
        journal.append(RunFinished(RunOutcome.FAILED))
        written = journal.entries()
        run_id = journal.run_id
    kinds = {e.record.kind for e in written}
    assert kinds == set(RecordKind)
    with Journal.open(tmp_path, run_id) as reopened:
        assert reopened.entries() == written
        assert reopened.replay() == journal.replay()


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"[1, 2]", "expected a JSON object"),
        (b'{"at": "2026-01-01T00:00:00Z", "kind": "uncordoned", "node": "a"}', "'seq'"),
        (b'{"seq": 1, "kind": "uncordoned", "node": "a"}', "'at'"),
        (b'{"seq": 1, "at": "yesterday", "kind": "uncordoned", "node": "a"}', "bad timestamp"),
        (
            b'{"seq": 1, "at": "2026-01-01T00:00:00", "kind": "uncordoned", "node": "a"}',
            "time zone",
        ),
        (b'{"seq": 1, "at": "2026-01-01T00:00:00Z", "kind": "exploded"}', "unknown record kind"),
        (b'{"seq": 1, "at": "2026-01-01T00:00:00Z", "kind": "uncordoned"}', "missing field 'node'"),
        (
            b'{"seq": 1, "at": "2026-01-01T00:00:00Z", "kind": "run-finished", "outcome": "great"}',
            "expected one of succeeded, failed, halted, aborted",
        ),
        (
            b'{"seq": 1, "at": "2026-01-01T00:00:00Z", "kind": "step-started", "node": "a",'
            b' "step_index": "2", "step": "x", "attempt": 1}',
            "step_index is '2', expected int",
        ),
        (
            b'{"seq": 1, "at": "2026-01-01T00:00:00Z", "kind": "step-started", "node": "a",'
            b' "step_index": true, "step": "x", "attempt": 1}',
            "expected int",
        ),
    ],
)
def test_bad_records_say_what_is_wrong(line: bytes, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        Entry.from_json_line(line)
    assert problem in str(caught.value)


def test_unknown_fields_are_ignored_for_newer_writers() -> None:
    line = b'{"seq": 3, "at": "2026-01-01T00:00:00Z", "kind": "uncordoned", "node": "a", "by": "x"}'
    assert Entry.from_json_line(line).record == Uncordoned("a")


def test_naive_timestamps_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        Journal.create(tmp_path, "p", PLAN_JSON, clock=lambda: datetime(2026, 1, 1))


def test_timestamps_are_utc(tmp_path: Path) -> None:
    plus_two = datetime(2026, 11, 30, 1, 15, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    with Journal.create(tmp_path, "p", PLAN_JSON, clock=lambda: plus_two) as journal:
        line = journal.path.read_text().splitlines()[0]
    assert json.loads(line)["at"] == "2026-11-30T01:15:00.000000Z"


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
    journal.plan_path.write_text(PLAN_JSON.replace("gpu-2", "gpu-3"))
    with pytest.raises(JournalMismatch, match="was changed"):
        journal.read_plan_json()


# --- replay ---------------------------------------------------------------------------------


def test_replay_of_a_complete_node(journal: Journal) -> None:
    run_node(journal, "gpu-1")
    journal.append(RunFinished(RunOutcome.SUCCEEDED))
    state = journal.replay()
    node = state.node("gpu-1")
    assert [c.kind for c in node.completed] == list(STEPS)
    assert all(state.is_step_done("gpu-1", StepRef(i, k)) for i, k in enumerate(STEPS))
    assert node.in_flight is None and node.outcome is NodeOutcome.SUCCEEDED
    assert not node.cordoned_by_rollout and state.cordoned_nodes() == ()
    assert node.backups == (
        Backup("/etc/a.toml", "/var/backup/a.toml", "ab" * 32, node.backups[0].written_at),
    )
    assert state.next_step("gpu-1", STEPS) is None
    assert state.pending_nodes(["gpu-1", "gpu-2"]) == ("gpu-2",)
    assert state.outcome is RunOutcome.SUCCEEDED and state.finished


def test_killed_after_step_started_leaves_the_step_in_flight(journal: Journal) -> None:
    journal.append(StepStarted("gpu-1", 0, "cordon", 1))
    journal.append(CordonedByRollout("gpu-1"))
    journal.append(StepFinished("gpu-1", 0, "cordon", 1, StepOutcome.DONE))
    journal.append(StepStarted("gpu-1", 1, "drain", 1))
    journal.close()  # as good as a kill: nothing more reaches the file

    state = read_run(journal.run_dir.parent.parent, journal.run_id)
    flying = state.step_in_flight("gpu-1")
    assert flying is not None and flying.ref == StepRef(1, "drain") and flying.attempt == 1
    assert state.is_step_done("gpu-1", StepRef(0, "cordon"))
    assert not state.is_step_done("gpu-1", StepRef(1, "drain"))
    assert state.next_step("gpu-1", STEPS) == StepRef(1, "drain")
    assert state.next_attempt("gpu-1", StepRef(1, "drain")) == 2
    assert state.next_attempt("gpu-1", StepRef(2, "containerd.write")) == 1
    assert state.cordoned_nodes() == ("gpu-1",)
    assert state.pending_nodes(["gpu-1", "gpu-2"]) == ("gpu-1", "gpu-2")


def test_resume_retries_the_step_in_flight(journal: Journal, tmp_path: Path) -> None:
    journal.append(StepStarted("gpu-1", 0, "cordon", 1))
    journal.close()
    with Journal.open(tmp_path, journal.run_id, clock=FakeClock()) as resumed:
        resumed.append(RunResumed("ops", "laptop"))
        resumed.append(StepStarted("gpu-1", 0, "cordon", 2))
        resumed.append(StepFinished("gpu-1", 0, "cordon", 2, StepOutcome.NOOP, "already"))
        state = resumed.replay()
    assert state.step_in_flight("gpu-1") is None
    (done,) = state.node("gpu-1").completed
    assert (done.outcome, done.attempt) == (StepOutcome.NOOP, 2)


def test_failed_step_then_rollback(journal: Journal) -> None:
    for index, kind in enumerate(STEPS[:3]):
        journal.append(StepStarted("gpu-1", index, kind, 1))
        journal.append(StepFinished("gpu-1", index, kind, 1, StepOutcome.DONE))
    journal.append(StepStarted("gpu-1", 3, "systemd.restart", 1))
    journal.append(StepFinished("gpu-1", 3, "systemd.restart", 1, StepOutcome.FAILED, "exit 1"))
    failed = journal.replay().node("gpu-1").last_failure
    assert failed is not None and failed.ref == StepRef(3, "systemd.restart")
    assert failed.detail == "exit 1"
    assert journal.replay().next_step("gpu-1", STEPS) == StepRef(3, "systemd.restart")
    for index in (3, 2, 1, 0):
        journal.append(StepUndone("gpu-1", index, STEPS[index]))
    journal.append(NodeFinished("gpu-1", NodeOutcome.ROLLED_BACK, "systemd.restart failed"))
    journal.append(RunHalted("gpu-1 failed"))
    journal.append(RunFinished(RunOutcome.HALTED))
    state = journal.replay()
    node = state.node("gpu-1")
    assert node.completed == () and [u.index for u in node.undone] == [3, 2, 1, 0]
    assert (node.outcome, node.outcome_reason) == (
        NodeOutcome.ROLLED_BACK,
        "systemd.restart failed",
    )
    assert state.halted_reason == "gpu-1 failed" and state.outcome is RunOutcome.HALTED
    assert state.pending_nodes(["gpu-1"]) == ()


def test_undo_of_the_step_in_flight(journal: Journal) -> None:
    journal.append(StepStarted("gpu-1", 2, "containerd.write", 1))
    journal.append(StepUndone("gpu-1", 2, "containerd.write", "restored from backup"))
    assert journal.replay().step_in_flight("gpu-1") is None


def test_left_cordoned_after_a_halt(journal: Journal) -> None:
    journal.append(StepStarted("gpu-1", 0, "cordon", 1))
    journal.append(CordonedByRollout("gpu-1"))
    journal.append(StepFinished("gpu-1", 0, "cordon", 1, StepOutcome.DONE))
    journal.append(NodeFinished("gpu-1", NodeOutcome.LEFT_CORDONED, "halted by upgrade-failed"))
    journal.append(RunHalted("gpu-2 upgrade-failed"))
    state = journal.replay()
    assert state.cordoned_nodes() == ("gpu-1",)
    assert state.node("gpu-1").outcome is NodeOutcome.LEFT_CORDONED
    journal.append(RunResumed("ops", "laptop"))
    assert journal.replay().halted_reason is None


def test_rollback_after_the_run_finished(journal: Journal) -> None:
    run_node(journal, "gpu-1")
    journal.append(RunFinished(RunOutcome.SUCCEEDED))
    journal.append(RunResumed("ops", "laptop"))
    journal.append(StepUndone("gpu-1", 2, "containerd.write"))
    journal.append(NodeFinished("gpu-1", NodeOutcome.ROLLED_BACK, "rollout rollback"))
    state = journal.replay()
    assert state.node("gpu-1").outcome is NodeOutcome.ROLLED_BACK
    assert not state.is_step_done("gpu-1", StepRef(2, "containerd.write"))
    assert state.outcome is None


def test_nodes_keep_first_seen_order(journal: Journal) -> None:
    for node in ("gpu-3", "gpu-1", "gpu-2"):
        journal.append(CordonedByRollout(node))
    assert [n.name for n in journal.replay().nodes] == ["gpu-3", "gpu-1", "gpu-2"]
    assert journal.replay().node("never-seen").completed == ()


def test_plan_changed_under_the_journal(journal: Journal) -> None:
    journal.append(StepStarted("gpu-1", 0, "cordon", 1))
    journal.append(StepFinished("gpu-1", 0, "cordon", 1, StepOutcome.DONE))
    state = journal.replay()
    with pytest.raises(JournalMismatch, match="step 1 of gpu-1 as cordon"):
        state.next_step("gpu-1", ("drain", "cordon"))
    with pytest.raises(JournalMismatch):
        state.next_step("gpu-1", ())
    with pytest.raises(JournalMismatch):
        state.is_step_done("gpu-1", StepRef(0, "drain"))


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ([StepFinished("a", 0, "cordon", 1, StepOutcome.DONE)], "not the step in flight"),
        (
            [StepStarted("a", 0, "cordon", 1), StepFinished("a", 0, "cordon", 2, StepOutcome.DONE)],
            "not the step in flight",
        ),
        ([StepStarted("a", 0, "cordon", 1), StepStarted("a", 1, "drain", 1)], "is in flight"),
        ([StepStarted("a", 0, "cordon", 2), StepStarted("a", 0, "cordon", 2)], "after attempt 2"),
        ([StepStarted("a", 0, "cordon", 1), StepStarted("a", 0, "drain", 2)], "recorded as cordon"),
        ([StepStarted("a", -1, "cordon", 1)], "negative step index"),
        ([StepUndone("a", 0, "cordon")], "never started"),
        ([Uncordoned("a")], "which rollout did not cordon"),
        ([StepStarted("a", 0, "cordon", 1), NodeFinished("a", NodeOutcome.FAILED)], "in flight"),
        ([StepStarted("a", 0, "cordon", 1), RunFinished(RunOutcome.ABORTED)], "in flight on a"),
        ([RunStarted("x", "p", "d", "u", "h")], "second run-started"),
        ([CordonedByRollout("")], "without a node"),
    ],
)
def test_contradicting_records_are_refused_before_writing(
    journal: Journal, records: list[Record], problem: str
) -> None:
    *setup, bad = records
    for record in setup:
        journal.append(record)
    before = journal.path.read_bytes()
    state = journal.replay()
    with pytest.raises(InvalidRecord, match=problem):
        journal.append(bad)
    assert journal.path.read_bytes() == before
    assert journal.replay() == state
    journal.append(RunHalted("still usable"))  # the refusal did not break the journal


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
from rollout.journal import StepFinished, StepOutcome, StepStarted

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
from rollout.journal import Journal

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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text().splitlines():
            return
        time.sleep(0.005)
    raise AssertionError(f"writer never wrote {text!r}")


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

HOLDER = """
import sys
from pathlib import Path
from rollout.journal import Journal

with Journal.open(Path(sys.argv[1]), sys.argv[2]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_second_process_gets_journal_locked_with_the_pid(journal: Journal, tmp_path: Path) -> None:
    journal.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), journal.run_id],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
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
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), journal.run_id],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    holder.kill()
    holder.wait()
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.close()
    holder.stdout.close()
    with Journal.open(tmp_path, journal.run_id):
        pass


# --- listing ------------------------------------------------------------------------------


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


def test_journal_file_name_is_stable() -> None:
    # Other tools (status, the CronJob's log scraper) read this path; renaming it breaks them.
    assert JOURNAL_FILE == "journal.jsonl"
