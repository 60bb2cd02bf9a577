"""`POST /v1/chat/completions`: what the openai SDK and its users send together.

`"logprobs": true` without `top_logprobs` (what the SDK sends for `logprobs=True`) and
`top_logprobs: 0` are levels of their own: an outside trial lost 150 of ~230 requests to them
(issue 28). Rules (docs/http.md): `top_logprobs` needs `logprobs: true`; `tool_choice`
`required` or a named function needs `tools`; an output constraint (`response_format`
json_object / json_schema) cannot be combined with tools unless `tool_choice` is `none`;
`stream_options` only with `stream` (what OpenAI and vLLM accept).
"""

from __future__ import annotations

from services.common.sampling_fields import FIELDS
from tests.matrix.covering import ABSENT, Factor, Row
from tests.matrix.table import (
    CLOCK,
    JSON_SCHEMA,
    NAMED_CLOCK,
    NAMED_WEATHER,
    OK,
    WEATHER,
    Expect,
    Table,
    assigned,
    present,
    refused,
)

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATIONS = {
    "one": {"messages": [{"role": "user", "content": "Say hi."}]},
    "system": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    "turns": {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                           {"role": "user", "content": "And again?"}]},
    "parts": {"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                           {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]},
    "tool_history": {"messages": [{"role": "user", "content": "Weather in Paris?"},
                                  {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                  {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]},
    # negatives
    "orphan_tool": {"messages": [{"role": "user", "content": "Hi"},
                                 {"role": "tool", "tool_call_id": "call_9", "content": "?"}]},
    "empty": {"messages": []},
}
JSON_FORMATS = ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "reply", "schema": JSON_SCHEMA}})

FACTORS = (
    Factor("stream", (False, True)),
    Factor("n", (1, 2)),
    Factor("logprobs", (ABSENT, False, True)),
    Factor("top_logprobs", (ABSENT, 0, 2, 5)),
    Factor("stream_options", (ABSENT, {"include_usage": True}, {"include_usage": False})),
    Factor("temperature", (ABSENT, 0.0, 0.7, 1.5)),
    Factor("tools", (ABSENT, [WEATHER], [WEATHER, CLOCK])),
    Factor("tool_choice", (ABSENT, "auto", "none", "required", NAMED_WEATHER)),
    Factor("response_format", (ABSENT, {"type": "text"}, *JSON_FORMATS)),
    Factor("stop", (ABSENT, "\n", [".", " the"])),
    Factor("seed", (ABSENT, 0, 1234)),
    Factor("penalties", (ABSENT, {"presence_penalty": 0.5}, {"frequency_penalty": 1.0},
                         {"presence_penalty": -0.5, "frequency_penalty": 0.5})),
    Factor("logit_bias", (ABSENT, {})),  # only the neutral value is supported (docs/http.md)
    Factor("budget", ({"max_tokens": 1}, {"max_completion_tokens": 3}, {"max_tokens": 4})),
    Factor("conversation", ("one", "system", "turns", "parts", "tool_history")),
)


def _json_format(row: Row) -> bool:
    return row.get("response_format") in JSON_FORMATS


def _named(row: Row) -> str | None:
    choice = row.get("tool_choice")
    return choice["function"]["name"] if isinstance(choice, dict) else None


def allowed(row: Row) -> bool:
    if assigned(row, "top_logprobs", "logprobs") and present(row, "top_logprobs") and row["logprobs"] is not True:
        return False
    if assigned(row, "stream_options", "stream") and present(row, "stream_options") and not row["stream"]:
        return False
    if assigned(row, "tool_choice", "tools") and row["tool_choice"] in ("required", NAMED_WEATHER):
        if not present(row, "tools"):
            return False
    return not (assigned(row, "response_format", "tools", "tool_choice") and _json_format(row)
                and present(row, "tools") and row["tool_choice"] != "none")


def expect(row: Row) -> Expect:
    if row.get("logit_bias", ABSENT) not in (ABSENT, {}):
        return refused("logit_bias")
    for name in ("n", "temperature", "top_logprobs"):
        domain = {"top_logprobs": "logprobs"}.get(name, name)
        value = row.get(name, ABSENT)
        if value is not ABSENT and not FIELDS[domain].bounds.low <= value <= FIELDS[domain].bounds.high:
            return refused(name)
    budget = row["budget"]
    if any(v < FIELDS["max_tokens"].bounds.low for v in budget.values()):
        return refused(next(iter(budget)))
    if "max_token" in row.get("extra", {}):
        return refused("max_token")
    messages = CONVERSATIONS[row["conversation"]]["messages"]
    if not messages:
        return refused("messages")
    if row["conversation"] == "orphan_tool":
        return refused("messages[1].tool_call_id")
    if present(row, "top_logprobs") and row.get("logprobs", ABSENT) is not True:
        return refused("top_logprobs")
    tools = row.get("tools", ABSENT)
    names = [t["function"]["name"] for t in tools] if tools is not ABSENT else []
    if row.get("tool_choice", ABSENT) not in (ABSENT, "none", "auto") and not names:
        return refused("tool_choice")
    if _named(row) is not None and _named(row) not in names:
        return refused("tool_choice.function.name")
    if _json_format(row) and names and row.get("tool_choice", ABSENT) != "none":
        return refused("response_format")
    return OK


NEGATIVES = (
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"logprobs": ABSENT, "top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": FIELDS["logprobs"].bounds.high + 1}, "top_logprobs"),
    ({"n": FIELDS["n"].bounds.high + 1}, "n"),
    ({"temperature": -0.5}, "temperature"),
    ({"budget": {"max_completion_tokens": 0}}, "max_completion_tokens"),
    ({"tools": ABSENT, "tool_choice": "required", "response_format": ABSENT}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": NAMED_CLOCK, "response_format": ABSENT}, "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "auto", "response_format": {"type": "json_object"}}, "response_format"),
    ({"conversation": "orphan_tool"}, "messages[1].tool_call_id"),
    ({"conversation": "empty"}, "messages"),
    ({"extra": {"max_token": 3}}, "max_token"),
)

TABLE = Table(surface="chat.completions", path="/v1/chat/completions", factors=FACTORS, allowed=allowed,
              constrained=frozenset({"stream", "logprobs", "top_logprobs", "stream_options", "tools",
                                     "tool_choice", "response_format"}),
              expect=expect, negatives=NEGATIVES, fragments=frozenset({"penalties", "budget", "extra"}),
              lookups={"conversation": CONVERSATIONS}, base={"model": "default"})
