"""OpenAI `/v1/chat/completions` and `/v1/completions` request bodies.

Every top-level key is supported (mapped onto the domain spec), ignored (known, no effect on a
self-hosted model's output: accepted so the official client and existing code keep working),
unsupported (known, would change the output and mstar cannot honour it: 400 UNSUPPORTED_FIELD
unless neutral) or unknown (400 UNKNOWN_FIELD: a typo like `max_token` must not be ignored).
Sampling fields, their bounds and vLLM's extension names come from the one field table.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import (
    Body,
    Ignored,
    field_error,
    only_types,
    string_or_list,
    unsupported,
)

INT32_MAX = 2**31 - 1
# OpenAI's documented default for the legacy completions endpoint.
COMPLETION_DEFAULT_MAX_TOKENS = 16
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _stop(value: Any) -> Any:
    """OpenAI's `stop` is a string or a list of strings; empty strings are dropped."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        return [s for s in value if s != ""]
    return value


def _top_k(value: Any) -> Any:
    return 0 if value == -1 and not isinstance(value, bool) else value  # vLLM spells "off" as -1


class TextPart(Body):
    type: Literal["text"]
    text: str


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[list[Annotated[TextPart, only_types(("text",), "content parts")]],
                       string_or_list(lambda text: {"type": "text", "text": text}, "text parts")] | None = None
    name: Ignored = None
    tool_calls: unsupported() = None
    tool_call_id: unsupported() = None
    function_call: unsupported() = None
    refusal: unsupported() = None
    audio: unsupported() = None

    def text(self) -> str:
        return "".join(p.text for p in self.content or ())


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
    # Accepted and ignored.
    user: Ignored = None
    metadata: Ignored = None
    store: Ignored = None
    service_tier: Ignored = None
    parallel_tool_calls: Ignored = None
    prompt_cache_key: Ignored = None
    safety_identifier: Ignored = None
    logit_bias: unsupported() = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatBody(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=fields.MAX_MESSAGES)]
    max_completion_tokens: fields.sampling("max_tokens") = None
    max_tokens: fields.sampling("max_tokens") = Field(None, description="Deprecated name of max_completion_tokens.")
    logprobs: bool | None = None
    top_logprobs: fields.sampling("logprobs") = None
    # Not supported (yet); neutral values pass.
    tools: unsupported() = None
    tool_choice: unsupported("none") = None
    functions: unsupported() = None
    function_call: unsupported() = None
    response_format: unsupported({"type": "text"}) = None
    audio: unsupported() = None
    modalities: unsupported(["text"]) = None
    prediction: unsupported() = None
    reasoning_effort: unsupported() = None
    web_search_options: unsupported() = None
    verbosity: unsupported() = None

    def check(self) -> None:
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":
                raise field_error(f"messages[{i}].content", "required")
        if self.top_logprobs is not None and not self.logprobs:
            raise field_error("top_logprobs", "requires logprobs: true")

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


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class CompletionBody(_Common):
    prompt: Annotated[list[TokenId] | str, BeforeValidator(_prompt)]  # list first: errors point into it
    max_tokens: fields.sampling("max_tokens") = Field(None, description="Default 16, as at OpenAI.")
    logprobs: fields.sampling("logprobs") = None
    echo: unsupported() = None
    suffix: unsupported() = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    def check(self) -> None:
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise field_error("best_of", "only best_of == n is supported", reason="UNSUPPORTED_FIELD")
