"""A bounded, thread-safe cache: the one place rollout keeps computed values for reuse.

A fleet repeats a few node configurations many times, so the engine and the planner keep
results keyed by their inputs. Least recently used entries leave first; errors are never
kept (a computation that raises stores nothing), so a failing input always reports itself.
"""

from __future__ import annotations

import operator
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
        # the entry last asked for: a planner asks for one node's value many times in a row
        # (one read, one assignment: safe across threads without the lock)
        self._last: tuple[tuple[object, ...], V] | None = None

    def get_or_compute(self, inputs: tuple[object, ...], compute: Callable[[], V]) -> V:
        last = self._last
        if last is not None and _same_objects(last[0], inputs):
            return last[1]
        key = tuple(id(x) for x in inputs)
        hit = self._cache.get(key)
        if hit is not None and _same_objects(hit[0], inputs):
            self._last = hit
            return hit[1]
        value = compute()
        entry = (inputs, value)
        self._cache.put(key, entry)
        self._last = entry
        return value


def _same_objects(kept: tuple[object, ...], inputs: tuple[object, ...]) -> bool:
    return len(kept) == len(inputs) and all(map(operator.is_, kept, inputs))


class ValueTable(Generic[V]):
    """One shared value per key, made by `make(*key)`: for immutable values built again and
    again from the same parts (a fleet's nodes plan the same steps).

    A plain dict, emptied when it reaches `entries` (bounded, and cheaper than LRU order for
    values that cost a constructor call); without a lock: two threads making one key make
    equal values, and either may be kept.
    """

    def __init__(self, make: Callable[..., V], entries: int) -> None:
        self._make = make
        self._entries = entries
        self._values: dict[tuple[Hashable, ...], V] = {}

    def get(self, *key: Hashable) -> V:
        """The value made of these parts; the first one made, while it is kept."""
        value = self._values.get(key)
        if value is None:
            if len(self._values) >= self._entries:
                self._values.clear()
            value = self._values[key] = self._make(*key)
        return value
