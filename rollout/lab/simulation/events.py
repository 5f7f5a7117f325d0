"""Events the simulated components record, deduplicated the way the real recorder does.

A Warning is also logged (the control plane's log, which `rollout lab status` quotes): a pod
the lab cannot run says why there too, as a kubelet's own log does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import EVENTS

log = logging.getLogger("rollout.lab.simulation")


@dataclass(eq=False)
class EventRecorder:
    """Writes core/v1 Events for one component; a repeat bumps count and lastTimestamp."""

    registry: Registry
    component: str
    host: str = ""
    clock: Callable[[], float] = time.time
    # A repeated event bumps its count at most this often.
    repeat_s: float = 10.0
    _seen: dict[tuple[str, str, str], tuple[str, str, float]] = field(
        default_factory=dict, init=False
    )

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
        now = self.clock()
        key = (metadata["uid"], reason, message)
        seen = self._seen.get(key)
        if seen is not None:
            seen_namespace, seen_name, bumped_at = seen
            if now - bumped_at < self.repeat_s:
                return

            def bump(event: dict[str, Any]) -> None:
                event["count"] = int(event.get("count", 1)) + 1
                event["lastTimestamp"] = format_timestamp(now)

            if self.registry.mutate(EVENTS, seen_namespace, seen_name, bump) is not None:
                self._seen[key] = (seen_namespace, seen_name, now)
                self._log(involved, event_type, reason, message, host or self.host)
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
            "source": {"component": self.component, "host": host or self.host},
            "firstTimestamp": format_timestamp(now),
            "lastTimestamp": format_timestamp(now),
            "count": 1,
            "type": event_type,
            "reportingComponent": self.component,
            "reportingInstance": host or self.host,
        }
        try:
            self.registry.create(EVENTS, namespace, event)
        except ApiError:
            return  # the namespace went away: the real recorder drops such events too
        self._seen[key] = (namespace, name, now)
        self._log(involved, event_type, reason, message, host or self.host)

    def _log(
        self, involved: Mapping[str, Any], event_type: str, reason: str, message: str, host: str
    ) -> None:
        """A Warning, as written (a repeat at most every repeat_s), in the log."""
        if event_type != "Warning":
            return
        metadata = involved["metadata"]
        where = "/".join(filter(None, (metadata.get("namespace"), metadata["name"])))
        kind = str(involved.get("kind") or "object").lower()
        source = f"{self.component} {host}" if host else self.component
        log.warning("%s: %s %s: %s: %s", source, kind, where, reason, message)
