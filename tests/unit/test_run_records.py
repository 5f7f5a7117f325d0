"""The run store's records: the JSON line codec, every kind, timestamps."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from rollout import run
from tests.unit.runfakes import PLAN_JSON, FakeClock, run_node

EVERY_RECORD: list[run.Record] = [
    run.RunStarted("20261129-231500-x-ab12", "x", "sha256:00", "ops", "laptop"),
    run.RunResumed("ops", "cron-pod"),
    run.StepStarted("gpu-1", 2, "containerd.write", 1),
    run.StepFinished("gpu-1", 2, "containerd.write", 1, run.StepOutcome.DONE, "wrote 1 file"),
    run.StepFinished("gpu-1", 3, "gpu.wait", 2, run.StepOutcome.NOOP),
    run.StepFinished("gpu-1", 3, "gpu.wait", 2, run.StepOutcome.FAILED, "0 of 4 GPUs after 300 s"),
    run.StepUndone("gpu-1", 2, "containerd.write", "restored 1 file"),
    run.NodeFinished("gpu-1", run.NodeOutcome.LEFT_CORDONED, "halted: upgrade-failed on gpu-2"),
    run.NodeFinished("gpu-1", run.NodeOutcome.ROLLED_BACK),
    run.CordonedByRollout("gpu-1"),
    run.Uncordoned("gpu-1"),
    run.BackupWritten(
        "gpu-1", "/etc/containerd/config.toml", "/var/lib/rollout/b/config.toml", "0f"
    ),
    run.RunHalted("gpu-2 labelled upgrade-failed"),
    run.RunFinished(run.RunOutcome.HALTED),
    run.Retried("patch node gpu-1", 1, "api 503", "503 Service Unavailable"),
    run.NodeSkipped("gpu-3", "never came back"),
    run.Notified("oncall", "halted", "failed", 3, "503 Service Unavailable from <webhook>"),
    run.SoakStarted(1, "2026-11-29T23:45:00.000000Z"),
    run.SoakFinished(1),
]


def test_every_record_kind_is_covered() -> None:
    assert {r.kind for r in EVERY_RECORD} == set(run.RecordKind)


@pytest.mark.parametrize("record", EVERY_RECORD, ids=lambda r: r.kind.value)
def test_record_round_trip(record: run.Record) -> None:
    entry = run.Entry(7, datetime(2026, 11, 29, 23, 15, 0, 123456, tzinfo=UTC), record)
    line = entry.to_json_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert (doc["seq"], doc["at"], doc["kind"]) == (
        7,
        "2026-11-29T23:15:00.123456Z",
        record.kind.value,
    )
    assert run.Entry.from_json_line(line.rstrip(b"\n")) == entry


def test_non_ascii_detail_round_trips() -> None:
    entry = run.Entry(
        2, datetime(2026, 1, 1, tzinfo=UTC), run.RunHalted("Knoten grün → rot\nzweite")
    )
    assert run.Entry.from_json_line(entry.to_json_line()) == entry


def test_round_trip_through_the_disk(tmp_path: Path) -> None:
    with run.Journal.create(tmp_path, "plan", PLAN_JSON, clock=FakeClock()) as journal:
        run_node(journal, "gpu-1")
        journal.append(run.RunHalted("operator said so"))
        journal.append(run.RunResumed("ops", "laptop"))
        journal.append(run.StepStarted("gpu-2", 0, "cordon", 1))
        journal.append(run.StepFinished("gpu-2", 0, "cordon", 1, run.StepOutcome.FAILED, "409"))
        journal.append(run.StepUndone("gpu-2", 0, "cordon"))
        journal.append(run.NodeFinished("gpu-2", run.NodeOutcome.ROLLED_BACK, "cordon failed"))
        journal.append(run.Retried("patch node gpu-3", 1, "api 503", "503"))
        journal.append(run.StepStarted("gpu-3", 0, "cordon", 1))
        journal.append(run.NodeSkipped("gpu-3", "never came back"))
        journal.append(run.Notified("oncall", "node-failed", "sent", 1))
        journal.append(run.SoakStarted(1, "2026-11-29T23:45:00.000000Z"))
        journal.append(run.SoakFinished(1))
        journal.append(run.RunFinished(run.RunOutcome.FAILED))
        written = journal.entries()
        run_id = journal.run_id
    kinds = {e.record.kind for e in written}
    assert kinds == set(run.RecordKind)
    with run.Journal.open(tmp_path, run_id) as reopened:
        assert reopened.entries() == written
        assert reopened.replay() == journal.replay()


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"[1, 2]", "a list, not a JSON object"),
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
        run.Entry.from_json_line(line)
    assert problem in str(caught.value)


def test_unknown_fields_are_ignored_for_newer_writers() -> None:
    line = b'{"seq": 3, "at": "2026-01-01T00:00:00Z", "kind": "uncordoned", "node": "a", "by": "x"}'
    assert run.Entry.from_json_line(line).record == run.Uncordoned("a")


def test_naive_timestamps_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        run.Journal.create(tmp_path, "p", PLAN_JSON, clock=lambda: datetime(2026, 1, 1))


def test_timestamps_are_utc(tmp_path: Path) -> None:
    plus_two = datetime(2026, 11, 30, 1, 15, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    with run.Journal.create(tmp_path, "p", PLAN_JSON, clock=lambda: plus_two) as journal:
        line = journal.path.read_text().splitlines()[0]
    assert json.loads(line)["at"] == "2026-11-30T01:15:00.000000Z"
