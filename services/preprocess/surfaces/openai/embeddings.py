"""OpenAI `POST /v1/embeddings`: body, fan-out and response.

`input` is a string, an array of strings, an array of token ids or an array of token-id arrays.
Every input is checked before any work starts (a 400 names the input: `input[3]`, `input[1][5]`),
then each input runs as its own prefill-only request (RequestSpec.embedding) on the request
runner: at most WINDOW of them in flight per call, so the engine batches a list with itself and
with generation traffic, and a long list never takes more than its client's admission share. The
first failure ends the call (the other inputs are cancelled, their KV blocks freed) with that
input's error. The response lists one unit-length embedding per input, in input order, as JSON
numbers (`encoding_format: float`) or base64 of the float32 little-endian bytes (`base64`, what the
official client asks for by default); `usage.prompt_tokens` sums the inputs' tokens. Its body is
sent in frames of about FRAME_BYTES (each its own gRPC message; Envoy passes them on as one body):
2,048 vectors as JSON numbers are ~25 MB for a 576-wide model, more than one gRPC message may
carry, and the body grows with the model's width.
"""

from __future__ import annotations

import asyncio
import base64
from array import array
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from services.common import errors
from services.common.finish import FinishReason
from services.common.prompt_fit import check_prompt_fits
from services.preprocess.prompt import min_prompt_tokens
from services.preprocess.request import TOKENS, Complete, EmbeddingSpec, Failed, Part, RequestSpec, Tensor
from services.preprocess.runner import RunScope
from services.preprocess.surfaces import fields
from services.preprocess.surfaces.http import (
    JSON,
    Body,
    Frame,
    HttpRequest,
    Ignored,
    TokenId,
    dumps,
    field_error,
    parse,
)
from services.preprocess.surfaces.sampling_names import EMBEDDINGS

MAX_INPUTS = 2048  # OpenAI's documented limit on the input array
WINDOW = 16  # inputs of one call in flight at once
FRAME_BYTES = 1024 * 1024  # a response frame is cut after the embedding that reaches this size
_SHAPES = "a string, an array of strings, an array of token ids or an array of token-id arrays"


def _kind(value: Any) -> str:
    """Which member of a union a JSON value is meant as. The tags look like pydantic's own type
    tags, so error paths leave them out (`input[1][5]`, not `input[1].tokens[5]`)."""
    if isinstance(value, str):
        return "str"
    if isinstance(value, int) and not isinstance(value, bool):
        return "int"
    return "list[int]"


def _str_or_list(value: Any) -> Any:
    if not isinstance(value, str | list):
        raise PydanticCustomError("input_type", f"must be {_SHAPES}")
    return value


# One element of `input`: a text, a token id (the whole input is one token array) or a token array.
Item = Annotated[Annotated[str, Tag("str")] | Annotated[TokenId, Tag("int")]
                 | Annotated[list[TokenId], Tag("list[int]")], Discriminator(_kind)]
Input = Annotated[Annotated[str, Tag("str")] | Annotated[list[Item], Tag("list[int]")],
                  Discriminator(lambda v: "str" if isinstance(v, str) else "list[int]"), BeforeValidator(_str_or_list)]


class EmbeddingBody(Body):
    input: Input = Field(description=f"{_SHAPES[0].upper()}{_SHAPES[1:]} (at most {MAX_INPUTS} inputs, none empty).")
    model: fields.Model = ""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, description="Keep the first N values, then normalize "
                                     "(at most the model's hidden size).")] | None = None
    user: Ignored = None

    def check(self) -> None:
        if isinstance(self.input, list) and not self.input:
            raise field_error("input", "must not be empty")
        if isinstance(self.input, list) and len({_kind(item) for item in self.input}) > 1:
            raise field_error("input", f"must be {_SHAPES}, not a mix")
        if len(self.input) > MAX_INPUTS and isinstance(self.input, list) and not self.is_flat_tokens:
            raise field_error("input", f"at most {MAX_INPUTS} inputs per request")
        for i, item in enumerate(self.items()):
            if not item:
                raise field_error(self.field(i), "must not be empty")

    @property
    def is_flat_tokens(self) -> bool:
        """One input given as a bare token-id array."""
        return isinstance(self.input, list) and isinstance(self.input[0], int)

    def items(self) -> list[str | list[int]]:
        if isinstance(self.input, str) or self.is_flat_tokens:
            return [self.input]
        return list(self.input)

    def field(self, i: int) -> str:
        """How the client names input i."""
        return "input" if isinstance(self.input, str) or self.is_flat_tokens else f"input[{i}]"


