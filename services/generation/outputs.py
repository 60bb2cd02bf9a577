"""What the engine hands back after each step (plain dataclasses; the servicer makes protobuf)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from services.common.errors import MstarError
from services.common.finish import FinishReason
from services.generation.sequence import Sequence


@dataclass
class TokenLogprobs:
    logprob: float
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass
class SampleOutput:
    """What the sampler drew for the rows it was given."""

    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]  # one per row; None where not asked
    is_finite: list[bool]  # False: the row's logits had NaN/Inf; its token is meaningless


@dataclass
class TokenEvent:
    key: Hashable
    token_id: int
    index: int  # position within the request's output, from 0
    logprobs: TokenLogprobs | None = None


@dataclass
class TensorEvent:
    """An embedding request's result: float32 little-endian bytes of shape `shape`."""

    key: Hashable
    data: bytes
    shape: tuple[int, ...]


@dataclass
class Completion:
    key: Hashable
    finish_reason: FinishReason  # END, LENGTH or CANCELLED (stop strings are preprocess's)
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    # Milliseconds.
    queue_ms: float
    prefill_ms: float
    ttft_ms: float
    decode_ms: float
    e2e_ms: float
    preempted_ms: float
    # Unix seconds.
    arrival_time: float
    ingest_time: float
    finish_time: float


def completion_of(seq: Sequence, reason: FinishReason, now: float, wall_offset: float) -> Completion:
    """A finished request's Completion; `now` is monotonic, wall_offset = time.time() - monotonic()."""
    t = seq.timing
    first = t.first_token or now
    ms = 1000.0
    return Completion(
        key=seq.key,
        finish_reason=reason,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_cached_tokens=seq.num_cached_tokens,
        num_output_tokens=seq.num_output_tokens,
        queue_ms=((t.first_scheduled or now) - t.arrival) * ms,
        prefill_ms=t.prefill_s * ms,
        ttft_ms=(first - t.ingest) * ms if t.first_token else 0.0,
        decode_ms=((t.last_token or first) - first) * ms,
        e2e_ms=(now - t.arrival) * ms,
        preempted_ms=t.preempted_s * ms,
        arrival_time=t.arrival + wall_offset,
        ingest_time=t.ingest + wall_offset,
        finish_time=now + wall_offset,
    )


@dataclass
class Failure:
    key: Hashable
    error: MstarError


@dataclass
class StepOutput:
    step: int
    num_batched_tokens: int = 0
    tokens: list[TokenEvent] = field(default_factory=list)
    # Requests that only prefilled in this step (a chunk of a long or still-streaming prompt):
    # no token yet, but progress (the servicer sends them a SIGNAL_HEARTBEAT frame).
    prefilling: list[Hashable] = field(default_factory=list)
    # Embeddings of the requests that finished prefilling in this step (each also in `completed`).
    tensors: list[TensorEvent] = field(default_factory=list)
    completed: list[Completion] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tokens or self.prefilling or self.tensors or self.completed or self.failed)
