"""Maintenance windows as spans of time: the occurrence holding a moment, the next one, its
length, and the cron schedule that opens it.

`MaintenanceWindow.contains` (rollout/spec/policy.py) is the one rule for "is this moment
inside"; the spans here are built so that a moment lies in a span exactly when `contains`
says so (tests/unit/test_window.py checks it minute by minute across midnight and both DST
changes). The documented semantics (docs/plan-reference.md, FACTS.md "Scheduling
conventions"): times are wall-clock times in the window's IANA zone; a window whose end is
before its start wraps past midnight and belongs to the day it starts; nothing starts
outside the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from rollout.spec.policy import MaintenanceWindow, Weekday

DAY_S = 86_400
# Far enough to find the next opening of any window (a weekly window opens within 7 days;
# a DST gap can swallow one opening, so look two weeks ahead).
_SEARCH_DAYS = 15


@dataclass(frozen=True)
class WindowSpan:
    """One occurrence of a window: [opens, closes), both timezone-aware (UTC)."""

    opens: datetime
    closes: datetime

    def holds(self, moment: datetime) -> bool:
        return self.opens <= moment < self.closes


def nominal_length_s(window: MaintenanceWindow) -> int:
    """The window's length on a day without a clock change: end - start, wrapping midnight."""
    start = window.start.hour * 3600 + window.start.minute * 60
    end = window.end.hour * 3600 + window.end.minute * 60
    return (end - start) % DAY_S


def span_on(window: MaintenanceWindow, day: datetime) -> WindowSpan | None:
    """The occurrence that starts on the local calendar day of `day` (None when the window
    is not open that day, or a DST gap leaves it no time at all)."""
    zone = window.zone
    local_day = day.astimezone(zone).date()
    if Weekday.from_index(local_day.weekday()) not in window.days:
        return None
    end_day = local_day if window.start < window.end else local_day + timedelta(days=1)
    opens = _instant_of(local_day, window.start, window, later=False)
    closes = _instant_of(end_day, window.end, window, later=True)
    if closes <= opens:
        return None
    return WindowSpan(opens, closes)


def span_at(window: MaintenanceWindow, moment: datetime) -> WindowSpan | None:
    """The occurrence holding `moment`, or None when the window is closed then."""
    _check_aware(moment)
    if not window.contains(moment):
        return None
    local = moment.astimezone(window.zone)
    for back in (0, 1):
        span = span_on(window, local - timedelta(days=back))
        if span is not None and span.holds(moment):
            return span
    # contains() said yes, so one of the two candidate days holds it
    raise AssertionError(f"no span holds {moment.isoformat()} though the window contains it")


def next_span(window: MaintenanceWindow, after: datetime) -> WindowSpan:
    """The occurrence open at `after`, else the next one to open."""
    current = span_at(window, after)
    if current is not None:
        return current
    local = after.astimezone(window.zone)
    for ahead in range(_SEARCH_DAYS):
        span = span_on(window, local + timedelta(days=ahead))
        if span is not None and span.opens >= after:
            return span
    raise AssertionError(f"window {window} never opens")  # days is never empty


def spans_from(window: MaintenanceWindow, after: datetime, count: int) -> list[WindowSpan]:
    """`count` consecutive occurrences, the first being next_span(after)."""
    spans = [next_span(window, after)]
    while len(spans) < count:
        spans.append(next_span(window, spans[-1].closes))
    return spans


def to_cron(window: MaintenanceWindow) -> str:
    """A five-field cron schedule firing when the window opens, in the window's time zone
    (put the zone in the CronJob's `timeZone`)."""
    if len(window.days) == len(Weekday):
        days = "*"
    else:
        # cron counts Sunday as 0, Monday as 1
        days = ",".join(str((d.index + 1) % 7) for d in sorted(window.days, key=lambda d: d.index))
    return f"{window.start.minute} {window.start.hour} * * {days}"


def _instant_of(day: date, clock: time, window: MaintenanceWindow, *, later: bool) -> datetime:
    """The instant the zone's wall clock reads `clock` on `day`.

    In a DST gap (the time does not exist) it is the instant the clock jumps past it; in a
    DST fold (the time happens twice) the earlier instant for an opening, the later for a
    closing, so the span covers every moment `contains` accepts.
    """
    zone = window.zone
    naive = datetime.combine(day, clock)
    instant = naive.replace(tzinfo=zone, fold=1 if later else 0).astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == naive:
        return instant
    # `naive` does not exist (a gap): the first instant after it is the end of the gap
    before = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    after = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    low, high = min(before, after), max(before, after)
    while (high - low) > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).replace(tzinfo=None) >= naive:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


def _check_aware(moment: datetime) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("window spans need a timezone-aware datetime")
