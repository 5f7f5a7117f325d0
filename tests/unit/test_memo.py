"""The one bounded cache: least recently used leaves first, errors are never kept."""

from __future__ import annotations

import pytest

from rollout.memo import BoundedCache, IdentityMemo, ValueTable


def test_least_recently_used_leaves_first() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_computed_once_and_errors_not_kept() -> None:
    cache: BoundedCache[str, int] = BoundedCache(4)
    calls: list[str] = []

    def compute() -> int:
        calls.append("x")
        return 7

    assert cache.get_or_compute("k", compute) == 7
    assert cache.get_or_compute("k", compute) == 7
    assert calls == ["x"]

    def fail() -> int:
        raise ValueError("bad input")

    for _ in range(2):
        with pytest.raises(ValueError):
            cache.get_or_compute("broken", fail)
    assert cache.get("broken") is None


def test_identity_memo_answers_only_the_same_objects() -> None:
    memo: IdentityMemo[int] = IdentityMemo(4)
    first, second = {"a": 1}, {"a": 1}  # equal, unhashable, distinct
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert memo.get_or_compute((first,), compute) == 1
    assert memo.get_or_compute((first,), compute) == 1
    assert memo.get_or_compute((second,), compute) == 2


def test_a_value_table_makes_one_value_per_key_and_stays_bounded() -> None:
    made: list[tuple[str, int]] = []

    def make(name: str, number: int) -> tuple[str, int]:
        made.append((name, number))
        return (name, number)

    table: ValueTable[tuple[str, int]] = ValueTable(make, 2)
    first = table.get("a", 1)
    assert table.get("a", 1) is first
    assert made == [("a", 1)]
    table.get("b", 2)
    table.get("c", 3)  # the table was full: emptied, then "c" kept
    assert table.get("a", 1) == first
    assert made == [("a", 1), ("b", 2), ("c", 3), ("a", 1)]


def test_step_plans_are_shared_values() -> None:
    from rollout.plan import StepPlan

    acting = StepPlan.acting("cordon", "mark the node unschedulable")
    assert StepPlan.acting("cordon", "mark the node unschedulable") is acting
    stated = acting.with_step("cordon", "why")
    assert stated == StepPlan("cordon", "why", "mark the node unschedulable", None, ())
    assert StepPlan.skipping("cordon", "nothing to do").noop_reason == "nothing to do"
