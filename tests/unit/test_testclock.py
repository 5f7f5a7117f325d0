"""The product's test-only clock seam (rollout/testclock.py): the wall clock unless
$ROLLOUT_TEST_CLOCK_FILE names a clock file, which is read again at every call."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.errors import BadInput
from rollout.lab.simulation.cronjobs import ScaledClock
from rollout.testclock import CLOCK_FILE_ENV, ScaledTime, run_clock


def test_without_the_variable_the_clock_is_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CLOCK_FILE_ENV, raising=False)
    before = datetime.now(UTC)
    now = run_clock()()
    assert before <= now <= datetime.now(UTC)


def test_the_named_file_is_read_at_every_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock_file = tmp_path / "now"
    monkeypatch.setenv(CLOCK_FILE_ENV, str(clock_file))
    day = datetime(2031, 5, 6, tzinfo=UTC).timestamp()
    start = 1_000_000_000.0  # stopped (scale 0): real time does not count
    clock_file.write_text(ScaledTime(start, day - start, 0.0).to_text())
    clock = run_clock()
    assert clock() == datetime(2031, 5, 6, tzinfo=UTC)
    # moved while the run goes on: the next call sees it
    clock_file.write_text(ScaledTime(start, day + 3600 - start, 0.0).to_text())
    assert clock() == datetime(2031, 5, 6, 1, tzinfo=UTC)
    # running 60 times faster from `start` on
    running = ScaledTime(start, 0.0, 60.0)
    assert running.at(start + 10) == start + 600


def test_the_lab_s_scaled_clock_writes_what_the_product_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lab = ScaledClock()
    lab.set(datetime(2030, 1, 1, tzinfo=UTC).timestamp(), scale=0)
    clock_file = tmp_path / "now"
    clock_file.write_text(lab.to_text())
    monkeypatch.setenv(CLOCK_FILE_ENV, str(clock_file))
    assert run_clock()().timestamp() == pytest.approx(lab(), abs=1e-3)
    assert ScaledClock.from_text(lab.to_text())() == pytest.approx(lab(), abs=1e-3)


def test_a_bad_clock_file_says_what_it_should_hold(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock_file = tmp_path / "now"
    clock_file.write_text("tomorrow")
    monkeypatch.setenv(CLOCK_FILE_ENV, str(clock_file))
    with pytest.raises(BadInput, match="START,OFFSET_S,SCALE"):
        run_clock()()
    monkeypatch.setenv(CLOCK_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(BadInput, match="No such file"):
        run_clock()()
