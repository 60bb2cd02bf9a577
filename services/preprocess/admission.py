"""Admission: a bounded number of requests and of prompt tokens in flight.

Requests beyond either bound are refused at once with RESOURCE_EXHAUSTED + RetryInfo, before
anything is streamed, instead of queueing without limit: the generation service keeps its own
(bounded) waiting queue, so what we admit is "running + queued", and waiting here would only add
latency the client cannot see or cancel cheaply. The retry delay grows with the overload so a
burst of refused clients does not come back all at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import resource_exhausted


@dataclass
class Ticket:
    """Held by an admitted request; `release` is idempotent (finally-paths call it freely)."""

    admission: Admission
    prompt_tokens: int
    released: bool = False

    def add_tokens(self, n: int) -> None:
        """Streamed input grows the prompt after admission; account for it (never refused:
        the per-stream input caps bound it)."""
        if not self.released:
            self.prompt_tokens += n
            self.admission.tokens_in_flight += n

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.requests_in_flight -= 1
            self.admission.tokens_in_flight -= self.prompt_tokens


class Admission:
    def __init__(self, max_requests: int = 64, max_prompt_tokens: int = 256 * 1024) -> None:
        self.max_requests = max_requests
        self.max_prompt_tokens = max_prompt_tokens
        self.requests_in_flight = 0
        self.tokens_in_flight = 0

    def admit(self, prompt_tokens: int) -> Ticket:
        """A ticket, or RESOURCE_EXHAUSTED with a retry delay. Event-loop only (no locking)."""
        if self.requests_in_flight >= self.max_requests:
            raise self._refuse(f"{self.requests_in_flight} requests in flight (limit {self.max_requests})")
        # A single prompt larger than the whole budget is still admitted when nothing else is in
        # flight; the context-length check bounds it and refusing it forever would be worse.
        if self.tokens_in_flight and self.tokens_in_flight + prompt_tokens > self.max_prompt_tokens:
            raise self._refuse(
                f"{self.tokens_in_flight} prompt tokens in flight (limit {self.max_prompt_tokens})"
            )
        self.requests_in_flight += 1
        self.tokens_in_flight += prompt_tokens
        return Ticket(self, prompt_tokens)

    def _refuse(self, why: str):
        load = self.requests_in_flight / max(1, self.max_requests)
        err = resource_exhausted(
            f"server overloaded: {why}", reason="OVERLOADED", retry_after_s=round(0.5 + load, 2)
        )
        err.metadata.update(
            requests_in_flight=str(self.requests_in_flight), tokens_in_flight=str(self.tokens_in_flight)
        )
        return err
