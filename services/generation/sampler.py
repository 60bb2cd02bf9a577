"""Turn a step's logits into tokens: penalties, logprobs, then KernelOps.sample for the draw.

Per row (one per sequence that samples this step), in order:
  1. rows with non-finite logits are reported and given a harmless placeholder token; the engine
     fails exactly those requests (their batch-mates are unaffected: every op here is row-wise);
  2. rows with a structured-output grammar: every token the grammar does not allow next gets -inf
     (grammar/bitmask.py), so everything below, logprobs included, sees the masked distribution;
  3. logprobs (when asked): log_softmax of the (masked) logits, the sampled token's value and the
     top-n, before penalties and temperature, as vLLM reports them;
  4. penalties on the logits: repetition (CTRL/HF: divide positive logits, multiply negative ones,
     for tokens in prompt or output), frequency (minus f * count in output) and presence (minus p
     once if in output);
  5. KernelOps.sample: temperature, top-k, top-p, min-p and a seeded Gumbel-max draw whose noise is
     a pure function of (seed, index of the output token, vocab index), so a seeded request gives
     the same tokens alone, in any batch, and after a preemption.
A batch whose rows are all plain greedy (temperature 0, no grammar, logprobs or penalties) takes
one op instead, KernelOps.greedy: the argmax and step 1's finiteness check in one pass.

A speculative verify step (speculation.py) gives a sequence several rows; row j comes after the
first j proposed tokens (`ahead`), and is drawn exactly as decoding would draw the token there if
those tokens were the sequence's: its noise at output index num_output_tokens + j, its penalties
counting them, its grammar mask after accepting them (then rolled back). So an accepted row's token
is the token one-token-a-step decoding gives, for sampled and constrained requests too.
"""

from __future__ import annotations

import torch

from kernels.dispatch import KernelOps
from services.generation.grammar.bitmask import TokenMasks
from services.generation.outputs import SampleOutput, TokenLogprobs
from services.generation.sequence import Sequence


class Sampler:
    def __init__(self, ops: KernelOps, device: torch.device):
        self.ops = ops
        self.device = device
        self.token_masks = TokenMasks()

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence],
                 ahead: list[tuple[int, ...]] | None = None) -> SampleOutput:
        """logits [S, V] fp32, one row per entry of seqs; ahead[i]: the proposed tokens row i
        comes after (None: none for every row)."""
        if all(_plain_greedy(s) for s in seqs):
            # Steps 1 and 5 in one op (steps 2-4 do nothing here): the general path's sum, isfinite,
            # host copy and six parameter tensors cost 0.5 ms of a 1-row CPU step, run as they are
            # right after the weights streamed through the caches (bench: 0.1 ms with warm caches).
            drawn = self.ops.greedy(logits).tolist()  # -1: the row was not finite
            return SampleOutput([max(t, 0) for t in drawn], [None] * len(seqs), [t >= 0 for t in drawn])
        # A row's sum is finite iff all its logits are (|logit| * V stays far below fp32's max):
        # one reduction instead of isfinite + all (0.7 ms at V = 49,152 on the 2-core box).
        finite = torch.isfinite(logits.sum(dim=-1))  # [S]
        is_finite = finite.tolist()
        if not all(is_finite):
            logits = torch.where(finite[:, None], logits, torch.zeros((), device=logits.device))
        grammars = [s.grammar for s in seqs]
        if any(g is not None for g in grammars):
            self.token_masks.apply(logits, grammars, ahead)
        params = [s.params for s in seqs]
        want_logprobs = [p.logprobs is not None for p in params]
        log_probs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None  # [S, V]
        if any(p.has_penalties for p in params):
            logits = apply_penalties(logits, seqs, ahead)

        def column(values, dtype):
            return torch.tensor(values, dtype=dtype, device=self.device)

        tokens = self.ops.sample(
            logits,
            column([p.temperature for p in params], torch.float32),
            column([p.top_k for p in params], torch.int64),
            column([p.top_p for p in params], torch.float32),
            column([p.min_p for p in params], torch.float32),
            column([s.seed for s in seqs], torch.int64),
            column([s.num_output_tokens + len(a) for s, a in zip(seqs, ahead or [()] * len(seqs), strict=True)],
                   torch.int64),
        )  # [S] int64
        token_ids = tokens.tolist()
        logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
        if log_probs is not None:
            logprobs = gather_logprobs(log_probs, tokens, [p.logprobs for p in params])
        return SampleOutput(token_ids, logprobs, is_finite)


