"""Request caps and sampling validation: everything that is checked before admission, so the
generation engine never sees an impossible value and no huge allocation follows a huge number.

The ranges and counts are the contract's declared bounds (protovalidate rules on
mstar.v1.SamplingParams, read through the one sampling field table,
services/common/sampling_fields.py; the servicer or the surface's body model already enforced
them on the input). What is added here is server policy: the
configured max_tokens cap, n (the engine runs one completion per request), the model's
vocabulary.

max_tokens policy: CLAMP. An absent max_tokens means `default_max_tokens` when the operator set one
(`--default-max-tokens`, `make run` MSTAR_DEFAULT_MAX_TOKENS), else "what fits" (context - prompt,
capped by `max_tokens_cap`), like vLLM; either way never more than fits. A max_tokens larger than what fits is
clamped and the request carries the warning "max_tokens clamped to N". A value above the absolute
cap, zero or negative is INVALID_ARGUMENT (that is a client bug, not a fit question).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.errors import MstarError, invalid_argument, quote, renamed, resource_exhausted
from services.common.sampling_fields import FIELDS
from services.common.structured_output import ConstraintError, StructuredOutput, validate_structured_output
from services.preprocess.request import EmbeddingSpec, Sampling
from services.preprocess.surfaces.sampling_names import EMBEDDINGS, NATIVE, public_name, scheme_of


@dataclass(frozen=True)
class Limits:
    """Server-side caps (CLI flags set the interesting ones)."""

    max_tokens_cap: int = 8192
    default_max_tokens: int | None = None  # for requests without max_tokens; None = what fits
    max_n: int = 1
    # Per stream (a Session, or one GenerateStream/Generate call plus its unary Appends).
    max_input_bytes: int = 8 * 1024 * 1024
    max_appends: int = 4096
    # Per file read through an allow-listed file_path.
    max_file_bytes: int = 4 * 1024 * 1024


def validate_sampling(s: Sampling, limits: Limits, vocab_size: int, surface: str = "GenerateStream") -> None:
    """Raise INVALID_ARGUMENT naming the first offending field the way `surface`'s clients spell it
    (services/common/sampling_fields.py): the contract's declared bounds, then server policy."""

    def name(field: str) -> str:
        return sent_name(s, field, surface)

    for f in FIELDS.values():
        value = getattr(s, f.name)
        if value is None or f.repeated or f.kind is bool:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid_argument(name(f.name), "must be a finite number")
        if not f.bounds.contains(value):
            raise invalid_argument(name(f.name), f"must be in {f.bounds.describe()}")
    if s.top_k is not None and s.top_k > vocab_size:
        raise invalid_argument(name("top_k"), f"must be in [0, {vocab_size}] (the vocabulary)")
    if s.max_tokens is not None and s.max_tokens > limits.max_tokens_cap:
        raise invalid_argument(name("max_tokens"), f"must be in [1, {limits.max_tokens_cap}] (server cap)")
    if s.n is not None and s.n > limits.max_n:
        raise invalid_argument(name("n"), f"must be in [1, {limits.max_n}] (one completion per request)")
    stop, stop_ids = FIELDS["stop"].bounds, FIELDS["stop_token_ids"].bounds
    if len(s.stop) > stop.max_items:
        raise invalid_argument(name("stop"), f"at most {stop.max_items} stop strings")
    for i, text in enumerate(s.stop):
        if not stop.items.min_len <= len(text) <= stop.items.max_len:
            raise invalid_argument(f"{name('stop')}[{i}]",
                                   f"must be {stop.items.min_len} to {stop.items.max_len} characters")
    if len(s.stop_token_ids) > stop_ids.max_items:
        raise invalid_argument(name("stop_token_ids"), f"at most {stop_ids.max_items} ids")
    for i, token in enumerate(s.stop_token_ids):
        if not 0 <= token < vocab_size:
            raise invalid_argument(f"{name('stop_token_ids')}[{i}]", f"must be in [0, {vocab_size})")


def sent_name(s: Sampling, field: str, surface: str, bare: bool = False) -> str:
    """How the client named sampling field `field`: the alias it sent (Sampling.spelled), else
    the surface's own name for it (services/preprocess/surfaces/sampling_names.py). `bare`: a native name
    without its path (`max_tokens`, as the native API's warnings have always said)."""
    if bare and scheme_of(surface) == NATIVE:
        return field
    return dict(s.spelled).get(field) or public_name(field, surface)


def validate_constraint(c: StructuredOutput | None, renames: tuple[tuple[str, str], ...]) -> None:
    """The engine's own caps and shape checks, here too, so a malformed constraint is refused before
    admission, named as the surface's client spelled it. Whether it compiles only the engine knows."""
    if c is None:
        return
    try:
        validate_structured_output(c)
    except ConstraintError as e:
        raise renamed(invalid_argument(e.field, e.description), renames) from None


def validate_extra(keys: tuple[str, ...]) -> None:
    """No model-specific keyword arguments are understood; unknown keys are errors, not ignored."""
    if keys:
        raise invalid_argument(f"input.model_kwargs.extra[{quote(min(keys), 32)}]", "unknown model argument")


def check_embedding(e: EmbeddingSpec, hidden_size: int, surface: str) -> None:
    """`dimensions` at most the model's hidden size (when known; the engine checks it too)."""
    if e.dimensions is not None and hidden_size and not 1 <= e.dimensions <= hidden_size:
        root = "start" if surface == "Session" else "input"
        field = "dimensions" if surface == EMBEDDINGS else f"{root}.model_kwargs.embedding.dimensions"
        raise invalid_argument(field, f"must be in [1, {hidden_size}] (the model's hidden size)")


def effective_max_tokens(
    requested: int | None, prompt_tokens: int, context_length: int, limits: Limits, field: str = "max_tokens"
) -> tuple[int, tuple[str, ...]]:
    """max_tokens after the clamp policy, and the warnings to report (naming `field`, the
    client's own name for it: `max_output_tokens` on Responses)."""
    room = min(context_length - prompt_tokens, limits.max_tokens_cap)
    if requested is None:
        return min(room, limits.default_max_tokens or room), ()
    if requested > room:
        return room, (f"{field} clamped to {room}",)
    return requested, ()


def check_token_ids(ids: tuple[int, ...], vocab_size: int, field: str) -> None:
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise invalid_argument(f"{field}[{i}]", f"token id {token} is outside [0, {vocab_size})")


def input_caps_error(what: str) -> MstarError:
    """Per-stream input caps: retrying the same input would exceed them again, so no RetryInfo."""
    return resource_exhausted(what, reason="INPUT_LIMIT", retry_after_s=None)


@dataclass
class InputBudget:
    """Per-stream input caps (shared by all requests of a Session). The servicer charges every
    message as it arrives, refused ones included, before any other work on it."""

    limits: Limits
    bytes_used: int = 0
    appends: int = 0

    def charge(self, size: int, is_append: bool) -> None:
        self.bytes_used += size
        self.appends += int(is_append)
        if self.bytes_used > self.limits.max_input_bytes:
            raise input_caps_error(f"more than {self.limits.max_input_bytes} input bytes on this stream")
        if self.appends > self.limits.max_appends:
            raise input_caps_error(f"more than {self.limits.max_appends} appends on this stream")
