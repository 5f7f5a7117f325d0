"""Per-kind rules for create and update: defaults, immutable fields, status isolation.

Named after the real server's registry strategies (PrepareForCreate, PrepareForUpdate) and
following them for the kinds served here.
"""

from __future__ import annotations

import copy
from typing import Any

from rollout.lab.apiserver.batch import default_batch
from rollout.lab.apiserver.metadata import format_timestamp, new_uid
from rollout.lab.apiserver.resources import (
    CRONJOBS,
    DAEMONSETS,
    JOBS,
    NAMESPACES,
    NODES,
    PODDISRUPTIONBUDGETS,
    PODS,
    SECRETS,
    ResourceKind,
)

_IMMUTABLE_METADATA = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "name",
    "namespace",
)
# The DefaultTolerationSeconds admission plugin adds these to every pod that lacks them.
_DEFAULT_TOLERATIONS = (
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
)


def prepare_for_create(kind: ResourceKind, obj: dict[str, Any], now_s: float) -> None:
    """Fill server-owned metadata and defaults, and reset what clients may not set on create."""
    obj["apiVersion"] = kind.api_version
    obj["kind"] = kind.kind
    metadata = obj["metadata"]
    for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
        metadata.pop(field, None)
    metadata["uid"] = new_uid()
    metadata["creationTimestamp"] = format_timestamp(now_s)
    if kind.tracks_generation:
        metadata["generation"] = 1
    if kind == PODS:
        _default_pod(obj)
    elif kind == NAMESPACES:
        metadata.setdefault("labels", {})["kubernetes.io/metadata.name"] = metadata["name"]
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
    elif kind == DAEMONSETS:
        spec = obj.setdefault("spec", {})
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault(
            "updateStrategy",
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
        )
        obj["status"] = {
            "currentNumberScheduled": 0,
            "desiredNumberScheduled": 0,
            "numberMisscheduled": 0,
            "numberReady": 0,
        }
    elif kind == PODDISRUPTIONBUDGETS:
        obj["status"] = {
            "currentHealthy": 0,
            "desiredHealthy": 0,
            "disruptionsAllowed": 0,
            "expectedPods": 0,
        }
    elif kind in (CRONJOBS, JOBS):
        default_batch(kind, obj)
    elif kind == SECRETS:
        # SetDefaults_Secret: `kubectl create secret generic` sends no type
        obj["type"] = obj.get("type") or "Opaque"
    elif kind.has_status and kind != NODES:
        # Nodes register with their status (the kubelet does); everything else starts empty.
        obj.pop("status", None)


def prepare_for_update(kind: ResourceKind, new: dict[str, Any], old: dict[str, Any]) -> None:
    """A write to the main resource: keep server-owned metadata and, where split off, status."""
    new["apiVersion"] = kind.api_version
    new["kind"] = kind.kind
    _keep_immutable_metadata(new, old)
    if kind.has_status:
        _copy_field(new, old, "status")
    if kind == NAMESPACES:
        new["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = old["metadata"][
            "name"
        ]
    _bump_generation(kind, new, old)


def prepare_for_status_update(kind: ResourceKind, new: dict[str, Any], old: dict[str, Any]) -> None:
    """A write to the status subresource: only status moves (built-ins also take metadata)."""
    if kind.custom:
        status = new.get("status")
        new.clear()
        new.update(copy.deepcopy(old))
        if status is None:
            new.pop("status", None)
        else:
            new["status"] = status
        return
    new["apiVersion"] = kind.api_version
    new["kind"] = kind.kind
    _keep_immutable_metadata(new, old)
    for field in list(new):
        if field not in {"apiVersion", "kind", "metadata", "status"}:
            del new[field]
    for field, value in old.items():
        if field not in {"apiVersion", "kind", "metadata", "status"}:
            new[field] = copy.deepcopy(value)
    if kind == PODS:
        # The real pod status strategy: old kubelets corrupted owner references through it.
        _copy_field(new["metadata"], old["metadata"], "ownerReferences")


def _keep_immutable_metadata(new: dict[str, Any], old: dict[str, Any]) -> None:
    metadata = new.setdefault("metadata", {})
    for field in _IMMUTABLE_METADATA:
        _copy_field(metadata, old["metadata"], field)


def _copy_field(target: dict[str, Any], source: dict[str, Any], field: str) -> None:
    if field in source:
        target[field] = copy.deepcopy(source[field])
    else:
        target.pop(field, None)


def _bump_generation(kind: ResourceKind, new: dict[str, Any], old: dict[str, Any]) -> None:
    if not kind.tracks_generation:
        return
    ignored = {"metadata", "status", "apiVersion", "kind"}
    new_body = {k: v for k, v in new.items() if k not in ignored}
    old_body = {k: v for k, v in old.items() if k not in ignored}
    generation = int(old["metadata"].get("generation", 1))
    new["metadata"]["generation"] = generation + 1 if new_body != old_body else generation


def _default_pod(pod: dict[str, Any]) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    tolerations = spec.setdefault("tolerations", [])
    for default in _DEFAULT_TOLERATIONS:
        if not any(t.get("key") == default["key"] for t in tolerations):
            tolerations.append(dict(default))
    for container in spec.get("containers") or []:
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        image = str(container.get("image") or "")
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        resources = container.setdefault("resources", {})
        # Requests default to limits, as the real defaulting does; the scheduler counts requests.
        if resources.get("limits"):
            requests = resources.setdefault("requests", {})
            for name, quantity in resources["limits"].items():
                requests.setdefault(name, quantity)
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}


def _qos_class(spec: dict[str, Any]) -> str:
    containers = spec.get("containers") or []
    compute = ("cpu", "memory")
    requests = [(c.get("resources") or {}).get("requests") or {} for c in containers]
    limits = [(c.get("resources") or {}).get("limits") or {} for c in containers]
    if not any(r.get(n) for r in requests + limits for n in compute):
        return "BestEffort"
    guaranteed = all(
        lim.get(n) is not None and str(lim.get(n)) == str(req.get(n, lim.get(n)))
        for req, lim in zip(requests, limits, strict=True)
        for n in compute
    )
    return "Guaranteed" if guaranteed else "Burstable"
