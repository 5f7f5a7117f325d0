"""Where each kind rollout touches lives in the API, and the HTTP requests rollout makes on it.

`calls` sends these through the official client's generic path (`ApiClient.param_serialize`,
then `call_api`), which is what the client's generated API classes call underneath. Those
classes are not used: importing one imports every model its methods name and builds their
validators (most of `plan -i`'s start-up), for answers rollout reads as raw JSON anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MERGE_PATCH = "application/merge-patch+json"

QueryValue = str | int | None


@dataclass(frozen=True)
class ApiRequest:
    """One request as a generated client method builds it: a path template whose parameters
    the client quotes, the query (in the generated methods' order), a body, and the
    Content-Type of a patch (a POST or PUT sends none, as the generated methods do)."""

    method: str
    path: str
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: tuple[tuple[str, str | int], ...] = ()
    body: Any = None
    content_type: str | None = None


@dataclass(frozen=True)
class Resource:
    """A kind's collection: `v1 pods` is /api/v1/[namespaces/{namespace}/]pods."""

    group_version: str  # "v1" for the core group, else "group/version"
    plural: str

    def request(
        self,
        method: str,
        namespace: str | None = None,
        name: str | None = None,
        *,
        subresource: str | None = None,
        query: Mapping[str, QueryValue] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> ApiRequest:
        """A request on the collection (no `name`) or one object; a parameter that is None
        is left out of the query."""
        root = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        params: dict[str, str] = {}
        path = root
        if namespace is not None:
            path += "/namespaces/{namespace}"
            params["namespace"] = namespace
        path += f"/{self.plural}"
        if name is not None:
            path += "/{name}"
            params["name"] = name
        if subresource is not None:
            path += f"/{subresource}"
        sent = tuple((k, v) for k, v in (query or {}).items() if v is not None)
        return ApiRequest(method, path, params, sent, body, content_type)

    def get(self, name: str, namespace: str | None = None) -> ApiRequest:
        return self.request("GET", namespace, name)

    def list(
        self,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ApiRequest:
        """Every namespace's objects when `namespace` is None (or the kind is cluster-wide)."""
        query = {"fieldSelector": field_selector, "labelSelector": label_selector}
        return self.request("GET", namespace, query=query)

    def create(self, body: Any, namespace: str | None = None) -> ApiRequest:
        return self.request("POST", namespace, body=body)

    def replace(self, name: str, body: Any, namespace: str | None = None) -> ApiRequest:
        return self.request("PUT", namespace, name, body=body)

    def merge_patch(self, name: str, patch: Any, namespace: str | None = None) -> ApiRequest:
        """A JSON merge patch: None deletes a field, a list is replaced whole."""
        return self.request("PATCH", namespace, name, body=patch, content_type=MERGE_PATCH)

    def delete(
        self, name: str, namespace: str | None = None, grace_period_s: int | None = None
    ) -> ApiRequest:
        return self.request("DELETE", namespace, name, query={"gracePeriodSeconds": grace_period_s})


NODES = Resource("v1", "nodes")
PODS = Resource("v1", "pods")
CONFIGMAPS = Resource("v1", "configmaps")
SECRETS = Resource("v1", "secrets")
EVENTS = Resource("v1", "events")
PDBS = Resource("policy/v1", "poddisruptionbudgets")
DAEMONSETS = Resource("apps/v1", "daemonsets")
RUNTIME_CLASSES = Resource("node.k8s.io/v1", "runtimeclasses")
LEASES = Resource("coordination.k8s.io/v1", "leases")
CLUSTER_POLICIES = Resource("nvidia.com/v1", "clusterpolicies")
NVIDIA_DRIVERS = Resource("nvidia.com/v1alpha1", "nvidiadrivers")
