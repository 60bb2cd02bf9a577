"""Request bodies drawn from a surface's published JSON schema (docs/schemas/*.json), kept small.

    strategy = schema_bodies("chat.completions", context)   # a hypothesis strategy of dicts
    bodies = draw_bodies(strategy, count=25)               # the same 25 on every run

hypothesis-jsonschema's `from_schema` would be the natural tool, but it fails on every object
schema with the pinned hypothesis (`'many' object has no attribute 'more'`: it drives a private
hypothesis API that changed; tests/unit/generation/test_structured_output_properties.py met the
same). So this module reads the subset of JSON Schema that pydantic writes ($ref/$defs, anyOf,
oneOf, const, enum, object, array, string, integer, number, boolean, null and their bounds) and
refuses any other keyword, so a schema that grows one fails here instead of being half-read.

Small on purpose (the bodies run on the real model): strings of at most 12 characters, arrays of
at most 3 items, max_tokens 1-4, n 1-2. A few fields are drawn from what clients really send
(`OVERRIDES`): JSON schemas for tools and formats, tool-call arguments as JSON text, token ids
inside the vocabulary (and now and then one outside), the served model's names. A property the
schema leaves untyped (`{}`: accepted-and-ignored or unsupported-unless-neutral fields, which the
schema cannot tell apart) is drawn as null, the neutral value either way. An object gets its
required fields and at most `MAX_OPTIONAL` of its optional ones; a generating surface always gets
a budget (`BUDGETS`); an Anthropic conversation ends with a user turn; /tokenize gets a prompt
when it drew neither prompt nor messages. Rules across fields that
the schema cannot state (a tool message answers an earlier call, `top_logprobs` needs `logprobs`)
are left to chance: their 4xx are counted by rule in the summary (checks.refusal_rule).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.matrix.table import STORED

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
SURFACES = ("chat.completions", "completions", "messages", "responses", "embeddings", "tokenize", "detokenize",
            "messages.count_tokens")
VOCAB = 49152  # SmolLM2's vocabulary: ids drawn inside it, now and then one past it
MAX_STRING = 12
MAX_ITEMS = 3
MAX_OPTIONAL = 4  # optional fields per object: clients send a handful, not all forty
# The budget field each generating surface always gets (tiny: the model is real); chat may carry
# either name, so it is added only when the draw has neither.
BUDGETS = {"chat.completions": ("max_completion_tokens", "max_tokens"), "completions": ("max_tokens",),
           "responses": ("max_output_tokens",)}
_ANNOTATIONS = {"title", "description", "default", "discriminator", "examples"}
_KNOWN = _ANNOTATIONS | {"$ref", "$defs", "anyOf", "oneOf", "const", "enum", "type", "properties", "required",
                         "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength",
                         "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "maxProperties",
                         "propertyNames"}
ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from("aé東🙂 .\n")
TEXT = st.text(ALPHABET, max_size=MAX_STRING)
# Token ids inside the vocabulary; about one list in eight ends with the first id past it.
TOKEN_IDS = st.tuples(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), st.integers(0, 7)).map(
    lambda drawn: drawn[0] + [VOCAB] * (drawn[1] == 0))
SAMPLE_SCHEMAS = st.sampled_from([
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}}}},
    {"type": "object"},
    {"type": "string", "enum": ["yes", "no"]},
    {"type": "nope"},  # does not compile: a 400 invalid_grammar, never a crash
])
ARGUMENTS = st.sampled_from(['{}', '{"city": "Paris"}', '{"n": 3}', "not json", "[1]"])
# Images as clients send them: a real (1x1 PNG) base64 payload, a remote URL the server never
# fetches, broken base64. The served default is text-only, so a valid image is refused naming its part.
PNG_1X1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
IMAGE_URLS = st.sampled_from(["data:image/png;base64," + PNG_1X1, "https://example.com/cat.png",
                              "data:image/png;base64,@@"]) | TEXT
IMAGE_DATA = st.sampled_from([PNG_1X1, "@@"])


def _surface_overrides(surface: str, context: Mapping[str, str]) -> dict[str, st.SearchStrategy]:
    """Fields drawn from what clients send, by property name, wherever they appear in `surface`."""
    small = st.integers(1, 4)
    out: dict[str, st.SearchStrategy] = {
        "model": st.sampled_from(["default", ""]),
        "max_tokens": small, "max_completion_tokens": small, "max_output_tokens": small,
        "n": st.integers(1, 2), "best_of": st.integers(1, 2),
        "parameters": SAMPLE_SCHEMAS, "input_schema": SAMPLE_SCHEMAS, "schema": SAMPLE_SCHEMAS,
        "guided_json": SAMPLE_SCHEMAS, "arguments": ARGUMENTS,
        "guided_regex": st.sampled_from(["[a-z]{1,3}", "(yes|no)", "\\d+"]),
        "guided_grammar": st.sampled_from(['root ::= "yes" | "no"', "root ::= [a-z]+"]),
        "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=2),
        "tokens": TOKEN_IDS, "dimensions": st.integers(1, 600),
        "previous_response_id": st.sampled_from([context[STORED], "resp_not_stored"]),
        "seed": st.integers(-(2**63), 2**63 - 1),
    }
    if surface == "chat.completions":
        out["url"] = IMAGE_URLS  # image_url.url
    if surface == "messages":
        out["data"] = IMAGE_DATA  # a base64 image source (count_tokens keeps the schema's own draws:
        # there a refused image leaves too few bodies served for the matrix's share)
    if surface == "responses":
        out["image_url"] = IMAGE_URLS  # input_image.image_url (chat's image_url is an object: not here)
    if surface == "chat.completions":
        out["tool_call_id"] = st.none()  # must answer an earlier call, which no schema can say
        out["top_logprobs"] = st.integers(0, 5)
    if surface == "completions":
        out["logprobs"] = st.integers(0, 5)
        out["prompt"] = TEXT.filter(bool) | TOKEN_IDS
    if surface == "embeddings":
        out["input"] = TEXT | st.lists(TEXT, min_size=1, max_size=2) | TOKEN_IDS | st.lists(TOKEN_IDS, max_size=2)
    return out


def load(surface: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{surface}.json").read_text())


# Optional fields drawn, never null, in every object that has them: a chat message's content is
# optional only because an assistant message with tool calls may leave it out.
ALWAYS = {"chat.completions": {"content"}}


def schema_bodies(surface: str, context: Mapping[str, str]) -> st.SearchStrategy:
    root = load(surface)
    bodies = _Reader(root, _surface_overrides(surface, context), ALWAYS.get(surface, set())).of(root)
    if surface in ("messages", "messages.count_tokens"):
        bodies = bodies.map(_ends_with_user_turn)
    if surface == "tokenize":  # a client tokenizes something: a prompt when it drew no messages
        bodies = bodies.map(lambda b: b if b.get("prompt") is not None or b.get("messages") is not None
                            else {**b, "prompt": "Hello"})
    names = BUDGETS.get(surface)
    if names is None:
        return bodies
    return st.tuples(bodies, st.integers(1, 4)).map(
        lambda drawn: drawn[0] if any(n in drawn[0] for n in names) else {**drawn[0], names[-1]: drawn[1]})


def _not_null(node: dict[str, Any]) -> dict[str, Any]:
    """A field drawn in every object (ALWAYS) is drawn with a value, not null."""
    options = [o for o in node.get("anyOf", ()) if o.get("type") != "null"]
    return {**node, "anyOf": options} if options else node


def _ends_with_user_turn(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic conversation a client sends ends with the user's turn (a final assistant
    message is a prefill, which this server refuses: tests/matrix/messages_table.py covers it)."""
    if body["messages"][-1]["role"] == "user":
        return body
    return {**body, "messages": [*body["messages"], {"role": "user", "content": "Go on."}]}


