"""mstar.v1.StructuredOutput <-> the domain constraint: every form survives the round trip both
services make (preprocess writes it, generation reads it), and the contract's declared bounds
agree with the engine's caps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from mstar.v1 import messages_pb2 as pb

from services.common import structured_output as so
from services.common.contract import declared
from services.common.structured_output_wire import structured_output_of, structured_output_pb

TEXT = st.text(min_size=1, max_size=12)
SCHEMA = st.dictionaries(st.sampled_from(["type", "title", "maxLength"]), st.one_of(TEXT, st.integers()), max_size=3)
TAG = st.builds(lambda name, schema, end: so.tool_call_tag("<t>" + name, schema, end), TEXT, SCHEMA, st.text(max_size=8))
CONSTRAINTS = st.one_of(
    SCHEMA.map(so.StructuredOutput.from_json_schema),
    st.just(so.StructuredOutput.any_json_object()),
    TEXT.map(so.StructuredOutput.from_regex),
    TEXT.map(so.StructuredOutput.from_grammar),
    st.lists(TEXT, min_size=1, max_size=4).map(so.StructuredOutput.from_choices),
    st.builds(lambda tags, require, parallel, sep: so.StructuredOutput.for_tool_calls(tags, ["<t>"], require, parallel, sep),
              st.lists(TAG, min_size=1, max_size=3), st.booleans(), st.booleans(), st.text(max_size=3)),
)


@settings(max_examples=200, deadline=None)
@given(CONSTRAINTS)
def test_every_form_round_trips_through_the_contract(c):
    wire = pb.StructuredOutput.FromString(structured_output_pb(c).SerializeToString())
    assert structured_output_of(wire) == c


def test_unset_is_none_and_the_declared_bounds_are_the_engines_caps():
    assert structured_output_of(pb.StructuredOutput()) is None
    assert declared("mstar.v1.StructuredOutput", "json_schema").max_bytes == so.MAX_SCHEMA_BYTES
    assert declared("mstar.v1.StructuredOutput", "regex").max_bytes == so.MAX_REGEX_BYTES
    assert declared("mstar.v1.StructuredOutput", "grammar").max_bytes == so.MAX_GRAMMAR_BYTES
    assert declared("mstar.v1.Choices", "choices").max_items == so.MAX_CHOICES
    assert declared("mstar.v1.ToolCallFormat", "tags").max_items == so.MAX_TOOLS
