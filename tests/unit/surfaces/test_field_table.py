"""The one sampling field table: every field, every surface's public name, every bound.

For each row and each surface that offers it: the body model has a field under that public name,
its bounds are the contract's declared ones (read here straight from the descriptor's protovalidate
options, independently of the code under test), a value at each bound is accepted and one just
past it is refused naming the field as the client spelled it; the domain Sampling gets the value.
"""

from __future__ import annotations

import json
import math

import pytest
from buf.validate import validate_pb2
from mstar.v1 import messages_pb2

from services.common.errors import MstarError
from services.common.sampling_fields import FIELDS
from services.preprocess.surfaces.anthropic.body import MessagesBody
from services.preprocess.surfaces.fields import sampling_of
from services.preprocess.surfaces.http import HttpRequest, parse
from services.preprocess.surfaces.openai.body import ChatBody, CompletionBody
from services.preprocess.surfaces.responses.body import ResponsesBody
from services.preprocess.surfaces.sampling_names import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    NAMES,
    NATIVE_SURFACES,
    RESPONSES,
    offered,
    public_name,
    public_names,
)

MODELS = {CHAT: ChatBody, COMPLETIONS: CompletionBody, MESSAGES: MessagesBody, RESPONSES: ResponsesBody}
BASE = {
    CHAT: {"messages": [{"role": "user", "content": "x"}], "logprobs": True},
    COMPLETIONS: {"prompt": "x"},
    MESSAGES: {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
    RESPONSES: {"input": "x"},
}
SURFACE_FIELDS = [(s, f.name, public) for s in MODELS for f in offered(s) for public in public_names(f.name, s)]


def declared(name: str) -> validate_pb2.FieldRules:
    """The raw protovalidate rules of SamplingParams.<name> (the test's own reading of the contract)."""
    fd = messages_pb2.SamplingParams.DESCRIPTOR.fields_by_name[FIELDS[name].wire_name]
    return fd.GetOptions().Extensions[validate_pb2.field]


def edges(name: str) -> list[tuple[object, bool]]:
    """(value, accepted) pairs at and just past every declared numeric bound of field `name`."""
    rules = declared(name)
    kind = rules.WhichOneof("type")
    if kind not in ("float", "int32", "int64"):
        return []
    r = getattr(rules, kind)
    step = (lambda v, d: v + d) if kind != "float" else (lambda v, d: v + d * 1e-3)
    out = []
    low, high = r.WhichOneof("greater_than"), r.WhichOneof("less_than")
    if low:
        v = getattr(r, low)
        out += [(step(v, -1), False), (v, low == "gte"), (step(v, 1), True)]
    if high:
        v = getattr(r, high)
        out += [(step(v, 1), False), (v, high == "lte"), (step(v, -1), True)]
    return out


def body(surface: str, **fields) -> object:
    data = json.dumps({**BASE[surface], **fields}).encode()
    return parse(MODELS[surface], HttpRequest(data, "application/json"))


def test_every_row_is_a_contract_field_with_declared_bounds_where_it_has_a_range():
    for name, row in FIELDS.items():
        fd = messages_pb2.SamplingParams.DESCRIPTOR.fields_by_name[row.wire_name]
        assert fd.is_repeated == row.repeated, name
        if row.kind in (float, int) and name not in ("seed",):
            assert declared(name).WhichOneof("type") is not None, f"{name} declares no bounds"
    # structured_output is a message each surface builds from its own fields (response_format,
    # tools, guided_*), not a scalar row: surfaces/structured.py and the surfaces' tests cover it.
    assert set(FIELDS) | {"include_stop"} >= {f.name for f in messages_pb2.SamplingParams.DESCRIPTOR.fields
                                               if f.name not in ("include_stop_str_in_output", "structured_output")}


def test_the_names_table_has_a_row_per_field():
    assert set(NAMES) == set(FIELDS)


def test_every_surface_name_is_a_field_of_that_surfaces_body_and_nothing_else_is_sampling():
    for surface, model in MODELS.items():
        names = {public for f in offered(surface) for public in public_names(f.name, surface)}
        assert names <= set(model.model_fields), (surface, names - set(model.model_fields))
    # The native API spells every field under model_kwargs.sampling, on every native RPC.
    for rpc in NATIVE_SURFACES:
        root = "start" if rpc == "Session" else "input"
        assert public_name("stop", rpc) == f"{root}.model_kwargs.sampling.stop"
    assert public_name("stop", MESSAGES) == "stop_sequences" and public_name("max_tokens", RESPONSES) == \
        "max_output_tokens" and public_names("max_tokens", CHAT) == ("max_completion_tokens", "max_tokens")


@pytest.mark.parametrize(("surface", "name", "public"), SURFACE_FIELDS)
def test_every_bound_of_every_field_on_every_surface(surface, name, public):
    row = FIELDS[name]
    cases = edges(name)
    if row.kind is bool:
        cases = [(True, True), (1, False)]
    if row.repeated:
        rules = declared(name).repeated
        item = "x" if row.kind is str else 1
        cases = [([item] * rules.max_items, True), ([item] * (rules.max_items + 1), False)]
        if rules.items.WhichOneof("type") == "string":
            cases += [(["x" * rules.items.string.max_len], True), (["x" * (rules.items.string.max_len + 1)], False)]
        if rules.items.WhichOneof("type") == "int32":
            cases += [([rules.items.int32.gte], True), ([rules.items.int32.gte - 1], False)]
    if name == "seed":
        cases = [(2**63 - 1, True), (2**63, False), (-(2**63), True)]
    assert cases, f"no bound to test for {name}"
    for value, accepted in cases:
        if name == "top_k" and value == -1 and surface in (CHAT, COMPLETIONS):
            accepted = True  # vLLM's spelling of "off"
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if accepted:
            parsed = body(surface, **{public: value})
            got = getattr(sampling_of(parsed, surface), name)
            expected = tuple(value) if row.repeated else value
            if name == "top_k" and value == -1:
                expected = 0
            if name == "stop":
                expected = tuple(v for v in expected if v)
            assert got == pytest.approx(expected) if row.kind is float else got == expected, (public, value)
        else:
            with pytest.raises(MstarError) as info:
                body(surface, **{public: value})
            assert info.value.field_violations[0].field.split("[")[0] == public, (public, value)
