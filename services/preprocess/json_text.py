"""A JSON request body as a Python value: strict, and measured before a deep document is parsed.

    value = json_text.loads(body)        # ValueError (client wording: json_text.message) or a 400

Strict: NaN/Infinity literals, lone UTF-16 surrogate escapes and bytes that are not UTF-8 are not
JSON. The fast parser (pydantic's jiter) refuses a document nested past ~200 levels with
"recursion limit exceeded", which is not a property of the body: a JSON schema 100 objects deep
(`response_format.json_schema.schema`, 200 JSON levels) is valid JSON whose limit
(MAX_SCHEMA_DEPTH, 32 levels: docs/design.md "Structured output") the field's own check names. So a deeper body is measured
without parsing and, when it nests at most MAX_DEPTH levels, parsed by Python's json (which
recurses once per level, well inside the interpreter's limit); only a body deeper than that, which
no field of any request needs (a schema may nest 32 levels, a body adds a handful), is refused
as a whole: 400 `body`, reason BODY_TOO_DEEP.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic_core import from_json

from services.common import errors
from services.common.structured_output import MAX_SCHEMA_DEPTH

MAX_DEPTH = 512
_JITER_DEPTH = "recursion limit exceeded"
# A JSON string (no raw quote or backslash inside but escapes), for removing strings before
# counting brackets.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Every byte but brackets removed; openers become "(" and closers ")".
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Chunks of at most this many brackets: a chunk is scanned byte by byte only if its openers could
# take the depth past the limit; a shallow body costs a few counts per chunk.
_CHUNK = MAX_DEPTH // 2
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def loads(body: bytes) -> Any:
    """The JSON value of `body`. Raises ValueError with the parser's message (see `message`), or
    a 400 MstarError naming `body` for a document nested deeper than MAX_DEPTH."""
    try:
        return from_json(body, allow_inf_nan=False)
    except ValueError as exc:
        if _JITER_DEPTH not in str(exc):
            raise
    if _deeper_than(body, MAX_DEPTH):
        raise errors.invalid_argument(
            "body", f"nests more than {MAX_DEPTH} levels deep (the most a request body may; a JSON schema "
            f"in it may nest {MAX_SCHEMA_DEPTH})", reason="BODY_TOO_DEEP")
    return _python_loads(body)


def message(parser_message: str) -> str:
    """A parser's complaint in the client's terms."""
    if "surrogate" in parser_message or "end of hex escape" in parser_message:
        # What a lone \ud800 looks like to the parser; say it in the client's terms.
        where = parser_message[parser_message.rfind(" at line"):] if " at line" in parser_message else ""
        return f"invalid JSON: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff come in pairs){where}"
    return f"invalid JSON: {parser_message}"


def _deeper_than(body: bytes, limit: int) -> bool:
    brackets = _STRING.sub(b"", body).translate(_BRACKETS, _NOT_BRACKETS)
    depth = 0
    for start in range(0, len(brackets), _CHUNK):
        chunk = brackets[start:start + _CHUNK]
        opens = chunk.count(b"(")
        if depth + opens > limit:
            for byte in chunk:
                depth += 1 if byte == 40 else -1  # "("
                if depth > limit:
                    return True
        else:
            depth += 2 * opens - len(chunk)
    return False


def _python_loads(body: bytes) -> Any:
    """Python's json with jiter's strictness (the caller measured the depth first)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_not_json)
    except RecursionError:  # only if the caller's own stack was already deep
        raise errors.invalid_argument("body", "nests too deep to parse", reason="BODY_TOO_DEEP") from None
    if _SURROGATE_ESCAPE.search(body):  # json.loads keeps a lone surrogate; UTF-8 cannot hold one
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("lone surrogate in a string") from None
    return value


def _not_json(literal: str) -> Any:
    raise ValueError(f"{literal} is not a JSON value")
