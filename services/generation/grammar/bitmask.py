"""Mask the logits of constrained rows to the tokens their grammar allows next, in place.

Per step: each constrained row's matcher fills its row of a packed int32 bitmask [S, ceil(V/32)]
(bit v of a row set = token v allowed; xgrammar's layout, bit order little-endian within each
int32), then every disallowed logit becomes -inf, before penalties, logprobs and the draw, so
all samplers and the reported logprobs see the masked distribution. Rows whose grammar allows
every token (fill returns False) and unconstrained rows are not touched.

Applying on CPU, per row by what the mask looks like (docs/benchmarks-grammar.md): xgrammar's CPU
kernel skips all-ones words and writes -inf token by token, so it is nearly free where almost
everything is allowed (inside a JSON string) and ~4x slower than needed where almost everything is
blocked (between JSON tokens). Rows with more than a quarter of their words all-zero go through a
[256, 8] table of "blocked" flags instead: each bitmask byte indexes it, one index_select unpacks
the row and one masked_fill_ applies it, at a cost independent of the mask. On CUDA the bitmask
goes to the device and xgrammar's Triton kernel applies it.
"""

from __future__ import annotations

import time

import torch

from services.generation.grammar.xgr import xgrammar

# _BLOCKED[b, i]: bit i of byte value b is clear, i.e. the token at that bit is not allowed.
_BLOCKED = ((torch.arange(256, dtype=torch.int32)[:, None] >> torch.arange(8, dtype=torch.int32)) & 1) == 0


class TokenMasks:
    def __init__(self):
        self._bitmask: torch.Tensor | None = None  # [rows, words] int32 on CPU, grown on demand
        self.fill_seconds = 0.0  # cumulative (bench/grammar.py reads them)
        self.apply_seconds = 0.0

    def apply(self, logits: torch.Tensor, grammars: list, ahead: list[tuple[int, ...]] | None = None) -> None:
        """logits [S, V] fp32; grammars[i] is row i's SequenceGrammar or None (unconstrained);
        ahead[i]: tokens row i's mask comes after (a speculative verify row: matcher.fill_after)."""
        start = time.perf_counter()
        bitmask = self._buffer(logits.shape[0], logits.shape[1])
        rows = []
        for grammar in grammars:
            if grammar is not None:
                grammar.is_dead_end = False  # a verify row's dead end may be a row nobody reaches
        for row, grammar in enumerate(grammars):
            if grammar is not None and grammar.fill_after(ahead[row] if ahead else (), bitmask, row):
                rows.append(row)
        filled = time.perf_counter()
        self.fill_seconds += filled - start
        if not rows:
            return
        num_blocked_words = bitmask[rows].eq(0).sum(dim=1).tolist()
        for row, n in zip(rows, num_blocked_words, strict=True):
            if n == bitmask.shape[1]:  # not one token allowed
                grammars[row].is_dead_end = True
        apply_bitmask(logits, bitmask, rows, num_blocked_words)
        self.apply_seconds += time.perf_counter() - filled

    def _buffer(self, num_rows: int, vocab_size: int) -> torch.Tensor:
        words = (vocab_size + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < num_rows or self._bitmask.shape[1] != words:
            self._bitmask = torch.full((max(num_rows, 16), words), -1, dtype=torch.int32)
        return self._bitmask


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], num_blocked_words=None) -> None:
    """Set logits[r, v] = -inf where bit v of bitmask[r] is 0, for r in rows (in place).
    num_blocked_words: per row of rows, its all-zero int32 words (counted here when not given)."""
    xgr = xgrammar()
    vocab = logits.shape[1]
    if logits.device.type != "cpu":
        xgr.apply_token_bitmask_inplace(logits, bitmask[: logits.shape[0]].to(logits.device, non_blocking=True),
                                        vocab_size=vocab, indices=rows)
        return
    if num_blocked_words is None:
        num_blocked_words = bitmask[rows].eq(0).sum(dim=1).tolist()
    words = bitmask.shape[1]
    dense = [r for r, n in zip(rows, num_blocked_words, strict=True) if 4 * n > words]
    sparse = [r for r, n in zip(rows, num_blocked_words, strict=True) if 4 * n <= words]
    if sparse:
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=sparse, backend="cpu")
    if dense:
        apply_bitmask_by_table(logits, bitmask, dense)


def apply_bitmask_by_table(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """apply_bitmask through the [256, 8] table (CPU), whatever the mask holds."""
    vocab = logits.shape[1]
    packed = bitmask[rows].view(torch.uint8).reshape(-1).to(torch.int32)  # [R * words * 4]
    blocked = _BLOCKED.index_select(0, packed).view(len(rows), -1)[:, :vocab]  # [R, V]
    if len(rows) == logits.shape[0]:
        logits.masked_fill_(blocked, float("-inf"))
    else:
        index = torch.tensor(rows, dtype=torch.int64)
        logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(blocked, float("-inf")))
