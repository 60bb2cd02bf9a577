"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: parse → spec, run, render.

Headers: `x-api-key` is checked by Envoy when API keys are configured (and never reaches us);
`anthropic-version` is accepted when it looks like a version date (the SDK sends 2023-06-01) and
does not change behaviour; `anthropic-beta` is ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from services.common import errors
from services.common.finish import FinishReason
from services.common.metrics import timing_headers
from services.preprocess.chat_template import ChatImage, ChatMessage
from services.preprocess.images import ImageError, image_url_bytes
from services.preprocess.request import Chunk, Complete, Failed, RequestSpec
from services.preprocess.runner import RunScope
from services.preprocess.surfaces import fields
from services.preprocess.surfaces.anthropic import render
from services.preprocess.surfaces.anthropic.body import CountTokensBody, MessagesBody
from services.preprocess.surfaces.http import Frame, HttpRequest, field_error, json_frame, parse
from services.preprocess.tools import Tool, ToolCall, constraint, field_renames

SURFACE = "messages"
_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")


def _check_headers(req: HttpRequest) -> None:
    version = req.headers.get("anthropic-version")
    if version is not None and not _VERSION.fullmatch(version):
        raise errors.invalid_argument("anthropic-version", "must be a version date such as 2023-06-01")


def _turns(m, i: int) -> list[ChatMessage]:
    """One Anthropic message as domain turns: tool results become tool messages (in order), tool
    uses the assistant's calls, image blocks images where they stand in the text."""
    texts, images = [], []
    for j, b in enumerate(m.content):
        if b.type == "text":
            texts.append(b.text)
        elif b.type == "image":
            images.append(ChatImage(sum(map(len, texts)), _image_bytes(b.source, f"messages[{i}].content[{j}].source"),
                                    f"messages[{i}].content[{j}].source"))
    text = "".join(texts)
    results = [ChatMessage("tool", b.text(), tool_call_id=b.tool_use_id) for b in m.content if b.type == "tool_result"]
    calls = tuple(ToolCall(b.id, b.name, json.dumps(b.input, ensure_ascii=False)) for b in m.content
                  if b.type == "tool_use")
    if results:
        return results + ([ChatMessage(m.role, text, images=tuple(images))] if text or images else [])
    return [ChatMessage(m.role, text, calls, images=tuple(images))]


def _image_bytes(source, where: str) -> bytes:
    """A base64 image source's bytes; a url source is refused (nothing is fetched)."""
    url = source.url if source.type == "url" else f"data:{source.media_type};base64,{source.data}"
    try:
        return image_url_bytes(url)
    except ImageError as exc:
        raise errors.invalid_argument(where, str(exc), reason="INVALID_IMAGE") from None


def _conversation(body) -> tuple[ChatMessage, ...]:
    out = []
    if body.system:
        out.append(ChatMessage("system", "".join(b.text for b in body.system)))
    for i, m in enumerate(body.messages):
        out += _turns(m, i)
    if body.messages[-1].role == "assistant":
        # Anthropic continues a trailing assistant message (prefill); chat templates cannot
        # render an open assistant turn faithfully, so say so instead of answering a new turn.
        raise field_error(f"messages[{len(body.messages) - 1}].role",
                          "a final assistant message (prefill) is not supported; end with a user message")
    return tuple(out)


def tools_of(body) -> tuple[Tool, ...]:
    return tuple(Tool(t.name, t.description or "", t.input_schema) for t in body.tools or ()) if body.uses_tools else ()


def spec_of(body: MessagesBody, upload_bytes: int) -> RequestSpec:
    tools, choice = tools_of(body), body.tool_choice_name
    parallel = not (body.tool_choice and body.tool_choice.disable_parallel_tool_use)
    return RequestSpec(
        model=body.model,
        messages=_conversation(body),
        tools=tools,
        sampling=replace(fields.sampling_of(body, SURFACE), structured_output=constraint(tools, choice, parallel)),
        field_renames=field_renames(tools, choice, "tools", "input_schema") if tools else (),
        upload_bytes=upload_bytes,
        surface=SURFACE,
    )


async def create_message(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    _check_headers(req)
    body = parse(MessagesBody, req)
    stream = runs.run(spec_of(body, len(req.body)))
    async with aclosing(stream):
        accepted = await anext(stream)  # validation and admission errors: a real HTTP status
        if body.stream:
            out = render.MessageStream(body.model, runs.runner.deps.keepalive_s, tool_calls=body.uses_tools)
            for frame in out.on_event(accepted):
                yield frame
            async for event in stream:
                for frame in out.on_event(event):
                    yield frame
                if out.ended:
                    return
            return
        text: list[str] = []
        async for event in stream:
            if isinstance(event, Chunk):
                text.append(event.text)
            elif isinstance(event, Failed):
                raise event.error
            elif isinstance(event, Complete):
                if event.finish_reason is FinishReason.CANCELLED:
                    raise errors.cancelled("the request was cancelled")
                msg = render.message("msg_" + accepted.request_id, body.model, "".join(text), event,
                                     tool_calls=body.uses_tools)
                yield json_frame(msg, timing_headers(event))
                return
        raise errors.internal("request ended without a terminal event")


async def count_tokens(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    _check_headers(req)
    body = parse(CountTokensBody, req)
    spec = RequestSpec(model=body.model, messages=_conversation(body), tools=tools_of(body), upload_bytes=len(req.body),
                       surface=SURFACE)
    runs.runner.check_model(spec.model)
    yield json_frame({"input_tokens": len(runs.runner.prompt_token_ids(spec))})
