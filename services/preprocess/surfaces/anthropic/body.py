"""Anthropic Messages request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`).

Content is a string or an array of `text` blocks; other block types (image, document, tool_use,
tool_result, thinking, ...) are a 400 until mstar supports them. Sampling fields and their bounds
come from the one field table (surfaces/fields.py). Newer `anthropic` SDKs send parameters such as
`temperature` only through `extra_body`, which lands in the same JSON body: nothing to do here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import Body, Ignored, only_types, string_or_list, unsupported


class TextBlock(Body):
    type: Literal["text"]
    text: str
    cache_control: Ignored = Field(None, description="Accepted, ignored: the prefix cache is automatic.")
    citations: unsupported() = None


Content = Annotated[list[Annotated[TextBlock, only_types(("text",), "content blocks")]],
                    string_or_list(lambda text: {"type": "text", "text": text}, "content blocks"),
                    Field(description="A string, or an array of text blocks.")]


class Message(Body):
    role: Literal["user", "assistant"]
    content: Content


class Metadata(Body):
    user_id: str | None = None


class _Conversation(Body):
    model: fields.Model
    messages: list[Message] = Field(min_length=1, max_length=fields.MAX_MESSAGES)
    system: Content | None = None
    # Tool use and extended thinking are not supported yet (neutral values pass).
    tools: unsupported() = None
    tool_choice: unsupported({"type": "auto"}, {"type": "none"}) = None
    thinking: unsupported({"type": "disabled"}) = None
    mcp_servers: unsupported() = None


class MessagesBody(_Conversation):
    max_tokens: fields.sampling("max_tokens", required=True)
    stop_sequences: fields.sampling("stop") = None
    temperature: fields.sampling("temperature") = None
    top_p: fields.sampling("top_p") = None
    top_k: fields.sampling("top_k") = None
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Ignored = None
    container: unsupported() = None
    context_management: unsupported() = None


class CountTokensBody(_Conversation):
    pass
