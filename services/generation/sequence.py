"""Per-request state of the engine (plain Python: no torch, no grpc).

A sequence's tokens are its prompt followed by its output. Its KV cache covers the first
``num_computed_tokens`` of them. One rule drives prefill, chunked prefill, streamed input
(ClientAppend) and decode alike: each step computes some of the not-yet-computed tokens, and when
a step reaches the last token of a sequence whose input has ended, a new token is sampled. While
the input is still streaming, the last prompt token is held back, so the step that sees the end
of the input has a token left to compute and produces the first output at once. The same hold-back
keeps a structured-output request from sampling while its grammar compiles: its prompt prefills,
its batch-mates keep stepping, and its first token is sampled in the first step after the grammar
is ready.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from services.generation.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Timing:
    """Wall-clock marks (time.monotonic seconds) and accumulated durations of one request."""

    arrival: float
    ingest: float  # when the input was complete (arrival, or the append that ended it)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    prefill_s: float = 0.0  # time in steps that computed its prompt tokens
    preempted_s: float = 0.0
    preempted_at: float | None = None


@dataclass
class Sequence:
    key: Hashable  # the caller's key, e.g. (stream_id, request_id); unique among live sequences
    seq_id: int  # engine-wide admission order
    token_ids: list[int]
    params: SamplingParams
    seed: int
    timing: Timing
    is_input_done: bool = True
    max_tokens: int = 0  # resolved when the input ends (the request's own limit, clamped to fit)
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0  # tokens whose K/V are in this sequence's blocks
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first admission
    num_preemptions: int = 0
    block_table: list[int] = field(default_factory=list)
    num_passed_blocks: int = 0  # leading blocks its sliding-window layers will never read again
    block_hashes: list[int] = field(default_factory=list)  # hashes of its full, computed blocks
    status: SequenceStatus = SequenceStatus.WAITING
    # Structured output: grammar/matcher.SequenceGrammar once compiled (typed Any: this module stays
    # torch- and xgrammar-free); is_waiting_for_grammar while the compile runs.
    grammar: Any = None
    is_waiting_for_grammar: bool = False
    # Embedding requests with mean pooling: the model runner's running sum of the final hidden
    # states of the prompt tokens computed so far (a tensor; typed Any to stay torch-free).
    pooled: Any = None
    # Speculative decoding (speculation.py): tokens this step verifies after its last token.
    proposal: tuple[int, ...] = ()
    spec_tokens: int = 0  # its proposal length now (0: the configured most; it adapts)
    spec_rate: float = 1.0  # moving average of its proposals' accepted share
    spec_idle: int = 0  # steps without a proposal since its share fell below the policy's floor
    # A vision-language request's images (image_inputs.SequenceImages; typed Any: torch-free).
    images: Any = None

    def __post_init__(self):
        self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_schedulable_tokens(self) -> int:
        """Tokens a step could compute now (the last token waits for the input's end and the grammar)."""
        n = len(self.token_ids) - self.num_computed_tokens
        if not self.is_input_done or self.is_waiting_for_grammar:
            n -= 1
        return max(n, 0)

    def is_sampling_step(self, num_new_tokens: int) -> bool:
        """True when computing num_new_tokens more reaches the end of a complete input."""
        return self.is_input_done and self.num_computed_tokens + num_new_tokens == len(self.token_ids)

    @property
    def is_embedding(self) -> bool:
        """Prefill only: the step that computes its last prompt token pools instead of sampling."""
        return self.params.embedding is not None

    def block_key(self, index: int, block_size: int) -> tuple:
        """What identifies block `index`'s contents in the prefix cache: its tokens, and the
        content hashes of the images with a token in it (image_inputs.py)."""
        start = index * block_size
        tokens = tuple(self.token_ids[start:start + block_size])
        if self.images is None or start >= self.num_prompt_tokens:
            return tokens
        return tokens + self.images.salt(start, start + block_size)

    def is_prefill_step(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    def append_prompt(self, token_ids: list[int]) -> None:
        self.token_ids.extend(token_ids)
        self.num_prompt_tokens = len(self.token_ids)

    def append_output(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        """Preempted: its blocks were taken back; it will prefill prompt + output again."""
        self.num_computed_tokens = 0
        self.block_table = []
        self.num_passed_blocks = 0
        self.proposal = ()
        self.pooled = None  # the recompute pools every prompt token again
        self.status = SequenceStatus.WAITING
