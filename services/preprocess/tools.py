"""Tool calling as text: the call format, its grammar, the prompt fallback, and parsing the output.

The engine never parses calls (docs/design.md "Structured output"): a surface turns the client's
tools and tool_choice into a `tool_calls` constraint here, and the text the model wrote back into
calls. One format for every model, Hermes/Qwen style:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The grammar writes `begin(name)` + the arguments (compact JSON valid against the tool's
parameters) + `END`. A chat template that knows tools (it mentions `tools`) renders the
definitions and the history's calls itself; for one that does not (SmolLM2's), `fallback_messages`
writes them as text: the definitions in the system message, earlier calls as the call text in the
assistant turn, and each tool result as a user turn wrapped in `<tool_response>` tags.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.contract import declared
from services.common.structured_output import StructuredOutput, tool_call_tag

TRIGGER = "<tool_call>"
END = "}\n</tool_call>"
AUTO, NONE, REQUIRED = "auto", "none", "required"
# A request's tools: each is one tag of the contract's ToolCallFormat, so the surfaces' `tools`
# lists are bounded by its declared count.
MAX_TOOLS = declared("mstar.v1.ToolCallFormat", "tags").max_items


def begin(name: str) -> str:
    return f'{TRIGGER}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict:
        """The definition as chat templates expect it (OpenAI's shape)."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of the arguments object

    def text(self) -> str:
        """The call as the model writes it."""
        return begin(self.name) + self.arguments + END


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def constraint(tools: Sequence[Tool], choice: str, parallel: bool) -> StructuredOutput | None:
    """The grammar for tool_choice `choice`: auto (text or calls), required (calls only), or one
    tool's name (calls of that tool only); none = no constraint."""
    if choice == NONE or not tools:
        return None
    chosen = tools if choice in (AUTO, REQUIRED) else [t for t in tools if t.name == choice]
    tags = [tool_call_tag(begin(t.name), t.parameters, END) for t in chosen]
    return StructuredOutput.for_tool_calls(tags, [TRIGGER], require_call=choice != AUTO, parallel=parallel)


def field_renames(tools: Sequence[Tool], choice: str, tools_field: str = "tools",
                  parameters: str = "function.parameters") -> tuple[tuple[str, str], ...]:
    """Engine error paths -> the client's: tag i is the i-th tool the grammar offers."""
    indices = range(len(tools)) if choice in (AUTO, REQUIRED) else [
        i for i, t in enumerate(tools) if t.name == choice]
    tags = "structured_output.tool_calls.tags"
    return (*((f"{tags}[{k}].json_schema", f"{tools_field}[{i}].{parameters}") for k, i in enumerate(indices)),
            ("structured_output", tools_field))


# ---- the prompt, for templates without tool support


FALLBACK_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
FALLBACK_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tools_text(tools: Sequence[Tool]) -> str:
    lines = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    return FALLBACK_HEADER + lines + FALLBACK_FOOTER


def response_text(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


# ---- parsing the output


@dataclass(frozen=True)
class Parsed:
    content: str  # the text outside calls
    calls: tuple[ToolCall, ...]


def _call_at(text: str, start: int) -> tuple[ToolCall, int] | None:
    """The complete call starting at `start` (at TRIGGER), and where it ends; None if incomplete."""
    i = start + len(TRIGGER)
    while i < len(text) and text[i] in " \n":
        i += 1
    try:
        obj, j = json.JSONDecoder().raw_decode(text, i)
    except ValueError:
        return None
    rest = text[j:]
    close = "</tool_call>"
    stripped = rest.lstrip(" \n")
    if not stripped.startswith(close) or not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    # The grammar writes the arguments compactly: their own text is what the client gets.
    raw = json.dumps(args, ensure_ascii=False, separators=(", ", ": "))
    end = j + (len(rest) - len(stripped)) + len(close)
    return ToolCall(new_call_id(), obj["name"], raw), end


class CallStream:
    """Incremental parser: text in; content to show now and calls completed so far out. Text that
    may be the start of a call is held until it is one (or cannot be)."""

    def __init__(self) -> None:
        self._held = ""
        self._after_call = False  # newlines right after a call separate calls: not content

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._held += text
        content, calls = "", []
        while True:
            if self._after_call:
                self._held = self._held.lstrip("\n")
                if not self._held:
                    return content, calls
                self._after_call = False
            at = self._held.find(TRIGGER)
            if at < 0:
                keep = _partial_trigger(self._held)
                content += self._held[: len(self._held) - keep]
                self._held = self._held[len(self._held) - keep:]
                return content, calls
            content += self._held[:at]
            self._held = self._held[at:]
            found = _call_at(self._held, 0)
            if found is None:
                return content, calls
            call, end = found
            calls.append(call)
            self._held = self._held[end:]
            self._after_call = True

    def finish(self) -> str:
        """What is still held (an unfinished call at max_tokens) is content after all."""
        rest, self._held = self._held, ""
        return rest


def _partial_trigger(text: str) -> int:
    """How many trailing characters of text could start TRIGGER."""
    for n in range(min(len(TRIGGER) - 1, len(text)), 0, -1):
        if TRIGGER.startswith(text[-n:]):
            return n
    return 0


def parse(text: str) -> Parsed:
    stream = CallStream()
    content, calls = stream.feed(text)
    return Parsed(content + stream.finish(), tuple(calls))
