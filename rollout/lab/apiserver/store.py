"""The object store: every object of every kind, one cluster-wide revision, a watch history.

The store knows nothing of API semantics (validation, status isolation, preconditions); the
registry layers those on top. It hands out deep copies so no caller can change stored state
except through `put` and `remove`.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollout.lab.apiserver.resources import ResourceKind


@dataclass(frozen=True)
class ObjectKey:
    """Where one object lives: (group, version, resource, namespace, name)."""

    group: str
    version: str
    resource: str
    namespace: str
    name: str

    @classmethod
    def from_kind(cls, kind: ResourceKind, namespace: str | None, name: str) -> ObjectKey:
        return cls(kind.group, kind.version, kind.resource, namespace or "", name)


class WatchEventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True)
class WatchEvent:
    """One change, at the revision it produced; `obj` is never mutated after recording."""

    type: WatchEventType
    key: ObjectKey
    revision: int
    obj: dict[str, Any]


class RevisionExpired(Exception):
    """A watch asked for changes older than the history still holds (the real 410 Gone)."""

    def __init__(self, requested: int, oldest: int) -> None:
        self.requested = requested
        self.oldest = oldest
        super().__init__(f"too old resource version: {requested} ({oldest})")


class Store:
    """Thread-safe in-memory objects with a monotonically increasing resourceVersion."""

    def __init__(self, history_size: int = 20000) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._objects: dict[ObjectKey, dict[str, Any]] = {}
        self._revision = 1
        self._history: deque[WatchEvent] = deque(maxlen=history_size)
        self._closed = False

    @contextmanager
    def locked(self) -> Iterator[Store]:
        """Hold the store for a read-modify-write spanning several calls."""
        with self._lock:
            yield self

    @property
    def revision(self) -> int:
        with self._lock:
            return self._revision

    def get(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._objects.get(ObjectKey.from_kind(kind, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def select(self, kind: ResourceKind, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of one kind, in one namespace or all, ordered by (namespace, name)."""
        with self._lock:
            found = [
                (key, obj)
                for key, obj in self._objects.items()
                if key.group == kind.group
                and key.version == kind.version
                and key.resource == kind.resource
                and (namespace is None or key.namespace == namespace)
            ]
            found.sort(key=lambda item: (item[0].namespace, item[0].name))
            return [copy.deepcopy(obj) for _, obj in found]

    def put(self, kind: ResourceKind, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` (create or replace) at a new revision; returns the stored copy."""
        metadata = obj["metadata"]
        key = ObjectKey.from_kind(kind, metadata.get("namespace"), metadata["name"])
        with self._lock:
            self._revision += 1
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = str(self._revision)
            event_type = WatchEventType.MODIFIED if key in self._objects else WatchEventType.ADDED
            self._objects[key] = stored
            self._record(WatchEvent(event_type, key, self._revision, copy.deepcopy(stored)))
            return copy.deepcopy(stored)

    def remove(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Delete one object; returns it as it was, or None when absent."""
        key = ObjectKey.from_kind(kind, namespace, name)
        with self._lock:
            removed = self._objects.pop(key, None)
            if removed is None:
                return None
            # The real server reports a deletion at a new revision, on the object itself too.
            self._revision += 1
            removed["metadata"]["resourceVersion"] = str(self._revision)
            self._record(
                WatchEvent(WatchEventType.DELETED, key, self._revision, copy.deepcopy(removed))
            )
            return removed

    def wait_events(
        self, kind: ResourceKind, namespace: str | None, after: int, timeout_s: float
    ) -> tuple[list[WatchEvent], int]:
        """Events of a kind newer than revision `after`, waiting up to `timeout_s` for one.

        Returns the events and the revision to continue from. Raises RevisionExpired when
        `after` is older than the history.
        """
        with self._changed:
            if self._history and after < self._history[0].revision - 1:
                raise RevisionExpired(after, self._history[0].revision)
            if self._revision <= after and not self._closed:
                self._changed.wait(timeout_s)
            events = [
                e
                for e in self._history
                if e.revision > after
                and e.key.group == kind.group
                and e.key.version == kind.version
                and e.key.resource == kind.resource
                and (namespace is None or e.key.namespace == namespace)
            ]
            return events, self._revision

    def close(self) -> None:
        """Wake every waiting watch so it can notice the server is stopping."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _record(self, event: WatchEvent) -> None:
        self._history.append(event)
        self._changed.notify_all()
