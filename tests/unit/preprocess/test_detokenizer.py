"""Streaming detokenization: deltas concatenate to decode(all ids); no U+FFFD for split chars."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.preprocess.detokenizer import Detokenizer

TEXTS = [
    "emoji 😀🎉👨‍👩‍👧‍👦 flags 🇫🇷 end",
    "中文测试：你好，世界！日本語のテキスト",
    "rare chars 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 ꙮ and 🦀🦀",  # mostly byte-level fallback tokens
    "plain ascii only",
]


def _stream(tokenizer, ids, split_points):
    detok = Detokenizer(tokenizer.token_bytes)
    deltas, start = [], 0
    for cut in list(split_points) + [len(ids)]:
        deltas.append(detok.feed(ids[start:cut]))
        start = cut
    deltas.append(detok.finish())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time(model_spec, text):
    tok = model_spec.tokenizer
    ids = tok.encode(text)
    deltas = _stream(tok, ids, range(1, len(ids)))
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("text", TEXTS)
def test_every_single_split_point(model_spec, text):
    tok = model_spec.tokenizer
    ids = tok.encode(text)
    for cut in range(len(ids) + 1):
        assert "".join(_stream(tok, ids, [cut])) == text


def test_split_multibyte_char_is_held_back(model_spec):
    tok = model_spec.tokenizer
    ids = tok.encode("𓀀")  # 4 UTF-8 bytes, no merged token: several byte tokens
    assert len(ids) > 1
    detok = Detokenizer(tok.token_bytes)
    assert detok.feed(ids[:1]) == ""
    assert detok.feed(ids[1:]) == "𓀀"


def _byte_tokens(data: bytes):
    """A vocabulary of the 256 single bytes: token id == byte value."""
    return list(data), (lambda t: bytes([t]))


def test_invalid_bytes_become_replacement_and_stream_continues():
    ids, token_bytes = _byte_tokens(b"ok \xff\xfe then \xe4\xb8 cut then \xe4\xb8\xad")
    detok = Detokenizer(token_bytes)
    text = "".join(detok.feed([t]) for t in ids) + detok.finish()
    assert text == "ok \ufffd\ufffd then \ufffd cut then 中"


def test_dangling_tail_flushed_as_replacement():
    ids, token_bytes = _byte_tokens("a中".encode()[:-1])
    detok = Detokenizer(token_bytes)
    assert detok.feed(ids) == "a"
    assert detok.finish() == "\ufffd"


def test_special_tokens_are_not_shown(model_spec):
    tok = model_spec.tokenizer
    detok = Detokenizer(tok.token_bytes)
    assert detok.feed(tok.encode("hi<|im_end|>")) == "hi"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.lists(st.integers(0, 40), max_size=8))
def test_property_any_bytes_any_split(data, cuts):
    ids, token_bytes = _byte_tokens(data)
    points = sorted(c for c in cuts if c <= len(ids))
    detok = Detokenizer(token_bytes)
    deltas, start = [], 0
    for cut in points + [len(ids)]:
        deltas.append(detok.feed(ids[start:cut]))
        start = cut
    deltas.append(detok.finish())
    assert "".join(deltas) == data.decode("utf-8", "replace")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30), st.lists(st.integers(0, 60), max_size=6))
def test_property_real_tokenizer(model_spec, hf_tokenizer, text, cuts):
    tok = model_spec.tokenizer
    ids = tok.encode(text)
    points = sorted(c for c in cuts if c <= len(ids))
    joined = "".join(_stream(tok, ids, points))
    assert joined == hf_tokenizer.decode(ids, skip_special_tokens=True)
