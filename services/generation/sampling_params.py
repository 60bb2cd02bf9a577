"""Per-request sampling parameters and their validation (plain Python: no torch, no grpc).

Validation lives here, next to the fields, so the servicer and the engine agree on what is
"impossible": a bad value fails only its own request with INVALID_ARGUMENT, naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from services.generation.grammar.constraint import StructuredOutput

MAX_LOGPROBS = 20  # top-n alternatives per token; bounded so a request cannot ask for a [V] list


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # CTRL-style, on prompt + output tokens; 1 = off
    frequency_penalty: float = 0.0  # per occurrence in the output; 0 = off
    presence_penalty: float = 0.0  # once if present in the output; 0 = off
    seed: int | None = None  # None = the engine draws one
    max_tokens: int | None = None  # None = what fits in the context
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = no logprobs; n = the sampled token's logprob + top n
    # None = free text; else the output must match this grammar (grammar/constraint.py). It is
    # checked by the engine (validate_structured_output), which names the offending part.
    structured_output: StructuredOutput | None = None

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def validate_sampling_params(p: SamplingParams, vocab_size: int) -> str | None:
    """Return an error message naming the first bad field, or None when every value is possible."""
    checks = [
        ("temperature", _is_number(p.temperature) and 0.0 <= p.temperature <= 2.0, "must be in [0, 2]"),
        ("top_p", _is_number(p.top_p) and 0.0 < p.top_p <= 1.0, "must be in (0, 1]"),
        ("top_k", isinstance(p.top_k, int) and 0 <= p.top_k <= vocab_size, f"must be in [0, {vocab_size}]"),
        ("min_p", _is_number(p.min_p) and 0.0 <= p.min_p <= 1.0, "must be in [0, 1]"),
        (
            "repetition_penalty",
            _is_number(p.repetition_penalty) and 0.0 < p.repetition_penalty <= 2.0,
            "must be in (0, 2]",
        ),
        ("frequency_penalty", _is_number(p.frequency_penalty) and -2.0 <= p.frequency_penalty <= 2.0, "must be in [-2, 2]"),
        ("presence_penalty", _is_number(p.presence_penalty) and -2.0 <= p.presence_penalty <= 2.0, "must be in [-2, 2]"),
        ("seed", p.seed is None or (isinstance(p.seed, int) and -(2**63) <= p.seed < 2**63), "must fit in int64"),
        ("max_tokens", p.max_tokens is None or (isinstance(p.max_tokens, int) and p.max_tokens >= 1), "must be >= 1"),
        (
            "logprobs",
            p.logprobs is None or (isinstance(p.logprobs, int) and 0 <= p.logprobs <= MAX_LOGPROBS),
            f"must be in [0, {MAX_LOGPROBS}]",
        ),
        (
            "stop_token_ids",
            all(isinstance(t, int) and 0 <= t < vocab_size for t in p.stop_token_ids),
            f"must be token ids in [0, {vocab_size})",
        ),
    ]
    for name, ok, rule in checks:
        if not ok:
            return f"sampling.{name} {rule}, got {getattr(p, name)!r}"
    return None
