"""Kubernetes' protobuf encoding, read as kube-apiserver reads request bodies: the `k8s\\0`
envelope (runtime.Unknown: TypeMeta, then the raw message) and the message by its
generated.proto, into the object's JSON form. kubectl since 1.3x sends every built-in kind it
creates or replaces this way. Replies stay JSON, which kubectl also accepts.

The message table (rollout/lab/data/protobuf-messages.json) is written by
scripts/gen-protobuf-schema from k8s.io/api and k8s.io/apimachinery as Debian packages them:
each field's number, JSON name (empty for a field Go's JSON inlines into its parent), type,
shape (one, repeated, map) and whether JSON leaves its zero value out. A kind outside the
table (a custom resource) is refused with 415, as the real server refuses protobuf for them."""

from __future__ import annotations

import base64
import datetime
import json
import struct
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from typing import Any

from rollout.lab.apiserver.errors import ApiError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"
_JSON_TYPES = ["application/json", "application/yaml"]

Fields = dict[int, list[bytes | int]]
# field number -> [JSON name ("" inlined), type, "one" | "repeated" | "map", zero left out]
Message = Mapping[str, list[Any]]

_META = "k8s.io.apimachinery.pkg.apis.meta.v1."
_INTEGERS = ("int32", "int64", "uint32", "uint64")
# Go's time.Time{} (what an unset metav1.Time marshals as) in Unix seconds.
_ZERO_TIME_S = -62135596800


