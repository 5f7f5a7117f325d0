"""The one bounded cache: least recently used leaves first, errors are never kept."""

from __future__ import annotations

import pytest

from rollout.memo import BoundedCache, IdentityMemo


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
