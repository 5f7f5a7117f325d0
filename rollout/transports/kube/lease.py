"""A coordination.k8s.io Lease as rollout keeps one: the run's lock in the cluster
(rollout/lease.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from rollout.transports.kube.objects import (
    StrMap,
    empty_map,
    format_micro_time,
    frozen_map,
    object_parts,
    parse_time,
)


@dataclass(frozen=True)
class Lease:
    """A coordination.k8s.io Lease; replace_lease is optimistic on resource_version."""

    namespace: str
    name: str
    holder_identity: str | None = None
    lease_duration_s: int | None = None
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int = 0
    labels: StrMap = field(default_factory=empty_map)
    resource_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        spec: dict[str, Any] = {"leaseTransitions": self.lease_transitions}
        if self.holder_identity is not None:
            spec["holderIdentity"] = self.holder_identity
        if self.lease_duration_s is not None:
            spec["leaseDurationSeconds"] = self.lease_duration_s
        if self.acquire_time is not None:
            spec["acquireTime"] = format_micro_time(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = format_micro_time(self.renew_time)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def same_content(self, other: Lease) -> bool:
        """Whether `other` is this lease, its version aside."""
        return replace(self, resource_version=None) == replace(other, resource_version=None)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Lease:
        meta, spec, _ = object_parts(obj)
        duration = spec.get("leaseDurationSeconds")
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            holder_identity=spec.get("holderIdentity"),
            lease_duration_s=int(duration) if duration is not None else None,
            acquire_time=parse_time(spec.get("acquireTime")),
            renew_time=parse_time(spec.get("renewTime")),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
            labels=frozen_map(meta.get("labels")),
            resource_version=meta.get("resourceVersion"),
        )
