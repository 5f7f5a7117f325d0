"""What rollout reads and writes of Kubernetes objects: plain frozen dataclasses from JSON.

No client model objects: each class reads the few fields rollout needs from the JSON the
server sent (`from_json`) and writes the JSON it sends (`to_json`).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Self

StrMap = Mapping[str, str]
# Kubernetes' recommended labels, which rollout puts on the objects it creates
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"


def frozen_map(value: Mapping[str, Any] | None) -> StrMap:
    return types.MappingProxyType({str(k): str(v) for k, v in (value or {}).items()})


def empty_map() -> StrMap:
    return types.MappingProxyType({})


def parse_time(text: str | None) -> datetime | None:
    """A Kubernetes Time or MicroTime (RFC 3339, `Z`) as an aware datetime."""
    if not text:
        return None
    return datetime.fromisoformat(text)


def format_micro_time(moment: datetime) -> str:
    """MicroTime as the server writes it: `2024-05-01T10:00:00.000000Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_time(moment: datetime) -> str:
    """Time (whole seconds), as Event timestamps carry it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str | None = None


@dataclass(frozen=True)
class Node:
    """What rollout reads of a Node."""

    name: str
    uid: str
    resource_version: str
    labels: StrMap = field(default_factory=empty_map)
    annotations: StrMap = field(default_factory=empty_map)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    # condition type -> status ("True", "False", "Unknown")
    conditions: StrMap = field(default_factory=empty_map)
    capacity: StrMap = field(default_factory=empty_map)
    allocatable: StrMap = field(default_factory=empty_map)
    kubelet_version: str = ""
    container_runtime_version: str = ""
    # when the Ready condition last changed (its lastTransitionTime): NotReady since when
    ready_changed_at: datetime | None = None

    @property
    def ready(self) -> bool:
        return self.conditions.get("Ready") == "True"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Node:
        meta, spec, status = object_parts(obj)
        info = status.get("nodeInfo") or {}
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
            labels=frozen_map(meta.get("labels")),
            annotations=frozen_map(meta.get("annotations")),
            unschedulable=bool(spec.get("unschedulable", False)),
            taints=tuple(
                Taint(key=t["key"], effect=t.get("effect", ""), value=t.get("value"))
                for t in spec.get("taints") or []
            ),
            conditions=frozen_map(
                {c["type"]: c.get("status", "Unknown") for c in status.get("conditions") or []}
            ),
            capacity=frozen_map(status.get("capacity")),
            allocatable=frozen_map(status.get("allocatable")),
            kubelet_version=info.get("kubeletVersion", ""),
            container_runtime_version=info.get("containerRuntimeVersion", ""),
            ready_changed_at=parse_time(
                next(
                    (
                        c.get("lastTransitionTime")
                        for c in status.get("conditions") or []
                        if c.get("type") == "Ready"
                    ),
                    None,
                )
            ),
        )


@dataclass(frozen=True)
class OwnerRef:
    kind: str
    name: str
    controller: bool = False


@dataclass(frozen=True)
class Toleration:
    """A pod's toleration as written; an empty key with Exists tolerates every taint."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Toleration:
        seconds = obj.get("tolerationSeconds")
        return cls(
            key=str(obj.get("key") or ""),
            operator=str(obj.get("operator") or "Equal"),
            value=str(obj.get("value") or ""),
            effect=str(obj.get("effect") or ""),
            toleration_seconds=int(seconds) if seconds is not None else None,
        )


@dataclass(frozen=True)
class ContainerResources:
    """One container's requests and limits: resource name -> quantity text, as written."""

    name: str
    requests: StrMap = field(default_factory=empty_map)
    limits: StrMap = field(default_factory=empty_map)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ContainerResources:
        resources = obj.get("resources") or {}
        return cls(
            name=str(obj.get("name", "")),
            requests=frozen_map(resources.get("requests")),
            limits=frozen_map(resources.get("limits")),
        )


@dataclass(frozen=True)
class ContainerStatus:
    """Where one container is: its state (waiting, running, terminated) and that state's reason."""

    name: str
    ready: bool = False
    state: str = "waiting"
    reason: str = ""
    exit_code: int | None = None
    restart_count: int = 0

    @property
    def completed(self) -> bool:
        """Exited 0: for an init container, done."""
        return self.state == "terminated" and self.exit_code == 0

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ContainerStatus:
        states = obj.get("state") or {}
        # one key is set; none (a status written before the kubelet's first report) is waiting
        state, detail = next(
            ((k, v) for k, v in states.items() if isinstance(v, Mapping)), ("waiting", {})
        )
        code = detail.get("exitCode")
        return cls(
            name=str(obj.get("name", "")),
            ready=bool(obj.get("ready", False)),
            state=str(state),
            reason=str(detail.get("reason") or ""),
            exit_code=int(code) if code is not None else None,
            restart_count=int(obj.get("restartCount") or 0),
        )


# init containers wait so while an earlier one runs: not a fault
_INIT_WAITING = frozenset({"PodInitializing"})


@dataclass(frozen=True)
class Pod:
    """What rollout reads of a Pod: enough to drain a node, judge a smoke pod, diagnose one."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    node_name: str | None = None
    phase: str = "Pending"
    labels: StrMap = field(default_factory=empty_map)
    annotations: StrMap = field(default_factory=empty_map)
    owners: tuple[OwnerRef, ...] = ()
    containers: tuple[str, ...] = ()
    ready: bool = False
    deleting: bool = False
    uses_empty_dir: bool = False
    # waiting/terminated reasons of the containers (ContainerCreating, CrashLoopBackOff, ...)
    container_reasons: tuple[str, ...] = ()
    # what the containers' states say beside their reasons (a pull error, a start error)
    container_messages: tuple[str, ...] = ()
    reason: str = ""
    message: str = ""
    # nvidia.com/gpu the pod's containers ask for (limits, else requests), summed
    gpu_request: int = 0
    # the spec diagnose judges: every container's requests and limits, where the pod may run
    resources: tuple[ContainerResources, ...] = ()
    runtime_class_name: str | None = None
    node_selector: StrMap = field(default_factory=empty_map)
    tolerations: tuple[Toleration, ...] = ()
    init_statuses: tuple[ContainerStatus, ...] = ()
    # the PodScheduled=False condition's message (`0/4 nodes are available: ...`)
    scheduling_message: str = ""

    @property
    def stuck_init_container(self) -> ContainerStatus | None:
        """The first init container that has not completed (they run in order), if any."""
        return next((s for s in self.init_statuses if not s.completed), None)

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)

    @property
    def is_mirror(self) -> bool:
        """A static pod's mirror: the kubelet owns it, eviction cannot remove it."""
        return "kubernetes.io/config.mirror" in self.annotations

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Pod:
        meta, spec, status = object_parts(obj)
        reasons: list[str] = []
        messages: list[str] = []
        for container_status in status.get("containerStatuses") or []:
            for state in (container_status.get("state") or {}).values():
                if isinstance(state, Mapping) and state.get("reason"):
                    reasons.append(str(state["reason"]))
                if isinstance(state, Mapping) and state.get("message"):
                    messages.append(str(state["message"]))
        init_statuses = tuple(
            ContainerStatus.from_json(s) for s in status.get("initContainerStatuses") or []
        )
        # as kubectl shows them (Init:CrashLoopBackOff), so a stuck init container is a reason
        reasons += [
            f"Init:{s.reason}"
            for s in init_statuses
            if s.reason and not s.completed and s.reason not in _INIT_WAITING
        ]
        scheduling = next(
            (
                str(c.get("message") or "")
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            "",
        )
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
            node_name=spec.get("nodeName"),
            phase=status.get("phase", "Pending"),
            labels=frozen_map(meta.get("labels")),
            annotations=frozen_map(meta.get("annotations")),
            owners=tuple(
                OwnerRef(kind=o["kind"], name=o["name"], controller=bool(o.get("controller")))
                for o in meta.get("ownerReferences") or []
            ),
            containers=tuple(c["name"] for c in spec.get("containers") or []),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            ),
            deleting=bool(meta.get("deletionTimestamp")),
            uses_empty_dir=any("emptyDir" in v for v in spec.get("volumes") or []),
            container_reasons=tuple(reasons),
            container_messages=tuple(messages),
            reason=status.get("reason", ""),
            message=status.get("message", ""),
            gpu_request=sum(_gpu_request(c) for c in spec.get("containers") or []),
            resources=tuple(ContainerResources.from_json(c) for c in spec.get("containers") or []),
            runtime_class_name=spec.get("runtimeClassName") or None,
            node_selector=frozen_map(spec.get("nodeSelector")),
            tolerations=tuple(Toleration.from_json(t) for t in spec.get("tolerations") or []),
            init_statuses=init_statuses,
            scheduling_message=scheduling,
        )


def _gpu_request(container: Mapping[str, Any]) -> int:
    """A container's nvidia.com/gpu: its limit (the device plugin's rule), else its request."""
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get("nvidia.com/gpu")
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


@dataclass(frozen=True)
class PodDisruptionBudget:
    namespace: str
    name: str
    disruptions_allowed: int
    current_healthy: int
    desired_healthy: int
    expected_pods: int
    match_labels: StrMap = field(default_factory=empty_map)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PodDisruptionBudget:
        meta, spec, status = object_parts(obj)
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            disruptions_allowed=int(status.get("disruptionsAllowed", 0)),
            current_healthy=int(status.get("currentHealthy", 0)),
            desired_healthy=int(status.get("desiredHealthy", 0)),
            expected_pods=int(status.get("expectedPods", 0)),
            match_labels=frozen_map((spec.get("selector") or {}).get("matchLabels")),
        )


@dataclass(frozen=True)
class ConfigMap:
    """A ConfigMap; replace_configmap sends resource_version, so a stale copy is a Conflict."""

    namespace: str
    name: str
    data: StrMap = field(default_factory=empty_map)
    labels: StrMap = field(default_factory=empty_map)
    annotations: StrMap = field(default_factory=empty_map)
    resource_version: str | None = None
    uid: str | None = None  # as read: Events on the object name it

    def with_data(self, data: Mapping[str, str]) -> Self:
        return replace(self, data=frozen_map(data))

    def same_content(self, other: ConfigMap) -> bool:
        """Whether `other` holds what this one does (its version and uid aside)."""
        mine = (self.data, self.labels, self.annotations)
        return (other.data, other.labels, other.annotations) == mine

    def to_json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(self.data)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Self:
        meta = obj.get("metadata") or {}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            data=frozen_map(cls.decode_data(obj.get("data") or {})),
            labels=frozen_map(meta.get("labels")),
            annotations=frozen_map(meta.get("annotations")),
            resource_version=meta.get("resourceVersion"),
            uid=meta.get("uid"),
        )

    @staticmethod
    def decode_data(data: Mapping[str, Any]) -> Mapping[str, Any]:
        """`data` as the server sends it, as text (a Secret's comes base64)."""
        return data


class EventType(Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EvictionOutcome(Enum):
    """What an eviction did; a refusal by a budget raises EvictionBlocked instead."""

    EVICTED = "evicted"
    # Already deleted: for a drain, as good as evicted.
    GONE = "gone"


def object_parts(obj: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}


def plain(value: Any) -> Any:
    """Mappings as dicts, sequences as lists, all the way down (for the client, and YAML)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
