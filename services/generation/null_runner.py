"""A model runner without a model, for transport benchmarks (``--null-engine``).

Same engine, scheduler, block manager and protocol; each step just sleeps ``step_time_s`` and
"samples" a fixed token for every sequence, so what gets measured is gRPC, framing and the
engine's bookkeeping, not matmuls.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from services.generation.sampler import SampleOutput
from services.generation.sequence import Sequence


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
            pooling: list[bool] | None = None, on_launch: Callable[[], None] | None = None) -> SampleOutput:
        if on_launch is not None:
            on_launch()
        if self.step_time_s:
            time.sleep(self.step_time_s)
        n = sum(sampling)
        out = SampleOutput([self.token_id] * n, [None] * n, [True] * n)
        # An embedding is the first basis vector of the requested width (unit length, like real ones).
        for seq, is_pooling in zip(seqs, pooling or [False] * len(seqs), strict=True):
            if is_pooling:
                width = seq.params.embedding.dimensions or self.hidden_size
                out.embeddings.append(struct.pack(f"<{width}f", 1.0, *([0.0] * (width - 1))))
        return out

    def clear_blocks(self, block_ids: list[int]) -> None:
        return None

    def release_blocks(self, block_ids: list[int]) -> int:
        return 0
