"""The files beside a run's journal: invocation.json (written durably before the run can be
resumed, read back with clear errors) and per-step data."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rollout.run import (
    INVOCATION_FILE,
    Invocation,
    InvocationUnreadable,
    Journal,
    JournalError,
    RunIncomplete,
    StepDataUnreadable,
    list_runs,
    read_run,
)
from tests.unit.runfakes import PLAN_JSON

INVOCATION = Invocation(
    spec_source="plans/mirror.yaml",
    spec_text="apiVersion: rollout/v1\n",
    inventory="/srv/inventory.yaml",
    kubeconfig=None,
    context="lab",
    accept_new_host_keys=False,
)


def test_invocation_round_trips(tmp_path: Path) -> None:
    with Journal.create(tmp_path, "p", PLAN_JSON, invocation=INVOCATION) as journal:
        assert journal.read_invocation() == INVOCATION


def test_run_files_are_private_to_their_user(journal: Journal) -> None:
    """Invariant 9: the plan's text and what steps saw are readable by no one else."""
    journal.save_step_data("gpu-1", "cordon", {})
    files = [p for p in journal.run_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"journal.jsonl", "lock", "plan.json", "cordon.json"}
    assert {p.name: p.stat().st_mode & 0o077 for p in files} == {p.name: 0 for p in files}


class Crash(BaseException):
    """The process dies here: nothing after this point runs (not even cleanup)."""


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def test_invocation_is_on_disk_before_the_journal_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def logging_fsync(fd: int) -> None:
        events.append(f"fsync {fd_path(fd)}")
        real_fsync(fd)

    def logging_rename(src: str | Path, dst: str | Path) -> None:
        events.append(f"rename {Path(src).name} -> {Path(dst).name}")
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", logging_fsync)
    monkeypatch.setattr(os, "rename", logging_rename)
    with Journal.create(tmp_path, "p", PLAN_JSON, invocation=INVOCATION) as journal:
        run_dir = str(journal.run_dir)
    invocation_synced = events.index(f"fsync {run_dir}/{INVOCATION_FILE}")
    journal_named = events.index("rename .journal.jsonl.new -> journal.jsonl")
    assert invocation_synced < journal_named
    # the new names (invocation.json, journal.jsonl) are durable once the run dir is synced
    assert f"fsync {run_dir}" in events[journal_named:]


