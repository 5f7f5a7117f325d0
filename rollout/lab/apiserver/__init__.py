"""An emulated Kubernetes API server for the lab: the paths rollout uses, over plain HTTP.

Standard library only; the official kubernetes client drives it in tests as it drives a real
cluster.
"""

from rollout.lab.apiserver.errors import ApiError, StatusReason
from rollout.lab.apiserver.registry import DeleteOptions, Registry
from rollout.lab.apiserver.resources import ResourceCatalog, ResourceKind
from rollout.lab.apiserver.server import ApiServer
from rollout.lab.apiserver.store import Store

__all__ = [
    "ApiError",
    "ApiServer",
    "DeleteOptions",
    "Registry",
    "ResourceCatalog",
    "ResourceKind",
    "StatusReason",
    "Store",
]
