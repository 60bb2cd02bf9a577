"""Anthropic Messages request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`).

Content is a string or an array of `text`, `image` (a vision-language model's; base64 sources,
no URL is fetched), `tool_use` (assistant) and `tool_result` (user) blocks; other block types
(document, thinking, ...) are a 400 until mstar supports them. `tools`
with `tool_choice` auto, any, tool or none are grammar-constrained tool calls
(services/preprocess/tools.py). Sampling fields and their bounds
come from the one field table (surfaces/fields.py). Newer `anthropic` SDKs send parameters such as
`temperature` only through `extra_body`, which lands in the same JSON body: nothing to do here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

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

TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class TextBlock(Body):
    type: Literal["text"]
    text: str
    cache_control: Ignored = Field(None, description="Accepted, ignored: the prefix cache is automatic.")
    citations: unsupported() = None


Content = Annotated[list[Annotated[TextBlock, only_types(("text",), "content blocks")]],
                    string_or_list(lambda text: {"type": "text", "text": text}, "content blocks"),
                    Field(description="A string, or an array of text blocks.")]


class ToolUseBlock(Body):
    type: Literal["tool_use"]
    id: CallId
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    input: dict[str, Any]
    cache_control: Ignored = None


class ToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: CallId
    content: Content | None = None
    is_error: bool | None = None
    cache_control: Ignored = None

    def text(self) -> str:
        return "".join(b.text for b in self.content or ())


class Base64Source(Body):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(Body):
    type: Literal["url"]
    url: str  # refused: the server fetches nothing (services/preprocess/images.py image_url_bytes)


class ImageBlock(Body):
    type: Literal["image"]
    source: by_type(Base64Source, UrlSource)
    cache_control: Ignored = None


BLOCK_TYPES = ("text", "image", "tool_use", "tool_result")
Block = Annotated[by_type(TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock),
                  only_types(BLOCK_TYPES, "content blocks")]
MessageContent = Annotated[list[Block], string_or_list(lambda text: {"type": "text", "text": text}, "content blocks"),
                           Field(description="A string, or an array of text, image, tool_use and tool_result blocks.")]


class Message(Body):
    role: Literal["user", "assistant"]
    content: MessageContent


class ToolDef(Body):
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: Ignored = None


class ToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(Body):
    user_id: str | None = None


class _Conversation(Body):
    model: fields.Model
    messages: list[Message] = Field(min_length=1, max_length=fields.MAX_MESSAGES)
    system: Content | None = None
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    # Extended thinking is not supported (neutral values pass).
    thinking: unsupported({"type": "disabled"}) = None
    mcp_servers: unsupported() = None

    def check(self) -> None:
        used: set[str] = set()
        for i, m in enumerate(self.messages):
            for j, block in enumerate(m.content):
                where = f"messages[{i}].content[{j}]"
                if block.type == "tool_use":
                    if m.role != "assistant":
                        raise field_error(where, "tool_use blocks belong in assistant messages")
                    used.add(block.id)
                elif block.type == "tool_result":
                    if m.role != "user":
                        raise field_error(where, "tool_result blocks belong in user messages")
                    if block.tool_use_id not in used:
                        raise field_error(f"{where}.tool_use_id", "matches no tool_use of an earlier assistant message")
        names = [t.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise field_error("tools", "tool names must be unique")
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise field_error("tool_choice", "needs tools")
        if choice is not None and choice.type == "tool":
            if choice.name is None:
                raise field_error("tool_choice.name", "required with type tool")
            if choice.name not in names:
                raise field_error("tool_choice.name", "names no tool in tools")

    @property
    def tool_choice_name(self) -> str:
        """The domain's auto, none, required or a tool's name (tools.py)."""
        choice = self.tool_choice
        if choice is None or choice.type == "auto":
            return "auto"
        return {"any": "required", "none": "none"}.get(choice.type) or choice.name

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice_name != "none"


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
