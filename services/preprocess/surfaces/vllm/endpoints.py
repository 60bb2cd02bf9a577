"""vLLM-compatible utility endpoints: `POST /tokenize`, `POST /detokenize`, `GET /version`."""

from __future__ import annotations

from collections.abc import AsyncIterator

from services.common import errors
from services.preprocess.chat_template import ChatMessage
from services.preprocess.request import RequestSpec
from services.preprocess.runner import RunScope
from services.preprocess.surfaces.http import Frame, HttpRequest, json_frame, parse
from services.preprocess.surfaces.vllm.body import DetokenizeBody, TokenizeBody
from services.version import VERSION

SURFACE = "tokenize"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


async def tokenize(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    body = parse(TokenizeBody, req)
    runner = runs.runner
    runner.check_model(body.model)
    if body.messages is not None:
        messages = tuple(ChatMessage(ROLES[m.role], m.text()) for m in body.messages)
        spec = RequestSpec(model=body.model, messages=messages, surface=SURFACE)
    else:
        spec = RequestSpec(model=body.model, text=body.prompt or "", surface=SURFACE)
    ids = runner.prompt_token_ids(spec)
    decode = runner.model.tokenizer.decode
    yield json_frame({
        "count": len(ids),
        "max_model_len": runner.model.context_length,
        "tokens": ids,
        "token_strs": [decode([t]) for t in ids] if body.return_token_strs else None,
    })


async def detokenize(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    body = parse(DetokenizeBody, req)
    runner = runs.runner
    runner.check_model(body.model)
    vocab = runner.model.tokenizer.vocab_size
    for i, token in enumerate(body.tokens):
        if token >= vocab:
            raise errors.invalid_argument(f"tokens[{i}]", f"must be a token id in [0, {vocab})")
    yield json_frame({"prompt": runner.model.tokenizer.decode(body.tokens)})


async def version(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    yield json_frame({"version": VERSION})
