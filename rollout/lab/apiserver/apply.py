"""Server-side apply (PATCH with `application/apply-patch+yaml`), a faithful subset of
kube-apiserver's field manager.

What holds as on the real server: the request names its `fieldManager` (400 without one);
an object that does not exist is created from the applied configuration; one that exists
takes the applied fields (maps merge by field, lists with a merge key merge by that key,
other lists and scalars are replaced whole); a field the same manager applied before and
leaves out now is removed; the manager's fields are recorded in `metadata.managedFields`
(an `Apply` entry, FieldsV1).

Simplified: only `Apply` managers are tracked (the real server also records each update's
manager), and there are no conflicts: a field another manager owns is taken over as if every
request said `force=true`, where the real server answers 409 unless forced. A field this
manager gives up is removed even if another writer set it since.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.patches import MergeKeys, apply_strategic_merge_patch

# Not owned by a manager: the object's identity, and status (the main resource's apply
# leaves it to the status subresource).
_UNOWNED = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}
_UNOWNED_TOP = {"status"}
# what a FieldsV1 key means: a field, or a list element by its merge key
Path = tuple[str, ...]


def check_applied(applied: Any, name: str) -> dict[str, Any]:
    """The applied configuration, refused as kube-apiserver refuses it."""
    if not isinstance(applied, dict):
        raise ApiError.bad_request("error decoding YAML: the body is not an object")
    for field in ("apiVersion", "kind"):
        if not applied.get(field):
            raise ApiError.bad_request(f"{field} must be set in the applied configuration")
    given = (applied.get("metadata") or {}).get("name")
    if given not in (None, "", name):
        raise ApiError.bad_request(
            f"the name of the object ({given}) does not match the name on the URL ({name})"
        )
    return applied


def applied_object(
    applied: dict[str, Any], name: str, manager: str, merge_keys: MergeKeys
) -> dict[str, Any]:
    """An object created by an apply: the configuration, named, owned by its manager."""
    obj = copy.deepcopy(applied)
    metadata = obj.setdefault("metadata", {})
    metadata["name"] = name
    metadata["managedFields"] = [_entry(applied, manager, merge_keys)]
    return obj


def apply_to(
    live: dict[str, Any], applied: dict[str, Any], manager: str, merge_keys: MergeKeys
) -> dict[str, Any]:
    """`live` after `manager` applies `applied`: its fields given up removed, the applied
    ones merged in, its managedFields entry replaced; `live` is left untouched."""
    entries = list((live.get("metadata") or {}).get("managedFields") or [])
    mine = next((e for e in entries if _is_apply_of(e, manager)), None)
    before = set(_leaves(mine.get("fieldsV1") or {})) if mine else set()
    now = set(_paths(applied, merge_keys))
    result = copy.deepcopy(live)
    for path in sorted(before - now, key=len, reverse=True):
        _remove(result, path)
    result = apply_strategic_merge_patch(result, copy.deepcopy(applied), merge_keys)
    kept = [e for e in entries if not _is_apply_of(e, manager)]
    result["metadata"]["managedFields"] = [*kept, _entry(applied, manager, merge_keys)]
    return result


def _is_apply_of(entry: Any, manager: str) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("manager") == manager
        and entry.get("operation") == "Apply"
    )


def _entry(applied: dict[str, Any], manager: str, merge_keys: MergeKeys) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in _paths(applied, merge_keys):
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        if path and path[-1].startswith("k:"):
            node.setdefault(".", {})
    return {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": applied["apiVersion"],
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fieldsType": "FieldsV1",
        "fieldsV1": tree,
    }


def _paths(
    value: Any, merge_keys: MergeKeys, path: Path = (), fields: tuple[str, ...] = ()
) -> Iterator[Path]:
    """The FieldsV1 paths of the leaves the configuration sets (`f:name`, `k:{...}`); a
    keyed list element also counts as set itself."""
    if isinstance(value, dict) and (value or not path):
        for key, item in value.items():
            where = (*fields, key)
            if where in _UNOWNED or (not fields and key in _UNOWNED_TOP):
                continue
            yield from _paths(item, merge_keys, (*path, f"f:{key}"), where)
        return
    key = merge_keys.get(fields, "") if isinstance(value, list) else ""
    if key:
        for element in value:
            if isinstance(element, dict) and key in element:
                at = (*path, f"k:{json.dumps({key: element[key]}, separators=(',', ':'))}")
                yield at
                yield from _paths(element, merge_keys, at, fields)
        return
    yield path


def _leaves(tree: dict[str, Any], path: Path = ()) -> Iterator[Path]:
    """The paths a FieldsV1 tree records (the inverse of `_entry`)."""
    children = {k: v for k, v in tree.items() if k != "."}
    if path and (not children or "." in tree):
        yield path
    for key, child in children.items():
        yield from _leaves(child if isinstance(child, dict) else {}, (*path, key))


def _remove(obj: Any, path: Path) -> None:
    """Remove the field or keyed element at `path` when it is there."""
    parent, last = obj, path[-1]
    for part in path[:-1]:
        parent = _step(parent, part)
        if parent is None:
            return
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(parent, list):
        key = json.loads(last[2:])
        parent[:] = [e for e in parent if not _matches(e, key)]


def _step(node: Any, part: str) -> Any:
    if part.startswith("f:") and isinstance(node, dict):
        return node.get(part[2:])
    if part.startswith("k:") and isinstance(node, list):
        key = json.loads(part[2:])
        return next((e for e in node if _matches(e, key)), None)
    return None


def _matches(element: Any, key: dict[str, Any]) -> bool:
    return isinstance(element, dict) and all(element.get(k) == v for k, v in key.items())
