"""Per-request sampling parameters and their validation (plain Python: no torch, no grpc).

Defaults and bounds are the rows of the one sampling field table (services/common/sampling_fields.py,
bounds read from the contract's declared rules), so the engine, preprocess and every HTTP surface
agree on what is "impossible": a bad value fails only its own request with INVALID_ARGUMENT,
naming the field. The servicer already enforced the declared bounds on the wire message; this is
the engine's own guard (and the vocabulary, which only the model knows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.sampling_fields import ENGINE_FIELDS, FIELDS
from services.common.structured_output import StructuredOutput


def _default(name: str):
    return FIELDS[name].default


@dataclass(frozen=True)
class Embedding:
    """Prefill only: the request returns its pooled final hidden state instead of sampling (the
    model runner pools the last prompt token's row after the final norm, keeps the first
    `dimensions` values and L2-normalizes them; docs/design.md "Embeddings")."""

    dimensions: int | None = None  # None = the model's hidden size


@dataclass
class SamplingParams:
    temperature: float = _default("temperature")  # 0 = greedy
    top_k: int = _default("top_k")  # 0 = off
    top_p: float = _default("top_p")  # 1 = off
    min_p: float = _default("min_p")  # 0 = off
    repetition_penalty: float = _default("repetition_penalty")  # CTRL-style, prompt + output; 1 = off
    frequency_penalty: float = _default("frequency_penalty")  # per occurrence in the output; 0 = off
    presence_penalty: float = _default("presence_penalty")  # once if present in the output; 0 = off
    seed: int | None = _default("seed")  # None = the engine draws one
    max_tokens: int | None = _default("max_tokens")  # None = what fits in the context
    stop_token_ids: tuple[int, ...] = _default("stop_token_ids")
    ignore_eos: bool = _default("ignore_eos")
    logprobs: int | None = _default("logprobs")  # None = no logprobs; n = the sampled token's logprob + top n
    speculative: bool | None = _default("speculative")  # None = the engine's policy (speculation.py)
    # None = free text; else the output must match this grammar (common/structured_output.py). It is
    # checked by the engine (validate_structured_output), which names the offending part.
    structured_output: StructuredOutput | None = None
    # None = generate; else an embedding request: it ends (finish reason stop, no output token)
    # in the step that computes its last prompt token, and its KV blocks are freed in that step.
    embedding: Embedding | None = None

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


_CHECKED = tuple(f.name for f in ENGINE_FIELDS if f.is_number)  # range-checked against the contract


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def validate_sampling_params(p: SamplingParams, vocab_size: int) -> str | None:
    """Return an error message naming the first bad field, or None when every value is possible."""
    for name in _CHECKED:
        value, f = getattr(p, name), FIELDS[name]
        if value is None and f.default is None:
            continue
        ok = _is_number(value) and (f.kind is float or isinstance(value, int)) and f.bounds.contains(value)
        if ok and f.int_range is not None:
            ok = f.int_range[0] <= value <= f.int_range[1]
        if not ok:
            return f"sampling.{name} must be in {f.bounds.describe()}, got {value!r}"
    if not p.top_k <= vocab_size:
        return f"sampling.top_k must be in [0, {vocab_size}], got {p.top_k!r}"
    if not all(isinstance(t, int) and 0 <= t < vocab_size for t in p.stop_token_ids):
        return f"sampling.stop_token_ids must be token ids in [0, {vocab_size})"
    return None


def validate_embedding(p: SamplingParams, hidden_size: int) -> str | None:
    """An error message naming the bad embedding field, or None (also for a generation request)."""
    e = p.embedding
    if e is None:
        return None
    if e.dimensions is not None and not (isinstance(e.dimensions, int) and 1 <= e.dimensions <= hidden_size):
        return f"embedding.dimensions must be in [1, {hidden_size}] (the model's hidden size), got {e.dimensions!r}"
    if p.structured_output is not None:
        return "embedding: an embedding request cannot carry structured_output"
    return None
