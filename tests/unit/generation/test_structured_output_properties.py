"""Property tests over random JSON schemas (hypothesis), on the tiny random model.

Soundness: every output of a constrained request (random seed, temperature 0.5-2) parses and
validates against its schema (``jsonschema``). Completeness: every instance of the schema,
written compactly in schema order, is accepted by the grammar to its end, so the mask never rules
out a valid document. (hypothesis-jsonschema's ``from_schema`` fails on object schemas with the
pinned hypothesis, ``'many' object has no attribute 'more'``, so ``instances`` below draws them.)

Strings with minLength/maxLength are written without escapes (grammar/json_schema.py), so their
instances here hold no quote, backslash or control character. The schemas are bounded (strings <= 6 characters, arrays <= 3 items, ranges for integers) and an
example whose longest document could not fit in max_tokens is skipped: each token spells at least
one character, so every output then ends because its grammar ended, and must parse.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from grammar_helpers import EOS, constrained, make_engine, run
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.common.structured_output import StructuredOutput
from services.generation.grammar.compiler import GrammarCompiler
from services.generation.grammar.matcher import SequenceGrammar
from services.generation.weights.random_init import TINY, random_checkpoint

MAX_TOKENS = 200
ESCAPED = 6  # the widest JSON spelling of one string character: \uXXXX
NAMES = st.text(alphabet="abcxyz_", min_size=1, max_size=5)
SCALARS = st.one_of(st.integers(-99, 999), st.text(alphabet="ab yz\"\\é", max_size=4), st.booleans(), st.none())
LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-500, 500), st.integers(0, 2000)),
    st.builds(lambda hi, lo: {"type": "string", "minLength": min(lo, hi), "maxLength": hi},
              st.integers(0, 6), st.integers(0, 2)),
    st.just({"type": "string", "pattern": "^[a-c]{1,3}-[0-9]$"}),
    st.just({"type": "string"}),  # unbounded: only the completeness test can use it
    st.builds(lambda values: {"enum": values}, st.lists(SCALARS, min_size=1, max_size=4, unique_by=json.dumps)),
    st.builds(lambda value: {"const": value}, SCALARS),
)


@st.composite
def objects(draw, children):
    properties = draw(st.dictionaries(NAMES, children, max_size=3))
    required = [name for name in properties if draw(st.booleans())]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def compound(children):
    arrays = st.builds(lambda items, lo, extra: {"type": "array", "items": items, "minItems": lo,
                                                 "maxItems": lo + extra},
                       children, st.integers(0, 1), st.integers(0, 2))
    any_of = st.builds(lambda a, b: {"anyOf": [a, b]}, children, children)
    return st.one_of(objects(children), arrays, any_of)


SCHEMAS = st.recursive(LEAVES, compound, max_leaves=6)


def max_chars(schema: dict) -> int:
    """An upper bound on the compact JSON text of any instance (", " and ": " separators)."""
    if "enum" in schema or "const" in schema:
        return max(ESCAPED * len(json.dumps(v)) for v in schema.get("enum", [schema.get("const")]))
    if "anyOf" in schema:
        return max(map(max_chars, schema["anyOf"]))
    kind = schema["type"]
    if kind == "object":
        return 2 + sum(len(json.dumps(k)) + 4 + max_chars(v) for k, v in schema["properties"].items())
    if kind == "array":
        return 2 + schema["maxItems"] * (max_chars(schema["items"]) + 2)
    if kind == "string":
        return 2 + ESCAPED * schema.get("maxLength", MAX_TOKENS)
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    return 5  # true, false, null


def instances(schema: dict) -> st.SearchStrategy:
    """Any instance of a schema drawn from SCHEMAS, object keys in schema order (as the grammar writes them)."""
    if "enum" in schema or "const" in schema:
        return st.sampled_from(schema.get("enum", [schema.get("const")]))
    if "anyOf" in schema:
        return st.one_of(*map(instances, schema["anyOf"]))
    kind = schema["type"]
    if kind == "object":
        return st.fixed_dictionaries(
            {k: instances(v) for k, v in schema["properties"].items() if k in schema["required"]},
            optional={k: instances(v) for k, v in schema["properties"].items() if k not in schema["required"]},
        ).map(lambda d: {k: d[k] for k in schema["properties"] if k in d})
    if kind == "array":
        return st.lists(instances(schema["items"]), min_size=schema["minItems"], max_size=schema["maxItems"])
    if kind == "string" and "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    if kind == "string" and "maxLength" in schema:
        return st.text(st.characters(exclude_characters='"\\', exclude_categories=["Cs"], min_codepoint=0x20),
                       min_size=schema["minLength"], max_size=schema["maxLength"])
    if kind == "string":
        return st.text()
    if kind == "integer":
        return st.integers(schema["minimum"], schema["maximum"])
    return st.booleans() if kind == "boolean" else st.none()


@pytest.fixture(scope="module")
def engine():
    return make_engine(random_checkpoint(TINY, seed=0, std=0.02), num_blocks=512)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, seed=st.integers(0, 2**62), temperature=st.floats(0.5, 2.0))
def test_every_output_of_a_random_schema_parses_and_validates(engine, schema, seed, temperature):
    assume(max_chars(schema) < MAX_TOKENS)
    so = StructuredOutput.from_json_schema(schema)
    requests = {(seed, i): ([3 + (seed + 5 * i) % 90, 40 + i], constrained(so, seed=seed + i, temperature=temperature,
                                                                        max_tokens=MAX_TOKENS)) for i in range(3)}
    texts, reasons, tokens, failed = run(engine, requests)
    assert not failed, failed
    for key, text in texts.items():
        assert reasons[key] == "stop" and tokens[key][-1] == EOS, (schema, text)
        jsonschema.validate(json.loads(text), schema)


@pytest.fixture(scope="module")
def compiler(engine):
    return GrammarCompiler(engine.runner.vocabulary, TINY.vocab_size, (EOS,))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, data=st.data())
def test_every_valid_instance_is_accepted_by_the_grammar(compiler, schema, data):
    instance = data.draw(instances(schema))
    jsonschema.validate(instance, schema)  # the strategy itself is right
    text = json.dumps(instance, ensure_ascii=False, separators=(", ", ": "))
    grammar = SequenceGrammar(compiler.submit(StructuredOutput.from_json_schema(schema)).result(60), (EOS,))
    assert grammar._matcher.accept_string(text), (schema, text)
    assert grammar.accept(EOS) and grammar.is_terminated
