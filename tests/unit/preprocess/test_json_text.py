"""Request bodies as JSON values (services/preprocess/json_text.py): a document deeper than the
fast parser's ~200 levels is still read (up to MAX_DEPTH) with the same strictness, and only a
deeper one is refused as a whole."""

import json
import random

import pytest

from services.common.errors import MstarError
from services.preprocess import json_text
from services.preprocess.json_text import MAX_DEPTH


def nested(depth: int, leaf="1") -> bytes:
    """`depth` levels of alternating arrays and objects around `leaf`."""
    text = leaf
    for i in range(depth):
        text = f"[{text}]" if i % 2 else f'{{"k": {text}}}'
    return text.encode()


def reference_depth(value) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


@pytest.mark.parametrize("depth", [1, 150, 201, 300, MAX_DEPTH])
def test_a_body_up_to_the_limit_parses_to_the_same_value(depth):
    body = nested(depth)
    assert reference_depth(json_text.loads(body)) == depth
    assert json_text.loads(body) == json.loads(body)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000, 1_000_000])
def test_a_deeper_body_is_refused_as_a_whole(depth):
    with pytest.raises(MstarError) as info:
        json_text.loads(b"[" * depth + b"]" * depth)
    err = info.value
    assert err.reason == "BODY_TOO_DEEP" and err.field_violations[0].field == "body"
    assert str(MAX_DEPTH) in err.message


def test_brackets_inside_strings_do_not_count():
    deep_text = json.dumps("[{" * 5000 + '\\" ]')
    body = b'{"a": ' + nested(250, deep_text) + b"}"
    assert reference_depth(json_text.loads(body)) == 251


def test_the_depth_scan_agrees_with_a_parser_on_random_shapes():
    rng = random.Random(7)
    for _ in range(200):
        depth = rng.choice([rng.randint(1, 40), rng.randint(MAX_DEPTH - 40, MAX_DEPTH + 40)])
        wide = ", ".join(["[1, [2]]"] * rng.randint(0, 300))  # shallow bulk before the deep part
        body = f'{{"bulk": [{wide}], "deep": '.encode() + nested(depth) + b"}"
        want = max(depth + 1, 4 if wide else 2)
        assert json_text._deeper_than(body, MAX_DEPTH) == (want > MAX_DEPTH)


@pytest.mark.parametrize(("body", "words"), [
    (nested(300, "NaN"), "NaN"),
    (nested(300, "Infinity"), "Infinity"),
    (nested(300, '"a\\ud800b"'), "surrogate"),
    (nested(300, '"x"').replace(b'"x"', b'"\xff"'), "UTF-8"),
    (nested(300, "tru"), "Expecting value"),
])
def test_the_deep_path_keeps_the_fast_parsers_strictness(body, words):
    with pytest.raises(ValueError) as info:
        json_text.loads(body)
    assert words in json_text.message(str(info.value)) or words in str(info.value)


def test_a_surrogate_pair_is_fine_on_the_deep_path():
    assert "\U0001f600" in json.dumps(json_text.loads(nested(300, '"\\ud83d\\ude00"')), ensure_ascii=False)


def test_shallow_errors_are_the_fast_parsers_own():
    with pytest.raises(ValueError, match="EOF"):
        json_text.loads(b'{"a": ')
    assert "surrogate" in json_text.message("lone surrogate at line 1 column 9")
