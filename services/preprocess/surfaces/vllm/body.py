"""vLLM-compatible `/tokenize` and `/detokenize` request bodies.

`/tokenize` takes a `prompt` (text as the model would see it) or chat `messages` (rendered with
the model's chat template and the assistant header, exactly as a chat request would be), never
both. The tokens returned are the ones a request with the same input would run on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import Body, Ignored, TokenId, field_error, unsupported


class TextPart(Body):
    type: Literal["text"]
    text: str


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class TokenizeBody(Body):
    model: fields.Model = ""
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(max_length=fields.MAX_MESSAGES)] | None = None
    add_special_tokens: Ignored = Field(None, description="Accepted; the tokens are always those a "
                                        "request with this input runs on.")
    add_generation_prompt: Literal[True] = True
    return_token_strs: bool = False
    continue_final_message: unsupported() = None
    chat_template: unsupported() = None
    chat_template_kwargs: unsupported() = None
    tools: unsupported() = None

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise field_error("prompt", "send exactly one of prompt or messages")
        if self.messages is not None and not self.messages:
            raise field_error("messages", "must not be empty")


class DetokenizeBody(Body):
    model: fields.Model = ""
    tokens: list[TokenId]