@cache
def _table() -> dict[str, Any]:
    text = resources.files("rollout.lab").joinpath("data", "protobuf-messages.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


def is_protobuf(content_type: str) -> bool:
    return content_type.split(";")[0].strip() == MEDIA_TYPE


def can_decode(api_version: str, kind: str) -> bool:
    """Whether a body of this kind can be read from protobuf (every built-in kind served)."""
    return f"{api_version}/{kind}" in _table()["kinds"]


def decode_object(raw: bytes) -> dict[str, Any]:
    """A protobuf body as the JSON object it stands for; 415 for a kind not in the table."""
    if not raw.startswith(_MAGIC):
        raise ApiError.bad_request("the protobuf body does not start with the k8s envelope")
    envelope = _fields(raw[len(_MAGIC) :])
    type_meta = _fields(_last_bytes(envelope, 1))
    api_version, kind = _last_bytes(type_meta, 1).decode(), _last_bytes(type_meta, 2).decode()
    message = _table()["kinds"].get(f"{api_version}/{kind}")
    if message is None:
        raise ApiError.unsupported_media_type(MEDIA_TYPE, _JSON_TYPES)
    obj = _message(_last_bytes(envelope, 2), message)
    return {"apiVersion": api_version, "kind": kind, **obj}


def _message(data: bytes, name: str) -> Any:
    """One message as JSON: the few with a JSON form of their own, else field by field."""
    fields = _fields(data)
    special = _SPECIAL.get(name)
    if special is not None:
        return special(fields)
    schema: Message = _table()["messages"].get(name, {})
    obj: dict[str, Any] = {}
    for number, (json_name, type_, shape, omit_zero) in schema.items():
        values = fields.get(int(number))
        if not values:
            continue
        if shape == "repeated":
            obj[json_name] = [_value(v, type_) for v in _unpacked(values, type_)]
        elif shape == "map":
            entries = [_fields(_as_bytes(v)) for v in values]
            obj[json_name] = {
                _last_bytes(e, 1).decode(): _value(e.get(2, [b""])[-1], type_) for e in entries
            }
        else:
            value = _value(values[-1], type_)
            if value is None or (omit_zero and value in ("", 0, False) and type_ in _SCALARS):
                continue
            if json_name:
                obj[json_name] = value
            elif isinstance(value, dict):
                obj.update(value)  # a struct Go's JSON inlines into its parent
    return obj


def _value(value: bytes | int, type_: str) -> Any:
    if type_ in _INTEGERS:
        return _signed(_as_int(value)) if type_.startswith("int") else _as_int(value)
    if type_ == "bool":
        return bool(_as_int(value))
    if type_ == "string":
        return _as_bytes(value).decode()
    if type_ == "bytes":
        return base64.b64encode(_as_bytes(value)).decode()
    if type_ == "double":
        return struct.unpack("<d", _as_bytes(value))[0]
    if type_ == "float":
        return struct.unpack("<f", _as_bytes(value))[0]
    return _message(_as_bytes(value), type_)


_SCALARS = (*_INTEGERS, "bool", "string", "bytes", "double", "float")


def _unpacked(values: list[bytes | int], type_: str) -> list[bytes | int]:
    """Repeated varints may come packed, in one length-delimited field."""
    if type_ not in (*_INTEGERS, "bool"):
        return values
    unpacked: list[bytes | int] = []
    for value in values:
        if isinstance(value, int):
            unpacked.append(value)
            continue
        at = 0
        while at < len(value):
            number, at = _varint(value, at)
            unpacked.append(number)
    return unpacked


def _quantity(fields: Fields) -> str:
    return _last_bytes(fields, 1).decode()


def _int_or_string(fields: Fields) -> int | str:
    if fields.get(1, [0])[-1] == 1:
        return _last_bytes(fields, 3).decode()
    return _signed(_as_int(fields.get(2, [0])[-1]))


def _time(fields: Fields, micro: bool = False) -> str | None:
    seconds = _signed(_as_int(fields.get(1, [0])[-1]))
    nanos = _as_int(fields.get(2, [0])[-1])
    if seconds in (0, _ZERO_TIME_S) and nanos == 0:
        return None  # an unset time: null in JSON
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{nanos // 1000:06d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(fields: Fields) -> str:
    """metav1.Duration's JSON: Go's time.Duration.String() of its nanoseconds."""
    nanos = _signed(_as_int(fields.get(1, [0])[-1]))
    sign, nanos = ("-" if nanos < 0 else ""), abs(nanos)
    if nanos == 0:
        return "0s"
    if nanos < 1_000_000_000:
        return f"{sign}{nanos / 1e6:g}ms" if nanos >= 1_000_000 else f"{sign}{nanos}ns"
    hours, rest = divmod(nanos, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = f"{rest / 1e9:.9f}".rstrip("0").rstrip(".")
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    return f"{sign}{minutes}m{seconds}s" if minutes else f"{sign}{seconds}s"


def _raw_json(fields: Fields) -> Any:
    """runtime.RawExtension and metav1.FieldsV1: raw JSON bytes, embedded as they are."""
    raw = _last_bytes(fields, 1)
    try:
        return json.loads(raw) if raw else None
    except json.JSONDecodeError as error:
        raise ApiError.bad_request(f"an embedded object is not JSON: {error}") from error


_SPECIAL: dict[str, Callable[[Fields], Any]] = {
    "k8s.io.apimachinery.pkg.api.resource.Quantity": _quantity,
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": _int_or_string,
    f"{_META}Time": _time,
    f"{_META}MicroTime": lambda fields: _time(fields, micro=True),
    f"{_META}Duration": _duration,
    f"{_META}FieldsV1": _raw_json,
    "k8s.io.apimachinery.pkg.runtime.RawExtension": _raw_json,
}


def _signed(value: int) -> int:
    """A varint as Go's int32/int64 wrote it (negatives as 64-bit two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _as_int(value: bytes | int) -> int:
    if not isinstance(value, int):
        raise ApiError.bad_request("a protobuf field is not a varint")
    return value


def _as_bytes(value: bytes | int) -> bytes:
    if not isinstance(value, bytes):
        raise ApiError.bad_request("a protobuf field is not length-delimited")
    return value


def _last_bytes(fields: Fields, number: int) -> bytes:
    return _as_bytes((fields.get(number) or [b""])[-1])


def _fields(data: bytes) -> Fields:
    """Field number → values: bytes for length-delimited and fixed-width fields, ints for
    varints."""
    fields: Fields = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, at = _varint(data, at)
            fields.setdefault(number, []).append(value)
            continue
        if wire_type == 2:
            length, at = _varint(data, at)
        elif wire_type in (1, 5):
            length = 8 if wire_type == 1 else 4
        else:
            raise ApiError.bad_request(f"unsupported protobuf wire type {wire_type}")
        if at + length > len(data):
            raise ApiError.bad_request("truncated protobuf body")
        fields.setdefault(number, []).append(data[at : at + length])
        at += length
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
