"""`rollout pause`: the run starts no node, its nodes in flight finish, it exits 5 and
`status` says who paused it; `resume` (or `unpause`) clears it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.cli.apply import exit_code
from rollout.errors import ExitCode
from rollout.plan import plan_to_data
from rollout.run import Journal, RunId, RunOutcome
from rollout.run.pause import PauseMark, clear_pause, describe_pause_of, pause_run, read_pause
from rollout.steps.base import StepContext, StepResult
from tests.unit.test_executor import make_executor
from tests.unit.test_halt_watch import setup

RUN = RunId("demo-1")
AT = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)


def test_a_pause_mark_is_kept_whole_and_cleared(tmp_path: Path) -> None:
    assert read_pause(tmp_path) is None
    mark = PauseMark("ana@laptop", "GPU vendor ticket 4711", AT)
    pause_run(tmp_path, mark)
    assert read_pause(tmp_path) == mark
    assert mark.describe() == (
        "paused by ana@laptop at 2026-12-01T22:00:00.000000Z: GPU vendor ticket 4711"
    )
    assert clear_pause(tmp_path) == mark
    assert read_pause(tmp_path) is None and clear_pause(tmp_path) is None


def test_a_pause_lets_the_node_in_flight_finish_and_starts_no_node(tmp_path: Path) -> None:
    plan, spec, cluster, log, journal, steps = setup(tmp_path)
    real_apply = steps["gpu.wait"].apply

    def paused_meanwhile(ctx: StepContext) -> StepResult:
        pause_run(journal.run_dir, PauseMark("ana@laptop", "vendor ticket", AT))
        return real_apply(ctx)

    steps["gpu.wait"].apply = paused_meanwhile
    executor = make_executor(plan, spec, cluster, journal, steps)
    executor.paused = lambda: describe_pause_of(journal, cluster, plan.name)
    report = executor.run()
    assert report.outcome is RunOutcome.HALTED and report.paused
    assert report.halt_reason.startswith("paused by ana@laptop at ")
    assert report.nodes["gpu-a-1"][0] == "succeeded"  # in flight: it finished, uncordoned
    assert not cluster.nodes["gpu-a-1"].unschedulable
    assert {n for _, n, _ in log.calls} == {"gpu-a-1"}  # no other node started
    assert exit_code(report) == ExitCode.PAUSED == 5


def test_pause_status_and_unpause_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    plan = setup(tmp_path / "planned")[0]
    journal = Journal.create(state, plan.name, json.dumps(plan_to_data(plan)), run_id=RUN)
    journal.close()
    args = ["--state-dir", str(state)]
    assert main(["pause", RUN, "--reason", "vendor ticket", *args]) == 0
    assert "paused by " in capsys.readouterr().out
    assert main(["status", RUN, *args]) == 0
    out = capsys.readouterr().out
    assert f"run {RUN}: paused by " in out and f": vendor ticket; `rollout resume {RUN}`" in out
    assert main(["unpause", RUN, *args]) == 0
    assert "unpaused (was paused by " in capsys.readouterr().out
    assert read_pause(state / "runs" / RUN) is None
