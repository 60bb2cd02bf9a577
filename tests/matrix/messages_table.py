"""`POST /v1/messages` (Anthropic): what the anthropic SDK and its users send together.

Rules (docs/http.md "Anthropic Messages"): `max_tokens` is required; `tool_choice` `any` or
`tool` needs `tools`, and `tool` must name one of them; a final assistant message (prefill) is a
400; `thinking` is unsupported unless disabled. Errors name the field in the message
(`{"type": "error", "error": {"type", "message": "max_tokens: required"}}`).
"""

from __future__ import annotations

from services.common.sampling_fields import FIELDS
from tests.matrix.covering import ABSENT, Factor, Row
from tests.matrix.table import CITY, OK, ZONE, Expect, Table, assigned, present, refused

WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}
CLOCK = {"name": "get_time", "description": "Time in a zone", "input_schema": ZONE}
CONVERSATIONS = {
    "one": {"messages": [{"role": "user", "content": "Say hi."}]},
    "blocks": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Name a colour."},
                                                          {"type": "text", "text": "Just one.",
                                                           "cache_control": {"type": "ephemeral"}}]}]},
    "turns": {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                           {"role": "user", "content": "And again?"}]},
    "tool_history": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}]},
    # negatives
    "prefill": {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]},
    "system_role": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    "empty": {"messages": []},
}

FACTORS = (
    Factor("stream", (False, True)),
    Factor("tools", (ABSENT, [WEATHER], [WEATHER, CLOCK])),
    Factor("tool_choice", (ABSENT, {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_weather"},
                           {"type": "none"}, {"type": "auto", "disable_parallel_tool_use": True})),
    Factor("stop_sequences", (ABSENT, ["\n"], ["Hello", "."])),
    Factor("temperature", (ABSENT, 0.0, 1.0)),
    Factor("top_k", (ABSENT, 1, 40)),
    Factor("top_p", (ABSENT, 0.9)),
    Factor("system", (ABSENT, "Be brief.", [{"type": "text", "text": "Be brief."}])),
    Factor("metadata", (ABSENT, {"user_id": "user-1"})),
    Factor("conversation", ("one", "blocks", "turns", "tool_history")),
    Factor("max_tokens", (1, 2, 4)),
)
_NEEDS_TOOLS = ("any", "tool")


def allowed(row: Row) -> bool:
    if assigned(row, "tool_choice", "tools") and present(row, "tool_choice"):
        return row["tool_choice"]["type"] not in _NEEDS_TOOLS or present(row, "tools")
    return True


def expect(row: Row) -> Expect:
    max_tokens = row.get("max_tokens", ABSENT)
    if max_tokens is ABSENT:
        return refused("max_tokens")
    if max_tokens < FIELDS["max_tokens"].bounds.low:
        return refused("max_tokens")
    temperature = row.get("temperature", ABSENT)
    if temperature is not ABSENT and temperature > FIELDS["temperature"].bounds.high:
        return refused("temperature")
    if row.get("thinking", ABSENT) not in (ABSENT, {"type": "disabled"}):
        return refused("thinking")
    stops = row.get("stop_sequences", ABSENT)
    if stops is not ABSENT and "" in stops:
        return refused(f"stop_sequences[{stops.index('')}]")
    conversation = row["conversation"]
    if conversation == "empty":
        return refused("messages")
    if conversation == "system_role":
        return refused("messages[0].role")
    choice = row.get("tool_choice", ABSENT)
    tools = row.get("tools", ABSENT)
    names = [t["name"] for t in tools] if tools is not ABSENT else []
    if choice is not ABSENT and choice["type"] in _NEEDS_TOOLS and not names:
        return refused("tool_choice")
    if choice is not ABSENT and choice["type"] == "tool" and choice.get("name") not in names:
        return refused("tool_choice.name")
    if conversation == "prefill":
        return refused("messages[1].role")
    return OK


NEGATIVES = (
    ({"max_tokens": ABSENT}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 3.0}, "temperature"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"stop_sequences": [""]}, "stop_sequences[0]"),
    ({"tools": ABSENT, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_time"}}, "tool_choice.name"),
    ({"conversation": "prefill"}, "messages[1].role"),
    ({"conversation": "system_role"}, "messages[0].role"),
    ({"conversation": "empty"}, "messages"),
)

TABLE = Table(surface="messages", path="/v1/messages", factors=FACTORS, allowed=allowed,
              constrained=frozenset({"tools", "tool_choice"}), expect=expect,
              negatives=NEGATIVES, lookups={"conversation": CONVERSATIONS}, base={"model": "default"})
