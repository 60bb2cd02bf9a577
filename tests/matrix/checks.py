"""The matrix's properties for one exchange: what is wrong with it, as short sentences (none = ok).

- never a 5xx, never a dropped connection;
- a valid request (the table's oracle says so) gets 200, an invalid one its 4xx naming the field;
- a 4xx has its surface's shape: OpenAI `{"error": {"message", "type", "param", "code"}}` with
  `param` naming the field, Anthropic `{"type": "error", "error": {"type", "message"}}` with the
  message starting `<field>:` (docs/http.md "Errors"); the field is one of the request's, as the
  client spelled it (a path into the request's top-level fields), never an internal one;
- a body drawn from the published schema is never refused for a reason the schema rules out
  (unknown field, bad JSON, unsupported field: the schema says what is known and what types are);
- a 200 is a well-formed reply of its surface (reply_checks.py), streamed or not.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from tests.matrix import reply_checks, schema_bodies
from tests.matrix.exchange import Case, Outcome

ANTHROPIC = ("messages", "messages.count_tokens")
# Reasons no body that follows the published schema can earn (the schema lists every known field
# and its type, and an untyped field is drawn as null).
SCHEMA_LEVEL = {"unknown_field", "invalid_json", "bad_content_type"}
# What a 4xx may name besides the body's top-level fields (docs/http.md "Errors").
_OTHER_PARAMS = {"body", "anthropic-version", None}


def violations(case: Case, outcome: Outcome) -> list[str]:
    if outcome.transport_error:
        return [f"no reply: {outcome.transport_error}"]
    if outcome.status >= 500:
        err = error_fields(case, outcome) or {}
        return [f"status {outcome.status}: {str(err.get('message') or outcome.text)[:120]}"]
    expect = case.expect
    if expect is not None and outcome.status != expect.status:
        return [f"status {outcome.status}, expected {expect.status}" + (f" naming {expect.param}" if expect.param
                                                                          else "")]
    if outcome.status == 200:
        return reply_checks.ok_reply(case, outcome)
    if 400 <= outcome.status < 500:
        return error_shape(case, outcome)
    return [f"status {outcome.status}"]


def error_fields(case: Case, outcome: Outcome) -> dict[str, Any] | None:
    """The error's (type, message, param, code) as the surface spells them, or None if unparsable."""
    try:
        body = outcome.json()
    except ValueError:
        return None
    if case.surface in ANTHROPIC:
        if not (isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict)):
            return None
        err = body["error"]
        message = err.get("message")
        field = message.split(":", 1)[0] if isinstance(message, str) and ":" in message else None
        return {"type": err.get("type"), "message": message, "param": field, "code": None}
    if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
        return None
    err = body["error"]
    if set(err) < {"message", "type", "param", "code"}:
        return {"missing": sorted({"message", "type", "param", "code"} - set(err))}
    return err


def error_shape(case: Case, outcome: Outcome) -> list[str]:
    err = error_fields(case, outcome)
    if err is None:
        return [f"{outcome.status} body is not the {_shape_name(case)} error shape"]
    if "missing" in err:
        return [f"{outcome.status} error object lacks {', '.join(err['missing'])}"]
    problems = []
    if not isinstance(err.get("message"), str) or not err["message"]:
        problems.append(f"{outcome.status} error without a message")
    if not isinstance(err.get("type"), str) or not err["type"]:
        problems.append(f"{outcome.status} error without a type")
    root = re.split(r"[.\[]", err["param"], maxsplit=1)[0] if isinstance(err.get("param"), str) else None
    unknown = (err.get("code") or "").lower() == "unknown_field"  # names the client's stray field
    if not unknown and root not in _OTHER_PARAMS and root not in schema_fields(case.surface):
        problems.append(f"{outcome.status} names {err['param']!r}, not a field of the request")
    expect = case.expect
    if expect is not None and expect.param is not None and err.get("param") != expect.param:
        problems.append(f"{outcome.status} names {err.get('param')!r}, expected {expect.param!r}")
    if expect is None:
        if outcome.status == 400 and not err.get("param"):
            problems.append("400 names no field")
        code = (err.get("code") or "").lower()
        if code in SCHEMA_LEVEL:
            problems.append(f"a schema-valid body refused as {code} ({err.get('param')})")
        elif case.surface in ANTHROPIC and re.search(r"unknown field|not supported by this server", err["message"]):
            problems.append(f"a schema-valid body refused: {err['message'][:80]}")
    return problems


@functools.cache
def schema_fields(surface: str) -> frozenset[str]:
    """The top-level fields of the surface's published request schema."""
    return frozenset(schema_bodies.load(surface)["properties"])


def refusal_rule(case: Case, outcome: Outcome) -> str:
    """A 4xx of a schema-drawn body as its rule: field path with indices folded, and the message's
    first words (`messages[*].content: required`), for the report's list of rules the schema does
    not state."""
    err = error_fields(case, outcome) or {}
    param = re.sub(r"\[\d+\]", "[*]", str(err.get("param") or "-"))
    message = str(err.get("message") or "")
    if case.surface in ANTHROPIC:
        message = message.split(":", 1)[-1]
    message = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "…", message.strip())[:70]
    return f"{outcome.status} {param}: {message}"


def _shape_name(case: Case) -> str:
    return "Anthropic" if case.surface in ANTHROPIC else "OpenAI"
