"""Speculative decoding by a draft model: propose the tokens a smaller model with the same
tokenizer decodes greedily after the sequence (no torch, no grpc: the draft's runner is injected).

The draft runs in the same engine step, before the schedule (speculation.py's Speculator calls
``propose``): one pass computes every drafting sequence's tokens the draft has not seen yet (the
tokens accepted since its last proposal and the step's own last token) and gives its first
proposed token, then each further pass feeds the token just proposed and gives the next, all of
the step's drafting sequences batched into each pass. A greedy draft is a proposer that puts all
its mass on one token, so the target's verify step accepts exactly as it does prompt lookup's
proposals (speculation.py): greedy and sampled targets get the tokens they get without it.

The draft keeps its own KV cache and its own block pool (a second BlockManager, no prefix cache),
one *shadow* sequence per target sequence: the target's tokens, then the draft's own proposals.
A shadow's K/V stays valid as far as its tokens equal the target's: after a verify step the shadow
is cut back to the accepted length and the next pass recomputes from there. Shadows of requests
that ended are dropped with their blocks at the end of the engine iteration (Engine.run_once; a
preempted request keeps its shadow, whose K/V stays valid), and a sequence whose shadow cannot
get blocks drops it and proposes nothing that step (the draft never preempts).
A sequence seen for the first time (or after a preemption) catches up at most ``max_catch_up``
tokens a step, proposing nothing until it has, so a long prompt's catch-up is spread over steps
like a chunked prefill.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from services.generation.block_manager import BlockManager
from services.generation.sequence import Sequence, Timing


class DraftModelError(ValueError):
    """The draft model cannot propose for the target (a start-up error)."""


def check_draft(draft, target) -> None:
    """A draft must spell every token id as the target does and read every key (no window)."""
    if draft.vocab_size != target.vocab_size:
        raise DraftModelError(f"the draft model has {draft.vocab_size} tokens, the target {target.vocab_size}: "
                              "a draft model needs the target's tokenizer")
    dv, tv = getattr(draft, "vocabulary", None), getattr(target, "vocabulary", None)
    if dv is not None and tv is not None and dv.tokens != tv.tokens:
        raise DraftModelError("the draft model's tokens are spelled unlike the target's: "
                              "a draft model needs the target's tokenizer")
    if getattr(draft, "window", 0):
        raise DraftModelError("a draft model with sliding-window layers is not supported")


@dataclass
class _Shadow:
    seq: Sequence  # the draft's view: target tokens, then its proposals; its own block table
    num_synced: int  # the target's length when the shadow last copied its tokens


class DraftModel:
    name = "draft"

    def __init__(self, runner, num_blocks: int, block_size: int, max_catch_up: int = 256):
        """runner: the draft's ModelRunner (run, greedy_tokens, kv_cache) on its own num_blocks."""
        self.runner = runner
        kv_cache = getattr(runner, "kv_cache", None)
        self.blocks = BlockManager(num_blocks, block_size,
                                   bound_resident=bool(kv_cache is not None and kv_cache.resident_on_write))
        self.max_catch_up = max_catch_up
        self.shadows: dict[Hashable, _Shadow] = {}
        self.num_passes = 0  # draft model runs (each batches every drafting sequence)

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Drop the shadows (and free the blocks) of every request not in keys (those in flight)."""
        keep = set(keys)
        for key in [k for k in self.shadows if k not in keep]:
            self.blocks.free(self.shadows.pop(key).seq, keep_cache=False)

    def _sync(self, seq: Sequence) -> Sequence:
        """seq's shadow with the target's tokens, its K/V cut to where they still agree."""
        shadow = self.shadows.get(seq.key)
        if shadow is None:
            d = Sequence(seq.key, seq.seq_id, list(seq.token_ids), seq.params, seq.seed, Timing(0.0, 0.0))
            self.shadows[seq.key] = _Shadow(d, len(seq))
            return d
        d, s = shadow.seq, shadow.num_synced
        target = seq.token_ids
        agree = s
        while agree < min(len(d.token_ids), len(target)) and d.token_ids[agree] == target[agree]:
            agree += 1  # the proposals the verify step accepted
        d.num_computed_tokens = min(d.num_computed_tokens, agree)
        d.token_ids = list(target)
        shadow.num_synced = len(target)
        return d

    def propose(self, wants: list[tuple[Sequence, int]]) -> dict[Hashable, tuple[int, ...]]:
        """Up to `room` greedy draft tokens after each (seq, room) of decoding sequences; a
        sequence still catching up, or whose shadow got no blocks, gets none."""
        ready: list[tuple[Sequence, Sequence, int]] = []  # (target, shadow, room)
        catching: list[tuple[Sequence, int]] = []  # (shadow, tokens this pass)
        for seq, room in wants:
            d = self._sync(seq)
            behind = len(d) - d.num_computed_tokens  # >= 1: the target's last token is never fed yet
            n = min(behind, self.max_catch_up)
            extra = room - 1 if n == behind else 0  # the proposals fed back after the first
            if not self.blocks.can_allocate(d, n + extra):
                self.blocks.free(self.shadows.pop(seq.key).seq, keep_cache=False)
                continue
            self.blocks.allocate(d, n + extra)
            if n == behind:
                ready.append((seq, d, room))
            else:
                catching.append((d, n))
        if not ready and not catching:
            return {}
        live = self._pass([(seq, d, len(d) - d.num_computed_tokens) for seq, d, _ in ready]
                          + [(None, d, n) for d, n in catching])
        for j in range(1, max((room for _, _, room in ready), default=0)):
            live &= self._pass([(seq, d, 1) for seq, d, room in ready if room > j and seq.key in live])
        return {seq.key: tuple(d.token_ids[len(seq):len(seq) + room]) for seq, d, room in ready}

    def _pass(self, work: list[tuple[Sequence | None, Sequence, int]]) -> set[Hashable]:
        """One draft run computing n tokens of each (target, shadow, n); a shadow with a target
        (one not catching up) appends its greedy next token. A constrained request's draft picks
        among what its grammar allows after the tokens proposed so far, and stops proposing at a
        token the grammar ends with (or refuses: a row it allowed nothing in). Returns the keys of
        the shadows that may propose one more."""
        if not work:
            return set()
        sampling = [seq is not None for seq, _, _ in work]
        rows = self.runner.run([d for _, d, _ in work], [n for _, _, n in work], sampling)
        self.num_passes += 1
        drafting = [(seq, d) for seq, d, _ in work if seq is not None]
        grammars = [seq.grammar for seq, _ in drafting]
        ahead = [tuple(d.token_ids[len(seq):]) for seq, d in drafting] if any(grammars) else None
        tokens = iter(self.runner.greedy_tokens(rows, grammars, ahead) if drafting else ())
        live = set()
        for seq, d, n in work:
            d.num_computed_tokens += n
            if seq is None:
                continue
            token = next(tokens)
            proposed = (*d.token_ids[len(seq):], token)
            if seq.grammar is not None and not seq.grammar.is_open_after(proposed):
                if seq.grammar.legal_prefix(proposed) == len(proposed):
                    d.append_output(token)  # it ends the grammar: the last proposal
                continue
            d.append_output(token)
            live.add(seq.key)
        return live
