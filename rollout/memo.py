"""A bounded, thread-safe cache: the one place rollout keeps computed values for reuse.

A fleet repeats a few node configurations many times, so the engine and the planner keep
results keyed by their inputs. Least recently used entries leave first; errors are never
kept (a computation that raises stores nothing), so a failing input always reports itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most `entries` values by key; callers only read what they get back."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._values: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.entries:
                self._values.popitem(last=False)

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """The kept value, else `compute()` kept (computed outside the lock)."""
        hit = self.get(key)
        if hit is not None:
            return hit
        value = compute()
        self.put(key, value)
        return value

    def __len__(self) -> int:
        return len(self._values)


class IdentityMemo(Generic[V]):
    """Values keyed by the identity of their inputs (objects that are not hashable).

    The inputs are kept with the value, so an id cannot be reused while its entry exists.
    """

    def __init__(self, entries: int) -> None:
        self._cache: BoundedCache[tuple[int, ...], tuple[tuple[object, ...], V]] = BoundedCache(
            entries
        )

    def get_or_compute(self, inputs: tuple[object, ...], compute: Callable[[], V]) -> V:
        key = tuple(id(x) for x in inputs)
        hit = self._cache.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], inputs, strict=True)):
            return hit[1]
        value = compute()
        self._cache.put(key, (inputs, value))
        return value
