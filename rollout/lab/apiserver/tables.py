"""Server-side printing: `meta.k8s.io/v1` Table responses with the columns kube-apiserver's own
printers give the built-in kinds served here, and NAME/AGE for the others (what the real
server gives a custom resource without printer columns)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rollout.lab.apiserver.resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    CONFIGMAPS,
    CRONJOBS,
    DAEMONSETS,
    EVENTS,
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    NVIDIADRIVERS,
    PODDISRUPTIONBUDGETS,
    PODS,
    ROLEBINDINGS,
    ROLES,
    RUNTIMECLASSES,
    SERVICEACCOUNTS,
    ResourceKind,
)

# A column's cell: the object and the time now (for ages) to the value shown.
Cell = Callable[[Mapping[str, Any], float], Any]
_TABLE_MEDIA = "as=Table"
_NODE_ROLE_PREFIX = "node-role.kubernetes.io/"
_NODE_ROLE_LABEL = "kubernetes.io/role"


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for a meta.k8s.io Table (kubectl get does, first choice)."""
    for media in accept.split(","):
        params = {p.strip() for p in media.split(";")[1:]}
        if _TABLE_MEDIA in params and "g=meta.k8s.io" in params:
            return True
    return False


@dataclass(frozen=True)
class Column:
    """One column definition; priority 1 columns show only with `-o wide`."""

    name: str
    description: str
    cell: Cell
    priority: int = 0
    type: str = "string"
    format: str = ""

    def to_definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


def to_table(
    kind: ResourceKind,
    objects: Sequence[Mapping[str, Any]],
    *,
    resource_version: str = "",
    include_object: str = "",
    now_s: float | None = None,
) -> dict[str, Any]:
    """The Table of `objects` (one for a single GET), rows carrying the metadata as the real
    server does by default, the whole object with includeObject=Object, none with None."""
    now = time.time() if now_s is None else now_s
    columns = _COLUMNS.get(kind.resource, _DEFAULT_COLUMNS)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [column.cell(obj, now) for column in columns]}
        if include_object == "Object":
            row["object"] = dict(obj)
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata", {}),
            }
        rows.append(row)
    metadata = {"resourceVersion": resource_version} if resource_version else {}
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": [column.to_definition() for column in columns],
        "rows": rows,
    }


