"""A model runner without a model, for transport benchmarks (``--null-engine``).

Same engine, scheduler, block manager and protocol; each step just sleeps ``step_time_s`` and
"samples" a fixed token for every sequence, so what gets measured is gRPC, framing and the
engine's bookkeeping, not matmuls.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.generation.outputs import SampleOutput
from services.generation.sequence import Sequence


@dataclass
class NullRows:
    """A null step's rows: one flag per sampling sequence (False: poisoned by an injected fault)."""

    is_finite: list[bool]


class NullRunner:
    def __init__(self, vocab_size: int = 49152, max_model_len: int = 8192, step_time_s: float = 0.0,
                 token_id: int = 42, hidden_size: int = 576):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_model_len = max_model_len
        self.eos_token_ids: tuple[int, ...] = ()
        self.vocabulary = None  # no structured output without a model
        self.step_time_s = step_time_s
        self.token_id = token_id

    def run(self, seqs: list[Sequence], num_new_tokens: list[int], sampling: list[bool],
            pooling: list[bool] | None = None, on_launch: Callable[[], None] | None = None) -> NullRows:
        if on_launch is not None:
            on_launch()
        if self.step_time_s:
            time.sleep(self.step_time_s)
        return NullRows([True] * sum(sampling))

    def sample(self, rows: NullRows, seqs: list[Sequence], indices: list[int], ahead=None) -> SampleOutput:
        return SampleOutput([self.token_id] * len(indices), [None] * len(indices), [rows.is_finite[i] for i in indices])

    def embedding(self, rows: NullRows, index: int, seq: Sequence) -> bytes:
        """The first basis vector of the requested width (unit length, like real ones)."""
        width = seq.params.embedding.dimensions or self.hidden_size
        return struct.pack(f"<{width}f", 1.0, *([0.0] * (width - 1)))

    def clear_blocks(self, block_ids: list[int]) -> None:
        return None

    def release_blocks(self, block_ids: list[int]) -> int:
        return 0