def _plain_greedy(seq: Sequence) -> bool:
    """Greedy with nothing between the logits and the argmax: no grammar, logprobs or penalties."""
    p = seq.params
    return p.temperature == 0 and seq.grammar is None and p.logprobs is None and not p.has_penalties


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence], ahead: list[tuple[int, ...]] | None = None) -> torch.Tensor:
    """Penalised copy of logits [S, V]; rows without penalties are untouched. A row's output is
    its sequence's followed by its `ahead` tokens."""
    rows = [i for i, s in enumerate(seqs) if s.params.has_penalties]
    extra = [list(ahead[i]) if ahead else [] for i in rows]
    vocab = logits.shape[-1]
    out = logits.clone()
    sub = out[rows]  # [R, V]
    device = logits.device

    def counts(id_lists: list[list[int]]) -> torch.Tensor:  # [R, V] occurrences per token
        width = max(1, max(len(ids) for ids in id_lists))
        padded = torch.full((len(id_lists), width), vocab, dtype=torch.int64, device=device)
        for r, ids in enumerate(id_lists):
            if ids:
                padded[r, : len(ids)] = torch.tensor(ids, dtype=torch.int64, device=device)
        c = torch.zeros(len(id_lists), vocab + 1, device=device)  # column V absorbs the padding
        c.scatter_add_(1, padded, torch.ones_like(padded, dtype=c.dtype))
        return c[:, :vocab]

    chosen = [seqs[i] for i in rows]
    output_counts = counts([s.output_token_ids + e for s, e in zip(chosen, extra, strict=True)])  # [R, V]
    rep = torch.tensor([s.params.repetition_penalty for s in chosen], device=device)[:, None]  # [R, 1]
    if bool((rep != 1.0).any()):
        seen = counts([s.token_ids + e for s, e in zip(chosen, extra, strict=True)]) > 0  # prompt + output
        penalised = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, penalised, sub)
    freq = torch.tensor([s.params.frequency_penalty for s in chosen], device=device)[:, None]
    pres = torch.tensor([s.params.presence_penalty for s in chosen], device=device)[:, None]
    sub = sub - freq * output_counts - pres * (output_counts > 0).to(sub.dtype)
    out[rows] = sub
    return out


def gather_logprobs(log_probs: torch.Tensor, tokens: torch.Tensor, top_n: list[int | None]) -> list:
    """The sampled token's logprob and the top-n alternatives for each row that asked. Alternatives a
    grammar ruled out (logprob -inf) are left out, so a constrained row may list fewer than n."""
    chosen = log_probs.gather(1, tokens[:, None]).squeeze(1).tolist()  # [S]
    k = max((n or 0) for n in top_n)  # 0: only the sampled tokens' own logprobs were asked for
    top_values, top_ids = log_probs.topk(k, dim=-1) if k else (log_probs[:, :0], log_probs[:, :0].long())
    top_values, top_ids = top_values.tolist(), top_ids.tolist()  # [S][k]
    out: list[TokenLogprobs | None] = []
    for r, n in enumerate(top_n):
        if n is None:
            out.append(None)
            continue
        m = sum(1 for v in top_values[r][:n] if v != float("-inf"))
        out.append(TokenLogprobs(chosen[r], top_ids[r][:m], top_values[r][:m]))
    return out
