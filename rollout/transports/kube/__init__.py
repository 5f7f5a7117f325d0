"""The Kubernetes API through the official client: the operations rollout needs, nothing more.

The only package that imports `kubernetes`. It returns plain frozen dataclasses (`objects`;
`cluster_state` for what only diagnose reads) or JSON dicts for custom resources, never
client model objects, and translates ApiException and urllib3 errors in one place
(`apierrors.translate_api_errors`, called by `calls`) into rollout.transports.errors.
`config` finds the cluster as kubectl does; `client` holds the operations.
"""

from typing import TYPE_CHECKING, Any

from rollout.transports.kube.cluster_state import DaemonSet, Event, RuntimeClass
from rollout.transports.kube.lease import Lease
from rollout.transports.kube.objects import (
    ConfigMap,
    ContainerResources,
    ContainerStatus,
    EventType,
    EvictionOutcome,
    Node,
    OwnerRef,
    Pod,
    PodDisruptionBudget,
    StrMap,
    Taint,
    Toleration,
    format_micro_time,
    format_time,
    parse_time,
    plain,
)
from rollout.transports.kube.secret import Secret

__all__ = [
    "DEFAULT_KUBECONFIG",
    "KUBECONFIG_ENV",
    "ConfigMap",
    "ContainerResources",
    "ContainerStatus",
    "DaemonSet",
    "Event",
    "EventType",
    "EvictionOutcome",
    "KubeClient",
    "Lease",
    "Node",
    "OwnerRef",
    "Pod",
    "PodDisruptionBudget",
    "RuntimeClass",
    "Secret",
    "StrMap",
    "Taint",
    "Toleration",
    "error_from_api_exception",
    "format_micro_time",
    "format_time",
    "parse_time",
    "plain",
    "translate_api_errors",
]

if TYPE_CHECKING:
    from rollout.transports.kube.apierrors import error_from_api_exception, translate_api_errors
    from rollout.transports.kube.client import KubeClient
    from rollout.transports.kube.incluster import DEFAULT_KUBECONFIG, KUBECONFIG_ENV

# The names that need the kubernetes client load it on first use: the steps and facts
# import this package's plain objects (Pod, Node, ...), and `rollout plan --facts`, which
# never talks to a cluster, must not pay for importing kubernetes.
_LAZY = {
    "KubeClient": "rollout.transports.kube.client",
    "error_from_api_exception": "rollout.transports.kube.apierrors",
    "translate_api_errors": "rollout.transports.kube.apierrors",
    "DEFAULT_KUBECONFIG": "rollout.transports.kube.incluster",
    "KUBECONFIG_ENV": "rollout.transports.kube.incluster",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
