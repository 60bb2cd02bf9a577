"""Admission checks on a request's tokens and limits: client mistakes fail only that request.

INVALID_ARGUMENT for what the client got wrong (token out of vocabulary, prompt that leaves no room
in the context); RESOURCE_EXHAUSTED for what can never fit in this server's KV pool. max_tokens is
resolved once, by preprocess (services/preprocess/limits.py effective_max_tokens: the server cap,
the operator's default, the clamp to the context and its warning); here it is only checked when the
input ends. Unset (a direct client of this service) means whatever fits in the context and the pool.
"""

from __future__ import annotations

from services.common import errors
from services.common.prompt_fit import prompt_too_long
from services.generation.block_manager import BlockManager
from services.generation.sequence import Sequence


def check_prompt_tokens(token_ids: list[int], num_prompt_tokens: int, runner, block_manager: BlockManager,
                        output_tokens: int = 1):
    """Error for new prompt tokens (out of vocabulary, prompt too long), or None. `output_tokens`:
    the room the prompt must leave in the context (0 for an embedding, which generates nothing)."""
    vocab = runner.vocab_size
    if token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab):
        bad = next(t for t in token_ids if not 0 <= t < vocab)
        return errors.invalid_argument(
            "prompt_token_ids", f"token id {bad} is outside the vocabulary [0, {vocab})", "TOKEN_OUT_OF_VOCAB"
        )
    too_long = prompt_too_long(num_prompt_tokens, runner.max_model_len, "prompt_token_ids", output_tokens)
    if too_long is not None:
        return too_long
    if num_prompt_tokens > block_manager.num_sequence_tokens:
        return errors.resource_exhausted(
            f"prompt has {num_prompt_tokens} tokens; the KV cache holds {block_manager.num_tokens}",
            "KV_CACHE_TOO_SMALL",
            None,
        )
    return None


def check_input_end(seq: Sequence, runner, block_manager: BlockManager):
    """The input is complete: resolve seq.max_tokens, or return why the request cannot run."""
    n = seq.num_prompt_tokens
    if n == 0:
        return errors.invalid_argument("prompt_token_ids", "the prompt is empty", "EMPTY_PROMPT")
    if seq.is_embedding:
        seq.max_tokens = 0  # prefill only: nothing is generated, so the prompt alone must fit
        return None
    room = runner.max_model_len - n  # >= 1: check_prompt_tokens ran on every chunk
    # The last output token is never fed back, so the pool must hold prompt + max_tokens - 1.
    pool_room = block_manager.num_sequence_tokens - n + 1
    requested = seq.params.max_tokens
    if requested is None:
        seq.max_tokens = min(room, pool_room)
        return None
    if requested > room:
        return errors.invalid_argument(
            "max_tokens", f"prompt {n} + max_tokens {requested} tokens exceed the context ({runner.max_model_len})",
            "MAX_TOKENS_TOO_LARGE")
    seq.max_tokens = requested
    if seq.max_tokens > pool_room:
        return errors.resource_exhausted(
            f"prompt {n} + max_tokens {seq.max_tokens} tokens exceed the KV cache ({block_manager.num_tokens})",
            "KV_CACHE_TOO_SMALL",
            None,
        )
    return None
