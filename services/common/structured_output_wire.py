"""mstar.v1.StructuredOutput <-> the domain StructuredOutput (services/common/structured_output.py).

Both services' wire modules use it: preprocess reads it from a native request and writes it onto
the internal stream; the generation service reads it there. Protobuf stops here.
"""

from __future__ import annotations

from mstar.v1 import messages_pb2 as pb

from services.common.structured_output import (
    CHOICE,
    GRAMMAR,
    JSON_OBJECT,
    JSON_SCHEMA,
    REGEX,
    TOOL_CALLS,
    StructuredOutput,
    ToolCallTag,
)


def structured_output_pb(c: StructuredOutput) -> pb.StructuredOutput:
    if c.kind == JSON_SCHEMA:
        return pb.StructuredOutput(json_schema=c.json_schema)
    if c.kind == JSON_OBJECT:
        return pb.StructuredOutput(json_object=True)
    if c.kind == REGEX:
        return pb.StructuredOutput(regex=c.regex)
    if c.kind == GRAMMAR:
        return pb.StructuredOutput(grammar=c.grammar)
    if c.kind == CHOICE:
        return pb.StructuredOutput(choice=pb.Choices(choices=c.choices))
    if c.kind == TOOL_CALLS:
        calls = c.tool_calls
        return pb.StructuredOutput(tool_calls=pb.ToolCallFormat(
            tags=[pb.ToolCallTag(begin=t.begin, json_schema=t.json_schema, end=t.end) for t in calls.tags],
            triggers=calls.triggers, require_call=calls.require_call, single_call=not calls.parallel,
            separator=calls.separator))
    raise ValueError(f"unknown structured output kind {c.kind!r}")


def structured_output_of(msg: pb.StructuredOutput) -> StructuredOutput | None:
    """None when no form is set (the contract's validation refuses that on the public API)."""
    kind = msg.WhichOneof("kind")
    if kind == "json_schema":
        return StructuredOutput.from_json_schema(msg.json_schema)
    if kind == "json_object":
        return StructuredOutput.any_json_object()
    if kind == "regex":
        return StructuredOutput.from_regex(msg.regex)
    if kind == "grammar":
        return StructuredOutput.from_grammar(msg.grammar)
    if kind == "choice":
        return StructuredOutput.from_choices(msg.choice.choices)
    if kind == "tool_calls":
        calls = msg.tool_calls
        return StructuredOutput.for_tool_calls(
            [ToolCallTag(t.begin, t.json_schema, t.end) for t in calls.tags], calls.triggers,
            require_call=calls.require_call, parallel=not calls.single_call,
            separator=calls.separator if calls.HasField("separator") else "\n")
    return None
