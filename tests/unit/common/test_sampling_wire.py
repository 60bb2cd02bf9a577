"""The sampling converters are the field table's rows: every dataclass that carries sampling has
exactly the table's fields, and both services' wire forms round-trip any value the contract allows."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from mstar.v1 import messages_pb2 as pb

from services.common import sampling_wire
from services.common.sampling_fields import ENGINE_FIELDS, FIELDS, SamplingField
from services.generation import wire as generation_wire
from services.generation.sampling_params import SamplingParams
from services.preprocess import wire as preprocess_wire
from services.preprocess.request import Sampling


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_dataclasses_carry_exactly_the_tables_rows():
    # structured_output is a message (structured_output_wire.py); spelled is what the client wrote;
    # embedding rides in ModelKwargs.embedding, not in SamplingParams.
    assert names(Sampling) - {"structured_output", "spelled"} == set(FIELDS)
    assert names(SamplingParams) - {"structured_output", "embedding"} == {f.name for f in ENGINE_FIELDS}
    assert {f.name for f in FIELDS.values() if not f.engine} == {"stop", "include_stop", "n"}
    wire = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields} - {"structured_output"}
    assert {f.wire_name for f in FIELDS.values()} == wire


def value(row: SamplingField):
    """Any value the contract's bounds and wire type allow for one row (None: unset)."""
    if row.kind is bool:  # a plain bool (ignore_eos), or an optional one (speculative: unset = policy)
        return st.booleans() if row.default is not None else st.none() | st.booleans()
    if row.repeated:
        item = st.text(max_size=8) if row.kind is str else st.integers(0, 2**31 - 1)
        return st.lists(item, max_size=3).map(tuple)
    b = row.bounds
    if row.kind is float:  # float32 on the wire: draw values it holds exactly
        inner = st.floats(b.low if b.low is not None else -2.0, b.high if b.high is not None else 2.0,
                          width=32, exclude_min=not b.low_inclusive, exclude_max=not b.high_inclusive)
    else:
        low, high = row.int_range
        inner = st.integers(int(b.low) if b.low is not None else low, int(b.high) if b.high is not None else high)
    return st.none() | inner


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({name: value(row) for name, row in FIELDS.items()}))
def test_preprocess_round_trips_every_row(values):
    sampling = Sampling(**values)
    msg = preprocess_wire.sampling_pb(sampling)
    back = Sampling(**sampling_wire.values_of(msg, FIELDS.values()))
    assert back == sampling


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({row.name: value(row) for row in ENGINE_FIELDS}))
def test_the_engine_reads_what_preprocess_writes(values):
    sampling = Sampling(**values)
    params = generation_wire.sampling_params_of(pb.ModelKwargs(sampling=preprocess_wire.sampling_pb(sampling)))
    for row in ENGINE_FIELDS:
        sent = values[row.name]
        assert getattr(params, row.name) == (row.default if sent is None else sent), row.name
