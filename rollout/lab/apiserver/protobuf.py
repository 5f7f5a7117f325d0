"""Kubernetes' protobuf encoding, read far enough for the requests kubectl sends only as
protobuf (`auth can-i`'s self reviews, `create token`'s TokenRequest, the objects its
imperative `create` generators write): the `k8s\\0` envelope and the length-delimited and
varint fields inside it. Replies stay JSON, which kubectl also accepts. Other protobuf bodies
are refused with 415."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from rollout.lab.apiserver.errors import ApiError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

Fields = dict[int, list[bytes | int]]


def is_protobuf(content_type: str) -> bool:
    return content_type.split(";")[0].strip() == MEDIA_TYPE


def decode_self_subject_access_review(raw: bytes) -> dict[str, Any]:
    """A SelfSubjectAccessReview in protobuf as the JSON object it stands for."""
    return _decode_review(raw, "SelfSubjectAccessReview", _ACCESS_REVIEW_SPEC)


def decode_self_subject_rules_review(raw: bytes) -> dict[str, Any]:
    """A SelfSubjectRulesReview in protobuf (its spec holds only the namespace)."""
    return _decode_review(raw, "SelfSubjectRulesReview", _RULES_REVIEW_SPEC)


def _decode_review(raw: bytes, kind: str, spec_schema: Schema) -> dict[str, Any]:
    """A self review (authorization.k8s.io/v1): its spec, the message's field 2, by the schema."""
    review = _fields(_bytes(_envelope(raw), 2))
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {},
        "spec": _message(_bytes(review, 2), spec_schema),
    }


def decode_token_request(raw: bytes) -> dict[str, Any]:
    """A TokenRequest (authentication.k8s.io/v1) in protobuf as its JSON object."""
    spec = _fields(_bytes(_fields(_bytes(_envelope(raw), 2)), 2))
    body_spec: dict[str, Any] = {
        "audiences": [v.decode() for v in spec.get(1, []) if isinstance(v, bytes)]
    }
    lifetime = spec.get(4)
    if lifetime and isinstance(lifetime[-1], int):
        body_spec["expirationSeconds"] = lifetime[-1]
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "metadata": {},
        "spec": body_spec,
    }


# Message schemas (k8s.io/api/*/generated.proto): field number -> (JSON name, type), a type
# being "string", "int", "bool", "bytes", a nested schema, ("repeated", type) or
# ("map", value type). Only what kubectl's imperative `create` generators send.
Schema = Mapping[int, tuple[str, Any]]
_OWNER_REFERENCE: Schema = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
_OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    11: ("labels", ("map", "string")),
    12: ("annotations", ("map", "string")),
    13: ("ownerReferences", ("repeated", _OWNER_REFERENCE)),
    14: ("finalizers", ("repeated", "string")),
}
_POLICY_RULE: Schema = {
    1: ("verbs", ("repeated", "string")),
    2: ("apiGroups", ("repeated", "string")),
    3: ("resources", ("repeated", "string")),
    4: ("resourceNames", ("repeated", "string")),
    5: ("nonResourceURLs", ("repeated", "string")),
}
_SUBJECT: Schema = {
    1: ("kind", "string"),
    2: ("apiGroup", "string"),
    3: ("name", "string"),
    4: ("namespace", "string"),
}
# k8s.io/api/authorization/v1/generated.proto
_RESOURCE_ATTRIBUTES: Schema = {
    1: ("namespace", "string"),
    2: ("verb", "string"),
    3: ("group", "string"),
    4: ("version", "string"),
    5: ("resource", "string"),
    6: ("subresource", "string"),
    7: ("name", "string"),
}
_ACCESS_REVIEW_SPEC: Schema = {
    1: ("resourceAttributes", _RESOURCE_ATTRIBUTES),
    2: ("nonResourceAttributes", {1: ("path", "string"), 2: ("verb", "string")}),
}
_RULES_REVIEW_SPEC: Schema = {1: ("namespace", "string")}
_ROLE_REF: Schema = {1: ("apiGroup", "string"), 2: ("kind", "string"), 3: ("name", "string")}
_LOCAL_REFERENCE: Schema = {1: ("name", "string")}
_OBJECT_REFERENCE: Schema = {2: ("namespace", "string"), 3: ("name", "string")}
_BINDING: Schema = {
    1: ("metadata", _OBJECT_META),
    2: ("subjects", ("repeated", _SUBJECT)),
    3: ("roleRef", _ROLE_REF),
}
_ROLE: Schema = {1: ("metadata", _OBJECT_META), 2: ("rules", ("repeated", _POLICY_RULE))}
OBJECT_SCHEMAS: Mapping[str, Schema] = {
    "Namespace": {
        1: ("metadata", _OBJECT_META),
        2: ("spec", {1: ("finalizers", ("repeated", "string"))}),
    },
    "ConfigMap": {
        1: ("metadata", _OBJECT_META),
        2: ("data", ("map", "string")),
        3: ("binaryData", ("map", "bytes")),
        4: ("immutable", "bool"),
    },
    "ServiceAccount": {
        1: ("metadata", _OBJECT_META),
        2: ("secrets", ("repeated", _OBJECT_REFERENCE)),
        3: ("imagePullSecrets", ("repeated", _LOCAL_REFERENCE)),
        4: ("automountServiceAccountToken", "bool"),
    },
    "Role": _ROLE,
    "ClusterRole": _ROLE,
    "RoleBinding": _BINDING,
    "ClusterRoleBinding": _BINDING,
}


