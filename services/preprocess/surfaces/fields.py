"""Sampling fields as pydantic types, and body → domain `Sampling`, from the one field table.

    class Body(http.Body):
        temperature: fields.sampling("temperature") = None
        stop_sequences: fields.sampling("stop") = None

    fields.sampling_of(body, "messages", max_tokens=...)   # -> Sampling

The type carries the contract's declared bounds (services/common/sampling_fields.py reads them from
the .proto), so pydantic rejects an out-of-range value naming the field as the client spelled it,
and the published JSON schema of every surface shows the same numbers.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from services.common.contract import declared
from services.common.sampling_fields import FIELDS, SamplingField
from services.preprocess.request import Sampling
from services.preprocess.surfaces.http import field_error
from services.preprocess.surfaces.sampling_names import public_names

# The contract's declared limits on what every surface's body turns into (mstar.v1.PreprocessInput).
MAX_MESSAGES = declared("mstar.v1.PreprocessInput", "messages").max_items
Model = Annotated[str, Field(max_length=declared("mstar.v1.PreprocessInput", "model").max_len,
                             description='The served model\'s id or "default" (empty = the served model).')]


def _constraints(f: SamplingField, bounds) -> dict[str, Any]:
    out: dict[str, Any] = {}
    low, high = bounds.low, bounds.high
    if f.int_range is not None:  # what the wire type holds, where the contract declares less
        low = f.int_range[0] if low is None else max(low, f.int_range[0])
        high = f.int_range[1] if high is None else min(high, f.int_range[1])
        low, high = int(low), int(high)
    if low is not None:
        out["ge" if bounds.low_inclusive else "gt"] = low
    if high is not None:
        out["le" if bounds.high_inclusive else "lt"] = high
    if bounds.min_len is not None:
        out["min_length"] = bounds.min_len
    if bounds.max_len is not None:
        out["max_length"] = bounds.max_len
    return out


def sampling(name: str, *, before: Any = None, required: bool = False) -> Any:
    """The pydantic type of sampling field `name` (optional unless `required`); `before` adapts a
    surface's spelling first (OpenAI's `stop` may be one string)."""
    f = FIELDS[name]
    bounds = f.bounds
    if f.repeated:
        item = Annotated[f.kind, Field(**_constraints(f, bounds.items or type(bounds)()))]
        limit = {"max_length": bounds.max_items} if bounds.max_items is not None else {}
        kind: Any = Annotated[list[item], Field(**limit)]  # type: ignore[valid-type]
    else:
        kind = Annotated[f.kind, Field(**_constraints(f, bounds))]
        if f.is_float32:
            kind = Annotated[kind, AfterValidator(_as_float32(bounds))]
    if not required:
        kind = kind | None
    extra = (BeforeValidator(before),) if before is not None else ()
    return Annotated[kind, Field(description=f.doc), *extra]


def _as_float32(bounds):
    """The value as the contract's 32-bit float carries it, which must still be in bounds: a
    positive double below float32's smallest subnormal (1e-46) passes `gt: 0` here but is 0 on the
    wire, where the generation service would refuse it naming its internal path."""
    def check(value: float) -> float:
        try:
            wire = struct.unpack("<f", struct.pack("<f", value))[0]
        except OverflowError:  # beyond float32's range: infinite on the wire
            wire = math.copysign(math.inf, value)
        if not bounds.contains(wire):
            raise ValueError(f"{value!r} is {wire!r} as a 32-bit float, outside {bounds.describe()}")
        return wire
    return check


def sampling_of(body: Any, surface: str, **given: Any) -> Sampling:
    """The domain Sampling of a parsed body: every field the table lists for `surface`, read
    under its public name(s); `given` sets fields the surface derives itself (e.g. a default)."""
    values: dict[str, Any] = {}
    spelled = []
    for f in FIELDS.values():
        value, sent = None, None
        names = public_names(f.name, surface)
        for public in names:
            got = getattr(body, public, None)
            if got is None:
                continue
            if value is not None and got != value:
                raise field_error(public, f"conflicts with {sent}; send only one")
            value, sent = got, sent or public
        if value is not None:
            values[f.name] = tuple(value) if f.repeated else value
            if sent != names[0]:  # an alias: errors and warnings name what the client sent
                spelled.append((f.name, sent))
    values.update({k: v for k, v in given.items() if v is not None})
    return replace(Sampling(), **values, spelled=tuple(spelled))
