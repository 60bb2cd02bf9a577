"""OpenAI Responses request body (`POST /v1/responses`).

`input` is a string (one user message) or a list of message items: `{"role", "content"}` with
content a string or an array of `input_text` / `output_text` parts (what a previous response's
output looks like, so a client may resend it). Other item and part types (function calls,
images, files, reasoning) are a 400 until supported. Sampling fields and their bounds come from
the one field table (surfaces/fields.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from services.common.contract import declared
from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import Body, Ignored, only_types, string_or_list, unsupported

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


class InputMessage(Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[list[Annotated[TextPart, only_types(("input_text", "output_text"), "content parts")]],
                       string_or_list(lambda text: {"type": "input_text", "text": text}, "content parts")]
    id: Ignored = Field(None, description="Accepted, ignored (present on resent output items).")
    status: Ignored = None


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=MAX_METADATA_KEY)], Annotated[str, Field(max_length=MAX_METADATA_VALUE)]],
    Field(max_length=MAX_METADATA_PAIRS),
]


class ResponsesBody(Body):
    model: fields.Model = ""
    input: Annotated[list[Annotated[InputMessage, only_types(("message",), "input items")]],
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
    parallel_tool_calls: Ignored = None
    stream_options: Ignored = None
    include: Ignored = None
    # Not supported (yet); neutral values pass.
    tools: unsupported() = None
    tool_choice: unsupported("none", "auto") = None
    text: unsupported({"format": {"type": "text"}}) = None
    reasoning: unsupported() = None
    background: unsupported() = None
    truncation: unsupported("disabled") = None
    conversation: unsupported() = None
    prompt: unsupported() = None
    top_logprobs: unsupported(0) = None
    max_tool_calls: unsupported() = None
