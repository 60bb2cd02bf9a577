"""`POST /v1/responses` (OpenAI Responses): what the openai SDK and its users send together.

`previous_response_id` names a response the matrix stored first (`table.STORED`). Rules
(docs/http.md "OpenAI Responses"): `tool_choice` `required` or a named function needs `tools`;
`text.format` json_object / json_schema cannot be combined with tools unless `tool_choice` is
`none`; `top_logprobs`, `reasoning`, `truncation` (other than "disabled") are unsupported; an
unknown previous response is 404 `previous_response_not_found`; `metadata` holds at most 16 pairs.
"""

from __future__ import annotations

from services.common.sampling_fields import FIELDS
from tests.matrix.covering import ABSENT, Factor, Row
from tests.matrix.table import CITY, JSON_SCHEMA, OK, STORED, Expect, Table, assigned, present, refused

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": CITY}
NAMED = {"type": "function", "name": "get_weather"}
INPUTS = {
    "text": {"input": "Say hi."},
    "messages": {"input": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    "parts": {"input": [{"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": "Name a colour."}]}]},
    # a previous response's output sent back as is (output_text parts, ids, status)
    "resent_output": {"input": [{"role": "user", "content": "Hi"},
                                {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                                 "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
                                {"role": "user", "content": "Again?"}]},
    "function_history": {"input": [{"role": "user", "content": "Weather in Paris?"},
                                   {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                                    "arguments": '{"city": "Paris"}'},
                                   {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]},
    # negatives
    "orphan_output": {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "?"}]},
    "empty": {"input": []},
}
JSON_FORMATS = ({"format": {"type": "json_object"}},
                {"format": {"type": "json_schema", "name": "reply", "schema": JSON_SCHEMA}})

FACTORS = (
    Factor("stream", (False, True)),
    Factor("store", (ABSENT, True, False)),
    Factor("tools", (ABSENT, [WEATHER])),
    Factor("tool_choice", (ABSENT, "auto", "required", "none", NAMED)),
    Factor("text", (ABSENT, {"format": {"type": "text"}}, *JSON_FORMATS)),
    Factor("previous_response_id", (ABSENT, STORED)),
    Factor("instructions", (ABSENT, "Be brief.")),
    Factor("input", ("text", "messages", "parts", "resent_output", "function_history")),
    Factor("temperature", (ABSENT, 0.0, 0.8)),
    Factor("top_p", (ABSENT, 0.5)),
    Factor("max_output_tokens", (1, 3)),
    Factor("metadata", (ABSENT, {"trace": "matrix"})),
    Factor("parallel_tool_calls", (ABSENT, False)),
)


def allowed(row: Row) -> bool:
    if assigned(row, "tool_choice", "tools") and row["tool_choice"] in ("required", NAMED) and not present(row, "tools"):
        return False
    return not (assigned(row, "text", "tools", "tool_choice") and row["text"] in JSON_FORMATS
                and present(row, "tools") and row["tool_choice"] != "none")


def expect(row: Row) -> Expect:
    for name, neutral in (("top_logprobs", (0,)), ("reasoning", ()), ("truncation", ("disabled",))):
        if row.get(name, ABSENT) not in (ABSENT, None, *neutral):
            return refused(name)
    metadata = row.get("metadata", ABSENT)
    if metadata is not ABSENT and len(metadata) > 16:
        return refused("metadata")
    temperature = row.get("temperature", ABSENT)
    if temperature is not ABSENT and temperature > FIELDS["temperature"].bounds.high:
        return refused("temperature")
    if row["input"] == "empty":
        return refused("input")
    tools = row.get("tools", ABSENT)
    choice = row.get("tool_choice", ABSENT)
    if choice not in (ABSENT, "auto", "none") and tools is ABSENT:
        return refused("tool_choice")
    if row.get("text", ABSENT) in JSON_FORMATS and tools is not ABSENT and choice != "none":
        return refused("text.format")
    if row.get("previous_response_id", ABSENT) == "resp_not_stored":
        return refused("previous_response_id", status=404)
    if row["input"] == "orphan_output":
        return refused("input[0].call_id")
    return OK


NEGATIVES = (
    ({"previous_response_id": "resp_not_stored"}, "previous_response_id"),
    ({"tools": ABSENT, "tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "auto", "text": JSON_FORMATS[0]}, "text.format"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"temperature": 2.5}, "temperature"),
    ({"input": "empty"}, "input"),
    ({"input": "orphan_output", "previous_response_id": ABSENT}, "input[0].call_id"),
)

TABLE = Table(surface="responses", path="/v1/responses", factors=FACTORS, allowed=allowed,
              constrained=frozenset({"tools", "tool_choice", "text"}), expect=expect,
              negatives=NEGATIVES, lookups={"input": INPUTS}, base={"model": "default"})
