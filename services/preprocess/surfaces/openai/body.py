"""OpenAI `/v1/chat/completions` and `/v1/completions` request bodies.

Every top-level key is supported (mapped onto the domain spec), ignored (known, no effect on a
self-hosted model's output: accepted so the official client and existing code keep working),
unsupported (known, would change the output and mstar cannot honour it: 400 UNSUPPORTED_FIELD
unless neutral) or unknown (400 UNKNOWN_FIELD: a typo like `max_token` must not be ignored).
Sampling fields, their bounds and vLLM's extension names come from the one field table.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from services.common import errors
from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import (
    Body,
    CallId,
    Ignored,
    TokenId,
    by_type,
    field_error,
    only_types,
    string_or_list,
    unsupported,
)
from services.preprocess.tools import MAX_TOOLS

# OpenAI's documented default for the legacy completions endpoint.
COMPLETION_DEFAULT_MAX_TOKENS = 16
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for tool names


def _stop(value: Any) -> Any:
    """OpenAI's `stop` is a string or a list of strings; empty strings are dropped."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        return [s for s in value if s != ""]
    return value


def _output_modality(value: str) -> str:
    """What chat `modalities` may ask for: the served model writes text and nothing else."""
    if value != "text":
        raise PydanticCustomError("unsupported_field", "the model cannot produce {kind}; it produces text only",
                                  {"kind": errors.quote(value, 32)})
    return value


def _top_k(value: Any) -> Any:
    return 0 if value == -1 and not isinstance(value, bool) else value  # vLLM spells "off" as -1


class TextPart(Body):
    type: Literal["text"]
    text: str


class ImageUrl(Body):
    url: str  # a base64 data: URL (services/preprocess/images.py image_url_bytes: no server-side fetch)
    detail: Literal["auto", "low", "high"] | None = None  # Idefics3 tiles every image alike: no effect


class ImageUrlPart(Body):
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[by_type(TextPart, ImageUrlPart), only_types(("text", "image_url"), "content parts")]


class CalledFunction(Body):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    arguments: str  # JSON text, as OpenAI sends it


class MessageToolCall(Body):
    id: CallId
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[list[ContentPart],
                       string_or_list(lambda text: {"type": "text", "text": text}, "text parts")] | None = None
    name: Ignored = None
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=128)] | None = None  # assistant
    tool_call_id: CallId | None = None  # tool
    function_call: unsupported() = None
    refusal: unsupported() = None
    audio: unsupported() = None

    def text(self) -> str:
        return "".join(p.text for p in self.content or () if p.type == "text")


class FunctionDef(Body):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema; absent = no arguments
    strict: bool | None = None  # arguments always follow the schema here (grammar-constrained)


class ToolDef(Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Body):
    name: Annotated[str, Field(max_length=64)] = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # absent = any JSON object
    strict: bool | None = None  # always strict here: the grammar follows the schema


class TextFormat(Body):
    type: Literal["text"]


class JsonObjectFormat(Body):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")]
ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: Ignored = None


class _Common(Body):
    model: fields.Model = ""
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: fields.sampling("n") = None
    temperature: fields.sampling("temperature") = None
    top_p: fields.sampling("top_p") = None
    seed: fields.sampling("seed") = None
    stop: fields.sampling("stop", before=_stop) = None
    presence_penalty: fields.sampling("presence_penalty") = None
    frequency_penalty: fields.sampling("frequency_penalty") = None
    # Extensions with vLLM's names: not in OpenAI's API, common in self-hosted servers.
    top_k: fields.sampling("top_k", before=_top_k) = None
    min_p: fields.sampling("min_p") = None
    repetition_penalty: fields.sampling("repetition_penalty") = None
    ignore_eos: fields.sampling("ignore_eos") = None
    stop_token_ids: fields.sampling("stop_token_ids") = None
    include_stop_str_in_output: fields.sampling("include_stop") = None
    response_format: ResponseFormat | None = None
    # vLLM's guided decoding extras (one at most, not with response_format).
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None
    guided_grammar: str | None = None
    # Accepted and ignored.
    user: Ignored = None
    metadata: Ignored = None
    store: Ignored = None
    service_tier: Ignored = None
    prompt_cache_key: Ignored = None
    safety_identifier: Ignored = None
    logit_bias: unsupported() = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def constraint_field(self) -> str | None:
        """The one output-constraint field the body sets (response_format text is none)."""
        given = [name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type == "text":
            given.remove("response_format")
        return given[0] if given else None


CONSTRAINT_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


def check_constraint_fields(body: _Common) -> None:
    given = [name for name in CONSTRAINT_FIELDS if getattr(body, name) is not None]
    if len(given) > 1:
        raise field_error(given[1], f"conflicts with {given[0]}; send only one output constraint")
    if isinstance(body.guided_json, str) and not _is_json_object(body.guided_json):
        raise field_error("guided_json", "must be a JSON schema (an object, or its JSON text)")


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):  # json's parser recurses: a deep document ends up here
        return False


