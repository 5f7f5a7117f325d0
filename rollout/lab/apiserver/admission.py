"""Admission for pod creation: the RuntimeClass plugin, as kube-apiserver runs it by default.

A pod naming a RuntimeClass that does not exist is refused with 403 before anything else is
checked; one that exists lends the pod its overhead."""

from __future__ import annotations

import copy
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.resources import PODS, RUNTIMECLASSES
from rollout.lab.apiserver.store import Store


def admit_pod(store: Store, pod: dict[str, Any], requested_name: str) -> None:
    """Refuse or complete a pod about to be created (called under the store's lock).

    `requested_name` is the name as sent: empty for generateName, as admission sees it."""
    spec = pod.get("spec") or {}
    class_name = spec.get("runtimeClassName")
    if not class_name:
        return
    runtime_class = store.get(RUNTIMECLASSES, None, str(class_name))
    if runtime_class is None:
        raise ApiError.forbidden(
            PODS.group_resource,
            requested_name,
            f'pod rejected: RuntimeClass "{class_name}" not found',
        )
    overhead = (runtime_class.get("overhead") or {}).get("podFixed")
    if overhead and isinstance(pod.get("spec"), dict):
        if spec.get("overhead") not in (None, overhead):
            raise ApiError.forbidden(
                PODS.group_resource,
                requested_name,
                "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
            )
        pod["spec"]["overhead"] = copy.deepcopy(overhead)
