"""Render chat messages with the model's own Jinja chat template, the way Hugging Face's
`apply_chat_template` does: an immutable sandboxed environment with trim_blocks/lstrip_blocks,
loop controls, a non-HTML-escaping `tojson`, `raise_exception`, `strftime_now`, and the special
tokens passed as variables. Templates come from model files, so they are untrusted code: the
sandbox is what keeps them from reaching Python internals.

Tools: a template that mentions `tools` gets them (OpenAI's shape), assistant messages with
`tool_calls` and `tool` messages as Hugging Face passes them; any other template gets the
documented text fallback of services/preprocess/tools.py in plain system/user/assistant turns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from services.preprocess import tools as toolfmt
from services.preprocess.tokenizer import SpecialTokens

ROLES = ("system", "user", "assistant", "tool")
# Marks where streamed (appended) text goes inside the rendered conversation; chosen so no
# template would produce or alter it.
_SENTINEL = "\u2063mstar-streamed-input\u2063"


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered (template raised, or it is malformed)."""


@dataclass(frozen=True)
class ChatImage:
    """An image inside a message's content: at character `offset` of its text."""

    offset: int
    data: bytes  # the encoded image (PNG, JPEG, ...), as the client sent it
    where: str  # the request field it came from, for errors ("messages[0].content[1].image_url")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[toolfmt.ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str = ""  # a tool message: the call it answers
    images: tuple[ChatImage, ...] = ()  # a vision-language model's images, in content order

    def as_hf(self, content_parts: bool = False) -> dict:
        """The message as Hugging Face templates read it (arguments as an object). With
        content_parts (a vision-language model's template, Idefics3's) the content is HF's list of
        parts, {"type": "text"} and {"type": "image"}, for which the template writes "<image>"."""
        out: dict = {"role": self.role, "content": self.content}
        if content_parts:
            parts, at = [], 0
            for image in self.images:
                if image.offset > at:
                    parts.append({"type": "text", "text": self.content[at:image.offset]})
                parts.append({"type": "image"})
                at = image.offset
            if at < len(self.content):
                parts.append({"type": "text", "text": self.content[at:]})
            out["content"] = parts
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                 for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


def fallback_messages(messages: list[ChatMessage], tools: tuple[toolfmt.Tool, ...]) -> list[ChatMessage]:
    """Tools as text for a template that knows nothing of them (tools.py documents the format)."""
    out = []
    for m in messages:
        if m.role == "tool":
            out.append(ChatMessage("user", toolfmt.response_text(m.content)))
        elif m.tool_calls:
            calls = "\n".join(c.text() for c in m.tool_calls)
            out.append(replace(m, content=f"{m.content}\n{calls}" if m.content else calls, tool_calls=()))
        else:
            out.append(m)
    if tools:
        listing = toolfmt.tools_text(tools)
        if out and out[0].role == "system":
            out[0] = replace(out[0], content=f"{out[0].content}\n\n{listing}")  # its images stay where they were
        else:
            out.insert(0, ChatMessage("system", listing))
    return out


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's built-in tojson HTML-escapes; HF's does not, and templates are written for HF's.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template bound to the model's special tokens."""

    def __init__(self, source: str, special: SpecialTokens) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"invalid chat template: {exc}") from exc
        self._special = special
        self.supports_tools = "tools" in source

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
               tools: tuple[toolfmt.Tool, ...] = (), content_parts: bool = False) -> str:
        """The prompt text for `messages`, ending with the assistant header when asked;
        content_parts: every content as a list of parts (ChatMessage.as_hf)."""
        for i, message in enumerate(messages):
            if message.role not in ROLES:
                raise ChatTemplateError(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if not self.supports_tools:
            messages, tools = fallback_messages(messages, tools), ()
        try:
            return self._template.render(
                messages=[m.as_hf(content_parts) for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=[t.as_openai() for t in tools] or None,
                documents=None,
                bos_token=self._special.bos_token,
                eos_token=self._special.eos_token,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template: {exc}") from exc

    def render_open(self, messages: list[ChatMessage], tools: tuple[toolfmt.Tool, ...] = (),
                    content_parts: bool = False) -> tuple[str, str]:
        """Split rendering for a chat whose last message's content is still streaming in.

        Returns (head, tail): the prompt is head + <appended text> + tail, where the appended
        text continues the LAST message's content and tail closes it and opens the assistant
        turn. Rendered once with a sentinel so the template decides both halves.
        """
        if not messages:
            raise ChatTemplateError("messages must not be empty when input is streamed")
        last = messages[-1]
        marked = messages[:-1] + [ChatMessage(last.role, last.content + _SENTINEL, last.tool_calls,
                                              last.tool_call_id)]
        text = self.render(marked, tools=tools, content_parts=content_parts)
        if text.count(_SENTINEL) != 1:
            raise ChatTemplateError("this chat template cannot stream the last message's content")
        head, tail = text.split(_SENTINEL)
        return head, tail
