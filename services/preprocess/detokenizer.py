"""Streaming detokenization that is UTF-8 safe.

Tokens are turned into bytes (Tokenizer.token_bytes) and fed to Python's incremental UTF-8
decoder with errors="replace": an incomplete multi-byte character at the end of the buffer is
held until its next byte arrives, an invalid sequence becomes U+FFFD as soon as it is known to be
invalid (the stream continues), and `finish()` turns a dangling incomplete tail into U+FFFD.
Because the incremental decoder follows the same maximal-subpart rule as a one-shot decode, the
concatenation of all deltas equals `Tokenizer.decode(all ids)` for every way of splitting the ids.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class Detokenizer:
    """Per-request incremental decoder: feed token ids, get text deltas."""

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._finished = False

    def feed(self, token_ids: list[int]) -> str:
        """Text that became complete with these tokens (possibly empty)."""
        if self._finished:
            raise RuntimeError("detokenizer already finished")
        data = b"".join(self._token_bytes(t) for t in token_ids)
        return self._decoder.decode(data, final=False)

    def finish(self) -> str:
        """Flush: an incomplete trailing character is rendered as U+FFFD."""
        if self._finished:
            return ""
        self._finished = True
        return self._decoder.decode(b"", final=True)
