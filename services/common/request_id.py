"""The request id of the RPC being served, for log correlation.

Envoy stamps every request with `x-request-id` (a UUID; its access log prints it) and forwards it
as gRPC metadata; the server interceptor (interceptors.py) puts it in `current` for the RPC's
task, so every log line written while serving it carries it (logs.py), and the JSON access log
of Envoy and the services join on it. A call that arrives without one (a direct gRPC client)
gets a fresh id. Tasks started while serving inherit it (asyncio copies the context).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from contextvars import ContextVar

HEADER = "x-request-id"
# What we accept from a client as-is; anything else (too long, odd characters) is replaced, so a
# header can never smuggle an unbounded or multi-line value into every log line.
_ACCEPTED = re.compile(r"[A-Za-z0-9._~:+/=-]{1,128}")

current: ContextVar[str | None] = ContextVar("x_request_id", default=None)


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The caller's x-request-id if it is a sane token, else a new one."""
    for key, value in metadata or ():
        if key == HEADER and isinstance(value, str) and _ACCEPTED.fullmatch(value):
            return value
    return uuid.uuid4().hex
