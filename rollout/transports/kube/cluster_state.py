"""What diagnose reads of the cluster besides nodes and pods: RuntimeClasses, Events, and
the DaemonSets' rollout numbers. Read only, never written: each class has `from_json` alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rollout.transports.kube.objects import (
    StrMap,
    Toleration,
    empty_map,
    frozen_map,
    object_parts,
    parse_time,
)


@dataclass(frozen=True)
class RuntimeClass:
    """A node.k8s.io RuntimeClass: the name pods give, the CRI handler it maps to."""

    name: str
    handler: str

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RuntimeClass:
        return cls(name=(obj.get("metadata") or {})["name"], handler=str(obj.get("handler", "")))


@dataclass(frozen=True)
class Event:
    """A core/v1 Event as `kubectl describe` shows it: about what, why, how often, when last."""

    namespace: str
    name: str
    involved_kind: str
    involved_name: str
    reason: str = ""
    message: str = ""
    event_type: str = "Normal"
    count: int = 1
    last_seen: datetime | None = None

    def describe(self) -> str:
        """The event as `kubectl describe` lists it: type, reason, message, how often."""
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.event_type} {self.reason}: {self.message}{times}"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Event:
        meta = obj.get("metadata") or {}
        involved = obj.get("involvedObject") or {}
        series = obj.get("series") or {}
        # events.k8s.io writers fill series and eventTime; core writers count and lastTimestamp
        last = (
            obj.get("lastTimestamp")
            or series.get("lastObservedTime")
            or obj.get("eventTime")
            or obj.get("firstTimestamp")
        )
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            involved_kind=involved.get("kind", ""),
            involved_name=involved.get("name", ""),
            reason=obj.get("reason") or "",
            message=obj.get("message") or "",
            event_type=obj.get("type") or "Normal",
            count=int(obj.get("count") or series.get("count") or 1),
            last_seen=parse_time(last),
        )


@dataclass(frozen=True)
class DaemonSet:
    """A DaemonSet's rollout numbers: how many nodes should run its pod, and how many do."""

    namespace: str
    name: str
    labels: StrMap = field(default_factory=empty_map)
    desired: int = 0
    current: int = 0
    ready: int = 0
    available: int = 0
    updated: int = 0
    misscheduled: int = 0
    match_labels: StrMap = field(default_factory=empty_map)
    # where its pods go: the pod template's nodeSelector and tolerations
    node_selector: StrMap = field(default_factory=empty_map)
    tolerations: tuple[Toleration, ...] = ()

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> DaemonSet:
        meta, spec, status = object_parts(obj)
        template = (spec.get("template") or {}).get("spec") or {}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            labels=frozen_map(meta.get("labels")),
            desired=int(status.get("desiredNumberScheduled") or 0),
            current=int(status.get("currentNumberScheduled") or 0),
            ready=int(status.get("numberReady") or 0),
            available=int(status.get("numberAvailable") or 0),
            updated=int(status.get("updatedNumberScheduled") or 0),
            misscheduled=int(status.get("numberMisscheduled") or 0),
            match_labels=frozen_map((spec.get("selector") or {}).get("matchLabels")),
            node_selector=frozen_map(template.get("nodeSelector")),
            tolerations=tuple(Toleration.from_json(t) for t in template.get("tolerations") or []),
        )
