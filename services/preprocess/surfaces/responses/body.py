"""OpenAI Responses request body (`POST /v1/responses`).

`input` is a string (one user message) or a list of message items: `{"role", "content"}` with
content a string or an array of `input_text` / `output_text` parts (what a previous response's
output looks like, so a client may resend it), `function_call` items (a previous output's calls,
resent) and `function_call_output` items (their results). Function `tools` with `tool_choice` and
`text.format` (json_schema, json_object) are grammar-constrained (services/preprocess/tools.py).
`input_image` parts (base64 data: URLs; nothing is fetched) go to a vision-language model, and are
kept with a stored response's conversation. Other item and part types (files, reasoning) are a 400
until supported. Sampling fields and their bounds come from
the one field table (surfaces/fields.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from services.common.contract import declared
from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import (
    Body,
    CallId,
    Ignored,
    by_type,
    field_error,
    only_types,
    string_or_list,
    unsupported,
)
from services.preprocess.tools import MAX_TOOLS

# OpenAI's documented limits on `metadata` (part of the Responses API itself).
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_RESPONSE_ID = declared("mstar.v1.RetrieveModelResponseRequest", "response_id").max_len

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class TextPart(Body):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: Ignored = None
    logprobs: Ignored = None


class InputImagePart(Body):
    type: Literal["input_image"]
    image_url: str  # a base64 data: URL: nothing is fetched (services/preprocess/images.py image_url_bytes)
    detail: Literal["auto", "low", "high"] | None = None  # Idefics3 tiles every image alike: no effect
    file_id: unsupported() = None


CONTENT_TYPES = ("input_text", "output_text", "input_image")


class InputMessage(Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[list[Annotated[by_type(TextPart, InputImagePart), only_types(CONTENT_TYPES, "content parts")]],
                       string_or_list(lambda text: {"type": "input_text", "text": text}, "content parts")]
    id: Ignored = Field(None, description="Accepted, ignored (present on resent output items).")
    status: Ignored = None


TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class FunctionCallItem(Body):
    type: Literal["function_call"]
    call_id: CallId
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    arguments: str  # JSON text
    id: Ignored = None
    status: Ignored = None


class FunctionCallOutputItem(Body):
    type: Literal["function_call_output"]
    call_id: CallId
    output: str
    id: Ignored = None
    status: Ignored = None


ITEM_TYPES = ("message", "function_call", "function_call_output")


def _item_type(value: Any) -> Any:
    """Message items may omit `type`; the discriminated union needs it."""
    if isinstance(value, dict) and "type" not in value:
        return {**value, "type": "message"}
    return value


InputItem = Annotated[by_type(InputMessage, FunctionCallItem, FunctionCallOutputItem),
                      BeforeValidator(_item_type), only_types(ITEM_TYPES, "input items")]


class FunctionTool(Body):
    type: Literal["function"]
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(Body):
    type: Literal["function"]
    name: str


class TextFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(max_length=64)] | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Body):
    format: TextFormat | None = None
    verbosity: Ignored = None


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=MAX_METADATA_KEY)], Annotated[str, Field(max_length=MAX_METADATA_VALUE)]],
    Field(max_length=MAX_METADATA_PAIRS),
]


class ResponsesBody(Body):
    model: fields.Model = ""
    input: Annotated[list[InputItem],
                     string_or_list(lambda text: {"role": "user", "content": text}, "input items"),
                     Field(min_length=1, max_length=fields.MAX_MESSAGES)]
    instructions: str | None = Field(None, description="A system message in front of the input; "
                                     "not carried over by previous_response_id.")
    max_output_tokens: fields.sampling("max_tokens") = None
    temperature: fields.sampling("temperature") = None
    top_p: fields.sampling("top_p") = None
    stream: bool = False
    store: bool = Field(True, description="Keep the response for GET /v1/responses/{id} and previous_response_id.")
    previous_response_id: Annotated[str, Field(max_length=MAX_RESPONSE_ID)] | None = None
    metadata: Metadata | None = None
    # Accepted, ignored: no effect on a self-hosted model's output.
    user: Ignored = None
    service_tier: Ignored = None
    prompt_cache_key: Ignored = None
    safety_identifier: Ignored = None
    stream_options: Ignored = None
    include: Ignored = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    # Not supported (yet); neutral values pass.
    reasoning: unsupported() = None
    background: unsupported() = None
    truncation: unsupported("disabled") = None
    conversation: unsupported() = None
    prompt: unsupported() = None
    top_logprobs: unsupported(0) = None
    max_tool_calls: unsupported() = None

    def check(self) -> None:
        """Within this input; calls of the previous response are checked by the endpoint."""
        names = [t.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise field_error("tools", "tool names must be unique")
        choice = self.tool_choice
        if choice is not None and choice not in ("none", "auto") and not names:
            raise field_error("tool_choice", "needs tools")
        if isinstance(choice, NamedFunction) and choice.name not in names:
            raise field_error("tool_choice.name", "names no tool in tools")
        if self.uses_tools and self.text_format is not None:
            raise field_error("text.format", "cannot be combined with tools (unless tool_choice is none)")
        for i, item in enumerate(self.input):
            if item.type == "function_call":
                try:
                    ok = isinstance(json.loads(item.arguments), dict)
                except (ValueError, RecursionError):  # json's parser recurses on a deep document
                    ok = False
                if not ok:
                    raise field_error(f"input[{i}].arguments", "must be a JSON object encoded as a string")

    @property
    def tool_choice_name(self) -> str:
        choice = self.tool_choice
        return choice.name if isinstance(choice, NamedFunction) else (choice or "auto")

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice_name != "none"

    @property
    def text_format(self) -> TextFormat | None:
        """The structured text format asked for, if any (type text is none)."""
        fmt = self.text.format if self.text is not None else None
        return fmt if fmt is not None and fmt.type != "text" else None
