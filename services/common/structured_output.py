"""A request's structured-output constraint and its validation (plain Python: no torch, no grpc).

A constraint restricts what the model may emit to the language of one grammar, given in one of
six forms (``kind``):

- ``json_schema``: a JSON document valid against the schema (JSON Schema text). Output is compact
  JSON (", " and ": " separators, no other whitespace) with properties in schema order, and no
  properties or items the schema does not declare (strict, as OpenAI's ``strict: true``).
- ``json_object``: any JSON object (OpenAI ``response_format: {"type": "json_object"}``).
- ``regex``: text matching the regular expression (whole output, no anchors needed).
- ``grammar``: text in the language of an EBNF grammar (GBNF, as llama.cpp; rule ``root``).
- ``choice``: exactly one of the given strings.
- ``tool_calls``: xgrammar's structural tags. Without ``require_call`` ("auto"): free text, and
  wherever a trigger string starts, a tool call ``begin + JSON arguments + end`` whose arguments
  follow that tool's schema, then free text again. With ``require_call`` ("required", or a named
  tool as the only tag): calls only, at least one, joined by ``separator``. ``parallel=False``
  ends the output after the first call.

Caps bound the work a constraint can cause before anything is compiled (sizes, nesting depth,
counts); each failure names the field, like ``structured_output.choices[3]``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

JSON_SCHEMA = "json_schema"
JSON_OBJECT = "json_object"
REGEX = "regex"
GRAMMAR = "grammar"
CHOICE = "choice"
TOOL_CALLS = "tool_calls"
KINDS = (JSON_SCHEMA, JSON_OBJECT, REGEX, GRAMMAR, CHOICE, TOOL_CALLS)

MAX_SCHEMA_BYTES = 64 * 1024  # one JSON schema (response format or one tool's parameters)
MAX_SCHEMA_DEPTH = 32  # nesting of objects/arrays in the schema document itself
MAX_REGEX_BYTES = 4 * 1024
MAX_GRAMMAR_BYTES = 64 * 1024
MAX_CHOICES = 1024
MAX_TOOLS = 128
MAX_TEXT_BYTES = 256 * 1024  # everything in one constraint together


@dataclass(frozen=True)
class ToolCallTag:
    """One tool's call as text: ``begin``, then its JSON arguments, then ``end``."""

    begin: str  # e.g. '<tool_call>\n{"name": "get_weather", "arguments": '
    json_schema: str  # JSON Schema text of the arguments
    end: str  # e.g. '}\n</tool_call>'


