"""Structured-output constraints: validation names the bad part; caps bound the work; equal content, one key."""

import json

import pytest

from services.common.structured_output import (
    MAX_CHOICES,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    ConstraintError,
    StructuredOutput,
    tool_call_tag,
    validate_structured_output,
)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def deep_schema(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def tools(**overrides) -> StructuredOutput:
    tags = overrides.pop("tags", [tool_call_tag('<tool_call>{"name": "f", "arguments": ', SCHEMA, "}</tool_call>")])
    return StructuredOutput.for_tool_calls(tags, overrides.pop("triggers", ["<tool_call>"]), **overrides)


@pytest.mark.parametrize("constraint", [
    StructuredOutput.from_json_schema(SCHEMA),
    StructuredOutput.from_json_schema(json.dumps(SCHEMA)),
    StructuredOutput.from_json_schema(True),
    StructuredOutput.any_json_object(),
    StructuredOutput.from_regex(r"\d+"),
    StructuredOutput.from_grammar('root ::= "a" | "b"'),
    StructuredOutput.from_choices(["yes", "no"]),
    tools(),
    tools(require_call=True, parallel=False),
])
def test_valid_constraints_pass(constraint):
    validate_structured_output(constraint)


@pytest.mark.parametrize("constraint, field, words", [
    (StructuredOutput("yaml"), "structured_output.kind", "must be one of"),
    (StructuredOutput.from_json_schema("{not json"), "structured_output.json_schema", "not valid JSON"),
    (StructuredOutput.from_json_schema("[1, 2]"), "structured_output.json_schema", "must be a JSON object"),
    (StructuredOutput.from_json_schema(""), "structured_output.json_schema", "non-empty"),
    (StructuredOutput.from_json_schema({"enum": ["x" * MAX_SCHEMA_BYTES]}), "structured_output.json_schema", "bytes"),
    (StructuredOutput.from_json_schema(deep_schema(MAX_SCHEMA_DEPTH + 1)), "structured_output.json_schema",
     f"the limit is {MAX_SCHEMA_DEPTH}"),
    (StructuredOutput.from_regex(""), "structured_output.regex", "non-empty"),
    (StructuredOutput.from_regex("a" * 5000), "structured_output.regex", "the limit is 4096"),
    (StructuredOutput.from_grammar(None), "structured_output.grammar", "non-empty string"),
    (StructuredOutput.from_choices([]), "structured_output.choices", "1 to 1024"),
    (StructuredOutput.from_choices(["a"] * (MAX_CHOICES + 1)), "structured_output.choices", "1 to 1024"),
    (StructuredOutput.from_choices(["a", ""]), "structured_output.choices[1]", "non-empty"),
    (StructuredOutput("tool_calls"), "structured_output.tool_calls", "required"),
    (tools(tags=[]), "structured_output.tool_calls.tags", "1 to 128"),
    (tools(triggers=[]), "structured_output.tool_calls.triggers", "at least one"),
    (tools(triggers=["<call>"]), "structured_output.tool_calls.tags[0].begin", "exactly one trigger"),
    (tools(triggers=["<tool", "<tool_call>"]), "structured_output.tool_calls.tags[0].begin", "starts with 2"),
    (tools(tags=[tool_call_tag("<tool_call>", "{", "")]), "structured_output.tool_calls.tags[0].json_schema",
     "not valid JSON"),
])
def test_each_bad_part_is_named(constraint, field, words):
    with pytest.raises(ConstraintError) as info:
        validate_structured_output(constraint)
    assert info.value.field == field and words in info.value.description, str(info.value)


def test_a_deep_schema_is_measured_without_recursion():
    text = "[" * 30_000 + "]" * 30_000  # under the size cap; would overflow a recursive walk
    with pytest.raises(ConstraintError, match="nests too deep"):
        validate_structured_output(StructuredOutput.from_json_schema('{"enum": ' + text + "}"))


def test_the_whole_constraint_is_capped_too():
    many = StructuredOutput.from_choices(["x" * 1000] * 300)  # each fine, 300 KB in all
    with pytest.raises(ConstraintError, match="in all"):
        validate_structured_output(many)


def test_cache_key_follows_content_only():
    a = StructuredOutput.from_json_schema(SCHEMA)
    assert a.cache_key == StructuredOutput.from_json_schema(dict(SCHEMA)).cache_key
    assert a.cache_key != StructuredOutput.from_json_schema({"type": "object"}).cache_key
    assert StructuredOutput.from_regex("a").cache_key != StructuredOutput.from_grammar("a").cache_key
    assert tools().cache_key != tools(require_call=True).cache_key != tools(parallel=False).cache_key
