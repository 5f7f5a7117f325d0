"""The soak between waves is journalled: a resumed run skips a finished soak, waits only what
is left of one cut by a window (or a pause, or a kill), and goes straight to the gates when
the soak's end passed while the run was stopped. On the executor's fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rollout.cli.apply import exit_code
from rollout.errors import ExitCode
from rollout.executor import Executor
from rollout.run import Journal, RunOutcome, SoakFinished, SoakStarted, format_time
from rollout.steps.base import StepContext, StepResult
from tests.examples import PLAN
from tests.unit.test_executor import FakeCluster, make_executor, setup

# gates off: the re-read of the gates is then only the node read, which FakeCluster counts
GATES_OFF = "  verify:\n    gates: {resources: false, xid: false, validator: false}\n"


def soaking(soak_s: int, window: bool = False) -> str:
    policy = f"policy:\n  soak_s: {soak_s}\n{GATES_OFF}"
    if window:
        policy += '  maintenance_window: {start: "22:00", end: "23:00", timezone: UTC}\n'
    return PLAN.read_text().replace("policy:\n", policy)


class Clock:
    """The executor's clock and sleep: sleeping moves it; what was slept is kept."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += timedelta(seconds=seconds)


class GateReads(FakeCluster):
    """Counts the node reads: the soak's re-read of a node's gates reads it once."""

    def __init__(self, names: Any) -> None:
        super().__init__(names)
        self.reads: list[str] = []

    def get_node(self, name: str) -> Any:
        self.reads.append(name)
        return super().get_node(name)


def executor_on(clock: Clock, *parts: Any) -> Executor:
    executor = make_executor(*parts)
    executor.clock = clock
    executor.sleep = clock.sleep
    executor.say = lambda _: None
    return executor


def soak_records(journal: Journal) -> list[Any]:
    return [e.record for e in journal.entries() if isinstance(e.record, SoakStarted | SoakFinished)]


def test_the_soak_is_journalled_and_a_resumed_run_does_not_soak_that_wave_again(
    tmp_path: Path,
) -> None:
    plan, spec, cluster, _, journal, steps = setup(tmp_path, soaking(600))

    class Killed(BaseException):
        pass

    real = steps["systemd.restart"].apply
    killed = []

    def dying(ctx: StepContext) -> StepResult:
        if ctx.node == "gpu-a-2" and not killed:
            killed.append(ctx.node)
            raise Killed  # the process dies in wave 2, after wave 1's soak
        return real(ctx)

    steps["systemd.restart"].apply = dying
    start = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
    clock = Clock(start)
    with pytest.raises(Killed):
        executor_on(clock, plan, spec, cluster, journal, steps).run()
    assert sum(clock.slept) == 600
    ends = format_time(start + timedelta(seconds=600))
    assert soak_records(journal) == [SoakStarted(1, ends), SoakFinished(1)]
    journal.close()

    resumed = Journal.open(tmp_path, journal.run_id)
    clock.slept.clear()
    report = executor_on(clock, plan, spec, cluster, resumed, steps).run()
    assert report.outcome is RunOutcome.SUCCEEDED
    assert sum(clock.slept) == 600  # wave 2's soak only; wave 1's is not soaked again
    assert [type(r).__name__ for r in soak_records(resumed)] == [
        "SoakStarted",
        "SoakFinished",
        "SoakStarted",
        "SoakFinished",
    ]
    assert resumed.replay().soak_after(1) is not None
    assert [s.wave for s in resumed.replay().soaks if s.finished] == [1, 2]