def test_a_crash_at_any_point_of_creation_leaves_no_run_resume_cannot_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill creation at each fsync in turn: every run that has a journal has its invocation."""
    real_fsync = os.fsync
    # a real kill runs no cleanup
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)
    crashes = 0
    for crash_at in range(1, 20):
        calls = {"n": 0}

        def crashing_fsync(
            fd: int, crash_at: int = crash_at, calls: dict[str, int] = calls
        ) -> None:
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise Crash
            real_fsync(fd)

        state_dir = tmp_path / f"crash-{crash_at}"
        monkeypatch.setattr(os, "fsync", crashing_fsync)
        try:
            Journal.create(state_dir, "p", PLAN_JSON, invocation=INVOCATION).close()
        except Crash:
            crashes += 1
        finally:
            monkeypatch.setattr(os, "fsync", real_fsync)
        for run in list_runs(state_dir):
            if (run.run_dir / "journal.jsonl").exists():
                with Journal.open(state_dir, run.run_id) as reopened:
                    assert reopened.read_invocation() == INVOCATION, crash_at
            else:
                with pytest.raises(RunIncomplete, match="nothing to resume"):
                    Journal.open(state_dir, run.run_id)
                assert run.problem is not None and "rollout apply" in run.problem
        if crashes < crash_at:
            break  # creation needed fewer fsyncs than crash_at: every point was covered
    assert crashes >= 4


def test_a_failed_creation_leaves_no_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        Journal.create(tmp_path, "p", PLAN_JSON, invocation=INVOCATION)
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_chosen_run_id_is_used_and_never_reused(tmp_path: Path) -> None:
    run_id = "20261129-231500-p-abcd"
    with Journal.create(tmp_path, "p", PLAN_JSON, run_id=run_id) as journal:  # type: ignore[arg-type]
        assert journal.run_id == run_id and read_run(tmp_path, run_id).run_id == run_id
    with pytest.raises(JournalError, match="already exists"):
        Journal.create(tmp_path, "p", PLAN_JSON, run_id=run_id)  # type: ignore[arg-type]
    with pytest.raises(JournalError, match="cannot be a run id"):
        Journal.create(tmp_path, "p", PLAN_JSON, run_id="../escape")  # type: ignore[arg-type]


def test_a_missing_invocation_is_a_clear_error(journal: Journal) -> None:
    with pytest.raises(InvocationUnreadable) as caught:
        journal.read_invocation()
    message = str(caught.value)
    assert journal.run_id in message and f"{INVOCATION_FILE} is missing" in message
    assert "rollout apply PLAN" in message  # what to do


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (INVOCATION.to_json()[:25], "is not valid JSON"),
        (b"", "is not valid JSON"),
        (b"[]", "is a list, not a JSON object"),
        (json.dumps({"spec_source": "p"}).encode(), "has no 'spec_text'"),
        (
            INVOCATION.to_json().replace(b'"context": "lab"', b'"context": 3'),
            "has context = 3, expected str | None",
        ),
        (
            INVOCATION.to_json().replace(b"false", b'"no"'),
            "accept_new_host_keys = 'no', expected bool",
        ),
    ],
    ids=["torn", "empty", "not-an-object", "field-missing", "wrong-type", "not-a-bool"],
)
def test_a_damaged_invocation_is_a_clear_error(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    with Journal.create(tmp_path, "p", PLAN_JSON, invocation=INVOCATION) as journal:
        (journal.run_dir / INVOCATION_FILE).write_bytes(content)
        with pytest.raises(InvocationUnreadable, match=problem):
            journal.read_invocation()


# --- per-step data ----------------------------------------------------------------------------


def test_step_data_round_trips_per_node_and_step(journal: Journal) -> None:
    assert journal.load_step_data("gpu-1", "cordon") == {}
    journal.save_step_data("gpu-1", "cordon", {"cordoned_by_rollout": True})
    journal.save_step_data("gpu-2", "cordon", {"cordoned_by_rollout": False})
    journal.save_step_data("gpu-1", "cordon", {"cordoned_by_rollout": False, "n": 2})
    assert journal.load_step_data("gpu-1", "cordon") == {"cordoned_by_rollout": False, "n": 2}
    assert journal.load_step_data("gpu-2", "cordon") == {"cordoned_by_rollout": False}
    assert journal.load_step_data("gpu-1", "drain") == {}
    path = journal.run_dir / "nodes" / "gpu-1" / "cordon.json"
    assert json.loads(path.read_text()) == {"cordoned_by_rollout": False, "n": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["cordon.json"], "no temporary left"


def test_step_data_is_synced_with_its_directories(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def logging_fsync(fd: int) -> None:
        synced.append(fd_path(fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", logging_fsync)
    journal.save_step_data("gpu-1", "drain", {"evicted": ["ml/web"]})
    node_dir = journal.run_dir / "nodes" / "gpu-1"
    # the data itself, the new nodes/ and nodes/gpu-1 names, and the rename into place
    assert str(node_dir / ".drain.json.tmp") in synced
    assert {str(journal.run_dir), str(journal.run_dir / "nodes"), str(node_dir)} <= set(synced)


@pytest.mark.parametrize(("node", "step"), [("../x", "cordon"), ("gpu-1", "../../plan"), ("", "a")])
def test_step_data_names_cannot_leave_the_run(journal: Journal, node: str, step: str) -> None:
    with pytest.raises(JournalError, match="cannot name a file"):
        journal.save_step_data(node, step, {})
    with pytest.raises(JournalError, match="cannot name a file"):
        journal.load_step_data(node, step)


def test_unreadable_step_data_names_the_file(journal: Journal) -> None:
    journal.save_step_data("gpu-1", "cordon", {})
    path = journal.run_dir / "nodes" / "gpu-1" / "cordon.json"
    path.write_text("{")
    with pytest.raises(StepDataUnreadable, match=f"{path}: the data step cordon saved for gpu-1"):
        journal.load_step_data("gpu-1", "cordon")
    path.write_text("[]")
    with pytest.raises(StepDataUnreadable, match="a list, not a JSON object"):
        journal.load_step_data("gpu-1", "cordon")
