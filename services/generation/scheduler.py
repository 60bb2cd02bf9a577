"""Continuous batching: which sequences compute how many tokens this step (no torch, no grpc).

Each step has a token budget (max_num_batched_tokens). Running sequences go first, oldest first,
then waiting sequences are admitted in arrival order while the budget, max_num_seqs and the free
blocks allow. A decode takes one token. A prefill (a prompt, a chunk of a long one, a recompute,
streamed input) takes what is left of the budget, minus what it leaves for the sequences behind
it (running, or waiting with a seat free):
- one token for each decode, so a long prefill never stalls a stream;
- fairness: while prefills with fewer tokens left than it wait behind it, its chunk is capped at
  ``long_prefill_token_threshold`` tokens and they get up to the rest of the budget. A short chat
  that arrives while a 6k-token prompt prefills is admitted in the next step and gets its first
  token in it, instead of after the whole prompt; and that step is about half as long as a full
  chunk (on CPU a step's time grows with its tokens, and a chunk deep into a long prompt is the
  dearest kind), so the short chat waits about one chunk's time. The long prefill still computes
  the threshold (less a token a decode) every step, so any number of short arrivals cannot starve
  it, and on CPU it loses little: its tokens cost the same per token in a smaller step. Equal or
  longer prefills behind it are not interleaved (first come, first served among them: sharing
  would only delay both). Threshold 0 turns this off (every prefill takes what is left).
When a running sequence needs a block and none is free, the newest running sequence
is preempted: its blocks go back (their prefix hashes stay, so the recompute often hits the cache)
and it waits at the head of the queue to recompute its prompt + output later.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from services.generation.block_manager import BlockManager
from services.generation.image_inputs import MAX_NEW_IMAGES_PER_STEP
from services.generation.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    # A prefill's chunk while shorter prefills wait behind it (the module's docstring); None: half
    # the budget; 0 or the budget: no cap (first come, first served).
    long_prefill_token_threshold: int | None = None

    @property
    def fairness_cap(self) -> int | None:
        """The resolved threshold, or None when it caps nothing."""
        threshold = self.long_prefill_token_threshold
        if threshold is None:
            threshold = self.max_num_batched_tokens // 2
        return threshold if 0 < threshold < self.max_num_batched_tokens else None


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # parallel to seqs
    preempted: list[Sequence] = field(default_factory=list)
    unfittable: list[Sequence] = field(default_factory=list)  # can never fit in the pool

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        if config.max_num_seqs < 1 or config.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got {config}")
        if (config.long_prefill_token_threshold or 0) < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {config}")
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # cumulative
        self._cap = config.fairness_cap

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_work(self) -> bool:
        # tuple() copies atomically under the GIL, so a watchdog thread may call this too.
        return any(s.num_schedulable_tokens for s in tuple(self.running)) or any(
            s.num_schedulable_tokens for s in tuple(self.waiting)
        )

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence, keep_cache: bool = True) -> None:
        """Take a finished, failed or aborted sequence out and give its blocks back."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq, keep_cache=keep_cache)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, budget, running_behind=i + 1, waiting_from=0)
            if seq.proposal:  # speculation.py: verified only as far as the budget goes, never preempting
                if n > 1 and not self.block_manager.can_allocate(seq, n):
                    n = 1
                seq.proposal = seq.proposal[:max(n - 1, 0)]
            if n == 0:
                i += 1
                continue
            if self._make_room(seq, n, batch):
                self.block_manager.allocate(seq, n)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
                i += 1
            # else: seq itself was preempted (or marked unfittable); running[i] is now the next one
        if batch.preempted or batch.unfittable:
            return batch  # no admissions while memory is short: they would be preempted next step
        self._admit(batch, budget)
        return batch

    def _chunk(self, seq: Sequence, budget: int, running_behind: int, waiting_from: int) -> int:
        """How many tokens seq computes this step: what is left of the budget, less what a prefill
        leaves for the sequences behind it (the module's docstring): the running ones from
        running[running_behind], then the waiting ones from waiting[waiting_from], one per free seat."""
        need = seq.num_schedulable_tokens
        if need <= 1:  # a decode: its token and what it verifies (speculation.py)
            return min(need + len(seq.proposal) if need else 0, budget)
        seats = self.config.max_num_seqs - len(self.running) - waiting_from
        waiting = (s for s in itertools.islice(self.waiting, waiting_from, None) if s.num_schedulable_tokens)
        decodes = shorter = 0
        for other in itertools.chain(itertools.islice(self.running, running_behind, None),
                                     itertools.islice(waiting, max(seats, 0))):
            behind = other.num_schedulable_tokens
            if behind == 1:
                decodes += 1
            elif behind < need:
                shorter += behind
        limit = budget - decodes
        if shorter and self._cap is not None:
            limit = min(limit - min(shorter, self.config.max_num_batched_tokens - self._cap), self._cap)
        n = max(0, min(need, limit))
        if seq.images is not None and n and len(self.running) + len(self.waiting) > 1:
            # Others share the engine: a step encodes at most one new image of this sequence's (an
            # image costs an encoder pass over its tiles, far more than its tokens' decoder rows),
            # so their decode waits for one image's encoding at most (alone, it encodes at once).
            n = seq.images.chunk_limit(seq.num_computed_tokens, n, MAX_NEW_IMAGES_PER_STEP)
        return n

    def _make_room(self, seq: Sequence, n: int, batch: ScheduledBatch) -> bool:
        """Preempt from the tail until seq's next n tokens fit. False if seq itself had to go."""
        while not self.block_manager.can_allocate(seq, n):
            victim = self.running[-1]
            if victim is seq and len(self.running) == 1:
                # Alone and still short: only an append that outgrew the pool gets here.
                self.running.pop()
                self.block_manager.free(seq)
                seq.reset_for_recompute()
                seq.status = SequenceStatus.FINISHED
                batch.unfittable.append(seq)
                return False
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        skipped: list[Sequence] = []  # streaming inputs with nothing to compute yet keep their place
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_schedulable_tokens == 0:
                skipped.append(self.waiting.popleft())
                continue
            # An embedding request pools the hidden states of every prompt token, which cached
            # blocks do not hold: it computes them all (its own blocks still feed the cache).
            num_cached = 0 if seq.is_embedding else self.block_manager.allocate_cached_prefix(seq)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            n = self._chunk(seq, budget, running_behind=len(self.running), waiting_from=1)
            if n and not self.block_manager.can_allocate(seq, n):
                self.block_manager.free(seq)
                seq.reset_for_recompute()
                if not self.running:  # the whole pool is free and still too small
                    self.waiting.popleft()
                    seq.status = SequenceStatus.FINISHED
                    batch.unfittable.append(seq)
                    continue
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if n:
                self.block_manager.allocate(seq, n)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
        self.waiting.extendleft(reversed(skipped))
