"""Admission: bounded requests and prompt tokens in flight, shared fairly between clients.

Requests beyond a bound are refused at once with RESOURCE_EXHAUSTED + RetryInfo, before anything
is streamed, instead of queueing without limit: the generation service keeps its own (bounded)
waiting queue, so what we admit is "running + queued", and waiting here would only add latency the
client cannot see or cancel cheaply. The retry delay grows with the overload so a burst of refused
clients does not come back all at once.

Bounds (AdmissionLimits; docs/http.md "Fair admission"):
- all clients together: `max_requests` requests and `max_prompt_tokens` prompt tokens in flight;
- one client (client.py says who that is): at most `max_requests_per_client` of those slots
  (default 3/4), so one client can never take them all (64 cheap Session streams used to lock
  everyone else out) while a lone client, or an app server all users reach mstar through, keeps
  most of the capacity;
- open input: a request whose input is still open costs nothing to hold, so holding them is
  bounded separately: `max_open_inputs` over all clients (default 1/2 of the slots) and
  `max_open_inputs_per_client` each (1/4). Together with the idle timeout and the absolute
  open-input lifetime (request_run.py) this bounds the open-input time any client can hold:
  per-client open inputs x lifetime.

Event-loop only (the servicer); `snapshot` may be read from the metrics thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from services.common.errors import MstarError, resource_exhausted


@dataclass(frozen=True)
class AdmissionLimits:
    max_requests: int = 64
    max_prompt_tokens: int = 256 * 1024
    max_requests_per_client: int = 48
    max_open_inputs: int = 32
    max_open_inputs_per_client: int = 16

    @classmethod  # the defaults are the fields' own (names of this class body)
    def sized(cls, max_requests: int = max_requests, max_prompt_tokens: int = max_prompt_tokens, *,
              max_requests_per_client: int | None = None, max_open_inputs: int | None = None,
              max_open_inputs_per_client: int | None = None) -> AdmissionLimits:
        """The shares as fractions of `max_requests` unless given: 3/4 per client, open inputs
        1/2 overall and 1/4 per client (at least 1 each)."""
        return cls(
            max_requests, max_prompt_tokens,
            max_requests_per_client or max(1, max_requests - max_requests // 4),
            max_open_inputs or max(1, max_requests // 2),
            max_open_inputs_per_client or max(1, max_requests // 4),
        )


@dataclass
class _Client:
    requests: int = 0
    open_inputs: int = 0


@dataclass
class Ticket:
    """Held by an admitted request; `release` is idempotent (finally-paths call it freely)."""

    admission: Admission
    client: str
    prompt_tokens: int
    input_open: bool = False
    released: bool = False

    def add_tokens(self, n: int) -> None:
        """Streamed input grows the prompt after admission; account for it (never refused:
        the per-stream input caps bound it)."""
        if not self.released:
            self.prompt_tokens += n
            self.admission.tokens_in_flight += n

    def close_input(self) -> None:
        """The input ended: the request no longer holds an open-input slot."""
        if self.input_open and not self.released:
            self.input_open = False
            self.admission._close_input(self.client)

    def release(self) -> None:
        if not self.released:
            self.close_input()
            self.released = True
            self.admission._release(self)


class Admission:
    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        self.requests_in_flight = 0
        self.tokens_in_flight = 0
        self.open_inputs = 0
        self._clients: dict[str, _Client] = {}
        self._lock = threading.Lock()  # only for snapshot() readers on other threads

    def admit(self, prompt_tokens: int, client: str = "", input_open: bool = False) -> Ticket:
        """A ticket, or RESOURCE_EXHAUSTED with a retry delay."""
        lim, mine = self.limits, self._clients.get(client, _Client())
        if self.requests_in_flight >= lim.max_requests:
            raise self._refuse("OVERLOADED", f"server overloaded: {self.requests_in_flight} requests in "
                               f"flight (limit {lim.max_requests})")
        if mine.requests >= lim.max_requests_per_client:
            raise self._refuse("CLIENT_LIMIT", f"too many requests from this client: {mine.requests} in "
                               f"flight (limit {lim.max_requests_per_client} per client)", mine)
        # A single prompt larger than the whole budget is still admitted when nothing else is in
        # flight; the context-length check bounds it and refusing it forever would be worse.
        if self.tokens_in_flight and self.tokens_in_flight + prompt_tokens > lim.max_prompt_tokens:
            raise self._refuse("OVERLOADED", f"server overloaded: {self.tokens_in_flight} prompt tokens in "
                               f"flight (limit {lim.max_prompt_tokens})")
        if input_open and mine.open_inputs >= lim.max_open_inputs_per_client:
            raise self._refuse("OPEN_INPUT_LIMIT", f"too many open inputs from this client: {mine.open_inputs} "
                               f"requests whose input is open (limit {lim.max_open_inputs_per_client} per client)",
                               mine)
        if input_open and self.open_inputs >= lim.max_open_inputs:
            raise self._refuse("OPEN_INPUT_LIMIT", f"server overloaded: {self.open_inputs} requests whose "
                               f"input is open (limit {lim.max_open_inputs})")
        with self._lock:
            entry = self._clients.setdefault(client, _Client())
            entry.requests += 1
            entry.open_inputs += int(input_open)
            self.requests_in_flight += 1
            self.tokens_in_flight += prompt_tokens
            self.open_inputs += int(input_open)
        return Ticket(self, client, prompt_tokens, input_open)

    def snapshot(self) -> dict[str, int]:
        """Gauges for metrics: clients holding slots, the busiest one's requests, open inputs."""
        with self._lock:
            busiest = max((c.requests for c in self._clients.values()), default=0)
            return {"clients": len(self._clients), "busiest_client_requests": busiest,
                    "open_inputs": self.open_inputs, "requests": self.requests_in_flight}

    def _close_input(self, client: str) -> None:
        with self._lock:
            self.open_inputs -= 1
            self._clients[client].open_inputs -= 1

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            self.requests_in_flight -= 1
            self.tokens_in_flight -= ticket.prompt_tokens
            entry = self._clients[ticket.client]
            entry.requests -= 1
            if entry.requests == 0:
                del self._clients[ticket.client]

    def _refuse(self, reason: str, message: str, mine: _Client | None = None) -> MstarError:
        # A client over its own share waits for its own requests; everyone else by the overall load.
        load = (mine.requests / max(1, self.limits.max_requests_per_client) if mine is not None
                else self.requests_in_flight / max(1, self.limits.max_requests))
        err = resource_exhausted(message, reason=reason, retry_after_s=round(0.5 + load, 2))
        err.metadata.update(requests_in_flight=str(self.requests_in_flight),
                            tokens_in_flight=str(self.tokens_in_flight))
        return err
