"""Byte-level (GPT-2 style) GGUF vocabularies split text the way their merges were learned, by
`tokenizer.ggml.pre`: Llama 3's regex (digits in runs of up to 3, case-blind contractions, a
punctuation mark joining the word after it), Qwen2/Qwen3's (one digit a piece), GPT-2's. The oracle
is transformers' own reading of the same metadata; an unknown split is refused naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.preprocess.tokenizer import Tokenizer, TokenizerError, _byte_level_alphabet

transformers = pytest.importorskip("transformers")

# Merges that only some splits let apply: "123" needs digits kept together, "Ġ1" a space before a
# digit (GPT-2's " ?\p{N}+"), ".a" punctuation glued to a word (Llama 3's "[^\r\n\p{L}\p{N}]?\p{L}+"),
# "'S" a case-blind contraction, "ĊĊ"/"ĠĠ" whitespace runs.
MERGES = ["1 2", "12 3", "Ġ 1", "' s", "' S", "h e", "Ġ he", "Ċ Ċ", "Ġ Ġ", ". a", "a b", "Ġ ab", "4 5"]
CONTROLS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ARCH_OF_PRE = {"qwen2": "qwen2", "llama-bpe": "llama", "gpt-2": "llama", "smollm": "llama"}


def byte_level_fields(pre: str | None) -> dict:
    alphabet = sorted(_byte_level_alphabet(), key=lambda c: _byte_level_alphabet()[c])
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = CONTROLS + alphabet + merged
    fields = {
        "general.architecture": ARCH_OF_PRE.get(pre, "llama"),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": np.array([3] * len(CONTROLS) + [1] * (len(tokens) - len(CONTROLS)), np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    if pre is not None:
        fields["tokenizer.ggml.pre"] = pre
    return fields


def transformers_tokenizer(fields: dict):
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    listed = {name: (v.tolist() if isinstance(v := fields[f"tokenizer.{key}"], np.ndarray) else v)
              for key, name in renames.items() if f"tokenizer.{key}" in fields}
    backend, _ = convert_gguf_tokenizer(fields["general.architecture"], listed)
    return backend


@pytest.fixture(scope="module", params=sorted(ARCH_OF_PRE))
def pair(request):
    fields = byte_level_fields(request.param)
    return request.param, Tokenizer.from_gguf_fields(fields), transformers_tokenizer(fields)


ATOMS = ["1", "2", "3", "4", "5", "12345", " 1", "'s", "'S", "'re", "he", " he", "ab", " ab", ".a", ".", "!",
         " ", "  ", "\n", "\n\n", "\r\n", "\t", "é", "😀", "中", "<|im_end|>"]
texts = st.lists(st.sampled_from(ATOMS), max_size=12).map("".join)


@pytest.mark.parametrize("text", ["123456", " 12 3", "HE'S here's", ".ab", "a\n\n\nb", "x  1", "45.ab<|im_end|>"])
def test_ids_equal_transformers(pair, text):
    _, ours, theirs = pair
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_ids_equal_transformers_property(pair, text):
    _, ours, theirs = pair
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids


def test_the_splits_differ_where_they_should():
    """The fixture's merges see each regex: without the right one the ids would be GPT-2's."""
    ids = {pre: Tokenizer.from_gguf_fields(byte_level_fields(pre)).encode("12345 1.ab'S") for pre in ARCH_OF_PRE}
    assert len({tuple(v) for v in ids.values()}) == 3  # gpt-2 and smollm share GPT-2's
    assert ids["gpt-2"] == ids["smollm"] == Tokenizer.from_gguf_fields(byte_level_fields(None)).encode("12345 1.ab'S")


@settings(max_examples=100, deadline=None)
@given(chunks=st.lists(texts, max_size=5))
def test_appended_text_tokenizes_like_whole_text(pair, chunks):
    _, ours, _ = pair
    ids: list[int] = []
    pending = ""
    for chunk in chunks:
        pending += chunk
        cut = ours.stable_prefix_length(pending)
        ids += ours.encode(pending[:cut])
        pending = pending[cut:]
    assert ids + ours.encode(pending) == ours.encode("".join(chunks))


def test_an_unknown_split_is_refused_naming_the_field():
    with pytest.raises(TokenizerError, match=r"tokenizer.ggml.pre 'tekken' is not supported"):
        Tokenizer.from_gguf_fields(byte_level_fields("tekken"))