def cut_by_the_window(tmp_path: Path) -> tuple[Any, ...]:
    """Wave 1's node takes 10 minutes and ends at 22:10; its soak of a day would end at
    22:10 the next day; the window (22:00-23:00) cuts it: exit 4, the soak journalled as
    started, not finished."""
    plan, spec, _, log, journal, steps = setup(tmp_path, soaking(86400, window=True))
    cluster = GateReads([n.name for n in plan.nodes])
    steps = {k: type(s)(k, log, cluster, set()) for k, s in steps.items()}
    clock = Clock(datetime(2026, 11, 30, 22, 0, tzinfo=UTC))
    uncordon = steps["uncordon"].apply

    def slow_uncordon(ctx: StepContext) -> StepResult:
        if ctx.node == "gpu-a-1":
            clock.now += timedelta(minutes=10)
        return uncordon(ctx)

    steps["uncordon"].apply = slow_uncordon
    report = executor_on(clock, plan, spec, cluster, journal, steps).run()
    assert report.outcome is RunOutcome.HALTED and report.window_closed
    assert exit_code(report) == ExitCode.WINDOW_CLOSED
    # the next node would need 10 minutes: the run ends at the first check past 22:50
    assert clock.now == datetime(2026, 11, 30, 22, 50, 5, tzinfo=UTC)
    assert report.halt_reason.endswith("; 83995s of the soak after wave 1 left"), report
    ends = format_time(datetime(2026, 12, 1, 22, 10, tzinfo=UTC))
    assert soak_records(journal) == [SoakStarted(1, ends)]
    assert [n for _, n, _ in log.calls if n != "gpu-a-1"] == []  # wave 2 did not start
    journal.close()
    return plan, spec, cluster, log, Journal.open(tmp_path, journal.run_id), steps


def first_cordon(steps: Any, clock: Clock) -> list[datetime]:
    """Fills with the clock's time when the first node is cordoned."""
    at: list[datetime] = []
    cordon = steps["cordon"].apply

    def cordon_at(ctx: StepContext) -> StepResult:
        at[:] = at or [clock.now]
        return cordon(ctx)

    steps["cordon"].apply = cordon_at
    return at


def resumed_at(tmp_path: Path, now: datetime) -> tuple[list[str], list[datetime], GateReads, str]:
    """The run cut by the window, resumed at `now`: what it said, when its first node of wave
    2 was cordoned, the node reads (its gate reads) and the first node it stepped."""
    plan, spec, cluster, log, journal, steps = cut_by_the_window(tmp_path)
    clock = Clock(now)
    said: list[str] = []
    executor = executor_on(clock, plan, spec, cluster, journal, steps)
    executor.say = said.append
    started = first_cordon(steps, clock)
    cluster.reads.clear()
    before = len(log.calls)
    executor.run()
    assert soak_records(journal)[1] == SoakFinished(1)
    return said, started, cluster, log.calls[before][1]


def test_the_next_window_soaks_only_the_rest_then_reads_the_gates_and_goes_on(
    tmp_path: Path,
) -> None:
    opens = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)  # the next window
    said, started, cluster, first = resumed_at(tmp_path, opens)
    assert started == [opens + timedelta(seconds=600)]  # 600 s later: the rest
    assert said[0].startswith("wave 1: soaking the remaining 600s of its 86400s soak"), said
    assert cluster.reads[0] == "gpu-a-1"  # its gates read again before wave 2 started
    assert first == "gpu-a-2"


def test_a_soak_whose_end_passed_while_the_run_was_stopped_goes_straight_to_the_gates(
    tmp_path: Path,
) -> None:
    opens = datetime(2026, 12, 2, 22, 0, tzinfo=UTC)  # two windows later
    said, started, cluster, first = resumed_at(tmp_path, opens)
    assert started == [opens]  # no wait at all
    assert said[0] == (
        "wave 1: its 86400s soak ended while the run was stopped: reading the health gates "
        "of 1 node(s) again before the next wave"
    )
    assert cluster.reads[0] == "gpu-a-1"
    assert first == "gpu-a-2"


def test_the_fold_refuses_a_soak_finished_that_never_started(tmp_path: Path) -> None:
    journal = setup(tmp_path, soaking(600))[4]
    with pytest.raises(Exception, match="never started"):
        journal.append(SoakFinished(1))
    journal.append(SoakStarted(1, "2026-11-30T22:10:00.000000Z"))
    with pytest.raises(Exception, match="second soak-started"):
        journal.append(SoakStarted(1, "2026-11-30T22:20:00.000000Z"))
    soak = journal.replay().soak_after(1)
    assert soak is not None and not soak.finished
    assert soak.ends_at == datetime(2026, 11, 30, 22, 10, tzinfo=UTC)