def draw_bodies(strategy: st.SearchStrategy, count: int) -> list[dict[str, Any]]:
    """`count` examples, the same on every run (derandomized, no example database, no shrinking:
    the bodies are checked afterwards, all together, so every failure is listed, not the first)."""
    out: list[dict[str, Any]] = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(body):
        out.append(body)

    collect()
    return out


class _Reader:
    def __init__(self, root: dict[str, Any], overrides: Mapping[str, st.SearchStrategy], always: set[str]) -> None:
        self.defs = root.get("$defs", {})
        self.overrides = overrides
        self.always = always
        self._refs: dict[str, st.SearchStrategy] = {}

    def of(self, node: dict[str, Any]) -> st.SearchStrategy:
        unknown = set(node) - _KNOWN
        if unknown:
            raise ValueError(f"schema keyword(s) this reader does not know: {sorted(unknown)}")
        if "$ref" in node:
            name = node["$ref"].removeprefix("#/$defs/")
            if name not in self._refs:
                self._refs[name] = st.deferred(lambda: self.of(self.defs[name]))
            return self._refs[name]
        if "anyOf" in node or "oneOf" in node:
            return st.one_of([self.of(option) for option in node.get("anyOf", node.get("oneOf"))])
        if "const" in node:
            return st.just(node["const"])
        if "enum" in node:
            return st.sampled_from(node["enum"])
        kind = node.get("type")
        if kind is None:
            return st.none()  # untyped: ignored or unsupported-unless-neutral; null is neutral
        return getattr(self, f"_{kind}")(node)

    def _object(self, node: dict[str, Any]) -> st.SearchStrategy:
        properties = node.get("properties", {})
        extra = node.get("additionalProperties", True)
        if not properties:
            if isinstance(extra, dict):
                keys = self._string(node.get("propertyNames", {"type": "string"}))
                return st.dictionaries(keys, self.of(extra), max_size=min(node.get("maxProperties", MAX_ITEMS),
                                                                          MAX_ITEMS))
            return st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6),
                                   st.none() | st.integers(-9, 99) | TEXT | st.booleans(), max_size=2)
        required = set(node.get("required", ())) | (self.always & set(properties))
        fields = {name: self.overrides[name] if name in self.overrides
                  else self.of(_not_null(sub) if name in self.always else sub) for name, sub in properties.items()}
        optional = sorted(set(fields) - required)

        @st.composite
        def draw(draw_from) -> dict[str, Any]:
            chosen = draw_from(st.lists(st.sampled_from(optional), unique=True, max_size=MAX_OPTIONAL)) if optional else []
            return {name: draw_from(fields[name]) for name in [*sorted(required), *chosen]}

        return draw()

    def _array(self, node: dict[str, Any]) -> st.SearchStrategy:
        low = node.get("minItems", 0)
        high = max(low, min(node.get("maxItems", MAX_ITEMS), MAX_ITEMS))
        return st.lists(self.of(node.get("items", {})), min_size=low, max_size=high)

    def _string(self, node: dict[str, Any]) -> st.SearchStrategy:
        low = node.get("minLength", 0)
        high = max(low, min(node.get("maxLength", MAX_STRING), MAX_STRING))
        if "pattern" in node:
            return st.from_regex(node["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= 64)
        return st.text(ALPHABET, min_size=low, max_size=high)

    def _integer(self, node: dict[str, Any]) -> st.SearchStrategy:
        low = node["exclusiveMinimum"] + 1 if "exclusiveMinimum" in node else node.get("minimum", -(2**63))
        high = node["exclusiveMaximum"] - 1 if "exclusiveMaximum" in node else node.get("maximum", 2**63 - 1)
        return st.integers(low, high)

    def _number(self, node: dict[str, Any]) -> st.SearchStrategy:
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        return st.floats(low, high, exclude_min="exclusiveMinimum" in node, exclude_max="exclusiveMaximum" in node,
                         allow_nan=False, allow_infinity=False)

    def _boolean(self, node: dict[str, Any]) -> st.SearchStrategy:
        return st.booleans()

    def _null(self, node: dict[str, Any]) -> st.SearchStrategy:
        return st.none()
