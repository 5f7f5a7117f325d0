"""The three patch formats the real server accepts: JSON patch, JSON merge patch, strategic merge.

Strategic merge needs to know, per list field, whether the list merges by a key or is replaced;
MERGE_KEYS records that for the fields of the kinds served here (from the patchStrategy and
patchMergeKey tags of k8s.io/api). Lists not named there are atomic and replaced whole, which
is also the real rule for fields such as spec.taints and status.containerStatuses.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from rollout.lab.apiserver.errors import ApiError

# A merge key names the field that identifies list elements; None marks a list of primitives
# merged as a set (patchStrategy "merge" without a key, e.g. metadata.finalizers).
MergeKey = str | None
MergeKeys = Mapping[tuple[str, ...], MergeKey]


class PatchType(StrEnum):
    """Patch media types, by their Content-Type."""

    JSON = "application/json-patch+json"
    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    APPLY = "application/apply-patch+yaml"

    @classmethod
    def from_content_type(cls, content_type: str, *, custom: bool) -> PatchType:
        """The patch type of a request; 415 for types the resource does not take."""
        media = content_type.split(";")[0].strip().lower()
        accepted = [cls.JSON, cls.MERGE] if custom else [cls.JSON, cls.MERGE, cls.STRATEGIC]
        accepted.append(cls.APPLY)
        for patch_type in accepted:
            if patch_type.value == media:
                return patch_type
        raise ApiError.unsupported_media_type(media, [t.value for t in accepted])


_POD_SPEC_KEYS: dict[tuple[str, ...], MergeKey] = {
    ("containers",): "name",
    ("initContainers",): "name",
    ("ephemeralContainers",): "name",
    ("volumes",): "name",
    ("imagePullSecrets",): "name",
    ("hostAliases",): "ip",
}
for _containers in ("containers", "initContainers"):
    _POD_SPEC_KEYS[(_containers, "env")] = "name"
    _POD_SPEC_KEYS[(_containers, "ports")] = "containerPort"
    _POD_SPEC_KEYS[(_containers, "volumeMounts")] = "mountPath"
    _POD_SPEC_KEYS[(_containers, "volumeDevices")] = "devicePath"

_COMMON_KEYS: dict[tuple[str, ...], MergeKey] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): None,
}


def _under(
    prefix: tuple[str, ...], table: Mapping[tuple[str, ...], MergeKey]
) -> dict[tuple[str, ...], MergeKey]:
    return {prefix + path: key for path, key in table.items()}


MERGE_KEYS: dict[str, dict[tuple[str, ...], MergeKey]] = {
    "nodes": {
        **_COMMON_KEYS,
        ("spec", "podCIDRs"): None,
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
    },
    "pods": {
        **_COMMON_KEYS,
        **_under(("spec",), _POD_SPEC_KEYS),
        ("status", "conditions"): "type",
        ("status", "podIPs"): "ip",
    },
    "daemonsets": {
        **_COMMON_KEYS,
        **_under(("spec", "template", "spec"), _POD_SPEC_KEYS),
        ("status", "conditions"): "type",
    },
    "poddisruptionbudgets": {**_COMMON_KEYS, ("status", "conditions"): "type"},
    "namespaces": {**_COMMON_KEYS, ("status", "conditions"): "type"},
}


def apply_patch(
    patch_type: PatchType, original: dict[str, Any], patch: Any, merge_keys: MergeKeys
) -> dict[str, Any]:
    """The object `original` becomes under `patch`; `original` is left untouched."""
    if patch_type is PatchType.JSON:
        result = apply_json_patch(original, patch)
    elif patch_type is PatchType.MERGE:
        if not isinstance(patch, dict):
            raise ApiError.bad_request("json: cannot unmarshal array into Go value of type map")
        result = apply_merge_patch(original, patch)
    elif patch_type is PatchType.STRATEGIC:
        if not isinstance(patch, dict):
            raise ApiError.bad_request(
                "json: cannot unmarshal array into Go value of type map[string]interface {}"
            )
        result = apply_strategic_merge_patch(original, patch, merge_keys)
    else:
        raise ApiError.unsupported_media_type(patch_type.value, [])
    if not isinstance(result, dict):
        raise ApiError.bad_request("the patch turned the object into a non-object")
    return result


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


class _Deleted:
    """Marks a map removed by a `$patch: delete` directive."""


_DELETED = _Deleted()


def apply_strategic_merge_patch(
    original: dict[str, Any], patch: dict[str, Any], merge_keys: MergeKeys
) -> dict[str, Any]:
    """Strategic merge: maps merge, keyed lists merge by key, other lists are replaced."""
    merged = _merge_map(original, patch, merge_keys, ())
    return {} if isinstance(merged, _Deleted) else merged


def _merge_map(
    original: dict[str, Any], patch: dict[str, Any], keys: MergeKeys, path: tuple[str, ...]
) -> dict[str, Any] | _Deleted:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETED
    if directive == "replace":
        replaced: dict[str, Any] = _strip_directives(
            {k: v for k, v in patch.items() if k != "$patch"}
        )
        return replaced
    if directive is not None:
        raise ApiError.bad_request(f"Unknown patch type: {directive}")
    result = copy.deepcopy(original)
    deletions: list[tuple[str, list[Any]]] = []
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in {"$retainKeys"}:
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            deletions.append((key.split("/", 1)[1], list(value or [])))
            continue
        if value is None:
            result.pop(key, None)
            continue
        child = (*path, key)
        current = result.get(key)
        if isinstance(value, list) and child in keys:
            result[key] = _merge_list(
                current if isinstance(current, list) else [], value, keys, child
            )
        elif isinstance(value, dict) and isinstance(current, dict):
            merged = _merge_map(current, value, keys, child)
            if isinstance(merged, _Deleted):
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        else:
            result[key] = _strip_directives(value)
    for field, values in deletions:
        if isinstance(result.get(field), list):
            result[field] = [v for v in result[field] if v not in values]
    retained = patch.get("$retainKeys")
    if isinstance(retained, list):
        result = {k: v for k, v in result.items() if k in retained}
    return result


def _merge_list(
    original: list[Any], patch: list[Any], keys: MergeKeys, path: tuple[str, ...]
) -> list[Any]:
    merge_key = keys[path]
    if merge_key is None:
        merged = list(original)
        merged.extend(v for v in patch if v not in merged)
        return merged
    if any(isinstance(e, dict) and e.get("$patch") == "replace" for e in patch):
        return [
            _strip_directives(e)
            for e in patch
            if not (isinstance(e, dict) and e.get("$patch") == "replace")
        ]
    result = copy.deepcopy(original)
    for element in patch:
        if not isinstance(element, dict) or merge_key not in element:
            raise ApiError.bad_request(
                f"map: {element} does not contain declared merge key: {merge_key}"
            )
        index = next(
            (
                i
                for i, existing in enumerate(result)
                if isinstance(existing, dict) and existing.get(merge_key) == element[merge_key]
            ),
            None,
        )
        if element.get("$patch") == "delete":
            if index is not None:
                del result[index]
            continue
        if index is None:
            result.append(_strip_directives(element))
        else:
            merged_element = _merge_map(result[index], element, keys, path)
            result[index] = {} if isinstance(merged_element, _Deleted) else merged_element
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_directives(v)
            for k, v in value.items()
            if not k.startswith("$") and v is not None
        }
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def apply_json_patch(document: dict[str, Any], operations: Any) -> Any:
    """RFC 6902; a malformed patch is 400, one that cannot apply is 422, as on the real server."""
    if not isinstance(operations, list):
        raise ApiError.bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
        )
    result: Any = copy.deepcopy(document)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise ApiError.bad_request(f"invalid JSON patch operation: {operation}")
        result = _apply_operation(result, operation)
    return result


def _apply_operation(document: Any, operation: dict[str, Any]) -> Any:
    op, path = operation["op"], str(operation["path"])
    if op in {"add", "replace", "test"} and "value" not in operation:
        raise ApiError.bad_request(f"missing value for {op} operation at {path}")
    if op == "add":
        return _add(document, path, copy.deepcopy(operation["value"]))
    if op == "remove":
        document, _ = _remove(document, path)
        return document
    if op == "replace":
        _lookup(document, path)
        document, _ = _remove(document, path)
        return _add(document, path, copy.deepcopy(operation["value"]))
    if op in {"move", "copy"}:
        source = str(operation.get("from", ""))
        if op == "move":
            document, value = _remove(document, source)
        else:
            value = copy.deepcopy(_lookup(document, source))
        return _add(document, path, value)
    if op == "test":
        if _lookup(document, path) != operation["value"]:
            raise ApiError.unprocessable(f"testing value {path} failed: test failed")
        return document
    raise ApiError.bad_request(f"Unexpected kind: {op}")


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError.bad_request(f'JSON pointer must be empty or start with a "/": {path}')
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _missing(path: str) -> ApiError:
    return ApiError.unprocessable(f'doc is missing path: "{path}": missing value')


def _container(document: Any, path: str) -> tuple[Any, str]:
    tokens = _tokens(path)
    if not tokens:
        raise ApiError.unprocessable(f"cannot operate on the whole document at {path!r}")
    parent: Any = document
    for token in tokens[:-1]:
        parent = _child(parent, token, path)
    return parent, tokens[-1]


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise _missing(path)
        return node[token]
    if isinstance(node, list):
        if not token.isdigit() or int(token) >= len(node):
            raise _missing(path)
        return node[int(token)]
    raise _missing(path)


def _lookup(document: Any, path: str) -> Any:
    node = document
    for token in _tokens(path):
        node = _child(node, token, path)
    return node


def _add(document: Any, path: str, value: Any) -> Any:
    if path == "":
        return value
    parent, token = _container(document, path)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        if token == "-":
            parent.append(value)
        elif token.isdigit() and int(token) <= len(parent):
            parent.insert(int(token), value)
        else:
            raise ApiError.unprocessable(
                f"add operation does not apply: index out of range: {path}"
            )
    else:
        raise _missing(path)
    return document


def _remove(document: Any, path: str) -> tuple[Any, Any]:
    parent, token = _container(document, path)
    if isinstance(parent, dict) and token in parent:
        return document, parent.pop(token)
    if isinstance(parent, list) and token.isdigit() and int(token) < len(parent):
        return document, parent.pop(int(token))
    raise ApiError.unprocessable(f"Unable to remove nonexistent key: {token}: missing value")
