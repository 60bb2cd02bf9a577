"""OpenAIRequest → mstar.v1.PreprocessInput (one per choice), and ResultChunk logprobs back.

This is servicer-side code, so protobuf is fine here. n > 1 is n independent requests; with a
seed, choice i uses seed + i so every choice is reproducible and they differ from each other.
"""

from __future__ import annotations

from dataclasses import replace

from mstar.v1 import messages_pb2

from services.preprocess.openai.render import TokenLogprob
from services.preprocess.openai.request import OpenAIRequest
from services.preprocess.wire import sampling_pb


def preprocess_input(req: OpenAIRequest, choice: int) -> messages_pb2.PreprocessInput:
    s = req.sampling
    if s.seed is not None:
        # Wrap within int64 so seed + i never overflows the field.
        s = replace(s, seed=((s.seed + choice + 2**63) % 2**64) - 2**63)
    params = sampling_pb(s)
    out = messages_pb2.PreprocessInput(
        model=req.model, model_kwargs=messages_pb2.ModelKwargs(sampling=params)
    )
    if req.messages:
        out.messages.extend(messages_pb2.ChatMessage(role=r, content=c) for r, c in req.messages)
    elif req.prompt_token_ids is not None:
        out.prompt_parts.append(
            messages_pb2.PromptPart(
                modality=messages_pb2.MODALITY_TOKENS,
                token_ids=messages_pb2.TokenIds(ids=req.prompt_token_ids),
            )
        )
    else:
        out.text = req.prompt_text or ""
    return out


def token_logprobs(chunk: messages_pb2.ResultChunk) -> list[TokenLogprob]:
    return [
        TokenLogprob(token_id, lp.logprob, list(zip(lp.top_token_ids, lp.top_logprobs, strict=False)))
        for token_id, lp in zip(chunk.token_ids, chunk.logprobs, strict=False)
    ]
