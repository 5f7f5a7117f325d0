"""Policy arithmetic (waves, budgets), maintenance windows, label selectors, targets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout.spec import (
    LabelSelectorError,
    MaintenanceWindow,
    NodeAmount,
    Policy,
    SelectorOperator,
    Targets,
    Weekday,
    parse_label_selector,
    parse_node_amount,
)


def policy(waves: list[object], max_unavailable: object = 1) -> Policy:
    return Policy.model_validate({"waves": waves, "max_unavailable": max_unavailable})


@pytest.mark.parametrize(
    ("waves", "total", "sizes"),
    [
        ([1], 3, [1, 1, 1]),
        ([1, "10%", "25%"], 20, [1, 2, 5, 5, 5, 2]),
        ([1, "10%", "25%"], 4, [1, 1, 1, 1]),
        (["30%"], 10, [3, 3, 3, 1]),
        (["34%"], 10, [4, 4, 2]),  # rounded up: 3.4 -> 4
        (["1%"], 3, [1, 1, 1]),  # at least one node
        (["100%"], 7, [7]),
        ([2, 5], 6, [2, 4]),  # the last wave holds what is left
        ([10], 3, [3]),
        ([1], 0, []),
    ],
)
def test_wave_sizes(waves: list[object], total: int, sizes: list[int]) -> None:
    assert policy(waves).wave_sizes(total) == sizes


def test_wave_sizes_rejects_negative_totals() -> None:
    with pytest.raises(ValueError):
        policy([1]).wave_sizes(-1)


amounts = st.one_of(
    st.integers(min_value=1, max_value=50),
    st.integers(min_value=1, max_value=100).map(lambda p: f"{p}%"),
)


@given(waves=st.lists(amounts, min_size=1, max_size=6), total=st.integers(0, 500))
def test_wave_sizes_cover_every_node_once(waves: list[object], total: int) -> None:
    sizes = policy(waves).wave_sizes(total)
    assert sum(sizes) == total
    assert all(size >= 1 for size in sizes)
    # every wave but the last is exactly what its entry asks for
    parsed = [parse_node_amount(w) for w in waves]
    for index, size in enumerate(sizes[:-1]):
        assert size == parsed[min(index, len(parsed) - 1)].resolve_up(total)


@pytest.mark.parametrize(
    ("amount", "total", "count"),
    [(1, 10, 1), (3, 2, 3), ("25%", 6, 1), ("25%", 8, 2), ("25%", 2, 1), ("50%", 9, 4)],
)
def test_max_unavailable_count_rounds_down_but_at_least_one(
    amount: object, total: int, count: int
) -> None:
    assert policy([1], amount).max_unavailable_count(total) == count


def test_node_amount_text() -> None:
    assert str(parse_node_amount("25%")) == "25%"
    assert parse_node_amount(" 5 % ") == NodeAmount(5, is_percent=True)
    assert parse_node_amount(3).to_yaml() == 3


def test_halt_labels_always_include_upgrade_failed() -> None:
    custom = Policy.model_validate({"halt_on_labels": ["example.com/broken=yes"]})
    assert [str(label) for label in custom.effective_halt_labels] == [
        "example.com/broken=yes",
        "nvidia.com/gpu-driver-upgrade-state=upgrade-failed",
    ]
    labels = {"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}
    assert [str(x) for x in custom.find_halting_labels(labels)] == [
        "nvidia.com/gpu-driver-upgrade-state=upgrade-failed"
    ]
    assert custom.find_halting_labels({"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}) == ()


def window(**fields: object) -> MaintenanceWindow:
    return MaintenanceWindow.model_validate(fields)


def at(day: int, hour: int, minute: int = 0, tz: timezone = UTC) -> datetime:
    # 2024-01-01 is a Monday: day 0 = Monday
    return datetime(2024, 1, 1 + day, hour, minute, tzinfo=tz)


def test_window_same_day() -> None:
    w = window(days=["mon"], start="09:00", end="17:00")
    assert w.contains(at(0, 9)) and w.contains(at(0, 16, 59))
    assert not w.contains(at(0, 17)) and not w.contains(at(0, 8, 59))
    assert not w.contains(at(1, 10))  # Tuesday


def test_window_wrapping_midnight_belongs_to_its_start_day() -> None:
    w = window(days=["fri"], start="22:00", end="04:00")
    assert w.contains(at(4, 22)) and w.contains(at(4, 23, 59))
    assert w.contains(at(5, 3, 59))  # Saturday early morning, Friday's window
    assert not w.contains(at(5, 4)) and not w.contains(at(5, 22))
    assert not w.contains(at(4, 3))  # Friday early morning is Thursday's window


def test_window_time_zone() -> None:
    w = window(start="22:00", end="23:00", timezone="Asia/Tokyo")  # UTC+9, no DST
    assert w.contains(at(0, 13, 30))
    assert not w.contains(at(0, 22, 30))
    plus_nine = timezone(timedelta(hours=9))
    assert w.contains(at(0, 22, 30, plus_nine))


def test_window_defaults_to_every_day_utc() -> None:
    w = window(start="00:00", end="23:59")
    assert w.days == tuple(Weekday) and w.timezone == "UTC"


def test_window_needs_aware_datetimes() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        window(start="01:00", end="02:00").contains(datetime(2024, 1, 1, 1, 30))


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("", {}, True),
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),  # absent counts as not equal
        ("a!=b", {"a": "b"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": "x"}, False),
        ("!a", {}, True),
        ("a in (x, y)", {"a": "y"}, True),
        ("a in (x,y)", {}, False),
        ("a notin (x,y)", {}, True),
        ("a notin (x,y)", {"a": "x"}, False),
        ("a=", {"a": ""}, True),
        (
            "nvidia.com/gpu.present=true,node-role.kubernetes.io/gpu",
            {"nvidia.com/gpu.present": "true", "node-role.kubernetes.io/gpu": ""},
            True,
        ),
        (
            "nvidia.com/gpu.present=true,node-role.kubernetes.io/gpu",
            {"nvidia.com/gpu.present": "true"},
            False,
        ),
        (" a = b , ! c ", {"a": "b"}, True),
    ],
)
def test_selector_matches(text: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_label_selector(text).matches(labels) is matches


def test_selector_parts_and_canonical_text() -> None:
    selector = parse_label_selector("a in (x,y,x), b!=c, !d, e")
    ops = [r.operator for r in selector.requirements]
    assert ops == [
        SelectorOperator.IN,
        SelectorOperator.NOT_EQUALS,
        SelectorOperator.DOES_NOT_EXIST,
        SelectorOperator.EXISTS,
    ]
    assert selector.requirements[0].values == ("x", "y")
    assert selector.to_string() == "a in (x,y),b!=c,!d,e"
    assert parse_label_selector(selector.to_string()) == selector
    assert parse_label_selector(selector) is selector


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a in (b", "expected ')'"),
        ("a in ()", "needs at least one value"),
        ("a in b", "expected '('"),
        ("a b", "expected an operator"),
        ("a=b c", "expected ','"),
        ("a,,b", "expected a label key"),
        ("a=", None),
        ("=b", "expected a label key"),
        ("a>1", "operator '>' is not supported"),
        ("-a=b", "label key name"),
        ("Bad_/a=b", "prefix"),
        ("a=b_", "label value"),
        ("a=" + "x" * 64, "label value"),
        ("a,", "expected a label key, found the end"),
    ],
)
def test_selector_syntax_errors(text: str, fragment: str | None) -> None:
    if fragment is None:
        parse_label_selector(text)
        return
    with pytest.raises(LabelSelectorError) as caught:
        parse_label_selector(text)
    assert fragment in str(caught.value)


def test_selector_error_has_offset() -> None:
    with pytest.raises(LabelSelectorError) as caught:
        parse_label_selector("a=b, c>1")
    assert caught.value.offset == 6
    assert "at character 7" in str(caught.value)


def test_targets_include() -> None:
    targets = Targets.model_validate(
        {"selector": "gpu=true", "nodes": ["n1", "n2"], "exclude": ["n3"]}
    )
    assert targets.includes("n1", {"gpu": "true"})
    assert not targets.includes("n1", {})  # both selector and nodes must hold
    assert not targets.includes("n4", {"gpu": "true"})
    only_selector = Targets.model_validate({"selector": "gpu=true", "exclude": ["n3"]})
    assert only_selector.includes("n9", {"gpu": "true"})
    assert not only_selector.includes("n3", {"gpu": "true"})
