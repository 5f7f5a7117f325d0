"""The Kubernetes API through the official client: the operations rollout needs, nothing more.

The only package that imports `kubernetes`. It returns plain frozen dataclasses (`objects`;
`cluster_state` for what only diagnose reads) or JSON dicts for custom resources, never
client model objects, and translates ApiException and urllib3 errors in one place
(`apierrors.translate_api_errors`, called by `calls`) into rollout.transports.errors.
`config` finds the cluster as kubectl does; `client` holds the operations.
"""

from rollout.transports.kube.apierrors import error_from_api_exception, translate_api_errors
from rollout.transports.kube.client import KubeClient
from rollout.transports.kube.cluster_state import DaemonSet, Event, RuntimeClass
from rollout.transports.kube.config import DEFAULT_KUBECONFIG, KUBECONFIG_ENV
from rollout.transports.kube.objects import (
    ConfigMap,
    ContainerResources,
    ContainerStatus,
    EventType,
    EvictionOutcome,
    Lease,
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
)

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
    "StrMap",
    "Taint",
    "Toleration",
    "error_from_api_exception",
    "format_micro_time",
    "format_time",
    "parse_time",
    "translate_api_errors",
]
