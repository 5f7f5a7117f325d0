"""OpenAPI v3 discovery, as far as kubectl reads it before a write: the root's list of
group-versions, and per group-version the PATCH operations that declare the
`fieldValidation` query parameter. Finding it, kubectl leaves validation to the server
instead of downloading schemas to validate on the client. No schemas are served."""

from __future__ import annotations

from typing import Any

from rollout.lab.apiserver.resources import ResourceCatalog, ResourceKind

_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "description": "fieldValidation instructs the server on how to handle objects in the "
    "request (POST/PUT/PATCH) containing unknown or duplicate fields.",
    "schema": {"type": "string", "uniqueItems": True},
}


def to_openapi_root(catalog: ResourceCatalog) -> dict[str, Any]:
    """GET /openapi/v3: where each group-version's document lives."""
    paths = {}
    for group, version in _group_versions(catalog):
        prefix = f"api/{version}" if not group else f"apis/{group}/{version}"
        paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}"}
    return {"paths": paths}


def to_openapi_document(catalog: ResourceCatalog, group: str, version: str) -> dict[str, Any]:
    """GET /openapi/v3/api/v1 or /openapi/v3/apis/<group>/<version>."""
    paths = {
        _item_path(kind): {"patch": _patch_operation(kind)}
        for kind in catalog.kinds
        if kind.group == group and kind.version == version and "patch" in kind.verbs
    }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.31.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def _group_versions(catalog: ResourceCatalog) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for kind in catalog.kinds:
        if (kind.group, kind.version) not in seen:
            seen.append((kind.group, kind.version))
    return seen


def _item_path(kind: ResourceKind) -> str:
    prefix = f"/api/{kind.version}" if not kind.group else f"/apis/{kind.group}/{kind.version}"
    scope = "/namespaces/{namespace}" if kind.namespaced else ""
    return f"{prefix}{scope}/{kind.resource}/{{name}}"


def _patch_operation(kind: ResourceKind) -> dict[str, Any]:
    return {
        "operationId": f"patch{kind.kind}",
        "parameters": [_FIELD_VALIDATION],
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {
            "group": kind.group,
            "kind": kind.kind,
            "version": kind.version,
        },
    }