def decode_object(raw: bytes) -> dict[str, Any]:
    """An object of a kind in OBJECT_SCHEMAS, from protobuf to its JSON form; 415 for others."""
    envelope = _envelope(raw)
    type_meta = _fields(_bytes(envelope, 1))
    api_version, kind = _bytes(type_meta, 1).decode(), _bytes(type_meta, 2).decode()
    schema = OBJECT_SCHEMAS.get(kind)
    if schema is None:
        raise ApiError.unsupported_media_type(MEDIA_TYPE, ["application/json", "application/yaml"])
    obj = _message(_bytes(envelope, 2), schema)
    return {"apiVersion": api_version, "kind": kind, **obj}


def _message(data: bytes, schema: Schema) -> dict[str, Any]:
    fields = _fields(data)
    obj: dict[str, Any] = {}
    for number, (name, kind) in schema.items():
        values = fields.get(number)
        if not values:
            continue
        if isinstance(kind, tuple) and kind[0] == "repeated":
            obj[name] = [_value(v, kind[1]) for v in values]
        elif isinstance(kind, tuple) and kind[0] == "map":
            entries = [_fields(_as_bytes(v)) for v in values]
            obj[name] = {
                _bytes(e, 1).decode(): _value(e.get(2, [b""])[-1], kind[1]) for e in entries
            }
        elif (value := _value(values[-1], kind)) != "":
            # Go writes empty strings out; its JSON (omitempty) leaves them out.
            obj[name] = value
    return obj


def _value(value: bytes | int, kind: Any) -> Any:
    if kind == "int":
        return value
    if kind == "bool":
        return bool(value)
    if kind == "bytes":
        return base64.b64encode(_as_bytes(value)).decode()
    if kind == "string":
        return _as_bytes(value).decode()
    return _message(_as_bytes(value), kind)


def _as_bytes(value: bytes | int) -> bytes:
    if not isinstance(value, bytes):
        raise ApiError.bad_request("a protobuf field is not length-delimited")
    return value


def _envelope(raw: bytes) -> Fields:
    if not raw.startswith(_MAGIC):
        raise ApiError.bad_request("the protobuf body does not start with the k8s envelope")
    return _fields(raw[len(_MAGIC) :])


def _bytes(fields: Fields, number: int) -> bytes:
    values = fields.get(number) or [b""]
    value = values[-1]
    if not isinstance(value, bytes):
        raise ApiError.bad_request(f"protobuf field {number} is not length-delimited")
    return value


def _fields(data: bytes) -> Fields:
    """Field number → values: bytes for length-delimited fields, ints for varints."""
    fields: Fields = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, at = _varint(data, at)
            fields.setdefault(number, []).append(value)
        elif wire_type == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ApiError.bad_request("truncated protobuf body")
            fields.setdefault(number, []).append(data[at : at + length])
            at += length
        else:
            raise ApiError.bad_request(f"unsupported protobuf wire type {wire_type}")
    return fields


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ApiError.bad_request("truncated protobuf body")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
