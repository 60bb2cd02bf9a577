"""One sequence's position in its grammar: which tokens may come next, advanced on each sampled token.

The matcher advances only on tokens the engine samples, once each, and never on tokens the model
merely recomputes: a preempted sequence re-prefills its prompt and output, but its matcher has
already accepted that output and stays where it is. So ``num_accepted`` equals the number of
output tokens at every step, preempted or not.

Stop tokens: the model's EOS ids and the request's stop_token_ids are allowed only where the
grammar may end, and accepting one terminates the matcher. A vocabulary without any stop token
terminates the matcher as soon as the grammar is complete.
"""

from __future__ import annotations

from services.generation.grammar.xgr import xgrammar


class SequenceGrammar:
    def __init__(self, compiled_grammar, stop_token_ids):
        xgr = xgrammar()
        stops = sorted(set(stop_token_ids))
        self._matcher = xgr.GrammarMatcher(
            compiled_grammar, override_stop_tokens=stops or None, terminate_without_stop_token=not stops)
        self.num_accepted = 0
        self.is_dead_end = False  # set by a fill that allowed no token at all

    def fill(self, bitmask, row: int) -> bool:
        """Write the allowed next tokens into bitmask[row]; False when every token is allowed."""
        return self._matcher.fill_next_token_bitmask(bitmask, row)

    def fill_after(self, tokens: tuple[int, ...], bitmask, row: int) -> bool:
        """fill, as if tokens had been accepted first (a speculative verify row); the matcher ends
        where it was. The proposal was cut to what the grammar accepts (legal_prefix), so each
        accept here succeeds."""
        if not tokens:
            return self.fill(bitmask, row)
        taken = 0
        try:
            for token in tokens:
                if not self._matcher.accept_token(token):
                    raise RuntimeError(f"a proposed token the grammar does not accept: {token}")
                taken += 1
            return self.fill(bitmask, row)
        finally:
            if taken:
                self._matcher.rollback(taken)

    def legal_prefix(self, tokens: tuple[int, ...]) -> int:
        """How many of tokens, in order, the grammar accepts from here (nothing after a stop
        token); the matcher ends where it was."""
        taken = 0
        try:
            for token in tokens:
                if self._matcher.is_terminated() or not self._matcher.accept_token(token):
                    break
                taken += 1
            return taken
        finally:
            if taken:
                self._matcher.rollback(taken)

    def is_open_after(self, tokens: tuple[int, ...]) -> bool:
        """Whether the grammar accepts tokens, in order, and then still takes a token (it has
        not terminated); the matcher ends where it was."""
        taken = 0
        try:
            for token in tokens:
                if self._matcher.is_terminated() or not self._matcher.accept_token(token):
                    return False
                taken += 1
            return not self._matcher.is_terminated()
        finally:
            if taken:
                self._matcher.rollback(taken)

    def accept(self, token_id: int) -> bool:
        if not self._matcher.accept_token(token_id):
            return False
        self.num_accepted += 1
        return True

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()