async def create_embedding(req: HttpRequest, runs: RunScope) -> AsyncIterator[Frame]:
    body = parse(EmbeddingBody, req)
    runner = runs.runner
    runner.check_model(body.model)
    model = runner.model
    if body.dimensions is not None and model.hidden_size and body.dimensions > model.hidden_size:
        raise field_error("dimensions", f"must be in [1, {model.hidden_size}] (the model's hidden size)")
    prompts = [_token_ids(body, i, item, runs) for i, item in enumerate(body.items())]
    embedding = EmbeddingSpec(body.dimensions)
    specs = [RequestSpec(model=body.model, parts=(Part(TOKENS, token_ids=tuple(ids)),), embedding=embedding,
                         upload_bytes=len(req.body) if i == 0 else 0, surface=EMBEDDINGS)
             for i, ids in enumerate(prompts)]
    results = await _run_all(specs, runs)
    used = sum(len(ids) for ids in prompts)
    tail = {"model": body.model or model.name, "usage": {"prompt_tokens": used, "total_tokens": used}}
    for frame in _frames(results, body.encoding_format, tail):
        yield frame


def _frames(results: list[Tensor], encoding_format: str, tail: dict) -> Iterator[Frame]:
    """The list object `{"object": "list", "data": [...], **tail}` as frames of about FRAME_BYTES,
    encoded one frame at a time (the event loop runs between two)."""
    piece, size = [b'{"object":"list","data":['], 0
    for i, tensor in enumerate(results):
        entry = dumps({"object": "embedding", "index": i, "embedding": _encode(tensor, encoding_format)})
        piece.append(entry if i == 0 else b"," + entry)
        size += len(entry) + 1
        if size >= FRAME_BYTES:
            yield Frame(b"".join(piece), JSON)
            piece, size = [], 0
    piece.append(b"]," + dumps(tail)[1:])  # the tail's members close the object
    yield Frame(b"".join(piece), JSON)


def _token_ids(body: EmbeddingBody, i: int, item: str | list[int], runs: RunScope) -> list[int]:
    """Input i as the token ids it runs on, or a 400 naming it (out of vocabulary, too long)."""
    model = runs.runner.model
    where, context = body.field(i), model.context_length
    if isinstance(item, str):
        least = min_prompt_tokens((), model.tokenizer.max_token_bytes, item)  # before tokenizing
        check_prompt_fits(least, context, where, output_tokens=0, at_least=True)
        ids = model.tokenizer.encode(item)
    else:
        ids = item
        vocab = model.tokenizer.vocab_size
        bad = next((j for j, token in enumerate(ids) if token >= vocab), None)
        if bad is not None:
            path = f"input[{bad}]" if body.is_flat_tokens else f"{where}[{bad}]"
            raise field_error(path, f"token id {ids[bad]} is outside the vocabulary [0, {vocab})",
                              reason="TOKEN_OUT_OF_VOCAB")
    check_prompt_fits(len(ids), context, where, output_tokens=0)
    if not ids:
        raise field_error(where, "has no tokens")
    return ids


async def _run_all(specs: list[RequestSpec], runs: RunScope) -> list[Tensor]:
    """Every spec's embedding, in order; the first error cancels the rest and is raised."""
    results: list[Tensor | None] = [None] * len(specs)
    window = asyncio.Semaphore(WINDOW)

    async def one(i: int) -> None:
        async with window, aclosing(runs.run(specs[i])) as stream:
            async for event in stream:
                if isinstance(event, Tensor):
                    results[i] = event
                elif isinstance(event, Failed):
                    raise event.error
                elif isinstance(event, Complete):
                    if event.finish_reason is FinishReason.CANCELLED:
                        raise errors.cancelled("the request was cancelled")
                    break
        if results[i] is None:
            raise errors.internal("an embedding request ended without its embedding")

    try:
        async with asyncio.TaskGroup() as group:
            for i in range(len(specs)):
                group.create_task(one(i))
    except* errors.MstarError as failures:
        raise failures.exceptions[0] from None
    return results  # type: ignore[return-value]  # every slot was filled or an error was raised


def _encode(tensor: Tensor, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(tensor.data).decode("ascii")
    values = array("f")
    values.frombytes(tensor.data)  # float32, little-endian like every platform we run on
    return values.tolist()
