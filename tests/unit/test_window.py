"""Maintenance windows as spans of time (rollout/schedule/window.py) against the documented
semantics (docs/plan-reference.md, FACTS.md "Scheduling conventions"): wall-clock times in
the window's IANA zone, a window whose end is before its start wraps past midnight and
belongs to the day it starts, the end is exclusive."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from rollout.schedule.window import (
    WindowSpan,
    next_span,
    nominal_length_s,
    span_at,
    span_on,
    spans_from,
    to_cron,
)
from rollout.spec.policy import MaintenanceWindow

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def window(**fields: object) -> MaintenanceWindow:
    return MaintenanceWindow.model_validate(fields)


def local(zone: ZoneInfo, *parts: int, fold: int = 0) -> datetime:
    return datetime(*parts, tzinfo=zone, fold=fold)  # type: ignore[misc]


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


FRIDAY_NIGHT = window(days=["fri"], start="22:00", end="04:00", timezone="Europe/Berlin")


def test_a_window_crossing_midnight_is_one_span_from_its_start_day() -> None:
    # 2024-01-05 is a Friday; Berlin is UTC+1 in January
    span = span_at(FRIDAY_NIGHT, local(BERLIN, 2024, 1, 6, 1, 30))
    assert span == WindowSpan(utc(2024, 1, 5, 21), utc(2024, 1, 6, 3))
    assert (span.closes - span.opens).total_seconds() == 6 * 3600 == nominal_length_s(FRIDAY_NIGHT)
    assert span.closes == local(BERLIN, 2024, 1, 6, 4, 0)
    # Saturday is not listed, yet its small hours are Friday's window
    assert span_on(FRIDAY_NIGHT, local(BERLIN, 2024, 1, 6, 12)) is None


def test_the_end_is_exclusive_and_outside_means_no_span() -> None:
    assert span_at(FRIDAY_NIGHT, local(BERLIN, 2024, 1, 6, 4, 0)) is None
    assert span_at(FRIDAY_NIGHT, local(BERLIN, 2024, 1, 5, 21, 59)) is None
    # Friday's small hours belong to Thursday, which is not listed
    assert span_at(FRIDAY_NIGHT, local(BERLIN, 2024, 1, 5, 1, 0)) is None


def test_the_next_span_is_the_open_one_else_the_next_opening() -> None:
    inside = local(BERLIN, 2024, 1, 6, 2, 0)
    assert next_span(FRIDAY_NIGHT, inside).opens == utc(2024, 1, 5, 21)
    after = next_span(FRIDAY_NIGHT, local(BERLIN, 2024, 1, 6, 4, 0))
    assert after.opens == utc(2024, 1, 12, 21)  # a week later
    spans = spans_from(FRIDAY_NIGHT, utc(2024, 1, 1), 3)
    assert [s.opens.day for s in spans] == [5, 12, 19]


def test_the_time_zone_moves_the_window_in_utc() -> None:
    tokyo = window(start="22:00", end="23:00", timezone="Asia/Tokyo")  # UTC+9, no DST
    assert next_span(tokyo, utc(2024, 1, 1, 0)) == WindowSpan(
        utc(2024, 1, 1, 13), utc(2024, 1, 1, 14)
    )
    # Sunday 23:00 in New York (UTC-5) is Monday 04:00 UTC: the span is Sunday's
    sunday = window(days=["sun"], start="23:00", end="01:00", timezone="America/New_York")
    monday_utc = utc(2024, 1, 8, 5, 30)  # 00:30 Monday in New York
    assert sunday.contains(monday_utc)
    assert span_at(sunday, monday_utc) == WindowSpan(utc(2024, 1, 8, 4), utc(2024, 1, 8, 6))
    assert not sunday.contains(utc(2024, 1, 7, 23, 30))  # 18:30 Sunday local


def test_a_window_in_the_spring_forward_gap_starts_when_the_clock_jumps() -> None:
    # Berlin, Sunday 2024-03-31: 02:00 CET becomes 03:00 CEST; 02:30 never happens
    early = window(days=["sun"], start="02:30", end="04:00", timezone="Europe/Berlin")
    span = span_on(early, local(BERLIN, 2024, 3, 31, 12))
    assert span == WindowSpan(utc(2024, 3, 31, 1), utc(2024, 3, 31, 2))  # 03:00-04:00 CEST
    assert (span.closes - span.opens).total_seconds() == 3600 < nominal_length_s(early)
    # a window wholly inside the gap never opens that day
    lost = window(days=["sun"], start="02:10", end="02:50", timezone="Europe/Berlin")
    assert span_on(lost, local(BERLIN, 2024, 3, 31, 12)) is None
    assert next_span(lost, utc(2024, 3, 31)).opens == local(BERLIN, 2024, 4, 7, 2, 10)


def test_a_window_over_the_fall_back_fold_lasts_the_extra_hour() -> None:
    # Berlin, Sunday 2024-10-27: 03:00 CEST becomes 02:00 CET; 02:00-03:00 happens twice
    night = window(days=["sun"], start="01:00", end="04:00", timezone="Europe/Berlin")
    span = span_on(night, local(BERLIN, 2024, 10, 27, 12))
    assert span == WindowSpan(utc(2024, 10, 26, 23), utc(2024, 10, 27, 3))
    assert (span.closes - span.opens).total_seconds() == 4 * 3600
    assert night.contains(local(BERLIN, 2024, 10, 27, 2, 30, fold=1))


# Windows over midnight, over the DST changes and inside them, checked minute by minute.
WINDOWS = [
    FRIDAY_NIGHT,
    window(days=["sat", "sun"], start="22:00", end="03:30", timezone="Europe/Berlin"),
    window(days=["sun"], start="01:30", end="02:30", timezone="Europe/Berlin"),
    window(start="09:00", end="17:00", timezone="America/New_York"),
    window(days=["sun", "mon"], start="23:00", end="01:00", timezone="America/New_York"),
]
DAYS = [
    utc(2024, 1, 5),  # a plain Friday
    utc(2024, 3, 30),  # Berlin springs forward on Sunday the 31st
    utc(2024, 10, 26),  # Berlin falls back on Sunday the 27th
    utc(2024, 3, 9),  # New York springs forward on Sunday the 10th
    utc(2024, 11, 2),  # New York falls back on Sunday the 3rd
]


def _in_a_fold(moment: datetime, zone: ZoneInfo) -> bool:
    """True when the wall-clock time of `moment` happens twice that night."""
    wall = moment.astimezone(zone).replace(tzinfo=None)
    first = wall.replace(tzinfo=zone, fold=0).utcoffset()
    second = wall.replace(tzinfo=zone, fold=1).utcoffset()
    return first != second and wall.replace(tzinfo=zone).astimezone(UTC) != wall.replace(
        tzinfo=zone, fold=1
    ).astimezone(UTC)


@pytest.mark.parametrize("start", DAYS, ids=[d.date().isoformat() for d in DAYS])
@pytest.mark.parametrize("win", WINDOWS, ids=range(len(WINDOWS)))
def test_a_moment_is_in_a_span_exactly_when_the_window_contains_it(
    win: MaintenanceWindow, start: datetime
) -> None:
    """`contains` (what the executor asks) and the spans (what the schedule and the forecast
    use) agree on every fifth minute of three days (clocks change on the hour); in a DST fold
    the span is the envelope from the first opening to the last closing, and only there may
    it hold a minute `contains` does not (the wall clock runs back before the opening)."""
    zone = win.zone
    for minute in range(0, 3 * 24 * 60, 5):
        moment = start + timedelta(minutes=minute)
        span = span_at(win, moment)
        if win.contains(moment):
            assert span is not None and span.holds(moment), moment
        else:
            assert span is None, moment
            envelope = [s for back in (0, 1) if (s := span_on(win, moment - timedelta(days=back)))]
            if any(s.holds(moment) for s in envelope):
                assert _in_a_fold(moment, zone), moment


def test_the_cron_schedule_opens_the_window() -> None:
    assert to_cron(FRIDAY_NIGHT) == "0 22 * * 5"
    assert to_cron(window(start="07:05", end="08:00")) == "5 7 * * *"
    sunday_first = window(days=["sun", "mon", "sat"], start="23:30", end="01:00")
    assert to_cron(sunday_first) == "30 23 * * 1,6,0"


def test_spans_need_aware_moments() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        span_at(FRIDAY_NIGHT, datetime(2024, 1, 6, 1))