class ChatBody(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=fields.MAX_MESSAGES)]
    max_completion_tokens: fields.sampling("max_tokens") = None
    max_tokens: fields.sampling("max_tokens") = Field(None, description="Deprecated name of max_completion_tokens.")
    logprobs: bool | None = None
    top_logprobs: fields.sampling("logprobs") = None
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Not supported; neutral values pass.
    functions: unsupported() = None
    function_call: unsupported() = None
    audio: unsupported() = None
    modalities: list[Annotated[str, AfterValidator(_output_modality)]] | None = None  # ["text"] or nothing
    prediction: unsupported() = None
    reasoning_effort: unsupported() = None
    web_search_options: unsupported() = None
    verbosity: unsupported() = None

    def check(self) -> None:
        called: set[str] = set()
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":
                raise field_error(f"messages[{i}].content", "required")
            if m.tool_calls and m.role != "assistant":
                raise field_error(f"messages[{i}].tool_calls", "only assistant messages carry tool calls")
            if m.role == "tool":
                if m.tool_call_id is None:
                    raise field_error(f"messages[{i}].tool_call_id", "required in a tool message")
                if m.tool_call_id not in called:
                    raise field_error(f"messages[{i}].tool_call_id",
                                      "matches no tool call of an earlier assistant message")
            elif m.tool_call_id is not None:
                raise field_error(f"messages[{i}].tool_call_id", "only tool messages answer a tool call")
            for j, call in enumerate(m.tool_calls or ()):
                if not _is_json_object(call.function.arguments):
                    raise field_error(f"messages[{i}].tool_calls[{j}].function.arguments",
                                      "must be a JSON object encoded as a string")
                called.add(call.id)
        if self.top_logprobs is not None and not self.logprobs:
            raise field_error("top_logprobs", "requires logprobs: true")
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise field_error("tools", "tool names must be unique")
        choice = self.tool_choice
        if choice is not None and choice not in ("none", "auto") and not names:
            raise field_error("tool_choice", "needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise field_error("tool_choice.function.name", "names no tool in tools")
        if self.uses_tools and self.constraint_field is not None:
            raise field_error(self.constraint_field, "cannot be combined with tools (unless tool_choice is none)")
        check_constraint_fields(self)

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def tool_choice_name(self) -> str:
        """auto (the default with tools), none, required, or the named tool's name."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return choice.function.name
        return choice or "auto"

    @property
    def logprobs_n(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def _prompt(value: Any) -> Any:
    """A string, a token id array, or a one-element array of either."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str) or (isinstance(value, list) and value and not isinstance(value[0], str | list)):
        return value
    raise PydanticCustomError(
        "prompt_type", "must be a string or a token id array (batched prompts are not supported; "
        "send one per request)")




class CompletionBody(_Common):
    prompt: Annotated[list[TokenId] | str, BeforeValidator(_prompt)]  # list first: errors point into it
    max_tokens: fields.sampling("max_tokens") = Field(None, description="Default 16, as at OpenAI.")
    logprobs: fields.sampling("logprobs") = None
    echo: unsupported() = None
    suffix: unsupported() = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    def check(self) -> None:
        check_constraint_fields(self)
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise field_error("best_of", "only best_of == n is supported", reason="UNSUPPORTED_FIELD")