def format_age(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: 45s, 3m20s, 5h10m, 3d4h, 2y30d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata: Mapping[str, Any] = obj.get("metadata") or {}
    return metadata


def _name(obj: Mapping[str, Any], _now: float) -> str:
    return str(_metadata(obj).get("name", ""))


def _age(obj: Mapping[str, Any], now: float) -> str:
    return _since(_metadata(obj).get("creationTimestamp"), now)


def _since(stamp: Any, now: float) -> str:
    """translateTimestampSince: the age of an RFC 3339 time, `<unknown>` without one."""
    if not stamp:
        return "<unknown>"
    at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    return format_age(now - at)


def _field_text(path: str, absent: str = "") -> Cell:
    """The cell of the field at a dotted path (`status.podIP`); `absent` where it is empty."""
    keys = path.split(".")

    def cell(obj: Mapping[str, Any], _now: float) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        return str(value or absent)

    return cell


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status: Mapping[str, Any] = obj.get("status") or {}
    return status


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = obj.get("spec") or {}
    return spec


# ------------------------------------------------------------------ nodes


def _node_status(obj: Mapping[str, Any], _now: float) -> str:
    ready = "Unknown"
    for condition in _status(obj).get("conditions") or []:
        if condition.get("type") == "Ready":
            ready = "Ready" if condition.get("status") == "True" else "NotReady"
    states = [ready]
    if _spec(obj).get("unschedulable"):
        states.append("SchedulingDisabled")
    return ",".join(states)


def _node_roles(obj: Mapping[str, Any], _now: float) -> str:
    roles = set()
    for key, value in (_metadata(obj).get("labels") or {}).items():
        if key.startswith(_NODE_ROLE_PREFIX) and key != _NODE_ROLE_PREFIX:
            roles.add(key.removeprefix(_NODE_ROLE_PREFIX))
        elif key == _NODE_ROLE_LABEL and value:
            roles.add(value)
    return ",".join(sorted(roles)) or "<none>"


def _node_address(address_type: str) -> Cell:
    def cell(obj: Mapping[str, Any], _now: float) -> str:
        for address in _status(obj).get("addresses") or []:
            if address.get("type") == address_type:
                return str(address.get("address"))
        return "<none>"

    return cell


# ------------------------------------------------------------------- pods


def _pod_ready(obj: Mapping[str, Any], _now: float) -> str:
    statuses = _status(obj).get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{len(_spec(obj).get('containers') or [])}"


def _pod_reason(obj: Mapping[str, Any], _now: float) -> str:
    """The STATUS column as kubectl's printPod words it (init containers aside)."""
    status = _status(obj)
    phase = str(status.get("phase") or "")
    reason = str(status.get("reason") or phase)
    running = False
    for container in reversed(status.get("containerStatuses") or []):
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated:
            signal = terminated.get("signal")
            reason = f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"
        elif state.get("running") and container.get("ready"):
            running = True
    if reason == "Completed" and running:
        reason = "Running" if _has_ready_condition(status) else "NotReady"
    if _metadata(obj).get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason


def _has_ready_condition(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _pod_restarts(obj: Mapping[str, Any], _now: float) -> str:
    statuses = _status(obj).get("containerStatuses") or []
    return str(sum(int(s.get("restartCount") or 0) for s in statuses))


def _pod_gates(obj: Mapping[str, Any], _now: float) -> str:
    gates = _spec(obj).get("readinessGates") or []
    if not gates:
        return "<none>"
    conditions = {c.get("type"): c.get("status") for c in _status(obj).get("conditions") or []}
    ready = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
    return f"{ready}/{len(gates)}"


# ------------------------------------------------------------- the others


def _configmap_data(obj: Mapping[str, Any], _now: float) -> int:
    return len(obj.get("data") or {}) + len(obj.get("binaryData") or {})


def _budget_field(field: str) -> Cell:
    def cell(obj: Mapping[str, Any], _now: float) -> str:
        value = _spec(obj).get(field)
        return "N/A" if value is None else str(value)

    return cell


def _budget_allowed(obj: Mapping[str, Any], _now: float) -> int:
    return int(_status(obj).get("disruptionsAllowed") or 0)


def _status_count(name: str, description: str, field: str) -> Column:
    """An integer column of a count the controller writes in the status (0 until it does)."""

    def cell(obj: Mapping[str, Any], _now: float) -> int:
        return int(_status(obj).get(field) or 0)

    return Column(name, description, cell, type="integer")


def _format_labels(labels: Mapping[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "<none>"


def _template_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    template: Mapping[str, Any] = _spec(obj).get("template") or {}
    spec: Mapping[str, Any] = template.get("spec") or {}
    return spec


def _daemonset_node_selector(obj: Mapping[str, Any], _now: float) -> str:
    return _format_labels(_template_spec(obj).get("nodeSelector"))


def _daemonset_containers(field: str) -> Cell:
    def cell(obj: Mapping[str, Any], _now: float) -> str:
        return ",".join(str(c.get(field, "")) for c in _template_spec(obj).get("containers") or [])

    return cell


def _daemonset_selector(obj: Mapping[str, Any], _now: float) -> str:
    selector = _spec(obj).get("selector") or {}
    return _format_labels(selector.get("matchLabels"))


def _account_secrets(obj: Mapping[str, Any], _now: float) -> int:
    return len(obj.get("secrets") or [])


def _binding_role(obj: Mapping[str, Any], _now: float) -> str:
    ref = obj.get("roleRef") or {}
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


def _binding_subjects(kind: str) -> Cell:
    def cell(obj: Mapping[str, Any], _now: float) -> str:
        names = [
            f"{s.get('namespace', '')}/{s.get('name', '')}"
            if kind == "ServiceAccount"
            else str(s.get("name", ""))
            for s in obj.get("subjects") or []
            if s.get("kind") == kind
        ]
        return ", ".join(names)

    return cell


def _event_first_seen(obj: Mapping[str, Any], now: float) -> str:
    return _since(obj.get("firstTimestamp") or obj.get("eventTime"), now)


def _event_last_seen(obj: Mapping[str, Any], now: float) -> str:
    series = obj.get("series") or {}
    if series.get("lastObservedTime"):
        return _since(series["lastObservedTime"], now)
    if obj.get("lastTimestamp"):
        return _since(obj["lastTimestamp"], now)
    return _event_first_seen(obj, now)


def _event_count(obj: Mapping[str, Any], _now: float) -> int:
    series = obj.get("series") or {}
    return int(series.get("count") or obj.get("count") or 1)


def _event_object(obj: Mapping[str, Any], _now: float) -> str:
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    return f"{kind}/{involved['name']}" if involved.get("name") else kind


def _event_source(obj: Mapping[str, Any], _now: float) -> str:
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent") or ""
    instance = source.get("host") or obj.get("reportingInstance") or ""
    return f"{component}, {instance}" if instance else str(component)


def _event_field(field: str) -> Cell:
    def cell(obj: Mapping[str, Any], _now: float) -> str:
        return str(obj.get(field) or "").strip()

    return cell


def _event_subobject(obj: Mapping[str, Any], _now: float) -> str:
    return str((obj.get("involvedObject") or {}).get("fieldPath") or "")


# ------------------------------------------------------------------ batch


def _cronjob_suspend(obj: Mapping[str, Any], _now: float) -> str:
    suspend = _spec(obj).get("suspend")
    return "<unset>" if suspend is None else str(bool(suspend))


def _cronjob_active(obj: Mapping[str, Any], _now: float) -> int:
    return len(_status(obj).get("active") or [])


def _cronjob_last(obj: Mapping[str, Any], now: float) -> str:
    last = _status(obj).get("lastScheduleTime")
    return _since(last, now) if last else "<none>"


def _job_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Job's spec, or a CronJob's job template's."""
    template: Mapping[str, Any] = _spec(obj).get("jobTemplate") or {}
    return template.get("spec") or {} if obj.get("kind") == "CronJob" else _spec(obj)


def _batch_containers(field: str) -> Cell:
    def cell(obj: Mapping[str, Any], _now: float) -> str:
        pod = (_job_spec(obj).get("template") or {}).get("spec") or {}
        return ",".join(str(c.get(field, "")) for c in pod.get("containers") or [])

    return cell


def _job_selector(obj: Mapping[str, Any], _now: float) -> str:
    selector = _job_spec(obj).get("selector") or {}
    return _format_labels(selector.get("matchLabels")) or "<none>"


def _job_status(obj: Mapping[str, Any], _now: float) -> str:
    held = {
        c.get("type") for c in _status(obj).get("conditions") or [] if c.get("status") == "True"
    }
    if "Complete" in held:
        return "Complete"
    if "Failed" in held:
        return "Failed"
    if _metadata(obj).get("deletionTimestamp"):
        return "Terminating"
    if "Suspended" in held:
        return "Suspended"
    return "FailureTarget" if "FailureTarget" in held else "Running"


def _job_completions(obj: Mapping[str, Any], _now: float) -> str:
    succeeded = int(_status(obj).get("succeeded") or 0)
    return f"{succeeded}/{int(_spec(obj).get('completions') or 1)}"


def _job_duration(obj: Mapping[str, Any], now: float) -> str:
    status = _status(obj)
    if not status.get("startTime"):
        return ""
    started = datetime.fromisoformat(str(status["startTime"]).replace("Z", "+00:00"))
    end = status.get("completionTime")
    until = datetime.fromisoformat(str(end).replace("Z", "+00:00")).timestamp() if end else now
    return format_age(until - started.timestamp())


_NAME = Column(
    "Name",
    "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    _name,
    format="name",
)
_AGE = Column(
    "Age",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
    _age,
)
_DEFAULT_COLUMNS = (_NAME, _AGE)
_BINDING_COLUMNS = (
    _NAME,
    Column("Role", "Role referenced by the binding.", _binding_role),
    _AGE,
    Column("Users", "Users in the binding.", _binding_subjects("User"), 1),
    Column("Groups", "Groups in the binding.", _binding_subjects("Group"), 1),
    Column(
        "ServiceAccounts", "ServiceAccounts in the binding.", _binding_subjects("ServiceAccount"), 1
    ),
)
# printJob and printCronJob end alike: the age, then (wide) the pod template's containers
# and images and the Job's selector.
_BATCH_TAIL = (
    _AGE,
    Column("Containers", "Container names.", _batch_containers("name"), 1),
    Column("Images", "Container images.", _batch_containers("image"), 1),
    Column("Selector", "Label selector for pods.", _job_selector, 1),
)
_COLUMNS: dict[str, tuple[Column, ...]] = {
    NODES.resource: (
        _NAME,
        Column("Status", "The status of the node", _node_status),
        Column("Roles", "The roles of the node", _node_roles),
        _AGE,
        Column(
            "Version",
            "Kubelet Version reported by the node.",
            _field_text("status.nodeInfo.kubeletVersion"),
        ),
        Column("Internal-IP", "List of internal IPs.", _node_address("InternalIP"), 1),
        Column("External-IP", "List of external IPs.", _node_address("ExternalIP"), 1),
        Column(
            "OS-Image",
            "OS Image reported by the node.",
            _field_text("status.nodeInfo.osImage", "<unknown>"),
            1,
        ),
        Column(
            "Kernel-Version",
            "Kernel Version reported by the node.",
            _field_text("status.nodeInfo.kernelVersion", "<unknown>"),
            1,
        ),
        Column(
            "Container-Runtime",
            "Container Runtime Version reported by the node.",
            _field_text("status.nodeInfo.containerRuntimeVersion", "<unknown>"),
            1,
        ),
    ),
    PODS.resource: (
        _NAME,
        Column("Ready", "The aggregate readiness state of this pod.", _pod_ready),
        Column("Status", "The aggregate status of the containers.", _pod_reason),
        Column("Restarts", "The number of container restarts.", _pod_restarts),
        _AGE,
        Column("IP", "IP address allocated to the pod.", _field_text("status.podIP", "<none>"), 1),
        Column(
            "Node",
            "Name of the node the pod is assigned to.",
            _field_text("spec.nodeName", "<none>"),
            1,
        ),
        Column(
            "Nominated Node",
            "Nominated node name.",
            _field_text("status.nominatedNodeName", "<none>"),
            1,
        ),
        Column("Readiness Gates", "Pod readiness gates.", _pod_gates, 1),
    ),
    NAMESPACES.resource: (
        _NAME,
        Column("Status", "The status of the namespace", _field_text("status.phase")),
        _AGE,
    ),
    PODDISRUPTIONBUDGETS.resource: (
        _NAME,
        Column(
            "Min Available",
            "The minimum number of pods that must be available.",
            _budget_field("minAvailable"),
        ),
        Column(
            "Max Unavailable",
            "The maximum number of pods that may be unavailable.",
            _budget_field("maxUnavailable"),
        ),
        Column(
            "Allowed Disruptions",
            "Calculated number of pods that may be disrupted at this time.",
            _budget_allowed,
            type="integer",
        ),
        _AGE,
    ),
    RUNTIMECLASSES.resource: (
        _NAME,
        Column("Handler", "Handler specifies the underlying runtime.", _field_text("handler")),
        _AGE,
    ),
    DAEMONSETS.resource: (
        _NAME,
        _status_count("Desired", "The desired number of pods.", "desiredNumberScheduled"),
        _status_count("Current", "The current number of pods.", "currentNumberScheduled"),
        _status_count("Ready", "The number of ready pods.", "numberReady"),
        _status_count("Up-to-date", "The number of updated pods.", "updatedNumberScheduled"),
        _status_count("Available", "The number of available pods.", "numberAvailable"),
        Column("Node Selector", "The node selector of the pod template.", _daemonset_node_selector),
        _AGE,
        Column(
            "Containers",
            "Names of each container in the template.",
            _daemonset_containers("name"),
            1,
        ),
        Column(
            "Images",
            "Images referenced by each container in the template.",
            _daemonset_containers("image"),
            1,
        ),
        Column("Selector", "Label selector for pods.", _daemonset_selector, 1),
    ),
    EVENTS.resource: (
        Column("Last Seen", "Time since the event was last seen.", _event_last_seen),
        Column("Type", "The type of the event.", _event_field("type")),
        Column("Reason", "Why the event happened.", _event_field("reason")),
        Column("Object", "The object the event is about.", _event_object),
        Column("Subobject", "The part of the object.", _event_subobject, 1),
        Column("Source", "The component that reported it.", _event_source, 1),
        Column("Message", "What happened.", _event_field("message")),
        Column("First Seen", "Time since it was first seen.", _event_first_seen, 1),
        Column("Count", "How often it happened.", _event_count, 1),
        Column("Name", "The event's name.", _name, 1),
    ),
    # the CRD's additionalPrinterColumns: Status (.status.state) and Age, a string column of
    # .metadata.creationTimestamp, so the real server prints the timestamp itself
    NVIDIADRIVERS.resource: (
        _NAME,
        Column("Status", "", _field_text("status.state")),
        Column("Age", "", _field_text("metadata.creationTimestamp")),
    ),
    LEASES.resource: (
        _NAME,
        Column("Holder", "The holder of the lease.", _field_text("spec.holderIdentity")),
        _AGE,
    ),
    SERVICEACCOUNTS.resource: (
        _NAME,
        Column("Secrets", "Secrets of the service account.", _account_secrets),
        _AGE,
    ),
    ROLES.resource: (
        _NAME,
        Column(
            "Created At",
            "Time the role was created.",
            _field_text("metadata.creationTimestamp"),
            type="date",
        ),
    ),
    CLUSTERROLES.resource: (
        _NAME,
        Column(
            "Created At",
            "Time the cluster role was created.",
            _field_text("metadata.creationTimestamp"),
            type="date",
        ),
    ),
    ROLEBINDINGS.resource: _BINDING_COLUMNS,
    CLUSTERROLEBINDINGS.resource: _BINDING_COLUMNS,
    CONFIGMAPS.resource: (
        _NAME,
        Column("Data", "Data contains the configuration data.", _configmap_data, type="integer"),
        _AGE,
    ),
    # printCronJob and printJob of pkg/printers/internalversion
    CRONJOBS.resource: (
        _NAME,
        Column("Schedule", "The schedule in Cron format.", _field_text("spec.schedule", "<none>")),
        Column(
            "Timezone", "The time zone of the schedule.", _field_text("spec.timeZone", "<none>")
        ),
        Column("Suspend", "Whether runs are suspended.", _cronjob_suspend, type="boolean"),
        Column("Active", "The number of running jobs.", _cronjob_active, type="integer"),
        Column("Last Schedule", "When a job was last scheduled.", _cronjob_last),
        *_BATCH_TAIL,
    ),
    JOBS.resource: (
        _NAME,
        Column("Status", "Status of the job.", _job_status),
        Column("Completions", "Desired and successful completions.", _job_completions),
        Column("Duration", "How long the job ran.", _job_duration),
        *_BATCH_TAIL,
    ),
}