@dataclass(frozen=True)
class ToolCalls:
    tags: tuple[ToolCallTag, ...]
    triggers: tuple[str, ...]  # each tag's begin starts with exactly one trigger, e.g. "<tool_call>"
    require_call: bool = False  # True: calls only, at least one ("required", a named tool)
    parallel: bool = True  # False: the output ends after the first call
    separator: str = "\n"  # between two calls when require_call


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one form, named by kind; build it with the constructors below."""

    kind: str
    json_schema: str = ""  # json_schema
    regex: str = ""  # regex
    grammar: str = ""  # grammar (EBNF)
    choices: tuple[str, ...] = ()  # choice
    tool_calls: ToolCalls | None = None  # tool_calls

    @classmethod
    def from_json_schema(cls, schema: Mapping | str) -> StructuredOutput:
        return cls(JSON_SCHEMA, json_schema=_schema_text(schema))

    @classmethod
    def any_json_object(cls) -> StructuredOutput:
        return cls(JSON_OBJECT)

    @classmethod
    def from_regex(cls, pattern: str) -> StructuredOutput:
        return cls(REGEX, regex=pattern)

    @classmethod
    def from_grammar(cls, ebnf: str) -> StructuredOutput:
        return cls(GRAMMAR, grammar=ebnf)

    @classmethod
    def from_choices(cls, choices: Sequence[str]) -> StructuredOutput:
        return cls(CHOICE, choices=tuple(choices))

    @classmethod
    def for_tool_calls(
        cls,
        tags: Sequence[ToolCallTag],
        triggers: Sequence[str],
        require_call: bool = False,
        parallel: bool = True,
        separator: str = "\n",
    ) -> StructuredOutput:
        return cls(TOOL_CALLS, tool_calls=ToolCalls(tuple(tags), tuple(triggers), require_call, parallel, separator))

    @property
    def cache_key(self) -> str:
        """Content hash: equal constraints share one compiled grammar."""
        calls = self.tool_calls
        parts = [self.kind, self.json_schema, self.regex, self.grammar, list(self.choices)]
        if calls is not None:
            parts += [[[t.begin, t.json_schema, t.end] for t in calls.tags], list(calls.triggers),
                      calls.require_call, calls.parallel, calls.separator]
        return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


def tool_call_tag(begin: str, schema: Mapping | str, end: str) -> ToolCallTag:
    return ToolCallTag(begin, _schema_text(schema), end)


def _schema_text(schema: Mapping | str) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


# ---- validation ------------------------------------------------------------------------------

FIELD = "structured_output"


class ConstraintError(ValueError):
    """A constraint that cannot be compiled as given; field names the part."""

    def __init__(self, field: str, description: str):
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


def validate_structured_output(c: StructuredOutput) -> None:
    """Raise ConstraintError for the first impossible part; caps keep compiling bounded."""
    if not isinstance(c, StructuredOutput) or c.kind not in KINDS:
        raise ConstraintError(f"{FIELD}.kind", f"must be one of {', '.join(KINDS)}, got {getattr(c, 'kind', c)!r}")
    total = 0
    if c.kind == JSON_SCHEMA:
        total += _check_schema(c.json_schema, f"{FIELD}.json_schema")
    elif c.kind == REGEX:
        total += _check_text(c.regex, f"{FIELD}.regex", MAX_REGEX_BYTES)
    elif c.kind == GRAMMAR:
        total += _check_text(c.grammar, f"{FIELD}.grammar", MAX_GRAMMAR_BYTES)
    elif c.kind == CHOICE:
        if not 1 <= len(c.choices) <= MAX_CHOICES:
            raise ConstraintError(f"{FIELD}.choices", f"must hold 1 to {MAX_CHOICES} strings, got {len(c.choices)}")
        for i, choice in enumerate(c.choices):
            total += _check_text(choice, f"{FIELD}.choices[{i}]", MAX_TEXT_BYTES)
    elif c.kind == TOOL_CALLS:
        total += _check_tool_calls(c.tool_calls)
    if total > MAX_TEXT_BYTES:
        raise ConstraintError(FIELD, f"is {total} bytes in all; the limit is {MAX_TEXT_BYTES}")


def _check_text(text, field: str, limit: int) -> int:
    if not isinstance(text, str) or not text:
        raise ConstraintError(field, "must be a non-empty string")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ConstraintError(field, f"is {size} bytes; the limit is {limit}")
    return size


def _check_schema(text, field: str) -> int:
    size = _check_text(text, field, MAX_SCHEMA_BYTES)
    too_deep = f"nests too deep: more than {MAX_SCHEMA_DEPTH} levels (the limit is {MAX_SCHEMA_DEPTH})"
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise ConstraintError(field, f"is not valid JSON ({e})") from None
    except RecursionError:  # json's parser recurses: thousands of nested brackets end up here
        raise ConstraintError(field, too_deep) from None
    if not isinstance(schema, dict | bool):
        raise ConstraintError(field, f"must be a JSON object (or boolean), got {type(schema).__name__}")
    if _depth(schema) > MAX_SCHEMA_DEPTH:  # the walk stops one level past the limit
        raise ConstraintError(field, too_deep)
    return size


def _depth(value) -> int:
    """Nesting depth of a parsed JSON value, iteratively (a deep document must not blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d <= MAX_SCHEMA_DEPTH:
                stack.extend((child, d + 1) for child in (v.values() if isinstance(v, dict) else v))
    return deepest


def _check_tool_calls(calls) -> int:
    field = f"{FIELD}.tool_calls"
    if not isinstance(calls, ToolCalls):
        raise ConstraintError(field, "is required for kind tool_calls")
    if not 1 <= len(calls.tags) <= MAX_TOOLS:
        raise ConstraintError(f"{field}.tags", f"must hold 1 to {MAX_TOOLS} tools, got {len(calls.tags)}")
    if not calls.triggers:
        raise ConstraintError(f"{field}.triggers", "must hold at least one trigger string")
    total = sum(_check_text(t, f"{field}.triggers[{i}]", MAX_TEXT_BYTES) for i, t in enumerate(calls.triggers))
    if not isinstance(calls.separator, str):
        raise ConstraintError(f"{field}.separator", "must be a string")
    total += len(calls.separator.encode("utf-8", "surrogatepass"))
    for i, tag in enumerate(calls.tags):
        where = f"{field}.tags[{i}]"
        total += _check_text(tag.begin, f"{where}.begin", MAX_TEXT_BYTES)
        total += _check_schema(tag.json_schema, f"{where}.json_schema")
        if not isinstance(tag.end, str):
            raise ConstraintError(f"{where}.end", "must be a string")
        total += len(tag.end.encode("utf-8", "surrogatepass"))
        matching = [t for t in calls.triggers if tag.begin.startswith(t)]
        if len(matching) != 1:
            raise ConstraintError(f"{where}.begin", f"must start with exactly one trigger, starts with {len(matching)}")
    return total
