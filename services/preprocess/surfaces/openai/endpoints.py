"""OpenAI endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models[/{id}]`.

n > 1 is n independent requests; with a seed, choice i uses seed + i, so every choice is
reproducible and they differ from each other. Until the first frame, any error ends the call
with a status (Envoy's Lua reshapes it into OpenAI's error object); after it, a failure is an
in-band `data: {"error": ...}` frame followed by `data: [DONE]`. Non-streamed responses send
nothing until every choice ended, so their failures always get a real HTTP status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from urllib.parse import unquote

from services.common import errors, hop_trace
from services.common.metrics import timing_headers
from services.preprocess.chat_template import ChatImage, ChatMessage
from services.preprocess.images import ImageError, image_url_bytes
from services.preprocess.request import TOKENS, Chunk, Part, RequestSpec, Sampling
from services.preprocess.runner import RunScope
from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import Frame, HttpRequest, json_frame, parse
from services.preprocess.surfaces.openai import render
from services.preprocess.surfaces.openai.body import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    ROLES,
    ChatBody,
    CompletionBody,
)
from services.preprocess.surfaces.openai.choices import Choices
from services.preprocess.surfaces.openai.fanout import merged
from services.preprocess.surfaces.openai.structured import output_constraint, tools_of
from services.preprocess.surfaces.sampling_names import CHAT, COMPLETIONS
from services.preprocess.tools import ToolCall


def _choice_sampling(s: Sampling, choice: int) -> Sampling:
    """Each choice is one request (n = 1) with its own seed."""
    s = replace(s, n=None)
    if s.seed is None or choice == 0:
        return s
    return replace(s, seed=((s.seed + choice + 2**63) % 2**64) - 2**63)  # wraps within int64


def _chat_message(m, i: int) -> ChatMessage:
    calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
    text, images = [], []
    for j, part in enumerate(m.content or ()):
        if part.type == "text":
            text.append(part.text)
            continue
        where = f"messages[{i}].content[{j}].image_url.url"
        try:
            data = image_url_bytes(part.image_url.url)
        except ImageError as exc:
            raise errors.invalid_argument(where, str(exc), reason="INVALID_IMAGE") from None
        images.append(ChatImage(sum(map(len, text)), data, where))
    return ChatMessage(ROLES[m.role], "".join(text), calls, m.tool_call_id or "", tuple(images))


def chat_completions(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    """POST /v1/chat/completions. A plain function: it parses and builds the spec, then hands back
    _serve's frames as they are (no generator layer of its own on every token's way out)."""
    body = parse(ChatBody, req)
    constraint, renames = output_constraint(body)
    sampling = replace(fields.sampling_of(body, CHAT, logprobs=body.logprobs_n), structured_output=constraint)
    messages = tuple(_chat_message(m, i) for i, m in enumerate(body.messages))
    spec = RequestSpec(model=body.model, messages=messages, tools=tools_of(body) if body.uses_tools else (),
                       sampling=sampling, field_renames=renames, upload_bytes=len(req.body), surface=CHAT)
    return _serve(spec, body, runs, chat=True, logprobs=body.logprobs_n is not None, tool_calls=body.uses_tools)


def completions(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    """POST /v1/completions (a plain function, like chat_completions)."""
    body = parse(CompletionBody, req)
    default = COMPLETION_DEFAULT_MAX_TOKENS if body.max_tokens is None else None
    constraint, renames = output_constraint(body)
    sampling = replace(fields.sampling_of(body, COMPLETIONS, max_tokens=default), structured_output=constraint)
    if isinstance(body.prompt, str):
        spec = RequestSpec(model=body.model, text=body.prompt, sampling=sampling, upload_bytes=len(req.body),
                           field_renames=renames, surface=COMPLETIONS)
    else:
        parts = (Part(TOKENS, token_ids=tuple(body.prompt)),)
        spec = RequestSpec(model=body.model, parts=parts, sampling=sampling, upload_bytes=len(req.body),
                           field_renames=renames, surface=COMPLETIONS)
    return _serve(spec, body, runs, chat=False, logprobs=body.logprobs is not None)


async def _serve(spec: RequestSpec, body, runs: RunScope, *, chat: bool, logprobs: bool,
                 tool_calls: bool = False) -> AsyncIterator[Frame]:
    n = body.n or 1
    streams = [runs.run(replace(spec, sampling=_choice_sampling(spec.sampling, i),
                                request_id=spec.request_id if i == 0 else f"{spec.request_id}-{i}"))
               for i in range(n)]
    model = runs.runner.model
    out = Choices(chat=chat, n=n, stream=body.stream, include_usage=body.include_usage, logprobs=logprobs,
                  model=body.model or model.name, token_text=lambda t: model.tokenizer.decode([t]),
                  token_bytes=model.tokenizer.token_bytes, keepalive_s=runs.runner.deps.keepalive_s,
                  tool_calls=tool_calls)
    started = False
    events = merged(streams)
    try:
        async for index, event in events:
            traced = hop_trace.ON and isinstance(event, Chunk)
            for frame in out.on_event(index, event):
                started = True
                if traced:
                    hop_trace.mark("pp_write", event.request_id, event.index)
                yield frame
                if traced:  # grpc took the frame (http_routes yields it straight on)
                    hop_trace.mark("pp_sent", event.request_id, event.index)
            if out.failure is not None:
                if not started:
                    raise out.failure
                for frame in render.error_frames(out.failure):
                    yield frame
                return
        headers = () if body.stream or out.first_complete is None else timing_headers(out.first_complete)
        for frame in out.end(headers):
            yield frame
    except errors.MstarError as err:  # admission of a later choice, after the stream started
        if not started:
            raise
        for frame in render.error_frames(err):
            yield frame
    finally:
        await events.aclose()


# ---- GET /v1/models, GET /v1/models/{model}


def model_object(runs: RunScope, created: int) -> dict:
    model = runs.runner.model
    obj = {"id": model.name, "object": "model", "created": created, "owned_by": "mstar",
           "max_model_len": model.context_length, "input_modalities": sorted(model.input_modalities),
           "family": model.family}
    if runs.runner.numerics:  # how the generation backend computes; absent until one has connected
        obj["numerics"] = dict(runs.runner.numerics)
    return obj


async def list_models(req: HttpRequest, runs: RunScope, created: int) -> AsyncIterator[Frame]:
    yield json_frame({"object": "list", "data": [model_object(runs, created)]})


async def retrieve_model(req: HttpRequest, runs: RunScope, created: int) -> AsyncIterator[Frame]:
    # SDKs percent-encode the path (ORG%2FNAME for a repo id); the transcoder leaves %2F encoded.
    name = unquote(req.params.get("model", ""))
    if not runs.runner.model.answers_to(name):
        raise errors.not_found("model not found (see GET /v1/models)", reason="MODEL_NOT_FOUND")
    yield json_frame(model_object(runs, created))
