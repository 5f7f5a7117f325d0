"""The run store's fold: a journal's records replayed into a RunState, and refused when they
contradict it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout import run
from tests.unit.runfakes import STEPS, FakeClock, run_node


def test_replay_of_a_complete_node(journal: run.Journal) -> None:
    run_node(journal, "gpu-1")
    journal.append(run.RunFinished(run.RunOutcome.SUCCEEDED))
    state = journal.replay()
    node = state.node("gpu-1")
    assert [c.kind for c in node.completed] == list(STEPS)
    assert all(state.is_step_done("gpu-1", run.StepRef(i, k)) for i, k in enumerate(STEPS))
    assert node.in_flight is None and node.outcome is run.NodeOutcome.SUCCEEDED
    assert not node.cordoned_by_rollout and state.cordoned_nodes() == ()
    assert node.backups == (
        run.Backup("/etc/a.toml", "/var/backup/a.toml", "ab" * 32, node.backups[0].written_at),
    )
    assert state.next_step("gpu-1", STEPS) is None
    assert state.pending_nodes(["gpu-1", "gpu-2"]) == ("gpu-2",)
    assert state.outcome is run.RunOutcome.SUCCEEDED and state.finished


def test_killed_after_step_started_leaves_the_step_in_flight(journal: run.Journal) -> None:
    journal.append(run.StepStarted("gpu-1", 0, "cordon", 1))
    journal.append(run.CordonedByRollout("gpu-1"))
    journal.append(run.StepFinished("gpu-1", 0, "cordon", 1, run.StepOutcome.DONE))
    journal.append(run.StepStarted("gpu-1", 1, "drain", 1))
    journal.close()  # as good as a kill: nothing more reaches the file

    state = run.read_run(journal.run_dir.parent.parent, journal.run_id)
    flying = state.step_in_flight("gpu-1")
    assert flying is not None and flying.ref == run.StepRef(1, "drain") and flying.attempt == 1
    assert state.is_step_done("gpu-1", run.StepRef(0, "cordon"))
    assert not state.is_step_done("gpu-1", run.StepRef(1, "drain"))
    assert state.next_step("gpu-1", STEPS) == run.StepRef(1, "drain")
    assert state.next_attempt("gpu-1", run.StepRef(1, "drain")) == 2
    assert state.next_attempt("gpu-1", run.StepRef(2, "containerd.write")) == 1
    assert state.cordoned_nodes() == ("gpu-1",)
    assert state.pending_nodes(["gpu-1", "gpu-2"]) == ("gpu-1", "gpu-2")


def test_resume_retries_the_step_in_flight(journal: run.Journal, tmp_path: Path) -> None:
    journal.append(run.StepStarted("gpu-1", 0, "cordon", 1))
    journal.close()
    with run.Journal.open(tmp_path, journal.run_id, clock=FakeClock()) as resumed:
        resumed.append(run.RunResumed("ops", "laptop"))
        resumed.append(run.StepStarted("gpu-1", 0, "cordon", 2))
        resumed.append(run.StepFinished("gpu-1", 0, "cordon", 2, run.StepOutcome.NOOP, "already"))
        state = resumed.replay()
    assert state.step_in_flight("gpu-1") is None
    (done,) = state.node("gpu-1").completed
    assert (done.outcome, done.attempt) == (run.StepOutcome.NOOP, 2)


def test_failed_step_then_rollback(journal: run.Journal) -> None:
    for index, kind in enumerate(STEPS[:3]):
        journal.append(run.StepStarted("gpu-1", index, kind, 1))
        journal.append(run.StepFinished("gpu-1", index, kind, 1, run.StepOutcome.DONE))
    journal.append(run.StepStarted("gpu-1", 3, "systemd.restart", 1))
    journal.append(
        run.StepFinished("gpu-1", 3, "systemd.restart", 1, run.StepOutcome.FAILED, "exit 1")
    )
    failed = journal.replay().node("gpu-1").last_failure
    assert failed is not None and failed.ref == run.StepRef(3, "systemd.restart")
    assert failed.detail == "exit 1"
    assert journal.replay().next_step("gpu-1", STEPS) == run.StepRef(3, "systemd.restart")
    for index in (3, 2, 1, 0):
        journal.append(run.StepUndone("gpu-1", index, STEPS[index]))
    journal.append(run.NodeFinished("gpu-1", run.NodeOutcome.ROLLED_BACK, "systemd.restart failed"))
    journal.append(run.RunHalted("gpu-1 failed"))
    journal.append(run.RunFinished(run.RunOutcome.HALTED))
    state = journal.replay()
    node = state.node("gpu-1")
    assert node.completed == () and [u.index for u in node.undone] == [3, 2, 1, 0]
    assert (node.outcome, node.outcome_reason) == (
        run.NodeOutcome.ROLLED_BACK,
        "systemd.restart failed",
    )
    assert state.halted_reason == "gpu-1 failed" and state.outcome is run.RunOutcome.HALTED
    assert state.pending_nodes(["gpu-1"]) == ()


def test_undo_of_the_step_in_flight(journal: run.Journal) -> None:
    journal.append(run.StepStarted("gpu-1", 2, "containerd.write", 1))
    journal.append(run.StepUndone("gpu-1", 2, "containerd.write", "restored from backup"))
    assert journal.replay().step_in_flight("gpu-1") is None


def test_left_cordoned_after_a_halt(journal: run.Journal) -> None:
    journal.append(run.StepStarted("gpu-1", 0, "cordon", 1))
    journal.append(run.CordonedByRollout("gpu-1"))
    journal.append(run.StepFinished("gpu-1", 0, "cordon", 1, run.StepOutcome.DONE))
    journal.append(
        run.NodeFinished("gpu-1", run.NodeOutcome.LEFT_CORDONED, "halted by upgrade-failed")
    )
    journal.append(run.RunHalted("gpu-2 upgrade-failed"))
    state = journal.replay()
    assert state.cordoned_nodes() == ("gpu-1",)
    assert state.node("gpu-1").outcome is run.NodeOutcome.LEFT_CORDONED
    journal.append(run.RunResumed("ops", "laptop"))
    assert journal.replay().halted_reason is None


def test_rollback_after_the_run_finished(journal: run.Journal) -> None:
    run_node(journal, "gpu-1")
    journal.append(run.RunFinished(run.RunOutcome.SUCCEEDED))
    journal.append(run.RunResumed("ops", "laptop"))
    journal.append(run.StepUndone("gpu-1", 2, "containerd.write"))
    journal.append(run.NodeFinished("gpu-1", run.NodeOutcome.ROLLED_BACK, "rollout rollback"))
    state = journal.replay()
    assert state.node("gpu-1").outcome is run.NodeOutcome.ROLLED_BACK
    assert not state.is_step_done("gpu-1", run.StepRef(2, "containerd.write"))
    assert state.outcome is None


def test_nodes_keep_first_seen_order(journal: run.Journal) -> None:
    for node in ("gpu-3", "gpu-1", "gpu-2"):
        journal.append(run.CordonedByRollout(node))
    assert [n.name for n in journal.replay().nodes] == ["gpu-3", "gpu-1", "gpu-2"]
    assert journal.replay().node("never-seen").completed == ()


def test_plan_changed_under_the_journal(journal: run.Journal) -> None:
    journal.append(run.StepStarted("gpu-1", 0, "cordon", 1))
    journal.append(run.StepFinished("gpu-1", 0, "cordon", 1, run.StepOutcome.DONE))
    state = journal.replay()
    with pytest.raises(run.JournalMismatch, match="step 1 of gpu-1 as cordon"):
        state.next_step("gpu-1", ("drain", "cordon"))
    with pytest.raises(run.JournalMismatch):
        state.next_step("gpu-1", ())
    with pytest.raises(run.JournalMismatch):
        state.is_step_done("gpu-1", run.StepRef(0, "drain"))


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ([run.StepFinished("a", 0, "cordon", 1, run.StepOutcome.DONE)], "not the step in flight"),
        (
            [
                run.StepStarted("a", 0, "cordon", 1),
                run.StepFinished("a", 0, "cordon", 2, run.StepOutcome.DONE),
            ],
            "not the step in flight",
        ),
        (
            [run.StepStarted("a", 0, "cordon", 1), run.StepStarted("a", 1, "drain", 1)],
            "is in flight",
        ),
        (
            [run.StepStarted("a", 0, "cordon", 2), run.StepStarted("a", 0, "cordon", 2)],
            "after attempt 2",
        ),
        (
            [run.StepStarted("a", 0, "cordon", 1), run.StepStarted("a", 0, "drain", 2)],
            "recorded as cordon",
        ),
        ([run.StepStarted("a", -1, "cordon", 1)], "negative step index"),
        ([run.StepUndone("a", 0, "cordon")], "never started"),
        ([run.Uncordoned("a")], "which rollout did not cordon"),
        (
            [run.StepStarted("a", 0, "cordon", 1), run.NodeFinished("a", run.NodeOutcome.FAILED)],
            "in flight",
        ),
        (
            [run.StepStarted("a", 0, "cordon", 1), run.RunFinished(run.RunOutcome.ABORTED)],
            "in flight on a",
        ),
        ([run.RunStarted("x", "p", "d", "u", "h")], "second run-started"),
        ([run.CordonedByRollout("")], "without a node"),
    ],
)
def test_contradicting_records_are_refused_before_writing(
    journal: run.Journal, records: list[run.Record], problem: str
) -> None:
    *setup, bad = records
    for record in setup:
        journal.append(record)
    before = journal.path.read_bytes()
    state = journal.replay()
    with pytest.raises(run.InvalidRecord, match=problem):
        journal.append(bad)
    assert journal.path.read_bytes() == before
    assert journal.replay() == state
    journal.append(run.RunHalted("still usable"))  # the refusal did not break the journal


def test_phase_tells_finished_halted_running_and_interrupted_apart(journal: run.Journal) -> None:
    def phases() -> tuple[run.RunPhase, run.RunPhase]:
        state = journal.replay()
        return state.phase(locked=True), state.phase(locked=False)

    journal.append(run.StepStarted("gpu-1", 0, "cordon", 1))
    assert phases() == (run.RunPhase.RUNNING, run.RunPhase.INTERRUPTED)
    journal.append(run.StepFinished("gpu-1", 0, "cordon", 1, run.StepOutcome.DONE))
    journal.append(run.RunHalted("gpu-2 labelled upgrade-failed"))
    # a halt stands whether or not the halting process has exited yet
    assert phases() == (run.RunPhase.HALTED, run.RunPhase.HALTED)
    journal.append(run.RunResumed("ops", "laptop"))
    assert phases() == (run.RunPhase.RUNNING, run.RunPhase.INTERRUPTED)
    journal.append(run.RunFinished(run.RunOutcome.SUCCEEDED))
    assert phases() == (run.RunPhase.FINISHED, run.RunPhase.FINISHED)
