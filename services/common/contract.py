"""The contracts' declared bounds (protovalidate rules in protos/), enforced at servicer boundaries.

    contract.check(request)                      # raises MstarError INVALID_ARGUMENT, or returns
    contract.check(message.start, prefix="start")  # field paths relative to an enclosing message
    contract.bounds(pb.SamplingParams, "temperature")  # -> Bounds(low=0.0, high=2.0, ...)

`check` does its work in an order that keeps one request from pinning the event loop:
1. counts first: the length of every repeated or map field (O(1) each) against its declared
   maximum, descending only into lists already known to be within bounds, so the later steps'
   work is bounded by the declared counts and never by what the client sent;
2. an optional caller `cost` check on the now count-bounded message (e.g. "can these bytes or
   token ids still fit the context?"), before any per-element work;
3. protovalidate (native code) over the whole message: lengths, patterns, ranges, enum values.
Violations become one INVALID_ARGUMENT (reason INVALID_FIELD) with a BadRequest field violation
per broken rule, naming the field (`input.model_kwargs.sampling.stop[3]`) and the rule, never
the value.

`bounds` reads one field's declared limits back from the descriptor, so code that validates
another shape of the same data (the OpenAI JSON bodies) uses the contract's numbers instead of
copies of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import protovalidate
from buf.validate import validate_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from services.common import errors

_validator = protovalidate.Validator()


def check(
    msg: Message,
    *,
    prefix: str = "",
    cost: Callable[[Message], None] | None = None,
) -> None:
    """Raise INVALID_ARGUMENT naming every field of `msg` outside its declared bounds."""
    found: list[errors.FieldViolation] = []
    _check_counts(msg, prefix, found)
    if not found and cost is not None:
        cost(msg)
    if not found:
        for v in _validator.collect_violations(msg)[:errors.MAX_VIOLATIONS]:
            found.append(errors.FieldViolation(_join(prefix, _path(v.proto.field)), v.proto.message))
    if found:
        raise violations_error(found)


def violations_error(found: list[errors.FieldViolation]) -> errors.MstarError:
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return errors.MstarError(
        errors.Code.INVALID_ARGUMENT,
        "INVALID_FIELD",
        f"{first.field}: {first.description}{more}",
        field_violations=found[:errors.MAX_VIOLATIONS],
        metadata={"field": first.field},
    )


# ---- 1. counts first


def _check_counts(msg: Message, path: str, found: list[errors.FieldViolation]) -> None:
    for fd, value in msg.ListFields():
        if len(found) >= errors.MAX_VIOLATIONS:
            return
        where = _join(path, fd.name)
        if fd.message_type is not None and fd.message_type.full_name.startswith("google.protobuf."):
            continue  # well-known types (Struct, Timestamp) carry no declared counts
        if fd.is_repeated:
            limit = _max_items(fd)
            if limit is not None and len(value) > limit:
                noun = "pair" if _is_map(fd) else "item"
                found.append(errors.FieldViolation(where, f"must contain no more than {limit} {noun}(s)"))
                continue
            if fd.message_type is not None and not _is_map(fd):
                for i, item in enumerate(value):
                    _check_counts(item, f"{where}[{i}]", found)
        elif fd.message_type is not None:
            _check_counts(value, where, found)


@functools.cache
def _max_items(fd: FieldDescriptor) -> int | None:
    rules = _rules(fd)
    if rules is None:
        return None
    if rules.HasField("repeated") and rules.repeated.HasField("max_items"):
        return rules.repeated.max_items
    if rules.HasField("map") and rules.map.HasField("max_pairs"):
        return rules.map.max_pairs
    return None


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _rules(fd: FieldDescriptor) -> validate_pb2.FieldRules | None:
    options = fd.GetOptions()
    if not options.HasExtension(validate_pb2.field):
        return None
    return options.Extensions[validate_pb2.field]


# ---- field paths


def _join(prefix: str, name: str) -> str:
    if not prefix:
        return name
    if not name or name.startswith("["):
        return prefix + name
    return f"{prefix}.{name}"


def _path(field_path) -> str:
    out = ""
    for element in field_path.elements:
        out = _join(out, element.field_name)
        subscript = element.subscript
        if subscript is None:
            continue
        kind, key = subscript.field, subscript.value
        # Map keys come from the client: only a short, escaped prefix of them is shown.
        out += f"[{key}]" if kind == "index" else f"[{errors.quote(key, 32)}]"
    return out


# ---- declared bounds, read back


@dataclass(frozen=True)
class Bounds:
    """One field's declared limits (None = not declared). For repeated fields, `items` holds the
    bounds of each element."""

    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    finite: bool = False
    min_len: int | None = None
    max_len: int | None = None
    max_bytes: int | None = None
    pattern: str | None = None
    max_items: int | None = None
    items: Bounds | None = None

    def contains(self, value: float) -> bool:
        """True if the number is inside the declared range."""
        if math.isnan(value):
            return self.low is None and self.high is None and not self.finite
        if self.finite and math.isinf(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return not (self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive)))

    def describe(self) -> str:
        """The numeric range as an interval, e.g. "(0, 1]"."""
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"{'[' if self.low_inclusive else '('}{low}, {high}{']' if self.high_inclusive else ')'}"


def bounds(message: type[Message] | Descriptor, field_name: str) -> Bounds:
    """The declared bounds of `message.field_name`, read from its protovalidate annotation."""
    descriptor = message if isinstance(message, Descriptor) else message.DESCRIPTOR
    rules = _rules(descriptor.fields_by_name[field_name])
    return _bounds_of(rules) if rules is not None else Bounds()


_NUMERIC = ("float", "double", "int32", "int64", "uint32", "uint64", "sint32", "sint64")


def _bounds_of(rules: validate_pb2.FieldRules) -> Bounds:
    kind = rules.WhichOneof("type")
    if kind in _NUMERIC:
        r = getattr(rules, kind)
        low_kind, high_kind = r.WhichOneof("greater_than"), r.WhichOneof("less_than")
        return Bounds(
            low=getattr(r, low_kind) if low_kind else None,
            high=getattr(r, high_kind) if high_kind else None,
            low_inclusive=low_kind != "gt",
            high_inclusive=high_kind != "lt",
            finite=kind in ("float", "double") and r.finite,
        )
    if kind == "string":
        r = rules.string
        return Bounds(
            min_len=r.min_len if r.HasField("min_len") else None,
            max_len=r.max_len if r.HasField("max_len") else None,
            max_bytes=r.max_bytes if r.HasField("max_bytes") else None,
            pattern=r.pattern if r.HasField("pattern") else None,
        )
    if kind == "bytes":
        return Bounds(max_bytes=rules.bytes.max_len if rules.bytes.HasField("max_len") else None)
    if kind == "repeated":
        r = rules.repeated
        return Bounds(
            max_items=r.max_items if r.HasField("max_items") else None,
            items=_bounds_of(r.items) if r.HasField("items") else None,
        )
    if kind == "map":
        return Bounds(max_items=rules.map.max_pairs if rules.map.HasField("max_pairs") else None)
    return Bounds()


def declared(message: str, field_name: str) -> Bounds:
    """`bounds` by the message's full name ("mstar.v1.PreprocessInput"), for code that reads the
    contract's numbers without handling generated types (the HTTP surfaces' body models)."""
    import mstar.v1.inference_service_pb2  # noqa: F401 - registers every mstar.v1 message
    from google.protobuf import descriptor_pool

    return bounds(descriptor_pool.Default().FindMessageTypeByName(message), field_name)
