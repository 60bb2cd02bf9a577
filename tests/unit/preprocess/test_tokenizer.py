"""Token ids equal transformers' (the oracle) and appended text tokenizes like whole text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

LINES = [
    "Hello, world!",
    "The capital of France is Paris.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nmany",
    "numbers 12345 and 3.14159, -42",
    "emoji 😀🎉👨‍👩‍👧‍👦 flags 🇫🇷",
    "中文测试：你好，世界！",
    "日本語のテキストとカタカナ",
    "한국어 문장입니다",
    "mixed 中文 and English 😀 in one line",
    "accents: café naïve résumé Ωμέγα",
    "code: def f(x):\n    return x ** 2  # square",
    "it's they're we've I'm you'll he'd",
    "<|im_start|>user\nhi<|im_end|>\n",
    "special in text <|endoftext|> here",
    "\u200bzero width\u200d joiner",
    "",
]


@pytest.mark.parametrize("line", LINES)
def test_ids_equal_transformers(model_spec, hf_tokenizer, line):
    assert model_spec.tokenizer.encode(line) == hf_tokenizer.encode(line, add_special_tokens=False)


@pytest.mark.parametrize("line", LINES)
def test_decode_equals_transformers(model_spec, hf_tokenizer, line):
    ids = model_spec.tokenizer.encode(line)
    assert model_spec.tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_special_tokens(model_spec):
    special = model_spec.tokenizer.special
    assert (special.bos_token, special.eos_token, special.eos_token_ids) == (
        "<|im_start|>",
        "<|im_end|>",
        (2,),
    )
    assert model_spec.tokenizer.encode("<|im_end|>") == [2]
    assert model_spec.tokenizer.token_bytes(2) == b""
    assert model_spec.context_length == 8192


def _incremental(tokenizer, chunks: list[str]) -> list[int]:
    """What the servicer does with appended text: commit the stable prefix, hold the tail."""
    ids: list[int] = []
    pending = ""
    for chunk in chunks:
        pending += chunk
        cut = tokenizer.stable_prefix_length(pending)
        ids += tokenizer.encode(pending[:cut])
        pending = pending[cut:]
    return ids + tokenizer.encode(pending)


@pytest.mark.parametrize("line", LINES)
def test_incremental_every_split(model_spec, line):
    tok = model_spec.tokenizer
    whole = tok.encode(line)
    for i in range(len(line) + 1):
        assert _incremental(tok, [line[:i], line[i:]]) == whole, i


def test_special_token_split_across_chunks(model_spec):
    tok = model_spec.tokenizer
    assert _incremental(tok, ["hi <|im_", "end|> there"]) == tok.encode("hi <|im_end|> there")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from(list("ab cd\n\t'sre12.!😀中文 é<|>_")), max_size=12),
        max_size=6,
    )
)
def test_incremental_property(model_spec, chunks):
    tok = model_spec.tokenizer
    assert _incremental(tok, chunks) == tok.encode("".join(chunks))
