"""The soak counts against the maintenance window, on a lab of this module's own (two nodes,
one per wave): a window that closes during the soak after wave 1 ends the run's window
cleanly (exit 4, the soak journalled as started, not finished, wave 2 not started); the
next window's `rollout resume` soaks only what is left of it, then reads wave 1's gates
again and goes on to wave 2.

The soak's end is wall time on the clock of the process running rollout: here the run's
clock is the test's (rollout/testclock.py, $ROLLOUT_TEST_CLOCK_FILE), stopped where the test
puts it, so that a window a day after the first one comes seconds later. The plan soaks a
day (86400 s) after a wave that ends at 00:10 in a window of 00:00-01:00: the window closes
at 01:00 with 23h10m of it left; the next window opens at 00:00 with 600 s left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rollout.lab.cluster import Lab
from rollout.run import NodeOutcome, list_runs, read_run
from rollout.testclock import CLOCK_FILE_ENV, ScaledTime
from rollout.transports.kube import KubeClient
from tests.examples import edited_plan
from tests.lab.labapi import apply_args
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_resume_timeslicing import journal_entries

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

NODES = ("lab-node-1", "lab-node-2")
SOAK_S = 86400
# Generous: the machine running the suite may be loaded; a hang fails here, not in CI's limit.
RUN_S = 600.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("soakwindow") / "lab", ("1.7", "1.7"), 1) as built:
        yield built


def soak_plan(directory: Path) -> Path:
    """The example plan, one node per wave, soaking a day, in a window 00:00-01:00 UTC."""
    plan = edited_plan(directory, 'waves: [1, "50%"]', "waves: [1, 1]")
    text = plan.read_text().replace(
        "policy:\n",
        f"policy:\n  soak_s: {SOAK_S}\n  maintenance_window:\n"
        "    days: [mon, tue, wed, thu, fri, sat, sun]\n"
        '    start: "00:00"\n    end: "01:00"\n    timezone: UTC\n',
    )
    plan.write_text(text)
    return plan


def stop_clock(path: Path, moment: datetime) -> None:
    """The run's clock, stopped at `moment` until the test moves it."""
    real = time.time()
    path.write_text(ScaledTime(real, moment.timestamp() - real, 0.0).to_text())


def start(args: list[str], clock: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, CLOCK_FILE_ENV: str(clock)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rollout", *args], stdout=out, stderr=out, env=env
        )


def wait_until(probe: Callable[[], object], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + RUN_S
    while not probe():
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def kinds(state: Path, kind: str) -> list[dict[str, object]]:
    return [e for e in journal_entries(state) if e["kind"] == kind]


def test_a_window_closing_in_the_soak_exits_4_and_the_next_window_soaks_only_the_rest(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    state, clock, log = tmp_path / "state", tmp_path / "clock", tmp_path / "run.log"
    plan = soak_plan(tmp_path)
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(1)
    stop_clock(clock, day + timedelta(minutes=10))
    proc = start(apply_args(lab, plan, state), clock, log)
    try:
        wait_until(lambda: kinds(state, "soak-started"), proc, "wave 1's soak")
        (started,) = kinds(state, "soak-started")
        # the soak ends a day after wave 1 ended, on the run's clock (stopped at 00:10)
        ends = day + timedelta(days=1, minutes=10)
        assert (started["wave"], started["ends_at"]) == (1, ends.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        stop_clock(clock, day + timedelta(hours=1, seconds=30))  # the window has closed
        assert proc.wait(timeout=RUN_S) == 4, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert "window closed (00:00-01:00 UTC): 1 node(s) left" in output, output[-4000:]
    assert f"{SOAK_S - 3600 + 600 - 30}s of the soak after wave 1 left" in output, output[-4000:]
    (run,) = list_runs(state)
    record = read_run(state, run.run_id)
    soak = record.soak_after(1)
    assert soak is not None and not soak.finished
    assert record.node(NODES[0]).outcome is NodeOutcome.SUCCEEDED
    assert not record.node(NODES[1]).completed and record.node(NODES[1]).in_flight is None
    assert not kube.get_node(NODES[1]).unschedulable

    # the next window: only the soak's last 600 s, then wave 1's gates, then wave 2
    stop_clock(clock, day + timedelta(days=1))
    log.write_text("")
    proc = start(["resume", run.run_id, "--state-dir", str(state)], clock, log)
    try:
        remaining = f"wave 1: soaking the remaining 600s of its {SOAK_S}s soak"
        wait_until(lambda: remaining in log.read_text(), proc, "the rest of the soak")
        # the run soaks (the clock stands still): wave 2 has not started
        assert not kinds(state, "soak-finished") and proc.poll() is None
        assert not read_run(state, run.run_id).node(NODES[1]).completed
        stop_clock(clock, day + timedelta(days=1, minutes=10))  # the soak's end
        assert proc.wait(timeout=RUN_S) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert "reading the health gates of 1 node(s) again before the next wave" in output, output
    record = read_run(state, run.run_id)
    assert [s.wave for s in record.soaks] == [1] and record.soaks[0].finished
    assert len(kinds(state, "soak-started")) == 1  # the same soak, continued
    assert all(record.node(name).outcome is NodeOutcome.SUCCEEDED for name in NODES)
    assert not any(kube.get_node(name).unschedulable for name in NODES)
