"""A step's per-request work: from the model's rows to each request's outcome, behind the fault boundary.

After the model ran over the batch (shared work: a fault there is fatal), what remains is done
for each request on its own: draw its token and logprobs (the sampler, batched), advance its
grammar, append the token and decide whether it finished, or pool its embedding. Each of these
stages runs through the engine's `FaultBoundary` (services/common/fault_boundary.py), so a fault
in one request's work becomes that request's error and its batch-mates' outcomes are exactly
what they would have been. Nothing here touches the scheduler or the block manager: the engine
applies the outcomes (finishing, failing, freeing) itself. No torch, no grpc.

Stages (the names the boundary logs, counts and the fault hook sees): "sample", "grammar",
"token" and "pool"; the engine adds "finish" (the Completion) and the servicer "output" (frames).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common import errors
from services.common.fault_boundary import FaultBoundary, RequestFault
from services.common.finish import FinishReason
from services.generation.outputs import SampleOutput, TensorEvent, TokenEvent
from services.generation.sequence import Sequence


@dataclass
class RowOutcome:
    """What one request's work in a step produced: a token (maybe finishing it), an embedding
    (which finishes it), or the error it fails with."""

    seq: Sequence
    token: TokenEvent | None = None
    tensor: TensorEvent | None = None
    finish_reason: FinishReason | None = None
    error: errors.MstarError | None = None


class Postprocess:
    def __init__(self, runner, grammars, boundary: FaultBoundary):
        """runner: sample(rows, seqs, indices), embedding(rows, index, seq), eos_token_ids,
        max_model_len; grammars: GrammarRequests (advance)."""
        self.runner = runner
        self.grammars = grammars
        self.boundary = boundary

    def __call__(self, rows, seqs: list[Sequence], sampling: list[int], pooling: list[bool],
                 now: float) -> list[RowOutcome]:
        """The outcomes of the sequences that sample or pool in this step, in batch order.
        sampling[i]: how many logits rows seq i has (0: none; 1 + len(seq.proposal) for a verify
        step, speculation.py), which may give it several token outcomes, in output order."""
        sampled = [seq for seq, n in zip(seqs, sampling, strict=True) for _ in range(int(n))]
        # Row j of a verify step draws as if the first j proposed tokens were already the
        # sequence's: its seed position, penalties and grammar state (sampler.py).
        ahead = [seq.proposal[:j] for seq, n in zip(seqs, sampling, strict=True) for j in range(int(n))]

        def draw(indices: list[int]) -> list[tuple]:
            result: SampleOutput = self.runner.sample(rows, [sampled[i] for i in indices], indices,
                                                      [ahead[i] for i in indices])
            return list(zip(result.token_ids, result.logprobs, result.is_finite, strict=True))

        drawn = iter(self.boundary.each("sample", [seq.key for seq in sampled], draw))
        outcomes, pooled = [], 0
        for seq, n, is_pooling in zip(seqs, sampling, pooling, strict=True):
            if is_pooling:
                data = self.boundary.call("pool", seq.key, self.runner.embedding, rows, pooled, seq)
                pooled += 1
                outcomes.append(self._embedding(seq, data))
            elif n:
                outcomes.extend(self._accepted(seq, [next(drawn) for _ in range(int(n))], now))
        return outcomes

    def _accepted(self, seq: Sequence, drawn: list, now: float) -> list[RowOutcome]:
        """Row j's token counts only if every proposal before it was what row j - 1 produced: the
        longest matching prefix plus the token after it, an outcome that finishes or fails the
        request being its last. Each row's token is the one decoding one token a step would draw
        there (greedy, or seeded sampling: speculation.py), so this is exact for both."""
        outcomes = []
        for j, row in enumerate(drawn):
            outcome = self._token(seq, row, now)
            outcomes.append(outcome)
            if outcome.error is not None or outcome.finish_reason is not None:
                break
            if j == len(seq.proposal) or seq.proposal[j] != outcome.token.token_id:
                break
        return outcomes

    def _embedding(self, seq: Sequence, data) -> RowOutcome:
        if isinstance(data, RequestFault):
            return RowOutcome(seq, error=data.error)
        if data is None:
            return RowOutcome(seq, error=errors.internal(
                "the model produced a non-finite hidden state", "NON_FINITE_LOGITS"))
        return RowOutcome(seq, tensor=TensorEvent(seq.key, data, (len(data) // 4,)), finish_reason=FinishReason.END)

    def _token(self, seq: Sequence, drawn, now: float) -> RowOutcome:
        if isinstance(drawn, RequestFault):
            return RowOutcome(seq, error=drawn.error)
        token, logprobs, is_finite = drawn
        if not is_finite:
            return RowOutcome(seq, error=errors.internal(
                "the model produced non-finite logits", "NON_FINITE_LOGITS"))
        if seq.grammar is not None:
            error = self.boundary.call("grammar", seq.key, self.grammars.advance, seq, token)
            if error is not None:
                return RowOutcome(seq, error=error.error if isinstance(error, RequestFault) else error)
        outcome = self.boundary.call("token", seq.key, self._take, seq, token, logprobs, now)
        return RowOutcome(seq, error=outcome.error) if isinstance(outcome, RequestFault) else outcome

    def _take(self, seq: Sequence, token: int, logprobs, now: float) -> RowOutcome:
        """The token joins the request's output; did that finish it?"""
        seq.append_output(token)
        seq.timing.first_token = seq.timing.first_token or now
        seq.timing.last_token = now
        event = TokenEvent(seq.key, token, seq.num_output_tokens - 1, logprobs)
        return RowOutcome(seq, token=event, finish_reason=self._finish_reason(seq, token))

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self.runner.eos_token_ids):
            return FinishReason.END
        if seq.grammar is not None and seq.grammar.is_terminated:
            return FinishReason.END  # the grammar ended (even with ignore_eos: it allows nothing else)
        if seq.num_output_tokens >= seq.max_tokens or len(seq) >= self.runner.max_model_len:
            return FinishReason.LENGTH
        return None
