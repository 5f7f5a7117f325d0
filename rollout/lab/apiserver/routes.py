"""URL paths of the Kubernetes API, parsed into what a request is about."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.resources import NAMESPACES, ResourceCatalog, ResourceKind

_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_HEALTH_PATHS = ("/healthz", "/livez", "/readyz")


class Endpoint(StrEnum):
    HEALTH = "health"
    VERSION = "version"
    API_VERSIONS = "api-versions"
    GROUP_LIST = "group-list"
    GROUP = "group"
    RESOURCE_LIST = "resource-list"
    RESOURCE = "resource"
    OPENAPI_V3 = "openapi-v3"


@dataclass(frozen=True)
class Route:
    """One parsed request path. group and version: of GROUP, RESOURCE_LIST and OPENAPI_V3 (a
    RESOURCE's are its kind's). For RESOURCE: no name means the collection."""

    endpoint: Endpoint
    group: str = ""
    version: str = ""
    kind: ResourceKind | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    def require_kind(self) -> ResourceKind:
        if self.kind is None:
            raise ApiError.path_not_found()
        return self.kind


def parse_route(path: str, catalog: ResourceCatalog) -> Route:
    """The Route of a URL path; 404 Status for paths the server does not serve."""
    path = path.rstrip("/") or "/"
    if path in _HEALTH_PATHS or path.startswith(tuple(f"{p}/" for p in _HEALTH_PATHS)):
        return Route(Endpoint.HEALTH)
    if path == "/version":
        return Route(Endpoint.VERSION)
    if path == "/openapi/v3":
        return Route(Endpoint.OPENAPI_V3)
    if path.startswith("/openapi/v3/"):
        return _parse_openapi_path(path.removeprefix("/openapi/v3/"), catalog)
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        if len(parts) == 1:
            return Route(Endpoint.API_VERSIONS)
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"]:
        if len(parts) == 1:
            return Route(Endpoint.GROUP_LIST)
        if len(parts) == 2:
            if parts[1] not in catalog.groups():
                raise ApiError.path_not_found()
            return Route(Endpoint.GROUP, group=parts[1])
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError.path_not_found()
    if not catalog.has_group_version(group, version):
        raise ApiError.path_not_found()
    if not rest:
        return Route(Endpoint.RESOURCE_LIST, group=group, version=version)
    return _parse_resource_path(group, version, rest, catalog)


def _parse_openapi_path(rest: str, catalog: ResourceCatalog) -> Route:
    """/openapi/v3/api/v1 or /openapi/v3/apis/<group>/<version>: one group-version's document."""
    parts = rest.split("/")
    if parts[:1] == ["api"] and len(parts) == 2:
        group, version = "", parts[1]
    elif parts[:1] == ["apis"] and len(parts) == 3:
        group, version = parts[1], parts[2]
    else:
        raise ApiError.path_not_found()
    if not catalog.has_group_version(group, version):
        raise ApiError.path_not_found()
    return Route(Endpoint.OPENAPI_V3, group=group, version=version)


def _parse_resource_path(
    group: str, version: str, rest: list[str], catalog: ResourceCatalog
) -> Route:
    namespace: str | None = None
    namespace_subresource = group == "" and len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES
    if rest[0] == NAMESPACES.resource and len(rest) >= 3 and not namespace_subresource:
        namespace, rest = rest[1], rest[2:]
    kind = catalog.find_kind(group, version, rest[0])
    if kind is None or len(rest) > 3:
        raise ApiError.path_not_found()
    if namespace is not None and not kind.namespaced:
        raise ApiError.path_not_found()
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if subresource is not None and subresource not in kind.subresources:
        raise ApiError.path_not_found()
    return Route(
        Endpoint.RESOURCE,
        kind=kind,
        namespace=namespace,
        name=name,
        subresource=subresource,
    )
