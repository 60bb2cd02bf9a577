"""Stop strings matched on decoded text, with hold-back.

Semantics (independent of how the text is chunked, so streamed and non-streamed output agree):
the output ends at the FIRST position where any stop string is complete, i.e. the match with the
smallest end offset; among matches ending there, the one starting earliest (the longest) wins.
Text before the match is emitted; the stop string itself only with `include_stop`.

Hold-back: text is emitted only once no stop string can still begin in it, so the longest suffix
of the unemitted text that is a proper prefix of some stop string is kept back. No prefix of a
stop string is ever streamed before it is known not to be a stop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    """Outcome of feeding text: what may be emitted now, and the stop string if one matched."""

    text: str
    stop: str | None = None


class StopMatcher:
    """Per-request stop-string state."""

    def __init__(self, stops: list[str] | tuple[str, ...], include_stop: bool = False) -> None:
        self._stops = tuple(s for s in dict.fromkeys(stops) if s)
        self._include_stop = include_stop
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def held(self) -> str:
        """Text withheld because it might be the start of a stop string."""
        return self._held

    def feed(self, delta: str) -> StopResult:
        if self._stopped:
            return StopResult("")
        if not self._stops:
            return StopResult(delta)
        buffer = self._held + delta
        match = self._first_match(buffer)
        if match is not None:
            start, stop = match
            self._stopped = True
            self._held = ""
            end = start + len(stop) if self._include_stop else start
            return StopResult(buffer[:end], stop)
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :]
        return StopResult(buffer[: len(buffer) - keep])

    def finish(self) -> str:
        """End of output without a stop: the held-back text was not a stop after all."""
        text, self._held = self._held, ""
        return "" if self._stopped else text

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        # The held part holds no complete stop (it would have matched earlier), so any match
        # here ends inside the new delta; smallest end wins, then earliest start.
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = buffer.find(stop)
            if start < 0:
                continue
            key = (start + len(stop), start, stop)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else (best[1], best[2])

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:k]):
                    longest = k
                    break
        return longest
