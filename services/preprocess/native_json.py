"""The native RPCs' JSON bodies (POST /v1/generate, /v1/generate_stream, /v1/session, :append,
:cancel) as typed requests.

Envoy's transcoder would parse these bodies itself, but it drops JSON fields it does not know, so
a typo (`max_token`) would be ignored and the request served as if it were not there. These routes
hand the raw body over instead (google.api.HttpBody; the typed response is still printed by the
transcoder), and here it becomes the typed message under proto3's JSON mapping: proto or
lowerCamelCase names, enums by name or number, 64-bit integers as numbers or strings, floats
also as "NaN" / "Infinity" (the contract then refuses them), bytes as base64, null = unset. Every
key is looked up in the message's descriptor: an unknown one is INVALID_ARGUMENT, reason
UNKNOWN_FIELD, naming it the way native errors name fields (`input.model_kwargs.sampling.max_token`);
a value of the wrong type is INVALID_FIELD naming its field. Bounds are not checked here: the typed
RPC runs the contract's check as for any gRPC client.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from services.common import errors
from services.preprocess import json_text

_INTS = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
         FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
         FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
         FieldDescriptor.TYPE_SFIXED64}
_FLOATS = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE}
_QUOTED_INT = re.compile(r"-?[0-9]+")
_QUOTED_FLOAT = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Well-known types whose JSON form is not an object of their fields: protobuf's own parser.
_WELL_KNOWN = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


def body_message(body: bytes, message: Message, root: str) -> Message:
    """`message` filled from the JSON `body` (empty = an empty message, as the transcoder read it);
    errors name fields under `root` (`input`: a PreprocessInput body of Generate)."""
    if not body.strip():
        return message
    try:
        value = json_text.loads(body)
    except ValueError as exc:
        raise errors.invalid_argument(root or "body", json_text.message(str(exc)), reason="INVALID_JSON") from None
    return value_message(value, message, root)


def value_message(value: Any, message: Message, root: str) -> Message:
    """`message` filled from a parsed JSON value (a dict), every key checked."""
    _fill(message, value, root)
    return message


@functools.cache
def _fields(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """Fields by proto name and by JSON (lowerCamelCase) name."""
    out = {}
    for fd in descriptor.fields:
        out[fd.name] = fd
        out[fd.json_name] = fd
    return out


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _invalid(path: str, description: str) -> errors.MstarError:
    return errors.invalid_argument(path or "body", description)


def _fill(message: Message, value: Any, path: str) -> None:
    descriptor = message.DESCRIPTOR
    if descriptor.full_name in _WELL_KNOWN:
        try:
            json_format.ParseDict(value, message)
        except json_format.ParseError as exc:
            raise _invalid(path, f"is not a valid {descriptor.name} ({errors.quote(str(exc), 200)})") from None
        return
    if not isinstance(value, dict):
        raise _invalid(path, "must be a JSON object")
    fields = _fields(descriptor)
    for key, item in value.items():
        fd = fields.get(key)
        if fd is None:
            where = _join(path, errors.field_name(str(key)))
            raise errors.invalid_argument(where, "unknown field", reason="UNKNOWN_FIELD")
        where = _join(path, fd.name)
        if item is None:  # proto3 JSON: null is the field's default
            continue
        oneof = fd.containing_oneof  # a proto3 optional's own oneof has one member: never a conflict
        if oneof is not None and message.WhichOneof(oneof.name) not in (None, fd.name):
            raise _invalid(where, f"conflicts with {_join(path, message.WhichOneof(oneof.name))}; "
                           f"{oneof.name} takes one of its fields")
        _set(message, fd, item, where)


def _set(message: Message, fd: FieldDescriptor, value: Any, where: str) -> None:
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        _set_map(getattr(message, fd.name), fd.message_type, value, where)
    elif fd.is_repeated:
        if not isinstance(value, list):
            raise _invalid(where, "must be a JSON array")
        container = getattr(message, fd.name)
        if fd.message_type is not None:
            for i, item in enumerate(value):
                _fill(container.add(), item, f"{where}[{i}]")
            return
        if not (fd.type in _INTS and all(type(v) is int for v in value)):  # token ids: no per-item work
            value = [_scalar(fd, v, f"{where}[{i}]") for i, v in enumerate(value)]
        try:
            container.extend(value)
        except ValueError:  # an integer out of the field's range: find it
            for i, v in enumerate(value):
                if not _fits(fd, v):
                    raise _invalid(f"{where}[{i}]", f"is out of range for {_type_name(fd)}") from None
            raise
    elif fd.message_type is not None:
        sub = getattr(message, fd.name)
        sub.SetInParent()
        _fill(sub, value, where)
    else:
        try:
            setattr(message, fd.name, _scalar(fd, value, where))
        except (ValueError, TypeError):  # the protobuf runtime's range check
            raise _invalid(where, f"is out of range for {_type_name(fd)}") from None


def _set_map(container, entry: Descriptor, value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise _invalid(where, "must be a JSON object")
    key_fd, value_fd = entry.fields_by_name["key"], entry.fields_by_name["value"]
    for key, item in value.items():
        at = f"{where}[{errors.quote(str(key), 32)}]"
        if key_fd.type != FieldDescriptor.TYPE_STRING:
            key = _scalar(key_fd, key, at)
        if value_fd.message_type is not None:
            _fill(container[key], item, at)
        else:
            container[key] = _scalar(value_fd, item, at)


_RANGES = {FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-2**31, 2**31 - 1),
           FieldDescriptor.TYPE_SFIXED32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
           FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
           FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1)}


def _fits(fd: FieldDescriptor, value: int) -> bool:
    low, high = _RANGES.get(fd.type, (-2**63, 2**63 - 1))
    return low <= value <= high


def _type_name(fd: FieldDescriptor) -> str:
    if fd.enum_type is not None:
        return fd.enum_type.name
    return {FieldDescriptor.TYPE_INT32: "int32", FieldDescriptor.TYPE_INT64: "int64",
            FieldDescriptor.TYPE_UINT32: "uint32", FieldDescriptor.TYPE_UINT64: "uint64",
            FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_DOUBLE: "double"}.get(fd.type, "its type")


def _scalar(fd: FieldDescriptor, value: Any, where: str) -> Any:
    """One JSON value as the field's Python value (proto3 JSON mapping)."""
    if fd.enum_type is not None:
        if isinstance(value, str):
            found = fd.enum_type.values_by_name.get(value)
            if found is None:
                raise _invalid(where, f"{errors.quote(value, 48)} is not a {fd.enum_type.name}")
            return found.number
        if type(value) is int:
            return value
        raise _invalid(where, f"must be a {fd.enum_type.name} name (or number)")
    kind = fd.type
    if kind == FieldDescriptor.TYPE_BOOL:
        if isinstance(value, bool):
            return value
        raise _invalid(where, "must be true or false")
    if kind == FieldDescriptor.TYPE_STRING:
        if isinstance(value, str):
            return value
        raise _invalid(where, "must be a string")
    if kind == FieldDescriptor.TYPE_BYTES:
        if isinstance(value, str):
            try:  # standard or URL-safe alphabet, padding optional
                standard = value.replace("-", "+").replace("_", "/")
                return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
            except (binascii.Error, ValueError):
                pass
        raise _invalid(where, "must be base64 text")
    if kind in _INTS:
        return _integer(value, where, fd)
    if kind in _FLOATS:
        return _float(value, where)
    raise _invalid(where, "has a type this server does not read")  # groups: not in the contract


def _integer(value: Any, where: str, fd: FieldDescriptor) -> int:
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    if isinstance(value, str) and _QUOTED_INT.fullmatch(value):  # proto3 JSON: integers may be quoted
        return int(value)
    raise _invalid(where, f"must be an integer ({_type_name(fd)})")


def _float(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        if value in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value]
        if _QUOTED_FLOAT.fullmatch(value):
            return float(value)
    raise _invalid(where, "must be a number")
