"""The vocabulary read with the weights drives grammars exactly as the real tokenizer spells tokens."""

import json

import pytest
import torch

from services.common.structured_output import StructuredOutput
from services.generation.grammar.bitmask import TokenMasks
from services.generation.grammar.compiler import GrammarCompiler
from services.generation.grammar.matcher import SequenceGrammar
from services.generation.weights.locate import default_model_path
from services.generation.weights.vocabulary import (
    BYTE_FALLBACK,
    BYTE_LEVEL,
    RAW,
    vocabulary_from_gguf,
    vocabulary_from_tokenizer_json,
)

SMOLLM_VOCAB = 49_152
SMOLLM_EOS = 2
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {
    "type": "integer"}}}, "required": ["city", "days"]}


@pytest.fixture(scope="module")
def smollm():
    from gguf import GGUFReader

    from services.common.gguf_file import GGUFFile
    from services.preprocess.tokenizer import Tokenizer

    reader = GGUFReader(default_model_path())  # the preprocess side reads the file with gguf's reader
    tokenizer = Tokenizer.from_gguf_fields({k: f.contents() for k, f in reader.fields.items() if k.startswith("tok")})
    vocabulary = vocabulary_from_gguf(GGUFFile(default_model_path()).fields)  # what the generation service loads
    return vocabulary, GrammarCompiler(vocabulary, SMOLLM_VOCAB, (SMOLLM_EOS,)), tokenizer


def test_the_default_gguf_vocabulary_is_byte_level_with_its_control_tokens(smollm):
    vocabulary, _, _ = smollm
    assert len(vocabulary) == SMOLLM_VOCAB and vocabulary.encoding == BYTE_LEVEL
    assert vocabulary.control_token_ids == frozenset(range(17))  # <|endoftext|> .. <empty_output>
    assert vocabulary.tokens[1] == "<|im_start|>" and not vocabulary.add_prefix_space


@pytest.mark.parametrize("document", [
    {"city": "Paris", "days": [1, 2, 30]},
    {"city": "Zürich ☃ 🎉 日本", "days": []},  # multi-byte characters split across byte tokens
    {"city": "a \"quoted\"\nline", "days": [-7]},
])
def test_the_real_tokenizers_encoding_of_a_valid_document_walks_the_grammar_to_its_end(smollm, document):
    _, compiler, tokenizer = smollm
    grammar = SequenceGrammar(compiler.submit(StructuredOutput.from_json_schema(SCHEMA)).result(timeout=120),
                              (SMOLLM_EOS,))
    for token in tokenizer.encode(json.dumps(document, ensure_ascii=False)):
        assert grammar.accept(token), tokenizer.decode([token])
    assert not grammar.is_terminated and grammar.accept(SMOLLM_EOS) and grammar.is_terminated


def test_control_tokens_are_masked_even_where_any_text_may_follow(smollm):
    _, compiler, tokenizer = smollm
    grammar = SequenceGrammar(compiler.submit(StructuredOutput.from_json_schema(SCHEMA)).result(timeout=120),
                              (SMOLLM_EOS,))
    for token in tokenizer.encode('{"city": "'):  # inside a string: almost any token may come next
        assert grammar.accept(token)
    logits = torch.zeros(1, SMOLLM_VOCAB)
    TokenMasks().apply(logits, [grammar])
    allowed = torch.isfinite(logits[0])
    assert int(allowed.sum()) > 40_000 and not allowed[:17].any()  # <|im_start|> is not text, EOS not yet


def test_tokenizer_json_vocabularies_name_their_encoding_and_special_tokens(tmp_path):
    def write(name, raw):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "tokenizer.json").write_text(json.dumps(raw))
        return vocabulary_from_tokenizer_json(str(directory))

    added = [{"id": 3, "content": "<|eot|>", "special": True}, {"id": 4, "content": "<tool>", "special": False}]
    byte_level = write("bl", {"model": {"type": "BPE", "vocab": {"a": 0, "Ġb": 1, "c": 2}}, "added_tokens": added,
                              "decoder": {"type": "ByteLevel"}})
    assert byte_level.encoding == BYTE_LEVEL and byte_level.tokens == ("a", "Ġb", "c", "<|eot|>", "<tool>")
    assert byte_level.control_token_ids == {3}
    spm = write("spm", {"model": {"type": "BPE", "byte_fallback": True, "vocab": {"<0x0A>": 0, "▁the": 2}},
                        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}]},
                        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]}})
    assert spm.encoding == BYTE_FALLBACK and spm.add_prefix_space and spm.control_token_ids == {1}  # a hole
    unigram = write("uni", {"model": {"type": "Unigram", "vocab": [["x", 0.0], ["y", -1.0]]}})
    assert unigram.encoding == RAW and unigram.tokens == ("x", "y")
    assert vocabulary_from_tokenizer_json(str(tmp_path)) is None  # no tokenizer.json there
