"""One surface's combinatorial table: the parameters SDKs send together, their levels, the rules
between them, how a row becomes a body, and what the server must answer.

A row assigns every factor a level (`covering.ABSENT` = leave the field out). A factor named in
`fragments` holds a dict merged into the body (several fields that travel together, e.g. a budget
`{"max_completion_tokens": 3}`); one named in `lookups` holds a key into that table (the
conversation, the prompt); any other factor is the body field of its own name. `negatives` are
overrides that make a valid row invalid in exactly one way, with the field the 4xx must name:
the table's rows stay valid (the pairs are covered by requests that must succeed), and every
negative runs on a non-streamed and on a streamed row (`negative_rows`).

`expect(row)` is the table's oracle, written from docs/http.md and the published bounds (read
from the contract, `services.common.sampling_fields`), not from the server's code.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.matrix.covering import ABSENT, Allowed, Factor, Row

STORED = "{stored_response_id}"  # replaced by the id of a response the matrix stored first


@dataclass(frozen=True)
class Expect:
    status: int = 200
    param: str | None = None  # the field a 4xx names, as the client spelled it


OK = Expect()


def refused(param: str, status: int = 400) -> Expect:
    return Expect(status, param)


@dataclass(frozen=True)
class Table:
    surface: str  # the docs/schemas name: chat.completions, completions, messages, responses
    path: str
    factors: tuple[Factor, ...]
    allowed: Allowed
    expect: Callable[[Row], Expect]
    constrained: frozenset[str] = frozenset()  # the factors `allowed` reads
    negatives: tuple[tuple[Row, str], ...] = ()
    fragments: frozenset[str] = frozenset()
    lookups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    base: Mapping[str, Any] = field(default_factory=dict)  # fields every body carries

    def body(self, row: Row, context: Mapping[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = copy.deepcopy(dict(self.base))
        for name, level in row.items():
            if level is ABSENT:
                continue
            if name in self.fragments:
                out.update(copy.deepcopy(level))
            elif name in self.lookups:
                out.update(copy.deepcopy(self.lookups[name][level]))
            else:
                out[name] = copy.deepcopy(level)
        return _fill(out, context)


def _fill(value: Any, context: Mapping[str, str]) -> Any:
    if isinstance(value, str) and value in context:
        return context[value]
    if isinstance(value, dict):
        return {k: _fill(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, context) for v in value]
    return value


def negative_rows(table: Table, rows: list[Row]) -> list[tuple[Row, str]]:
    """Each negative applied to the first non-streamed and the first streamed row."""
    bases = [next(r for r in rows if not r["stream"]), next(r for r in rows if r["stream"])]
    return [({**base, **overrides}, param) for overrides, param in table.negatives for base in bases]


def present(row: Row, name: str) -> bool:
    return row.get(name, ABSENT) is not ABSENT


def assigned(row: Row, *names: str) -> bool:
    """Every factor named is assigned in this (partial) row: only then can a rule over them fail."""
    return all(name in row for name in names)


# ---- request fragments every table shares (OpenAI function tools; the other surfaces reshape them)

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ZONE = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": CITY}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                          "parameters": ZONE}}
NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}
NAMED_CLOCK = {"type": "function", "function": {"name": "get_time"}}
JSON_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
               "required": ["answer"]}
