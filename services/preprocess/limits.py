"""Request caps and sampling validation: everything that is checked before admission, so the
generation engine never sees an impossible value and no huge allocation follows a huge number.

max_tokens policy: CLAMP. An absent max_tokens means `default_max_tokens` when the operator set one
(`--default-max-tokens`, `make run` MSTAR_DEFAULT_MAX_TOKENS), else "what fits" (context - prompt,
capped by `max_tokens_cap`), like vLLM; either way never more than fits. A max_tokens larger than what fits is
clamped and the request carries the warning "max_tokens clamped to N". A value above the absolute
cap, zero or negative is INVALID_ARGUMENT (that is a client bug, not a fit question).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.errors import MstarError, invalid_argument, resource_exhausted
from services.preprocess.request import Sampling


@dataclass(frozen=True)
class Limits:
    """Server-side caps (CLI flags set the interesting ones)."""

    max_tokens_cap: int = 8192
    default_max_tokens: int | None = None  # for requests without max_tokens; None = what fits
    max_n: int = 1
    max_logprobs: int = 20
    max_stop_strings: int = 16
    max_stop_chars: int = 256
    max_stop_token_ids: int = 64
    # Per stream (a Session, or one GenerateStream/Generate call plus its unary Appends).
    max_input_bytes: int = 8 * 1024 * 1024
    max_appends: int = 4096
    # Per file read through an allow-listed file_path.
    max_file_bytes: int = 4 * 1024 * 1024


_RANGES = {
    # field: (low, high, low_inclusive)
    "temperature": (0.0, 2.0, True),
    "top_p": (0.0, 1.0, False),
    "min_p": (0.0, 1.0, True),
    "repetition_penalty": (0.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, True),
    "presence_penalty": (-2.0, 2.0, True),
}

_FIELD = "model_kwargs.sampling."


def validate_sampling(s: Sampling, limits: Limits, vocab_size: int) -> None:
    """Raise INVALID_ARGUMENT naming the first offending field."""
    for name, (low, high, low_inclusive) in _RANGES.items():
        value = getattr(s, name)
        if value is None:
            continue
        if not math.isfinite(value):
            raise invalid_argument(_FIELD + name, "must be a finite number")
        below = value < low if low_inclusive else value <= low
        if below or value > high:
            bracket = "[" if low_inclusive else "("
            raise invalid_argument(_FIELD + name, f"must be in {bracket}{low}, {high}]")
    if s.top_k is not None and not 0 <= s.top_k <= vocab_size:
        raise invalid_argument(_FIELD + "top_k", f"must be in [0, {vocab_size}]")
    if s.max_tokens is not None and not 1 <= s.max_tokens <= limits.max_tokens_cap:
        raise invalid_argument(_FIELD + "max_tokens", f"must be in [1, {limits.max_tokens_cap}]")
    if s.n is not None and not 1 <= s.n <= limits.max_n:
        raise invalid_argument(_FIELD + "n", f"must be in [1, {limits.max_n}] (one completion per request)")
    if s.logprobs is not None and not 0 <= s.logprobs <= limits.max_logprobs:
        raise invalid_argument(_FIELD + "logprobs", f"must be in [0, {limits.max_logprobs}]")
    if len(s.stop) > limits.max_stop_strings:
        raise invalid_argument(_FIELD + "stop", f"at most {limits.max_stop_strings} stop strings")
    for i, stop in enumerate(s.stop):
        if not stop or len(stop) > limits.max_stop_chars:
            raise invalid_argument(f"{_FIELD}stop[{i}]", f"must be 1 to {limits.max_stop_chars} characters")
    if len(s.stop_token_ids) > limits.max_stop_token_ids:
        raise invalid_argument(_FIELD + "stop_token_ids", f"at most {limits.max_stop_token_ids} ids")
    for i, token in enumerate(s.stop_token_ids):
        if not 0 <= token < vocab_size:
            raise invalid_argument(f"{_FIELD}stop_token_ids[{i}]", f"must be in [0, {vocab_size})")


def validate_extra(keys: tuple[str, ...]) -> None:
    """No model-specific keyword arguments are understood; unknown keys are errors, not ignored."""
    if keys:
        raise invalid_argument(f"model_kwargs.extra.{keys[0]}", "unknown model argument")


def check_prompt_fits(prompt_tokens: int, context_length: int, field: str) -> None:
    """A prompt must leave room for at least one generated token."""
    if prompt_tokens >= context_length:
        err = invalid_argument(
            field,
            f"prompt is {prompt_tokens} tokens; the context holds {context_length} "
            f"(prompt + at least 1 generated token)",
            reason="PROMPT_TOO_LONG",
        )
        err.metadata.update(prompt_tokens=str(prompt_tokens), context_length=str(context_length))
        raise err


def effective_max_tokens(
    requested: int | None, prompt_tokens: int, context_length: int, limits: Limits
) -> tuple[int, tuple[str, ...]]:
    """max_tokens after the clamp policy, and the warnings to report."""
    room = min(context_length - prompt_tokens, limits.max_tokens_cap)
    if requested is None:
        return min(room, limits.default_max_tokens or room), ()
    if requested > room:
        return room, (f"max_tokens clamped to {room}",)
    return requested, ()


def check_token_ids(ids: tuple[int, ...], vocab_size: int, field: str) -> None:
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise invalid_argument(f"{field}[{i}]", f"token id {token} is outside [0, {vocab_size})")


def input_caps_error(what: str) -> MstarError:
    """Per-stream input caps: retrying the same input would exceed them again, so no RetryInfo."""
    return resource_exhausted(what, reason="INPUT_LIMIT", retry_after_s=None)
