"""Field validation with the real server's messages, for the fields rollout and the lab write."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rollout.lab.apiserver.batch import batch_causes
from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.fielderrors import (
    invalid,
    max_len_error,
    not_supported,
    regex_error,
    required,
)
from rollout.lab.apiserver.podresources import container_resource_causes
from rollout.lab.apiserver.resources import (
    CONFIGMAPS,
    LEASES,
    NAMESPACES,
    NODES,
    PODDISRUPTIONBUDGETS,
    PODS,
    RUNTIMECLASSES,
    ResourceKind,
)

_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_CONFIG_KEY = r"[-._a-zA-Z0-9]+"
_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")
_CONFIG_KEY_ERROR = regex_error(
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
    _CONFIG_KEY,
    "key.name",
    "KEY_NAME",
    "key-name",
)
_PERCENT_ERROR = regex_error(
    "a valid percent string must be a numeric string followed by an ending '%'",
    "[0-9]+%",
    "1%",
    "93%",
)
_DNS1123_LABEL_ERROR = regex_error(
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character",
    _DNS1123_LABEL,
    "my-name",
    "123-abc",
)
_DNS1123_SUBDOMAIN_ERROR = regex_error(
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character",
    _DNS1123_SUBDOMAIN,
    "example.com",
)


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a valid label/annotation key, or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        return "prefix part must be non-empty"
    if prefix and (len(prefix) > 253 or not re.fullmatch(_DNS1123_SUBDOMAIN, prefix)):
        return f"prefix part {_DNS1123_SUBDOMAIN_ERROR}"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return f"name part {max_len_error(63)}"
    if not re.fullmatch(_NAME_PART, name):
        return "name part " + regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character",
            _NAME_PART,
            "MyName",
            "my.name",
            "123-abc",
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None."""
    if len(value) > 63:
        return max_len_error(63)
    if not re.fullmatch(_LABEL_VALUE, value):
        return regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character",
            _LABEL_VALUE,
            "MyValue",
            "my_value",
            "12345",
        )
    return None


def check_decodable(kind: ResourceKind, body: Any) -> None:
    """Refuse, with 400 as the real decoder does, bodies whose shapes cannot be decoded."""
    if not isinstance(body, dict):
        raise ApiError.bad_request(
            f"json: cannot unmarshal {type(body).__name__} into Go value of type "
            f"struct {{ APIVersion string; Kind string }}"
        )
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ApiError.bad_request(
            f"json: cannot unmarshal into Go struct field {kind.kind}.metadata of type "
            "v1.ObjectMeta"
        )
    for field in ("labels", "annotations"):
        values = metadata.get(field)
        if values is None:
            continue
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise ApiError.bad_request(
                f"json: cannot unmarshal into Go struct field ObjectMeta.metadata.{field} of "
                "type string"
            )


