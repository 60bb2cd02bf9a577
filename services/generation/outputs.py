"""What the engine hands back after each step (plain dataclasses; the servicer makes protobuf)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from services.common.errors import MstarError
from services.generation.sampler import TokenLogprobs

FINISH_STOP = "stop"  # EOS, or a stop token id
FINISH_LENGTH = "length"  # max_tokens or the context length
FINISH_CANCELLED = "cancelled"  # aborted by the client


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
    finish_reason: str
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
    warnings: list[str] = field(default_factory=list)


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
