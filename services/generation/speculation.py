"""Speculative decoding: propose tokens for decoding sequences and let one step verify them (no
torch, no grpc). Two proposers: prompt lookup (``ngram``: the tokens that followed the last
occurrence of the sequence's own latest n-gram) and a draft model (``draft``: a smaller model's
greedy continuation, draft.py).

A verify step feeds a decoding sequence its last token *and* k proposed tokens (the scheduler
counts 1 + k tokens for it); the model's logits at those k + 1 positions give, for greedy decoding,
the tokens non-speculative decoding would have produced one step at a time, as long as each
proposal matched the token before it. postprocess.py accepts the longest matching prefix plus the
token after it (so a step yields 1 to k + 1 tokens, identical to decoding them one by one); the
engine then sets the computed count to the accepted length, and the K/V written for rejected
proposals is overwritten by the next step (blocks are never registered in the prefix cache before
their tokens are final).

Every generating request may speculate: greedy, sampled, with penalties or a grammar. The sampler
draws verify row j as decoding would draw the token at that position if the first j proposals
were the sequence's (its Gumbel noise is a pure function of (seed, output index, token), its
penalties count those proposals, its grammar mask comes after them: sampler.py), so the accepted
rows are exactly the tokens one-token-a-step decoding gives, seed for seed. For a sampled request
that *is* the standard rejection-sampling rule for a proposer that puts all its mass on one
token: the proposal is kept with probability p(x) (the draw equals it), and a rejected position
takes the draw, which is distributed as p restricted to the other tokens, i.e. norm(max(0, p - q)).
A grammar's proposal is cut to the tokens the matcher accepts (SequenceGrammar.legal_prefix);
the matcher advances only on accepted rows (its tentative steps are rolled back).

Speculation stops while more sequences decode than ``max_rows`` (a request's own `speculative:
true` goes on past it; false turns it off): a batch that large is compute-bound on a CPU, and
verifying k extra positions per row then costs more than the weight reads it saves
(bench/speculation.py). Each sequence's proposal length adapts to what it gets accepted: one more
after a step that took them all, half after one that took none (at least 1). And a sequence whose
proposals rarely hold (a moving average of the accepted share below ``min_acceptance``) proposes
only one token every ``probe_every`` steps until one holds again: a verify row costs a fraction of
a 1-row step (~0.1-0.15 on the 2-core CPU), so below that share speculation makes the request
slower (bench/speculation.py's ordinary workload: best at 0.15 of 0, 0.15 and 0.25, greedy and
sampled).

Exactness needs a verify row to be computed with the same arithmetic as a decode row. The runner
hands each verify row to the kernels as a single-row sequence (model_runner.prepare), so attention
sees decode rows; the matmuls must treat rows alike too, which the CPU kernels' quant_matmul does
and a dense F.linear (a 5-row GEMM blocked unlike a 1-row GEMV) does not. So ``auto`` turns
speculation on where every matmul is block codes on the CPU kernels
(ModelRunner.verify_rows_exact) and leaves it off elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.generation.draft import DraftModel
from services.generation.sequence import Sequence

MODES = ("auto", "off", "ngram", "draft")


@dataclass(frozen=True)
class SpeculationConfig:
    mode: str = "auto"  # "ngram" (prompt lookup) | "draft" (a draft model) | "off" | "auto": ngram where verify rows are exact
    num_tokens: int = 4  # the most tokens proposed per sequence and step (each adapts below it)
    max_ngram: int = 3  # the longest suffix looked up; shorter ones are tried after it
    min_ngram: int = 1
    max_rows: int = 4  # decoding sequences above which no one speculates
    min_acceptance: float = 0.15  # accepted share (moving average) below which a sequence only probes
    probe_every: int = 8  # steps between one-token probes of such a sequence

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"speculative must be one of {MODES}, got {self.mode!r}")
        if self.num_tokens < 1 or not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("speculation needs num_tokens >= 1 and 1 <= min_ngram <= max_ngram")


def propose_ngram(token_ids: list[int], k: int, max_ngram: int, min_ngram: int) -> tuple[int, ...]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of
    token_ids (max_ngram down to min_ngram tokens long) that occurs earlier; () when none does."""
    n_tokens = len(token_ids)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        suffix = token_ids[n_tokens - n:]
        first = suffix[0]
        # Scan backwards from the latest possible start (the suffix itself excluded).
        for start in range(n_tokens - n - 1, -1, -1):
            if token_ids[start] == first and token_ids[start:start + n] == suffix:
                follow = token_ids[start + n:start + n + k]
                if follow:
                    return tuple(follow)
    return ()


def can_speculate(seq: Sequence) -> bool:
    """A generating request (not an embedding) that did not turn speculation off."""
    return seq.params.embedding is None and seq.params.speculative is not False


class Speculator:
    """Sets each eligible decoding sequence's `proposal` before the scheduler runs; counts what
    was proposed and accepted (EngineStats)."""

    def __init__(self, config: SpeculationConfig, max_model_len: int, verify_rows_exact: bool,
                 draft: DraftModel | None = None):
        if (config.mode == "draft") != (draft is not None):
            raise ValueError("speculative decoding by a draft model needs --speculative draft and a --draft-model")
        self.config = config
        self.max_model_len = max_model_len
        self.draft = draft
        self.active = config.mode in ("ngram", "draft") or (config.mode == "auto" and verify_rows_exact)
        self.proposer = "draft" if draft is not None else "ngram"  # the metrics' label

    @staticmethod
    def adapt(seq: Sequence, proposed: int, accepted: int, most: int) -> None:
        """The sequence's next proposal length (one more after a full acceptance, half after none)
        and its accepted share's moving average (a quarter weight on this step)."""
        if accepted == proposed:
            seq.spec_tokens = min(most, proposed + 1)
        elif accepted == 0:
            seq.spec_tokens = max(1, proposed // 2)
        seq.spec_rate = 0.75 * seq.spec_rate + 0.25 * accepted / proposed

    def propose(self, running: list[Sequence]) -> None:
        decoding = [s for s in running if s.is_input_done and s.num_output_tokens and s.num_schedulable_tokens == 1]
        for seq in running:
            seq.proposal = ()
        if not self.active:
            return
        c = self.config
        crowded = len(decoding) > c.max_rows
        wants: list[tuple[Sequence, int]] = []  # (seq, the most tokens it may propose)
        for seq in decoding:
            if not can_speculate(seq) or (crowded and seq.params.speculative is not True):
                continue
            # Room: the step's own token is the first output; a proposal never runs past
            # max_tokens or the context (its last token would be fed back beyond them).
            room = min(seq.spec_tokens or c.num_tokens, seq.max_tokens - seq.num_output_tokens - 1, self.max_model_len - len(seq) - 1)
            if seq.spec_rate < c.min_acceptance:  # its proposals rarely hold: probe now and then
                seq.spec_idle += 1
                if seq.spec_idle < c.probe_every:
                    continue
                seq.spec_idle, room = 0, min(room, 1)
            if room > 0:
                wants.append((seq, room))
        if self.draft is not None:
            drafted = self.draft.propose(wants)
        for seq, room in wants:
            if self.draft is not None:
                proposal = drafted.get(seq.key, ())
            else:
                proposal = propose_ngram(seq.token_ids, room, c.max_ngram, c.min_ngram)
            if proposal and seq.grammar is not None:
                proposal = proposal[:seq.grammar.legal_prefix(proposal)]
            seq.proposal = proposal