def validate_object(
    kind: ResourceKind, obj: Mapping[str, Any], old: Mapping[str, Any] | None
) -> None:
    """Raise 422 Invalid listing every problem, as the real server's validation does."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name") or "")
    causes = _metadata_causes(kind, metadata)
    spec = obj.get("spec") or {}
    if kind == PODS:
        causes += _pod_causes(spec, (old or {}).get("spec"))
        causes += container_resource_causes(spec)
    elif kind == NODES:
        causes += _taint_causes(spec.get("taints") or [])
    elif kind == CONFIGMAPS:
        for field in ("data", "binaryData"):
            for key in obj.get(field) or {}:
                if not re.fullmatch(_CONFIG_KEY, key):
                    causes.append(invalid(f"{field}[{key}]", key, _CONFIG_KEY_ERROR))
    elif kind == LEASES:
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            causes.append(invalid("spec.leaseDurationSeconds", duration, "must be greater than 0"))
    elif kind == PODDISRUPTIONBUDGETS:
        causes += _pdb_causes(spec)
    elif kind == RUNTIMECLASSES:
        causes += _runtime_class_causes(obj.get("handler"), (old or {}).get("handler"), old)
    elif kind.group == "batch":
        causes += batch_causes(kind, obj)
    if causes:
        raise ApiError.invalid(kind.kind, kind.group, name, causes)


def _metadata_causes(kind: ResourceKind, metadata: Mapping[str, Any]) -> list[StatusCause]:
    causes: list[StatusCause] = []
    name = metadata.get("name")
    if not name:
        causes.append(required("metadata.name", "name or generateName is required"))
    elif kind == NAMESPACES:
        if len(name) > 63 or not re.fullmatch(_DNS1123_LABEL, name):
            causes.append(invalid("metadata.name", name, _DNS1123_LABEL_ERROR))
    elif kind.group == "rbac.authorization.k8s.io":
        # RBAC objects are named like path segments (system:discovery), not like DNS names.
        if name in (".", ".."):
            causes.append(invalid("metadata.name", name, f'may not be "{name}"'))
        for bad in ("/", "%"):
            if bad in name:
                causes.append(invalid("metadata.name", name, f"may not contain '{bad}'"))
    elif len(name) > 253 or not re.fullmatch(_DNS1123_SUBDOMAIN, name):
        causes.append(invalid("metadata.name", name, _DNS1123_SUBDOMAIN_ERROR))
    for key, value in (metadata.get("labels") or {}).items():
        if (problem := qualified_name_problem(key)) is not None:
            causes.append(invalid("metadata.labels", key, problem))
        if (problem := label_value_problem(value)) is not None:
            causes.append(invalid("metadata.labels", value, problem))
    for key in metadata.get("annotations") or {}:
        if (problem := qualified_name_problem(key.lower())) is not None:
            causes.append(invalid("metadata.annotations", key, problem))
    return causes


def _pod_causes(spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None) -> list[StatusCause]:
    causes: list[StatusCause] = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(required("spec.containers"))
    for i, container in enumerate(containers):
        for field in ("name", "image"):
            if not container.get(field):
                causes.append(required(f"spec.containers[{i}].{field}"))
    if old_spec is not None and _mutable_pod_spec(spec) != _mutable_pod_spec(old_spec):
        causes.append(
            StatusCause(
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than "
                "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
                "tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if "
                "it was previously negative)",
                "spec",
            )
        )
    return causes


def _mutable_pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec with the fields an update may change blanked out, for comparison."""
    frozen = {k: v for k, v in spec.items() if k not in {"activeDeadlineSeconds", "tolerations"}}
    for field in ("containers", "initContainers"):
        if field in frozen:
            frozen[field] = [{k: v for k, v in c.items() if k != "image"} for c in frozen[field]]
    return frozen


def _taint_causes(taints: list[Any]) -> list[StatusCause]:
    causes: list[StatusCause] = []
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(taints):
        key, effect = str(taint.get("key") or ""), str(taint.get("effect") or "")
        if not key:
            causes.append(required(f"spec.taints[{i}].key"))
        elif (problem := qualified_name_problem(key)) is not None:
            causes.append(invalid(f"spec.taints[{i}].key", key, problem))
        if effect not in _TAINT_EFFECTS:
            causes.append(not_supported(f"spec.taints[{i}].effect", effect, _TAINT_EFFECTS))
        if (key, effect) in seen:
            causes.append(
                StatusCause(
                    "FieldValueDuplicate",
                    f'Duplicate value: "{key}:{effect}": taints must be unique by key and effect',
                    f"spec.taints[{i}]",
                )
            )
        seen.add((key, effect))
    return causes


def _pdb_causes(spec: Mapping[str, Any]) -> list[StatusCause]:
    causes: list[StatusCause] = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        causes.append(
            StatusCause(
                "FieldValueInvalid",
                'Invalid value: "": minAvailable and maxUnavailable cannot be both set',
                "spec",
            )
        )
    for field in ("minAvailable", "maxUnavailable"):
        value = spec.get(field)
        if isinstance(value, str) and not re.fullmatch(r"\d+%", value):
            causes.append(invalid(f"spec.{field}", value, _PERCENT_ERROR))
        elif isinstance(value, int) and value < 0:
            causes.append(invalid(f"spec.{field}", value, "must be greater than or equal to 0"))
    return causes


def _runtime_class_causes(
    handler: Any, old_handler: Any, old: Mapping[str, Any] | None
) -> list[StatusCause]:
    """ValidateRuntimeClass: the handler is a DNS label, and it never changes."""
    if old is not None and handler != old_handler:
        return [invalid("handler", handler, "field is immutable")]
    text = handler if isinstance(handler, str) else ""
    if len(text) > 63:
        return [invalid("handler", text, max_len_error(63))]
    if not re.fullmatch(_DNS1123_LABEL, text):
        return [invalid("handler", text, _DNS1123_LABEL_ERROR)]
    return []
