"""One matrix request over HTTP through Envoy, and what came back: status, JSON or SSE events.

A streamed reply is read to its end and split into SSE events (`event:` name, `data:` text;
`:` comment lines are keep-alives and dropped), so the checks see the whole exchange.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.matrix.table import Expect

REQUEST_TIMEOUT_S = 120.0
QUOTE = 600  # characters of a reply kept for the report


@dataclass(frozen=True)
class Case:
    surface: str  # docs/schemas name
    path: str
    body: dict[str, Any]
    source: str  # "schema", "edge", "table" or "negative"
    expect: Expect | None = None  # None (schema, edge): no oracle beyond "200 or a 4xx naming a field"

    @property
    def streamed(self) -> bool:
        return self.body.get("stream") is True

    def reproducer(self) -> str:
        return f"curl -sN localhost:8080{self.path} -H 'content-type: application/json' -d '{json.dumps(self.body)}'"


@dataclass(frozen=True)
class SseEvent:
    name: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class Outcome:
    status: int = 0
    content_type: str = ""
    text: str = ""
    seconds: float = 0.0
    transport_error: str | None = None
    stored_status: int | None = None  # Responses: GET /v1/responses/{id} afterwards
    events: list[SseEvent] = field(default_factory=list)

    @property
    def is_sse(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    def json(self) -> Any:
        return json.loads(self.text)

    def quote(self) -> str:
        text = self.transport_error or self.text
        return text if len(text) <= QUOTE else text[: QUOTE // 2] + " ... " + text[-QUOTE // 2:]


def parse_sse(text: str) -> list[SseEvent]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:"):].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:"):].removeprefix(" "))
        if name is not None or data:
            events.append(SseEvent(name, "\n".join(data)))
    return events


async def exchange(client: httpx.AsyncClient, case: Case) -> Outcome:
    start = time.monotonic()
    out = Outcome()
    try:
        async with client.stream("POST", case.path, json=case.body, timeout=REQUEST_TIMEOUT_S) as reply:
            raw = await reply.aread()
        out.status, out.content_type = reply.status_code, reply.headers.get("content-type", "")
        out.text = raw.decode("utf-8", errors="replace")
        if out.is_sse:
            out.events = parse_sse(out.text)
        if case.surface == "responses" and out.status == 200:
            out.stored_status = await _stored_status(client, out)
    except httpx.HTTPError as exc:
        out.transport_error = f"{type(exc).__name__}: {exc}"
    out.seconds = time.monotonic() - start
    return out


def response_id(outcome: Outcome) -> str | None:
    """The Responses object's id, from the JSON reply or the stream's response.created event."""
    try:
        if outcome.is_sse:
            first = next(e for e in outcome.events if e.name == "response.created")
            return first.json()["response"]["id"]
        return outcome.json()["id"]
    except (StopIteration, ValueError, KeyError, TypeError):
        return None


async def _stored_status(client: httpx.AsyncClient, outcome: Outcome) -> int | None:
    rid = response_id(outcome)
    if rid is None:
        return None
    reply = await client.get(f"/v1/responses/{rid}", timeout=30)
    return reply.status_code
