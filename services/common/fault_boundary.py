"""The per-request fault boundary: work that belongs to one request can only fail that request.

A serving process does two kinds of work. Shared work (the model step over the paged KV cache,
the scheduler's and block manager's books, the stream every request shares) fails everything it
touches when it breaks, and a fault there stays fatal. Per-request work (drawing a row's token
and its logprobs, advancing its grammar, its stop bookkeeping and output event, pooling its
embedding, building its part of a frame) reads only that request's state, so a bug or a bad
value there must end that request alone: the step's other rows are delivered and the process
keeps serving (docs/design.md, "Fault containment").

Every per-request stage runs through `FaultBoundary`:
- `call(stage, key, fn, *args)`: one request's work; an exception becomes a `RequestFault`.
- `each(stage, keys, run)`: work done for many requests at once (a batched sampler, one frame for
  a whole step). `run(indices)` returns one result per index. It runs once for all; if that
  raises, it runs again for each request alone, so only the requests whose own work raises get a
  fault and the others get the results they would have had (per-row work is batch invariant:
  docs/design.md "Kernel ops interface", sample).
A fault is logged once, with its stack, the stage, the request key and an error id; the client
gets INTERNAL (reason REQUEST_FAULT) carrying the same error id and none of the exception's text.

`inject` is a test hook (services/generation/faults.py, MSTAR_FAULTS): when set, it is called
with (stage, key) before each request's work and may raise. Plain Python: no torch, no grpc.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from services.common import errors

REASON = "REQUEST_FAULT"


@dataclass(frozen=True)
class RequestFault:
    """What a request's failed work left: the error its client gets."""

    key: Hashable
    stage: str
    error: errors.MstarError


class FaultBoundary:
    def __init__(self, where: str, logger: logging.Logger):
        self.where = where  # e.g. "engine", "generation servicer": named in the log line
        self.log = logger
        self.num_faults: dict[str, int] = {}  # per stage, cumulative (metrics)
        self.inject: Callable[[str, Hashable], None] | None = None

    def call(self, stage: str, key: Hashable, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or a RequestFault for `key` when it raises."""
        try:
            if self.inject is not None:
                self.inject(stage, key)
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - the boundary: any bug in one request's work
            return self.fault(stage, key, exc)

    def each(self, stage: str, keys: Sequence[Hashable], run: Callable[[list[int]], list[Any]]) -> list[Any]:
        """run(indices) for all keys at once; when that raises, for each alone (see the module doc).
        One result or RequestFault per key, in order."""
        if not keys:
            return []
        try:
            if self.inject is not None:
                for key in keys:
                    self.inject(stage, key)
            results = run(list(range(len(keys))))
            if len(results) != len(keys):
                raise RuntimeError(f"{stage}: {len(results)} results for {len(keys)} requests")
            return results
        except Exception:  # noqa: BLE001 - find whose work it was: each request alone
            return [self.call(stage, key, _only, run, i) for i, key in enumerate(keys)]

    def fault(self, stage: str, key: Hashable, exc: BaseException) -> RequestFault:
        error_id = uuid.uuid4().hex[:16]
        self.num_faults[stage] = self.num_faults.get(stage, 0) + 1
        self.log.error("request failed in %s (%s): %s", self.where, stage, type(exc).__name__, exc_info=exc,
                       extra={"request_key": str(key), "stage": stage, "error_id": error_id})
        error = errors.internal(
            f"internal error while the server worked on this request ({stage}); error id {error_id}, "
            "which the server log has with the details", REASON)
        error.metadata["error_id"] = error_id
        error.metadata["stage"] = stage
        return RequestFault(key, stage, error)


def _only(run: Callable[[list[int]], list[Any]], index: int) -> Any:
    results = run([index])
    if len(results) != 1:
        raise RuntimeError(f"{len(results)} results for one request")
    return results[0]
