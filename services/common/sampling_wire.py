"""mstar.v1.SamplingParams <-> a dict of the field table's values, for both services' wire modules.

The converters walk the rows of services/common/sampling_fields.py, so a new sampling field is one
row there (and one attribute on the dataclasses that carry it), never another hand-kept name list.
structured_output is not a row: it is a message, converted by structured_output_wire.py.
Protobuf stops here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mstar.v1 import messages_pb2 as pb

from services.common.sampling_fields import SamplingField

_FIELDS = pb.SamplingParams.DESCRIPTOR.fields_by_name


def values_of(msg: pb.SamplingParams, rows: Iterable[SamplingField]) -> dict[str, Any]:
    """name -> value of each row the message carries: a repeated field as a tuple, an `optional`
    field only when set (unset = the default applies), a plain field (ignore_eos) as it is."""
    out: dict[str, Any] = {}
    for row in rows:
        wire = row.wire_name
        if row.repeated:
            out[row.name] = tuple(getattr(msg, wire))
        elif not _FIELDS[wire].has_presence or msg.HasField(wire):
            out[row.name] = getattr(msg, wire)
    return out


def message_of(values: dict[str, Any], rows: Iterable[SamplingField]) -> pb.SamplingParams:
    """The inverse of values_of: each row's value from `values`; None stays unset."""
    msg = pb.SamplingParams()
    for row in rows:
        value = values.get(row.name)
        if value is None:
            continue
        if row.repeated:
            getattr(msg, row.wire_name).extend(value)
        else:
            setattr(msg, row.wire_name, value)
    return msg
