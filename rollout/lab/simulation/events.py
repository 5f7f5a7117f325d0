"""Events the simulated components record, deduplicated the way the real recorder does."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import EVENTS


class EventRecorder:
    """Writes core/v1 Events for one component; a repeat bumps count and lastTimestamp."""

    def __init__(
        self,
        registry: Registry,
        component: str,
        host: str = "",
        clock: Callable[[], float] = time.time,
        repeat_s: float = 10.0,
    ) -> None:
        """`repeat_s`: a repeated event bumps its count at most this often."""
        self._registry = registry
        self._component = component
        self._host = host
        self._clock = clock
        self._repeat_s = repeat_s
        self._seen: dict[tuple[str, str, str], tuple[str, str, float]] = {}

    def record(
        self,
        involved: Mapping[str, Any],
        event_type: str,
        reason: str,
        message: str,
        *,
        host: str | None = None,
    ) -> None:
        """Record an event about `involved` (a whole object with kind and apiVersion)."""
        metadata = involved["metadata"]
        namespace = metadata.get("namespace") or "default"
        now = self._clock()
        key = (metadata["uid"], reason, message)
        seen = self._seen.get(key)
        if seen is not None:
            seen_namespace, seen_name, bumped_at = seen
            if now - bumped_at < self._repeat_s:
                return

            def bump(event: dict[str, Any]) -> None:
                event["count"] = int(event.get("count", 1)) + 1
                event["lastTimestamp"] = format_timestamp(now)

            if self._registry.mutate(EVENTS, seen_namespace, seen_name, bump) is not None:
                self._seen[key] = (seen_namespace, seen_name, now)
                return
        name = f"{metadata['name']}.{int(now * 1e9):x}"
        event = {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "kind": involved.get("kind"),
                "namespace": metadata.get("namespace", ""),
                "name": metadata["name"],
                "uid": metadata["uid"],
                "apiVersion": involved.get("apiVersion"),
                "resourceVersion": metadata.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "source": {"component": self._component, "host": host or self._host},
            "firstTimestamp": format_timestamp(now),
            "lastTimestamp": format_timestamp(now),
            "count": 1,
            "type": event_type,
            "reportingComponent": self._component,
            "reportingInstance": host or self._host,
        }
        try:
            self._registry.create(EVENTS, namespace, event)
        except ApiError:
            return  # the namespace went away: the real recorder drops such events too
        self._seen[key] = (namespace, name, now)
